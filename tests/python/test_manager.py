# SPDX-License-Identifier: Apache-2.0
"""kvbm.Manager and kvbm.Request: the tiered manager through the binding.

An "engine" here writes, into every block it must compute, bytes derived
from the block's sequence hash; whatever later comes back from a match (in
G1, or onboarded from G2/G3) must be exactly those bytes.
"""
import gc
import threading

import numpy as np
import pytest

import kvbm
from kvbm import Tier

B = 16


def pattern(h, layer, n):
    """The bytes the engine writes for (block hash, layer)."""
    rng = np.random.default_rng([h & 0xFFFFFFFF, h >> 32, layer])
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def run(m, tokens, **kw):
    """One request as an engine runs it; returns (matched tokens, info)."""
    with m.prefill(tokens, **kw) as r:
        info = r.wait(timeout=30)
        nfull = len(tokens) // B
        for k in range(nfull):
            blk = r.block_table[k]
            for layer in range(m.num_layers):
                view = m.block_layer(Tier.G1, blk, layer)
                want = pattern(r.block_hash(k), layer, len(view))
                if r.must_compute(k):
                    view[:] = want
                else:  # matched: the KV must be what was written for it
                    assert view.tobytes() == want, f"block {k} layer {layer}"
                view.release()
        r.commit()
        return info


def prompt(seed, n):
    return (np.arange(n, dtype=np.uint32) + np.uint32(seed * 100000))


def test_prefix_hits_in_g1():
    with kvbm.Manager(g1_blocks=64) as m:
        toks = prompt(1, 100)
        assert run(m, toks).matched_tokens == 0
        info = run(m, toks)
        assert info.matched_tokens == (100 - 1) // B * B
        assert info.hit_blocks == (6, 0, 0, 0)
        assert m.stats(Tier.G1)["hit_blocks"] == 6


@pytest.mark.parametrize("layout,key", [("fully_contiguous", None), ("layer_separate", None),
                                        ("fully_contiguous", b"a shared secret!")])
def test_onboard_from_g2_and_g3_gives_the_bytes_written(tmp_path, layout, key):
    m = kvbm.Manager(g1_blocks=8, g2_blocks=8, g3_blocks=64, g3_dir=str(tmp_path),
                     g3_policy="all", layout=layout, num_layers=3, inner_dim=32, g3_key=key)
    first = prompt(1, 6 * B + 1)
    run(m, first)
    m.flush()
    # Push `first` out of G1 (8 blocks) and then out of G2 (8 blocks).
    for s in range(2, 5):
        run(m, prompt(s, 6 * B + 1))
        m.flush()
    info = run(m, first)  # asserts the bytes of every matched block
    assert info.matched_tokens == 6 * B
    assert sum(info.hit_blocks) == 6 and info.hit_blocks[0] == 0
    assert info.hit_blocks[2] > 0, info  # some came back from disk
    assert m.stats(Tier.G3)["onboarded_blocks"] >= info.hit_blocks[2]
    m.close()


def test_request_fields_and_block_sources():
    with kvbm.Manager(g1_blocks=32) as m:
        toks = prompt(7, 40)
        run(m, toks)
        r = m.prefill(toks)
        assert r.num_tokens == 40 and r.matched_tokens == 32
        assert len(r.block_table) == 3
        assert [r.block_source(k) for k in range(3)] == [0, 0, -1]
        assert [r.must_compute(k) for k in range(3)] == [False, False, True]
        r.append([1, 2, 3, 4, 5, 6, 7, 8])
        assert r.num_tokens == 48 and len(r.block_table) == 3
        r.append(np.array([9], dtype=np.uint32))
        assert len(r.block_table) == 4
        info = r.poll()
        assert info.ready and info.num_tokens == 49
        assert kvbm.block_hashes(np.concatenate([toks, np.arange(1, 9, dtype=np.uint32)]), B) == \
            [r.block_hash(k) for k in range(3)]
        r.destroy()
        r.destroy()  # idempotent
        with pytest.raises(kvbm.ClosedError):
            r.poll()


