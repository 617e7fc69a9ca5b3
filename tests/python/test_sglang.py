# SPDX-License-Identifier: Apache-2.0
"""kvbm.Volume and kvbm.sglang (the SGLang HiCache storage backend).

An SGLang-shaped driver: a host pool of torch CPU tensors in SGLang's
layouts (kvbm.sglang.HostPoolStandIn, or SGLang's own pool when SGLang is
installed), pages named by SGLang's hash chain, stored and read back the
way HiCacheController does it (zero copy: batch_set_v1 / batch_exists /
batch_get_v1; plain: get_data_page + batch_set, get_dummy_flat_data_page +
batch_get + set_from_flat_data_page), over file://, disk://, redis:// and
redis+cluster:// (real redis-server processes on loopback). Byte equality
is checked against the writer's pool; garbage written under a key by hand
(in the file, in Redis) must be a counted miss that leaves the destination
as it was.
"""
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid

import numpy as np
import pytest

import kvbm
import kvbm.sglang as S

torch = pytest.importorskip("torch")

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
LAYOUTS = ["page_first", "layer_first", "page_first_direct"]


# ------------------------------------------------------------- servers

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *words):
    return subprocess.run([REDIS_CLI, "-p", str(port), *words], capture_output=True,
                          timeout=30, check=False)


