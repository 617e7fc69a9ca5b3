# SPDX-License-Identifier: Apache-2.0
"""kvbm.connector.KvbmConnector over a hybrid KvbmCacheManager (issue 20):
both roles driven step by step in vLLM's order, over a kvbm.Manager with KV
cache groups (full attention + sliding window, full attention + Mamba).

Per step, as vLLM's scheduler and model runner call them:

    scheduler: get_computed_blocks, get_num_new_matched_tokens,
               allocate_slots, update_state_after_alloc (one block list per
               group), build_connector_meta
    worker:    bind_connector_metadata, start_load_kv, per layer
               wait_for_layer_load / attention / save_kv_layer,
               wait_for_save (commits every group), get_finished,
               clear_connector_metadata
    finish:    request_finished_all_groups (vLLM's SupportsHMA), free

The engine's KV caches are zero-copy views of G1 (g1_kv_caches), one set
of layers per group, registered with the group each layer is in. The
"attention" writes, through those views, into every block the step
completes that the request must write (the block ids the connector's
SaveSpec carries per group, minus skip_write_blocks), bytes derived from
the block's tokens and its group; whatever a later request gets as a hit
is read back through kvbm's own Manager.read_layer and must be exactly
those bytes. Null places (vLLM's null block) are the cache manager's
null_block_id and are never written or read.
"""
import pickle
import types

import pytest

torch = pytest.importorskip("torch")

import kvbm  # noqa: E402
from kvbm import Tier  # noqa: E402
from kvbm.connector import (  # noqa: E402
    KVConnectorRole,
    KvbmBlocks,
    KvbmCacheManager,
    KvbmConnector,
    KvbmConnectorMetadata,
    g1_kv_caches,
)

from test_cache_manager_groups import (  # noqa: E402
    B, NULL, MIXES, Req, content, expect_nulls, prompt, read_block,
)

HEADS = 4


def so(new=(), cached=(), finished=()):
    """A vLLM-shaped SchedulerOutput: new and cached (request, n) pairs."""
    return types.SimpleNamespace(
        num_scheduled_tokens={r.request_id: n for r, n in list(new) + list(cached)},
        scheduled_new_reqs=[types.SimpleNamespace(req_id=r.request_id, num_computed_tokens=r.num_computed_tokens)
                            for r, _ in new],
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[r.request_id for r, _ in cached],
                                                    num_computed_tokens=[r.num_computed_tokens for r, _ in cached]),
        finished_req_ids=set(finished))