def test_numpy_and_torch_view_the_memory_in_place():
    torch = pytest.importorskip("torch")
    with kvbm.Manager(g1_blocks=16, num_layers=2, inner_dim=64, dtype_bytes=2) as m:
        lay = m.layout(Tier.G1)
        region = np.frombuffer(m.region(Tier.G1), dtype=np.uint8)
        assert region.size == lay["region_size"]
        blk, layer = 5, 1
        off = blk * lay["block_stride"] + layer * lay["layer_stride"]
        region[off:off + 4] = [1, 2, 3, 4]
        view = m.block_layer(Tier.G1, blk, layer)
        assert view.tobytes()[:4] == b"\x01\x02\x03\x04"
        assert m.read_layer(Tier.G1, blk, layer)[:4] == b"\x01\x02\x03\x04"
        t = torch.frombuffer(m.block_layer(Tier.G1, blk, 0), dtype=torch.float16)
        t.fill_(1.5)
        assert np.frombuffer(view, dtype=np.uint8).sum() > 0
        assert np.all(region[blk * lay["block_stride"]:][:lay["layer_stride"]].view(np.float16) == 1.5)
        m.write_layer(Tier.G1, 0, 0, b"\xff" * 8)
        assert region[:8].tolist() == [255] * 8
        with pytest.raises(kvbm.BusyError):
            m.close()
        del region, view, t
        gc.collect()


def test_views_keep_the_manager_alive():
    m = kvbm.Manager(g1_blocks=4)
    a = np.frombuffer(m.region(Tier.G1), dtype=np.uint8)
    del m
    gc.collect()
    a[:] = 7  # the memory is still there
    assert int(a.sum()) == 7 * a.size


def test_close_destroys_live_requests_and_refuses_views():
    m = kvbm.Manager(g1_blocks=8)
    r = m.prefill(prompt(1, 20))
    v = m.block_layer(Tier.G1, 0, 0)
    with pytest.raises(kvbm.BusyError) as e:
        m.close()
    assert e.value.status == "KVBM_ESTATE" and "view" in e.value.message
    v.release()
    m.close()
    m.close()
    assert m.closed and r.closed
    for call in (r.poll, r.commit, lambda: r.append([1]), lambda: m.prefill([1]), m.flush,
                 lambda: m.block_layer(0, 0, 0)):
        with pytest.raises(kvbm.ClosedError):
            call()
    r.destroy()


def test_stats_after_close_are_the_final_counts():
    """The counts a user reads after close() are the last ones (issue 24):
    the G2 copies still queued at close are counted, not an error."""
    m = kvbm.Manager(g1_blocks=64, g2_blocks=64)
    info = run(m, prompt(3, 100))
    assert info.matched_tokens == 0
    before = m.stats(Tier.G1)
    m.close()
    after = m.stats(Tier.G1)
    assert after["hit_blocks"] == before["hit_blocks"] and after["allocated"] == before["allocated"]
    assert m.stats(Tier.G2)["offloaded_blocks"] == 100 // B  # every full block reached G2
    assert "abandoned" in after and "backoffs" in m.stats(Tier.G4)
    with pytest.raises(kvbm.Error):  # a tier that does not exist, closed or not
        m.stats(7)


def test_no_space_changes_nothing():
    with kvbm.Manager(g1_blocks=4) as m:
        with pytest.raises(kvbm.NoSpaceError) as e:
            m.prefill(prompt(1, 5 * B))
        assert e.value.code == -5 and e.value.status == "KVBM_ENOSPC"
        assert m.stats(Tier.G1)["free"] == 4
        r = m.prefill(prompt(1, 4 * B))
        with pytest.raises(kvbm.NoSpaceError):
            r.append([1])
        assert r.num_tokens == 4 * B
        r.destroy()