class RedisServer:
    def __init__(self, tmp, extra=()):
        self.dir = tmp
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(tmp),
                 "--save", "", "--appendonly", "no", *extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(100):
                if cli(self.port, "PING").stdout.strip() == b"PONG":
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
            self.stop()
        raise RuntimeError("redis-server did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def redis(tmp_path):
    if not os.path.exists(REDIS):
        pytest.skip("no redis-server")
    r = RedisServer(tmp_path)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three masters joined by redis-cli --cluster create (a few seconds)."""
    if not os.path.exists(REDIS):
        pytest.skip("no redis-server")
    nodes = []
    try:
        for i in range(3):
            d = tmp_path_factory.mktemp(f"node{i}")
            nodes.append(RedisServer(d, ("--cluster-enabled", "yes", "--cluster-config-file",
                                         "nodes.conf", "--cluster-node-timeout", "1000")))
        addrs = [f"127.0.0.1:{n.port}" for n in nodes]
        r = cli(nodes[0].port, "--cluster", "create", *addrs, "--cluster-replicas", "0",
                "--cluster-yes")
        assert r.returncode == 0, r.stderr
        for _ in range(300):
            if all(b"cluster_state:ok" in cli(n.port, "CLUSTER", "INFO").stdout for n in nodes):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the cluster did not become ok")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture(params=["file", "disk", "redis", "cluster"])
def url(request, tmp_path):
    kind = request.param
    if kind == "file":
        return f"file://{tmp_path}/vol"
    if kind == "disk":
        (tmp_path / "disk").mkdir()
        return f"disk://{tmp_path}/disk"
    if kind == "redis":
        return f"redis://127.0.0.1:{request.getfixturevalue('redis').port}"
    nodes = request.getfixturevalue("cluster")
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)


def volume_opts(url):
    return dict(slots=64, block_bytes=1 << 16) if url.startswith("disk:") else {}


# -------------------------------------------------------------- Volume

def test_volume_round_trip_zero_copy_and_new_bytes(url):
    with kvbm.Volume(url, namespace="t1", **volume_opts(url)) as v:
        rng = np.random.default_rng(1)
        vals = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1, 100, 4096, 40000)]
        keys = [11, 2**64 - 1, -5, 0]  # signed hashes read as their two's complement
        assert v.put(keys, vals) == [0, 0, 0, 0]
        bufs = [np.zeros(len(x), np.uint8) for x in vals]
        addrs = [b.ctypes.data for b in bufs]
        assert v.get_into(keys, bufs) == [len(x) for x in vals]
        for b, x, a in zip(bufs, vals, addrs):
            assert b.ctypes.data == a and np.array_equal(b, x)  # written in place
        got = v.get(keys + [12345], size_hint=64)  # small hint: the big ones take a 2nd round
        assert [g == x.tobytes() for g, x in zip(got, vals)] == [True] * 4 and got[4] is None
        assert v.exists([11, 12345]) == [True, False]
        assert v.delete([11, 11]) == [True, False]
        assert v.get_into([11], [bytearray(1)])[0] < 0
        st = v.stats()
        assert st["puts"] == 4 and st["hits"] >= 8
    assert v.closed
    assert v.stats()["puts"] == 4  # as close() left them


@pytest.mark.parametrize("hash_threads", [0, 2])
def test_volume_framed_values_are_verified(url, hash_threads):
    with kvbm.Volume(url, namespace=f"t2-{hash_threads}", hash_threads=hash_threads,
                     **volume_opts(url)) as v:
        page = np.arange(4096, dtype=np.uint8)
        assert v.put([7], [page], framed=True, checks=[99]) == [0]
        dst = np.zeros(4096, np.uint8)
        assert v.get_into([7], [dst], framed=True, checks=[99]) == [4096]
        assert np.array_equal(dst, page)
        # another name's value under a colliding key, and a buffer of another size
        for bufs, checks, counter in (([np.full(4096, 5, np.uint8)], [98], "frames_foreign"),
                                      ([np.full(4095, 5, np.uint8)], [99], "frames_wrong_size"),
                                      ([np.full(4097, 5, np.uint8)], [99], "frames_wrong_size")):
            before = v.stats()[counter]
            r = v.get_into([7], bufs, framed=True, checks=checks)
            assert r[0] < 0 and (bufs[0] == 5).all(), (counter, r)  # untouched
            assert v.stats()[counter] == before + 1
        # a raw value is not a frame: a corrupt miss
        assert v.put([8], [page]) == [0]
        d2 = np.full(4096, 5, np.uint8)
        assert v.get_into([8], [d2], framed=True)[0] < 0 and (d2 == 5).all()
        assert v.stats()["frames_corrupt"] == 1
        # a batch: many frames hashed together, good ones and bad ones mixed
        rng = np.random.default_rng(3)
        vals = [rng.integers(0, 256, 1000 + 37 * i, dtype=np.uint8) for i in range(40)]
        keys = list(range(100, 140))
        assert v.put(keys, vals, framed=True, checks=keys) == [0] * 40
        assert v.put([105], [vals[6]], framed=True, checks=[106]) == [0]  # 105 holds 106's
        outs = [np.zeros(len(x), np.uint8) for x in vals]
        r = v.get_into(keys, outs, framed=True, checks=keys)
        assert [x >= 0 for x in r] == [i != 5 for i in range(40)]
        assert all(np.array_equal(o, x) for i, (o, x) in enumerate(zip(outs, vals)) if i != 5)
        assert not outs[5].any()


def test_volume_hostile_calls(tmp_path):
    for bad, cls in (("nosuch://x", kvbm.UnsupportedError), ("redis://h:99999", kvbm.InvalidArgumentError),
                     ("disk:///tmp/x", kvbm.InvalidArgumentError)):  # disk:// without slots
        with pytest.raises(cls):
            kvbm.Volume(bad)
    with pytest.raises(kvbm.InvalidArgumentError, match="hash_threads"):
        kvbm.Volume(f"file://{tmp_path}", hash_threads=100000)
    with pytest.raises(kvbm.InvalidArgumentError, match="key_namespace"):
        kvbm.Volume(f"file://{tmp_path}", namespace="a/b")
    v = kvbm.Volume(f"file://{tmp_path}", max_value_bytes=1 << 16)
    with pytest.raises(kvbm.InvalidArgumentError, match=r"buffers\[0\]: a read-only buffer"):
        v.get_into([1], [b"abc"])
    with pytest.raises(kvbm.InvalidArgumentError, match="not C-contiguous"):
        v.get_into([1], [np.zeros((4, 4), np.uint8)[:, 1]])
    with pytest.raises(kvbm.InvalidArgumentError, match=r"values: 1 values for 2 keys"):
        v.put([1, 2], [b"x"])
    with pytest.raises(kvbm.InvalidArgumentError, match=r"values\[0\]: empty"):
        v.put([1], [b""])
    with pytest.raises(kvbm.InvalidArgumentError, match=r"keys\[1\]: not a 64-bit hash"):
        v.exists([1, 2**64])
    with pytest.raises(kvbm.InvalidArgumentError, match="at most 65536"):
        v.exists(range(65537))
    with pytest.raises(kvbm.TooLongError, match="max_value_bytes"):
        v.put([1], [bytes(1 << 17)])
    with pytest.raises(kvbm.InvalidArgumentError, match="checks"):
        v.put([1], [b"x"], checks=[1])
    with pytest.raises(kvbm.InvalidArgumentError, match="checks: 1 checks for 2 keys"):
        v.put([1, 2], [b"x", b"y"], framed=True, checks=[1])
    with pytest.raises(kvbm.PhaseError):
        v.put([1], [b"x"], framed=True, phase=7)
    with pytest.raises(TypeError):
        v.put([1], [object()])
    with pytest.raises(TypeError):
        v.put([1], b"xyz")  # one buffer, not a sequence of them
    assert v.put([], []) == [] and v.exists([]) == []
    v.close()
    v.close()  # idempotent
    for call in (lambda: v.exists([1]), lambda: v.put([1], [b"x"]),
                 lambda: v.get_into([1], [bytearray(1)]), lambda: v.get([1])):
        with pytest.raises(kvbm.ClosedError, match="Volume is closed"):
            call()


def test_volume_releases_the_gil_and_close_waits(redis):
    """A batch blocked on a stopped Redis runs with the GIL released: the
    main thread keeps running, sees the call in flight, and close() waits
    for it instead of freeing the volume under it."""
    v = kvbm.Volume(f"redis://127.0.0.1:{redis.port}", timeout_ms=1500)
    assert v.put([1], [b"x"]) == [0]
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", v.exists([1])))
        t.start()
        spins, t0 = 0, time.monotonic()
        while v.calls == 0 and time.monotonic() - t0 < 5:
            time.sleep(0.001)
        assert v.calls == 1
        while time.monotonic() - t0 < 0.3:
            spins += 1  # Python runs while the other thread waits in C
        assert spins > 1000 and v.calls == 1
        v.close()  # waits for the batch
        assert not t.is_alive() and out["r"] == [False] and v.closed
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)


# ------------------------------------------------------- SGLang driver

def config(url, *, tp_rank=0, tp_size=2, model="org/model-7b", v1=True, **extra):
    ec = {"backend_name": "kvbm", "module_path": "kvbm.sglang",
          "class_name": "KvbmHiCacheStorage", "kvbm_url": url, "kvbm_disk_slots": 256,
          "kvbm_disk_persist": True}  # disk://: one process at a time, reopened warm
    if v1:
        ec["interface_v1"] = 1
    ec.update(extra)
    return S.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=True, is_page_first_layout=True,
        model_name=model, extra_config=ec)


def pool(layout, seed=None, pages=16):
    p = S.HostPoolStandIn(layers=3, heads=2, head_dim=16, page_size=4, pages=pages, layout=layout)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        p.kv_buffer.copy_(torch.randn(p.kv_buffer.shape, generator=g))
    return p


def backend(url, p, **kw):
    b = S.KvbmHiCacheStorage(config(url, **kw), {})  # as SGLang's factory builds it
    b.register_mem_pool_host(p)
    return b


def pages_equal(pa, ia, pb, ib):
    return torch.equal(pa.get_data_page(ia).view(torch.uint8), pb.get_data_page(ib).view(torch.uint8))


TOKENS = list(range(1000, 1024))  # 6 pages of 4


def test_backend_is_sglangs_class_and_hashes_are_sglangs():
    assert issubclass(S.KvbmHiCacheStorage, S.HiCacheStorage)
    h = S.page_hashes(TOKENS, 4)
    assert len(h) == 6 and all(len(x) == 64 for x in h)
    first = hashlib.sha256(b"".join(t.to_bytes(4, "little") for t in TOKENS[:4])).hexdigest()
    second = hashlib.sha256(bytes.fromhex(first)
                            + b"".join(t.to_bytes(4, "little") for t in TOKENS[4:8])).hexdigest()
    assert h[:2] == [first, second]
    assert S.page_hashes(TOKENS[8:], 4, prior_hash=h[1]) == h[2:]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_copy_pages_round_trip(url, layout):
    """HiCacheController's order: backup (batch_set_v1), then on another
    server: batch_exists, batch_get_v1 into freshly allocated host pages.
    (Each backend is closed before the next opens: a disk:// slot file
    belongs to one process at a time.)"""
    keys = S.page_hashes(TOKENS, 4)
    ns = f"sglang-{uuid.uuid4().hex[:8]}"  # the cluster lives across tests
    pa = pool(layout, seed=1)
    a = backend(url, pa, kvbm_namespace=ns)
    src = pa.alloc(len(keys) * 4)
    assert a.batch_set_v1(keys, src) == [True] * 6
    assert a.batch_set_v1(keys[:2], src[:8]) == [True, True]  # stored already: kept
    assert a.counters()["pages_already_stored"] == 2
    a.close()
    pb = pool(layout)
    b = backend(url, pb, kvbm_namespace=ns)
    pb.alloc(8)  # different host slots on the reader
    dst = pb.alloc(len(keys) * 4)
    assert b.batch_exists(keys) == 6
    assert b.batch_exists(keys + S.page_hashes(TOKENS + [1, 2, 3, 4], 4)[6:]) == 6
    assert b.batch_get_v1(keys, dst) == [True] * 6
    for i in range(6):
        assert pages_equal(pa, src[4 * i].item(), pb, dst[4 * i].item())
    c = b.counters()
    assert c["pages_loaded"] == 6 and c["verify_failures"] == 0
    st = b.get_stats()
    assert st.prefetch_pgs == [6] and st.kvbm["pages_loaded"] == 6
    b.close()
    # another TP rank's pages are other keys; another layout's pages too
    other = backend(url, pool(layout), tp_rank=1, kvbm_namespace=ns)
    assert other.batch_exists(keys) == 0
    other.close()
    lay2 = LAYOUTS[(LAYOUTS.index(layout) + 1) % 3]
    third = backend(url, pool(lay2), kvbm_namespace=ns)
    assert third.batch_exists(keys) == 0
    third.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_plain_pages_round_trip(url, layout):
    """HiCacheController's generic path: get_data_page + batch_set, then
    get_dummy_flat_data_page + batch_get + set_from_flat_data_page."""
    keys = S.page_hashes(TOKENS, 4)
    ns = f"sglang-{uuid.uuid4().hex[:8]}"  # the cluster lives across tests
    pa = pool(layout, seed=2)
    a = backend(url, pa, v1=False, kvbm_namespace=ns)
    src = pa.alloc(len(keys) * 4)
    data = [pa.get_data_page(src[4 * i].item()) for i in range(len(keys))]
    assert a.batch_set(keys, data) is True
    assert a.set(keys[0], data[0]) is True
    a.close()
    pb = pool(layout)
    b = backend(url, pb, v1=False, kvbm_namespace=ns)
    assert b.batch_exists(keys) == 6 and b.exists(keys[0])
    dummies = [pb.get_dummy_flat_data_page() for _ in keys]
    got = b.batch_get(keys, dummies)
    dst = pb.alloc(len(keys) * 4)
    for i, page in enumerate(got):
        assert page is dummies[i]  # read into the target, returned as it
        pb.set_from_flat_data_page(dst[4 * i].item(), page)
        assert pages_equal(pa, src[4 * i].item(), pb, dst[4 * i].item())
    assert b.get(keys[0]) is not None and b.get("0" * 64) is None
    b.close()


def garble(url, b, key, component, how, tmp_redis_port=None):
    """Writes garbage under the volume key of (key, component) directly in
    the store: 'flip' changes a byte in place, 'short' truncates, 'foreign'
    puts another key's stored value there."""
    vkey, _ = S._key_and_check(b._name(key, component))
    hexkey = f"{vkey:016x}"
    if url.startswith("file://"):
        path = os.path.join(url[len("file://"):], "sglang", hexkey)
        data = bytearray(open(path, "rb").read())
        return path, data
    return f"sglang/{hexkey}", None


def corrupt_file(path, data, how, other):
    if how == "flip":
        data[len(data) // 2] ^= 0x40
    elif how == "short":
        data = data[:-7]
    else:
        data = bytearray(open(other, "rb").read())
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["flip", "short", "foreign"])
def test_garbage_in_a_file_is_a_counted_miss(tmp_path, how):
    url = f"file://{tmp_path}/vol"
    keys = S.page_hashes(TOKENS, 4)
    pa = pool("page_first", seed=3)
    a = backend(url, pa)
    src = pa.alloc(len(keys) * 4)
    assert a.batch_set_v1(keys, src) == [True] * 6
    path, data = garble(url, a, keys[2], "_k", how)
    other, _ = garble(url, a, keys[3], "_k", how)
    corrupt_file(path, data, how, other)
    pb = pool("page_first")
    pb.kv_buffer.fill_(7.0)
    b = backend(url, pb)
    dst = pb.alloc(len(keys) * 4)
    before = pb.kv_buffer.clone()
    ok = b.batch_get_v1(keys, dst)
    assert ok == [True, True, False, True, True, True]
    # the garbled component's pages are untouched; the others equal the writer's
    k_page = pb.kv_buffer[0, dst[8].item():dst[8].item() + 4]
    assert torch.equal(k_page, before[0, dst[8].item():dst[8].item() + 4])
    for i in (0, 1, 3, 4, 5):
        assert pages_equal(pa, src[4 * i].item(), pb, dst[4 * i].item())
    c = b.counters()
    assert c["verify_failures"] == 1 and c["page_misses"] == 1
    key = {"flip": "volume_frames_corrupt", "short": "volume_frames_corrupt",
           "foreign": "volume_frames_foreign"}[how]
    assert c[key] == 1
    # SGLang's controller stops at the first failed page: what it would count
    assert ok.index(False) == 2


def test_garbage_in_redis_is_a_counted_miss(redis):
    url = f"redis://127.0.0.1:{redis.port}"
    keys = S.page_hashes(TOKENS, 4)
    pa = pool("layer_first", seed=4)
    a = backend(url, pa)
    src = pa.alloc(len(keys) * 4)
    assert a.batch_set_v1(keys, src) == [True] * 6
    rkey, _ = garble(url, a, keys[1], "_v", "flip")
    raw = cli(redis.port, "--no-raw", "STRLEN", rkey).stdout
    n = int(raw.split()[-1])
    assert n > 40
    r = subprocess.run([REDIS_CLI, "-p", str(redis.port), "-x", "SET", rkey],
                       input=os.urandom(n), capture_output=True, timeout=30)
    assert r.returncode == 0
    rkey0, _ = garble(url, a, keys[4], "_k", "short")
    assert cli(redis.port, "SETRANGE", rkey0, "0", "XXXX").returncode == 0
    pb = pool("layer_first")
    b = backend(url, pb)
    dst = pb.alloc(len(keys) * 4)
    ok = b.batch_get_v1(keys, dst)
    assert ok == [True, False, True, True, False, True]
    assert b.counters()["verify_failures"] == 2
    # plain path: a wrong-size target is a miss too, never a partial read
    assert b.get(keys[0], torch.zeros(8, dtype=torch.bfloat16)) is None


def test_backend_hostile_calls(tmp_path):
    url = f"file://{tmp_path}/vol"
    with pytest.raises(kvbm.InvalidArgumentError, match="kvbm_url"):
        S.KvbmHiCacheStorage(config(url, kvbm_url=""), {})
    with pytest.raises(kvbm.UnsupportedError):
        S.KvbmHiCacheStorage(config("nosuch://x"), {})
    p = pool("page_first", seed=5)
    b = backend(url, p)
    keys = S.page_hashes(TOKENS, 4)
    idx = p.alloc(24)
    with pytest.raises(kvbm.InvalidArgumentError, match="host_indices: 20 indices for 6 pages"):
        b.batch_set_v1(keys, idx[:20])
    with pytest.raises(kvbm.RangeError, match="outside the host pool"):
        b.batch_get_v1(keys[:1], torch.arange(p.size - 2, p.size + 2))
    with pytest.raises(kvbm.RangeError):
        b.batch_get_v1(keys[:1], torch.arange(-4, 0))
    with pytest.raises(kvbm.InvalidArgumentError, match="characters"):
        b.exists("x" * 5000)
    with pytest.raises(TypeError):
        b.exists(12345)
    with pytest.raises(kvbm.InvalidArgumentError, match="not contiguous"):
        b.get(keys[0], torch.zeros(4, 100)[:, 0])
    with pytest.raises(kvbm.InvalidArgumentError, match="values: 1 values for 2 keys"):
        b.batch_set(keys[:2], [p.get_data_page(0)])
    q = S.HostPoolStandIn(layers=1, heads=1, head_dim=4, page_size=4, pages=2)
    q.layout = "page_sideways"
    with pytest.raises(kvbm.UnsupportedError, match="layout"):
        S.KvbmHiCacheStorage(config(url), {}).register_mem_pool_host(q)
    d = S.KvbmHiCacheStorage(config(f"disk://{tmp_path}/d"), {})
    with pytest.raises(kvbm.StateError, match="register"):
        d.exists(keys[0])
    b.close()
    with pytest.raises(kvbm.ClosedError):
        b.batch_exists(keys)


def test_clear_deletes_what_this_backend_stored(tmp_path):
    url = f"file://{tmp_path}/vol"
    p = pool("page_first", seed=6)
    b = backend(url, p)
    keys = S.page_hashes(TOKENS, 4)
    assert all(b.batch_set_v1(keys, p.alloc(24)))
    assert b.batch_exists(keys) == 6
    b.clear()
    assert b.batch_exists(keys) == 0


def test_prefetch_and_backup_threads_share_one_backend(redis):
    """SGLang calls one backend from its backup and prefetch threads at
    once: both run their batches concurrently (the GIL released in C) and
    every page read back equals the writer's."""
    url = f"redis://127.0.0.1:{redis.port}"
    p = pool("page_first", seed=7, pages=80)  # 64 pages written, 8 to read into
    b = backend(url, p)
    prompts = [list(range(10000 * k, 10000 * k + 32)) for k in range(8)]  # 8 pages each
    slots = [p.alloc(32) for _ in prompts]
    errors, loaded = [], []

    def backup():
        try:
            for toks, idx in zip(prompts, slots):
                assert all(b.batch_set_v1(S.page_hashes(toks, 4), idx))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    def prefetch():
        try:
            for _ in range(40):
                for toks in prompts:
                    keys = S.page_hashes(toks, 4)
                    n = b.batch_exists(keys)
                    if n:
                        ok = b.batch_get_v1(keys[:n], torch.arange(32 * 8, 32 * 8 + 4 * n))
                        loaded.append(sum(ok))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=backup), threading.Thread(target=prefetch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    keys = S.page_hashes(prompts[-1], 4)
    assert b.batch_get_v1(keys, torch.arange(32 * 8, 32 * 8 + 32)) == [True] * 8
    for i in range(8):
        assert pages_equal(p, slots[-1][4 * i].item(), p, 32 * 8 + 4 * i)
    assert b.counters()["verify_failures"] == 0


def test_a_store_that_goes_away_is_misses_not_exceptions(redis):
    """An exception in batch_get_v1/batch_set_v1 would kill SGLang's
    prefetch or backup thread for good: a Redis that is down must give
    False (and 0 from batch_exists) within the timeout, and the backend
    works again once Redis is back."""
    url = f"redis://127.0.0.1:{redis.port}"
    p = pool("page_first", seed=8)
    b = backend(url, p, kvbm_timeout_ms=300)
    keys = S.page_hashes(TOKENS, 4)
    src = p.alloc(24)
    assert all(b.batch_set_v1(keys[:3], src[:12]))
    port = redis.port
    redis.stop()
    t = time.monotonic()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys[:3], p.alloc(12)) == [False] * 3
    assert b.batch_set_v1(keys[3:], src[12:]) == [False] * 3
    assert b.batch_set(keys[:1], [p.get_data_page(0)]) is False
    assert b.get(keys[0], p.get_dummy_flat_data_page()) is None
    assert time.monotonic() - t < 10
    assert b.counters()["store_failures"] >= 4
    # back on the same port (empty: no persistence): stores work again
    again = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(redis.dir)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if cli(port, "PING").stdout.strip() == b"PONG":
                break
            time.sleep(0.05)
        for _ in range(50):  # the volume reconnects on its next batches
            if all(b.batch_set_v1(keys, src)):
                break
            time.sleep(0.1)
        assert b.batch_exists(keys) == 6
    finally:
        again.kill()
        again.wait()