class Engine:
    """A vLLM-shaped engine over one hybrid manager: both connector roles."""

    def __init__(self, m):
        self.m = m
        self.cm = KvbmCacheManager(m, null_block_id=NULL)
        self.names = [[f"g{g}.l{l}" for l in range(m.num_layers)] for g in range(m.num_groups)]
        self.sched = KvbmConnector(KVConnectorRole.SCHEDULER, self.cm)
        # vLLM's KVCacheConfig: kv_cache_groups[i].layer_names
        config = types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(layer_names=n) for n in self.names])
        self.worker = KvbmConnector(KVConnectorRole.WORKER, self.cm, kv_cache_groups=config)
        # Layer l of every group views kvbm layer l (vLLM's shared KVCacheTensor).
        self.kv = {}
        for names in self.names:
            self.kv.update(g1_kv_caches(m, names, num_kv_heads=HEADS))
        self.worker.register_kv_caches(self.kv)
        self.written = {}   # (request id, group, k) -> block id
        self.metas = []

    def admit(self, r):
        """Scheduler: a new request's hit and blocks; the hit must need no
        load (settled in G1 by get_computed_blocks). Returns the hit, or
        None when G1 has no room."""
        blocks, hit = self.cm.get_computed_blocks(r)
        assert self.sched.get_num_new_matched_tokens(r, hit) == (0, False)
        if self.cm.allocate_slots(r, len(r.all_token_ids) - hit, hit, blocks) is None:
            return None
        self.sched.update_state_after_alloc(r, self.cm.get_blocks(r.request_id), 0)
        r.num_computed_tokens = hit
        return hit

    def write_block(self, g, bid, data):
        """Group g's layers write block bid through their G1 views."""
        per_layer = self.m.layer_bytes
        for l, name in enumerate(self.names[g]):
            part = data[l * per_layer:(l + 1) * per_layer]
            if not part:
                break
            flat = self.kv[name][bid].reshape(-1).view(torch.uint8)
            flat[:len(part)] = torch.frombuffer(bytearray(part), dtype=torch.uint8)

    def step(self, new=(), cached=(), finished=()):
        """One engine step over the scheduled (request, tokens) pairs;
        returns the metadata."""
        meta = self.sched.build_connector_meta(so(new, cached, finished))
        meta = pickle.loads(pickle.dumps(meta))  # plain data, as across processes
        self.metas.append(meta)
        reqs = {r.request_id: r for r, _ in list(new) + list(cached)}
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        for names in self.names:
            for name in names:
                w.wait_for_layer_load(name)
        for s in meta.saves:  # the forward pass: each group's blocks from the metadata
            r = reqs[s.request_id]
            skip = self.cm.skip_write_blocks(s.request_id, s.start, s.end)
            first = s.start // B
            assert len(s.group_block_ids) == self.m.num_groups
            for g, ids in enumerate(s.group_block_ids):
                assert ids == self.cm.get_block_ids(s.request_id)[g][first:first + len(ids)]
                for k in range(first, s.end // B):
                    if k in skip[g]:
                        continue
                    bid = ids[k - first]
                    assert bid != NULL, f"group {g} block {k} must be written but is null"
                    self.write_block(g, bid, content(r.all_token_ids, k, g, self.m.group_bytes(g)))
                    self.written[(s.request_id, g, k)] = bid
        for names in self.names:
            for name in names:
                w.save_kv_layer(name, self.kv[name], None)
        w.wait_for_save()
        assert w.get_finished(set(finished)) == (None, None)  # nothing asynchronous
        assert w.get_block_ids_with_load_errors() == set()
        w.clear_connector_metadata()
        for s in meta.saves:
            reqs[s.request_id].num_computed_tokens = s.end
        return meta

    def prefill(self, r):
        hit = self.admit(r)
        assert hit is not None
        self.step(new=[(r, len(r.all_token_ids) - hit)])
        return hit

    def decode(self, r, token):
        r.all_token_ids.append(token)
        assert self.cm.allocate_slots(r, 1) is not None
        return self.step(cached=[(r, 1)])

    def finish(self, r):
        ids = self.cm.get_block_ids(r.request_id)
        assert self.sched.request_finished_all_groups(r, ids) == (False, None)
        self.cm.free(r)

    def check_hit(self, r, blocks, hit):
        """Every non-null hit block holds the bytes written for its prefix,
        read back through kvbm (not the engine's views)."""
        for g, table in enumerate(blocks.get_block_ids()):
            assert len(table) == hit // B
            for k, bid in enumerate(table):
                if bid != NULL:
                    n = self.m.group_bytes(g)
                    assert read_block(self.m, bid, n) == content(r.all_token_ids, k, g, n), f"group {g} block {k}"


@pytest.mark.parametrize("mix", ["gpt-oss", "mamba"])
def test_prefix_hit_through_both_roles(mix):
    """A computes and saves (prefill, then decode steps that release the
    window's/state's blocks at each commit); B gets the prefix hit, in every
    group's needed blocks the bytes A wrote; finished requests reported."""
    m = kvbm.Manager(g1_blocks=80, **MIXES[mix])
    e = Engine(m)
    a = Req("a", prompt(1, 10 * B + 5))
    assert e.prefill(a) == 0
    expect_nulls(mix, e.cm.get_block_ids("a"), len(a.all_token_ids))
    for i in range(2 * B):  # decode: every commit releases what a group no longer needs
        meta = e.decode(a, 50 + i)
        n = len(a.all_token_ids)
        (save,) = meta.saves
        assert (save.start, save.end) == (n - 1, n)
        ids = e.cm.get_block_ids("a")
        expect_nulls(mix, ids, n)
        assert m.stats(Tier.G1)["active"] == sum(1 for t in ids for b in t if b != NULL)
    assert NULL in ids[1] and NULL not in ids[0]
    ids = e.cm.get_block_ids("a")
    assert e.sched.request_finished_all_groups(a, ids) == (False, None)  # never delays the free
    with pytest.raises(kvbm.StateError, match="finished already"):
        e.sched.request_finished_all_groups(a, ids)
    e.cm.free(a)
    meta = e.sched.build_connector_meta(so(finished=["a"]))  # the next step names it
    assert meta.finished_req_ids == {"a"} and meta.saves == [] and meta.loads == []
    assert m.stats(Tier.G1)["active"] == 0

    b = Req("b", prompt(1, 8 * B) + [5] * (B + 3))  # block 8 is B's own
    blocks, hit = e.cm.get_computed_blocks(b)
    assert hit == 8 * B
    ids = blocks.get_block_ids()
    expect_nulls(mix, ids, hit)
    for g, table in enumerate(ids):  # the hit blocks are the ones A wrote
        for k, bid in enumerate(table):
            if bid != NULL:
                assert e.written[("a", g, k)] == bid
    e.check_hit(b, blocks, hit)
    assert e.prefill(b) == hit
    saves = e.metas[-1].saves
    assert [(s.start, s.end) for s in saves] == [(hit, len(b.all_token_ids))]
    assert not any(k[0] == "b" and k[2] < 8 for k in e.written)  # the hit is not rewritten
    assert ("b", 0, 8) in e.written and ("b", 1, 8) in e.written
    # A third request hits B's prompt, block 8 being the one B wrote.
    c = Req("c", list(b.all_token_ids) + [9] * B)
    blocks, hit = e.cm.get_computed_blocks(c)
    assert hit == 9 * B
    e.check_hit(c, blocks, hit)
    e.prefill(c)
    for r in (b, c):
        e.finish(r)
    assert m.stats(Tier.G1)["active"] == 0


@pytest.mark.parametrize("mix", ["gpt-oss", "mamba"])
def test_hit_onboarded_from_g2(mix):
    """A's blocks evicted from G1 come back from G2 for B's hit, settled by
    get_computed_blocks: the connector reports no external tokens and B's
    blocks hold A's bytes in every group's needed blocks."""
    m = kvbm.Manager(g1_blocks=40, g2_blocks=400, **MIXES[mix])
    e = Engine(m)
    a = Req("a", prompt(1, 12 * B + 3))
    e.prefill(a)
    e.finish(a)
    m.flush()
    for i in range(3):
        f = Req(f"f{i}", prompt(10 + i, 12 * B + 3))
        e.prefill(f)
        e.finish(f)
        m.flush()
    onboarded = m.stats(Tier.G2)["onboarded_blocks"]
    b = Req("b", prompt(1, 12 * B) + [1, 2, 3, 4])
    blocks, hit = e.cm.get_computed_blocks(b)
    assert hit == 12 * B
    second = 2 if mix == "gpt-oss" else 1  # only the window's blocks, or the state
    assert m.stats(Tier.G2)["onboarded_blocks"] - onboarded == 12 + second
    e.check_hit(b, blocks, hit)
    assert e.prefill(b) == hit
    e.finish(b)


def test_shared_unwritten_blocks_wait_for_their_writer():
    """A and B admitted in one step share A's registered, unwritten blocks:
    scheduling B before A has written them is refused (it would read them);
    the engine schedules A, then B, whose prompt then needs only its tail."""
    m = kvbm.Manager(g1_blocks=60, groups="full,sw:32")
    e = Engine(m)
    p = prompt(5, 4 * B + 2)
    a, b = Req("a", p), Req("b", list(p))
    assert e.admit(a) == 0 and e.admit(b) == 0
    assert e.cm.dependencies("b") == {"a"}
    with pytest.raises(kvbm.StateError, match=r"reads blocks that \['a'\] registered"):
        e.sched.build_connector_meta(so(new=[(a, len(p)), (b, len(p))]))
    e.step(new=[(a, len(p))])  # A alone; its commit ends B's wait
    assert not e.cm.dependencies("b")
    e.step(new=[(b, len(p))])
    assert not any(k[0] == "b" and k[2] < 4 for k in e.written)  # A's, not rewritten
    c = Req("c", p + [1])
    blocks, hit = e.cm.get_computed_blocks(c)
    assert hit == 4 * B
    e.check_hit(c, blocks, hit)
    for r in (a, b):
        e.finish(r)
    e.cm.free(c)


def test_gemma_like_six_groups():
    """Full attention + five windows: every group's layers registered, the
    hit holds A's bytes in each."""
    m = kvbm.Manager(g1_blocks=200, **MIXES["gemma"])
    e = Engine(m)
    assert len(e.worker._layers) == 6 * m.num_layers
    a = Req("a", prompt(2, 6 * B + 1))
    e.prefill(a)
    e.finish(a)
    b = Req("b", prompt(2, 6 * B) + [3])
    blocks, hit = e.cm.get_computed_blocks(b)
    assert hit == 6 * B and len(blocks.get_block_ids()) == 6
    e.check_hit(b, blocks, hit)
    e.prefill(b)
    e.finish(b)


def test_hybrid_misuse():
    m = kvbm.Manager(g1_blocks=40, groups="full,sw:32")
    cm = KvbmCacheManager(m, null_block_id=NULL)
    sched = KvbmConnector(KVConnectorRole.SCHEDULER, cm)
    names = [["f0", "f1"], ["s0", "s1"]]
    full, sw = g1_kv_caches(m, names[0], num_kv_heads=HEADS), g1_kv_caches(m, names[1], num_kv_heads=HEADS)
    # kv_cache_groups: counted, one group per layer, lists of str.
    with pytest.raises(kvbm.InvalidArgumentError, match="1 groups, the cache manager 2"):
        KvbmConnector(KVConnectorRole.WORKER, cm, kv_cache_groups=[names[0]])
    with pytest.raises(kvbm.InvalidArgumentError, match="'f1' is in groups 0 and 1"):
        KvbmConnector(KVConnectorRole.WORKER, cm, kv_cache_groups=[names[0], ["f1", "s0"]])
    with pytest.raises(kvbm.InvalidArgumentError, match="group 1 has no layers"):
        KvbmConnector(KVConnectorRole.WORKER, cm, kv_cache_groups=[names[0], []])
    with pytest.raises(TypeError, match="layer names must be str"):
        KvbmConnector(KVConnectorRole.WORKER, cm, kv_cache_groups=[names[0], [1, 2]])
    # register_kv_caches: which group each layer is in is needed.
    w = KvbmConnector(KVConnectorRole.WORKER, cm)
    with pytest.raises(kvbm.StateError, match="kv_cache_groups="):
        w.register_kv_caches({**full, **sw})
    w = KvbmConnector(KVConnectorRole.WORKER, cm, kv_cache_groups=names)
    with pytest.raises(kvbm.NotFoundError, match="'x' is in no KV cache group"):
        w.register_kv_caches({**full, **sw, "x": full["f0"]})
    with pytest.raises(kvbm.InvalidArgumentError, match="another name views too"):
        w.register_kv_caches({**full, "s0": sw["s0"], "s1": sw["s0"]})
    with pytest.raises(kvbm.InvalidArgumentError, match=r"\['s1'\] of kv_cache_groups have no KV cache"):
        w.register_kv_caches({**full, "s0": sw["s0"]})
    with pytest.raises(kvbm.InvalidArgumentError, match="not a view of kvbm's G1"):
        w.register_kv_caches({**full, **sw, "s1": sw["s1"].clone()})
    w.register_kv_caches({**full, **sw})  # layers of two groups share kvbm's layers
    assert w._layers["f0"][0] == w._layers["s0"][0] == 0

    # Scheduler: block lists per group, no external tokens.
    r = Req("r", prompt(3, 3 * B + 1))
    blocks, hit = cm.get_computed_blocks(r)
    assert sched.get_num_new_matched_tokens(r, hit) == (0, False)
    cm.allocate_slots(r, len(r.all_token_ids), 0, blocks)
    got = cm.get_blocks("r")
    with pytest.raises(kvbm.InvalidArgumentError, match="1 block lists for a cache manager of 2"):
        sched.update_state_after_alloc(r, (got.groups[0],), 0)
    with pytest.raises(kvbm.InvalidArgumentError, match="group 1's blocks"):
        sched.update_state_after_alloc(r, (got.groups[0], got.groups[0]), 0)
    with pytest.raises(kvbm.InvalidArgumentError, match="hit is local"):
        sched.update_state_after_alloc(r, got, B)
    sched.update_state_after_alloc(r, got, 0)
    sched.update_state_after_alloc(r, got.get_block_ids(), 0)  # the tuple vLLM passes works too
    with pytest.raises(kvbm.InvalidArgumentError, match="1 block lists for a cache manager of 2"):
        sched.request_finished(r, [got.groups[0]])
    meta = sched.build_connector_meta(so(new=[(r, len(r.all_token_ids))]))
    assert isinstance(meta, KvbmConnectorMetadata)
    (save,) = meta.saves
    assert save.group_block_ids == [list(t) for t in got.groups]
    assert sched.request_finished(r, got.get_block_ids()) == (False, None)  # the non-HMA name works too
    cm.free(r)


def test_one_group_unchanged_shapes():
    """One group: SaveSpec carries no per-group ids, request_finished_all_groups
    takes vLLM's 1-tuple, and kv_cache_groups (one group) is accepted."""
    m = kvbm.Manager(g1_blocks=16, block_size=4)
    cm = KvbmCacheManager(m)
    sched = KvbmConnector(KVConnectorRole.SCHEDULER, cm)
    w = KvbmConnector(KVConnectorRole.WORKER, cm, kv_cache_groups=[["l0", "l1"]])
    w.register_kv_caches(g1_kv_caches(m, ["l0", "l1"], num_kv_heads=HEADS))
    r = Req("r", list(range(9)))
    blocks, hit = cm.get_computed_blocks(r)
    cm.allocate_slots(r, 9, 0, blocks)
    sched.update_state_after_alloc(r, cm.get_blocks("r"), 0)
    (save,) = sched.build_connector_meta(so(new=[(r, 9)])).saves
    assert save.group_block_ids is None and (save.start, save.end) == (0, 9)
    with pytest.raises(kvbm.InvalidArgumentError, match="2 block lists for a cache manager of 1"):
        sched.request_finished_all_groups(r, ([1], [2]))
    assert sched.request_finished_all_groups(r, cm.get_block_ids("r")) == (False, None)
    cm.free(r)
    assert KvbmBlocks(groups=[[1], [2]]).get_block_ids() == ([1], [2])


def test_chunked_prefill_commits_after_its_last_chunk():
    """A prompt computed in two chunks (vLLM's max_num_batched_tokens):
    the first step's wait_for_save commits nothing (a hybrid commit says
    every token is computed), so a request admitted between the chunks
    shares the unwritten blocks and waits; the last chunk commits every
    group and releases the window's blocks before the window."""
    m = kvbm.Manager(g1_blocks=60, groups="full,sw:32")
    e = Engine(m)
    a = Req("a", prompt(7, 6 * B + 4))
    assert e.admit(a) == 0
    e.step(new=[(a, 3 * B)])
    assert a.num_computed_tokens == 3 * B
    assert NULL not in e.cm.get_block_ids("a")[1]  # nothing released before the commit
    b = Req("b", list(a.all_token_ids))
    assert e.admit(b) == 0  # A's blocks have no KV yet: no hit, shared
    assert e.cm.dependencies("b") == {"a"}
    with pytest.raises(kvbm.StateError, match="not written yet"):
        e.sched.build_connector_meta(so(new=[(b, len(b.all_token_ids))]))
    e.step(cached=[(a, 3 * B + 4)])  # the last chunk: committed
    expect_nulls("gpt-oss", e.cm.get_block_ids("a"), 6 * B + 4)
    assert not e.cm.dependencies("b")
    e.step(new=[(b, len(b.all_token_ids))])
    c = Req("c", list(a.all_token_ids))
    blocks, hit = e.cm.get_computed_blocks(c)
    assert hit == 6 * B
    e.check_hit(c, blocks, hit)
    for r in (a, b, c):
        e.finish(r)