def test_hostile_arguments():
    m = kvbm.Manager(g1_blocks=8, g2_blocks=4)
    assert m.stats(Tier.G4)["present"] is False  # the manager has no G4
    with pytest.raises(kvbm.TierError):
        m.layout(Tier.G4)
    for bad_tier in (4, 7, 2**70):
        with pytest.raises(kvbm.TierError if bad_tier < 2**64 else kvbm.InvalidArgumentError):
            m.stats(bad_tier)
    with pytest.raises(kvbm.InvalidArgumentError):
        m.stats(-1)
    for bad in ("G1", 1.0, None):
        with pytest.raises(TypeError):
            m.stats(bad)
    with pytest.raises(kvbm.RangeError):
        m.block_layer(Tier.G1, 8, 0)
    with pytest.raises(kvbm.RangeError):
        m.block_layer(Tier.G1, 0, 2)
    with pytest.raises(IndexError):
        m.block_layer(Tier.G2, 2**32 - 1, 0)
    with pytest.raises(kvbm.InvalidArgumentError):
        m.block_layer(Tier.G1, 2**32, 0)
    with pytest.raises(kvbm.InvalidArgumentError):
        m.block_layer(Tier.G1, -1, 0)
    with pytest.raises(kvbm.TierError):
        m.block_layer(Tier.G3, 0, 0)
    with pytest.raises(kvbm.RangeError):
        m.region(Tier.G1, 1)
    with pytest.raises(kvbm.InvalidArgumentError):
        m.write_layer(Tier.G1, 0, 0, b"x" * (m.layer_bytes + 1))
    with pytest.raises(TypeError):
        m.write_layer(Tier.G1, 0, 0, "text")
    # tokens
    with pytest.raises(kvbm.InvalidArgumentError):
        m.prefill([])
    with pytest.raises(kvbm.InvalidArgumentError):
        m.prefill([1, 2**32])
    with pytest.raises(kvbm.InvalidArgumentError):
        m.prefill([-1])
    with pytest.raises(TypeError):
        m.prefill([1.0])
    with pytest.raises(TypeError):
        m.prefill("abc")
    with pytest.raises(TypeError):
        m.prefill(b"abcd")
    with pytest.raises(TypeError):
        m.prefill(np.zeros(4, dtype=np.int64))
    with pytest.raises(TypeError):
        m.prefill(np.zeros((2, 2), dtype=np.uint32))
    with pytest.raises(TypeError):
        m.prefill(5)
    with pytest.raises(kvbm.InvalidArgumentError):
        m.prefill([1], priority=256)
    with pytest.raises(TypeError):
        m.prefill([1], salt_hash="x")
    # a strided buffer is gathered, not misread
    strided = np.arange(64, dtype=np.uint32)[::2]
    with m.prefill(strided) as r1, m.prefill(np.ascontiguousarray(strided)) as r2:
        assert [r1.block_hash(k) for k in range(2)] == [r2.block_hash(k) for k in range(2)]
        with pytest.raises(kvbm.RangeError):
            r1.block_hash(2)
        with pytest.raises(kvbm.RangeError):
            r1.must_compute(99)
        with pytest.raises(kvbm.InvalidArgumentError):
            r1.wait(timeout=-1)
        with pytest.raises(TypeError):
            r1.wait(timeout="1")
    # constructor
    for kw in ({"block_size": 0}, {"g1_blocks": 0}, {"layout": "x"}, {"g2_policy": "x"},
               {"scheme": "x"}, {"num_layers": 0}, {"alignment": 3}, {"g1_blocks": -1},
               {"env": {"DYN_KVBM_CPU_CACHE_GB": "lots"}}):
        with pytest.raises(kvbm.InvalidArgumentError):
            kvbm.Manager(**kw)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.Manager(g3_blocks=4, g3_key=b"short")
    for kw in ({"block_size": "16"}, {"env": 3}, {"g3_dir": 5}, {"env": {"A": 1}}, {"g3_key": "text"}):
        with pytest.raises(TypeError):
            kvbm.Manager(**kw)
    with pytest.raises(TypeError):
        kvbm.Manager(16)
    with pytest.raises(TypeError):
        kvbm.Request()
    m.close()


def test_evil_token_sequence_cannot_close_under_a_call():
    m = kvbm.Manager(g1_blocks=8)

    class Evil:
        def __index__(self):
            m.close()
            return 1

    with pytest.raises(kvbm.ClosedError):
        m.prefill([1, Evil(), 3])


def test_g3_unavailable_is_reported_not_raised():
    m = kvbm.Manager(g1_blocks=8, g3_blocks=8, g3_dir="/nonexistent/kvbm")
    assert "nonexistent" in m.g3_error
    assert m.stats(Tier.G3)["present"] is False
    m.close()


def test_many_threads_share_one_manager():
    m = kvbm.Manager(g1_blocks=256, g2_blocks=256)
    errors = []

    def worker(seed):
        try:
            for i in range(30):
                run(m, prompt(seed * 10 + i % 3, 3 * B + 5))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    m.close()


def test_one_request_from_two_threads_raises_busy_never_crashes():
    m = kvbm.Manager(g1_blocks=512)
    r = m.prefill(prompt(1, 20))
    seen = {"busy": 0, "appended": 0}
    lock = threading.Lock()

    def hammer():
        for _ in range(300):
            try:
                r.append([1])
                with lock:
                    seen["appended"] += 1
                r.commit()
            except kvbm.BusyError:
                with lock:
                    seen["busy"] += 1
            except kvbm.NoSpaceError:
                return

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["appended"] > 0
    # Every append that went through is in the request, none lost or doubled.
    assert r.num_tokens == 20 + seen["appended"]
    assert r.poll().num_tokens == r.num_tokens
    r.destroy()
    m.close()


def test_close_racing_calls_on_other_threads_never_crashes():
    """close() while other threads prefill, commit and destroy: each call
    either runs on an open manager or raises ClosedError; close() itself
    either succeeds or says BusyError (a call was running without the GIL)."""
    for _ in range(5):
        m = kvbm.Manager(g1_blocks=64, g2_blocks=64)
        stop = threading.Event()
        bad = []

        def worker(seed):
            i = 0
            while not stop.is_set():
                try:
                    with m.prefill(prompt(seed, 40 + i % 7)) as r:
                        r.wait()
                        r.append([1, 2])
                        r.commit()
                    m.flush()
                except (kvbm.ClosedError, kvbm.BusyError, kvbm.NoSpaceError):
                    pass
                except Exception as e:  # pragma: no cover
                    bad.append(e)
                i += 1
                if m.closed:
                    return

        ts = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
        for t in ts:
            t.start()
        closed = False
        for _ in range(10000):
            try:
                m.close()
                closed = True
                break
            except kvbm.BusyError:
                pass
        stop.set()
        for t in ts:
            t.join()
        if not closed:
            m.close()
        assert not bad, bad
        assert m.closed


def test_device_memory_is_refused_cleanly_or_copied():
    """Without CUDA (or a GPU) device and pinned tiers are clean errors; with
    a GPU, device G1 has no host views but read_layer/write_layer copy."""
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.Manager(g1_memory="gpu")
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.Manager(g2_blocks=4, g2_memory="device")
    try:
        m = kvbm.Manager(g1_blocks=8, g1_memory="device")
    except (kvbm.UnsupportedError, kvbm.DeviceError) as e:
        assert e.status in ("KVBM_EUNSUPPORTED", "KVBM_EDEVICE")
        return
    with m:
        assert m.memory(Tier.G1) == "device"
        with pytest.raises(kvbm.UnsupportedError):
            m.block_layer(Tier.G1, 0, 0)
        m.write_layer(Tier.G1, 1, 1, b"\x07" * m.layer_bytes)
        assert m.read_layer(Tier.G1, 1, 1) == b"\x07" * m.layer_bytes
