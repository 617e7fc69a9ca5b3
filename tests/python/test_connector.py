# SPDX-License-Identifier: Apache-2.0
"""kvbm.connector end to end: a tiny torch transformer with a paged KV cache
in kvbm's G1, driven by a vLLM-shaped engine loop (tests/python/tiny_engine.py)
that calls the connector in vLLM's order.

What is checked, in every scenario:
- every generated token (greedy) equals the token the same model computes
  with kvbm switched off (a plain forward pass over the whole sequence);
- the KV bytes of every full block are recorded by sequence hash when first
  computed; a block computed again must have the same bytes, and every
  block a request gets as a hit (G1, or onboarded from G2/G3) must hold
  exactly the recorded bytes when its load is reported finished, and equal
  the plain forward pass's K and V for that prefix;
- hits land in the tier the scenario arranged (G1 prefix sharing, then after
  eviction G2 and G3), counted per request and by the manager.

Scenarios run in phases separated by Manager.flush(), so which tier holds a
block depends only on the order of the engine's calls, not on copy timing;
the engine steps while loads are in flight, so how many steps a load takes
may vary and nothing asserts it.
"""

import pickle

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

from tiny_engine import Engine, Request, TinyTransformer  # noqa: E402

torch.set_num_threads(1)

BS = 4            # tokens per block
LAYERS, HEADS, HEAD_DIM, VOCAB = 2, 4, 16, 512


@pytest.fixture(scope="module")
def model():
    return TinyTransformer(vocab=VOCAB, num_layers=LAYERS, num_heads=HEADS, head_dim=HEAD_DIM, seed=1234)


@pytest.fixture(scope="module")
def reference(model):
    cache = {}

    def ref(prompt, max_tokens):
        key = (tuple(prompt), max_tokens)
        if key not in cache:
            cache[key] = model.generate(prompt, max_tokens)
        return cache[key]
    return ref


class Tokens:
    """Deterministic random prompts."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, n):
        return torch.randint(0, VOCAB, (n,), generator=self.g).tolist()


def make_manager(tmp_path=None, *, g1, g2=0, g3=0, g2_policy="all", g3_policy="all",
                 layout="fully_contiguous"):
    kw = {"layout": layout}
    if g3:
        kw["g3_dir"] = str(tmp_path)
    return kvbm.Manager(block_size=BS, num_layers=LAYERS, outer_dim=2, inner_dim=HEADS * HEAD_DIM,
                        dtype_bytes=4, g1_blocks=g1, g2_blocks=g2, g3_blocks=g3, g2_policy=g2_policy,
                        g3_policy=g3_policy, **kw)


class Harness:
    """An engine plus the checks that watch it."""

    def __init__(self, model, manager, reference, **engine_kw):
        self.model, self.manager, self.reference = model, manager, reference
        self.recorded = {}                        # sequence hash -> KV bytes of the block
        self.recomputed = 0                       # blocks computed again, same bytes
        self.checked = {t: 0 for t in Tier}        # hit blocks verified at load, by source tier
        self.load_hits = {}                       # request id -> RequestInfo.hit_blocks (G1..G4) at load
        self.engine = Engine(model, manager, on_loaded=self._loaded, on_step=self._step, **engine_kw)
        self.kv = self.engine.kv

    def block_bytes(self, bid):
        return b"".join(self.manager.read_layer(Tier.G1, bid, l) for l in range(LAYERS))

    def _step(self, so):
        starts = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        starts.update(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        for rid, n in so.num_scheduled_tokens.items():
            req = self.kv.request(rid)
            table = req.block_table
            for k in range(starts[rid] // BS, (starts[rid] + n) // BS):
                h, b = req.block_hash(k), self.block_bytes(table[k])
                first = self.recorded.setdefault(h, b)
                assert first == b, f"{rid}: block {k} computed again with different KV bytes"
                if first is not b:
                    self.recomputed += 1

    def _loaded(self, r):
        req = self.kv.request(r.request_id)
        info = req.poll()
        assert info.ready
        self.load_hits[r.request_id] = info.hit_blocks
        n = info.matched_tokens
        _, kvs = self.model.forward(r.all_token_ids[:n]) if n else (None, None)
        table = req.block_table
        for k in range(n // BS):
            src, h = Tier(req.block_source(k)), req.block_hash(k)
            got = self.block_bytes(table[k])
            assert h in self.recorded, f"{r.request_id}: block {k} (from {src.name}) was never computed"
            assert got == self.recorded[h], f"{r.request_id}: block {k} onboarded from {src.name} differs"
            want = b"".join(torch.cat([kvs[l][0][k * BS:(k + 1) * BS].reshape(-1),
                                       kvs[l][1][k * BS:(k + 1) * BS].reshape(-1)]).numpy().tobytes()
                            for l in range(LAYERS))
            assert got == want, f"{r.request_id}: block {k} is not the plain forward pass's KV"
            self.checked[src] += 1

    def run(self, *requests):
        for r in requests:
            self.engine.add_request(r)
        self.engine.run()
        self.manager.flush()
        for r in requests:
            assert r.output_token_ids == self.reference(r.prompt_token_ids, r.max_tokens), r.request_id
        return requests

    def stats(self, tier):
        return self.manager.stats(tier)

    def close(self):
        self.engine.close()
        assert self.stats(Tier.G1)["active"] == 0, "a request still holds G1 blocks"
        self.engine = self.kv = None
        self.manager.close()


@pytest.fixture
def harness_factory(model, reference):
    made = []

    def make(manager, **kw):
        h = Harness(model, manager, reference, **kw)
        made.append(h)
        return h
    yield make
    for h in made:
        if h.engine is not None:
            h.close()


# ------------------------------------------------------------------ G1


def test_g1_prefix_hits(harness_factory):
    tok = Tokens(1)
    h = harness_factory(make_manager(g1=64))
    a = Request("a", tok(30), 6)
    h.run(a)
    assert a.local_hit_tokens == [0]

    # A shared prompt prefix: 20 tokens = 5 blocks found in G1, written.
    b = Request("b", a.prompt_token_ids[:20] + tok(7), 6)
    h.run(b)
    assert (b.local_hit_tokens, b.external_tokens) == ([20], [0])

    # The next turn of a conversation: a's prompt and answer. a's kvbm request
    # held 35 tokens (the last sampled one is never computed): 8 full blocks,
    # registered as decode filled them.
    c = Request("c", a.all_token_ids + tok(5), 4)
    h.run(c)
    assert c.local_hit_tokens == [32]

    # A different cache salt shares nothing.
    d = Request("d", a.prompt_token_ids, 3, cache_salt="tenant-2")
    h.run(d)
    assert d.local_hit_tokens == [0]
    assert h.stats(Tier.G1)["hit_blocks"] == 5 + 8
    assert h.recorded and not h.checked[Tier.G2] and not h.checked[Tier.G3]
    h.close()


def test_g1_blocks_another_request_is_writing(harness_factory):
    """Two requests admitted in one step share a prefix: kvbm registers the
    first one's blocks at prefill, before their KV exists. The second waits
    for them as external tokens (asynchronously) and reads them only once
    the first has committed."""
    tok = Tokens(2)
    h = harness_factory(make_manager(g1=64))
    shared = tok(16)
    e = Request("e", shared + tok(9), 5)
    f = Request("f", shared + tok(6), 5)
    h.run(e, f)
    assert (e.local_hit_tokens, e.external_tokens) == ([0], [0])
    assert (f.local_hit_tokens, f.external_tokens) == ([0], [16])
    assert h.load_hits["f"] == (4, 0, 0, 0)       # four G1 blocks, e's
    assert h.checked[Tier.G1] == 4
    assert h.stats(Tier.G1)["hit_blocks"] == 4
    h.close()


# ------------------------------------------------------------------ G2, G3


@pytest.mark.parametrize("layout", ["fully_contiguous", "layer_separate"])
def test_g2_g3_onboarding_after_eviction(harness_factory, tmp_path, layout):
    """G1 of 20 blocks, G2 of 24, G3 of 128, write-through to both. Request
    a (a 32-token prompt: blocks a0..a7) is pushed out of G1 and partly out
    of G2 by a filler; its prefix comes back from G2 and G3, later from G3
    only.

    What keeps the counts independent of copy timing: every filler needs
    all 20 G1 blocks, so no block of an earlier request stays in G1 (which
    of a request's blocks would stay cached depends on when its offload
    copies let go of them: they hold G1 references and drop them on kvbm's
    worker thread); a's blocks are all committed by one commit (its output
    fills no block), because G2 orders the blocks of different commits by
    when each commit's copies (G3 writes included) complete, not by use."""
    tok = Tokens(3)
    m = make_manager(tmp_path, g1=20, g2=24, g3=128, layout=layout)
    assert m.g3_error == "" and m.layout(Tier.G1)["kind"] == layout
    h = harness_factory(m)
    filler = lambda name: Request(name, tok(76), 5)   # 80 tokens: 20 blocks
    a = Request("a", tok(32), 4)
    h.run(a)                                   # a0..a7 in G1, G2, G3
    h.run(filler("f1"))                        # G1: all f1's. G2: 8 + 20 uses > 24: a0..a3 dropped

    c = Request("c", a.prompt_token_ids + tok(6), 5)
    h.run(c)
    assert (c.local_hit_tokens, c.external_tokens) == ([0], [32])
    assert h.load_hits["c"] == (0, 4, 4, 0)       # a0..a3 from G3, a4..a7 from G2
    assert (h.checked[Tier.G2], h.checked[Tier.G3]) == (4, 4)

    h.run(filler("f2"))                        # 2 x 20 uses: a (and c) leave G2 too
    h.run(filler("f3"))
    d = Request("d", a.prompt_token_ids[:24] + tok(6), 5)
    h.run(d)
    assert (d.local_hit_tokens, d.external_tokens) == ([0], [24])
    assert h.load_hits["d"] == (0, 0, 6, 0)
    assert (h.checked[Tier.G2], h.checked[Tier.G3]) == (4, 10)

    s2, s3 = h.stats(Tier.G2), h.stats(Tier.G3)
    assert (s2["hit_blocks"], s2["onboarded_blocks"]) == (4, 4)
    assert (s3["hit_blocks"], s3["onboarded_blocks"]) == (10, 10)
    assert s2["onboarded_bytes"] == 4 * m.block_bytes and s3["onboarded_bytes"] == 10 * m.block_bytes
    assert s3["checksum_failures"] == 0 and s3["read_errors"] == 0
    h.close()


def test_loading_requests_share_blocks(harness_factory, tmp_path):
    """x and y share a's prefix (in G2) and 8 more tokens S, and are admitted
    in one step. x onboards a's blocks and registers S's (its own until it
    commits); y waits for x, not only for the copies: once x has written S,
    y gets a's blocks and S's as hits. (Settling when the copies land, y's
    match would end at S, which it would then compute again.)"""
    tok = Tokens(4)
    h = harness_factory(make_manager(tmp_path, g1=24, g2=64, g3=0))
    a = Request("a", tok(28), 4)
    h.run(a)
    h.run(Request("f1", tok(48), 4))
    h.run(Request("f2", tok(48), 4))           # a is out of G1, still in G2
    shared = tok(8)
    x = Request("x", a.prompt_token_ids[:24] + shared + tok(5), 5)
    y = Request("y", a.prompt_token_ids[:24] + shared + tok(7), 5)
    h.run(x, y)
    assert (x.local_hit_tokens, x.external_tokens) == ([0], [24])
    assert (y.local_hit_tokens, y.external_tokens) == ([0], [32])
    assert h.load_hits["x"] == (0, 6, 0, 0)
    assert h.load_hits["y"] == (8, 0, 0, 0)       # x's onboarded blocks and S, once x committed them
    assert (x.failed_load_tokens, y.failed_load_tokens) == (0, 0)
    assert h.stats(Tier.G2)["onboarded_blocks"] == 6
    h.close()


def test_preemption_and_resume(harness_factory):
    """A G1 too small for every running request's decode: the scheduler
    preempts (frees) the last admitted request, which comes back through
    prefill and finds its committed blocks again in G1. G1 only, so no copy
    holds a block and every count follows from the engine's calls."""
    tok = Tokens(5)
    h = harness_factory(make_manager(g1=16))
    reqs = [Request(f"p{i}", tok(11), 14) for i in range(3)]
    h.run(*reqs)
    # Three requests of 5 blocks each (20 tokens) fill 15 of 16 blocks; the
    # 21st token: p0 takes the last free block, p1 finds none and p2 (last
    # admitted) is preempted. p1 evicts p2's tail block (released first);
    # p2 comes back with 21 tokens and finds its first 4 blocks in G1.
    assert h.engine.scheduler.num_preemptions == 1
    assert [(r.local_hit_tokens, r.external_tokens) for r in reqs] == \
        [([0], [0]), ([0], [0]), ([0, 16], [0, 0])]
    h.close()


def test_abort_while_loading(harness_factory, tmp_path):
    tok = Tokens(6)
    h = harness_factory(make_manager(tmp_path, g1=20, g2=0, g3=128))
    a = Request("a", tok(32), 4)
    h.run(a)
    for i in range(3):
        h.run(Request(f"f{i}", tok(32), 4))
    c = Request("c", a.prompt_token_ids + tok(3), 4)
    h.engine.add_request(c)
    h.engine.step()                            # admitted, loading from G3
    assert c.status.name == "WAITING_FOR_REMOTE_KVS"
    h.engine.scheduler.finish_requests(["c"])
    h.engine.run()                             # the free waits for the load's report
    assert "c" not in h.engine.scheduler.requests
    d = Request("d", a.prompt_token_ids + tok(2), 4)
    h.run(d)
    assert sum(h.load_hits["d"]) == 8
    h.close()


def test_owner_aborted_blocks_are_recomputed(harness_factory, tmp_path):
    """e and f share a's prefix (in G2) and 8 more tokens S. e, admitted
    first, onboards a's blocks and registers S's; f waits for e. e is
    aborted before it computes anything: S's blocks have no KV, f's load
    reports them as failed (get_block_ids_with_load_errors), the engine
    truncates f to a's blocks and f computes S itself."""
    tok = Tokens(7)
    h = harness_factory(make_manager(tmp_path, g1=24, g2=64))
    a = Request("a", tok(24), 3)
    h.run(a)
    h.run(Request("f1", tok(92), 4))           # 95 tokens: all 24 G1 blocks; a stays in G2
    shared = tok(8)
    e = Request("e", a.prompt_token_ids + shared + tok(3), 4)
    f = Request("f", a.prompt_token_ids + shared + tok(5), 4)
    h.engine.add_request(e)
    h.engine.add_request(f)
    h.engine.step()                            # both admitted, both loading
    assert (e.external_tokens, f.external_tokens) == ([24], [32])
    h.engine.scheduler.finish_requests(["e"])
    h.run()
    assert f.output_token_ids == h.reference(f.prompt_token_ids, f.max_tokens)
    assert h.load_hits["f"] == (6, 0, 0, 0)       # a's blocks (onboarded by e); S's failed
    assert (e.failed_load_tokens, f.failed_load_tokens) == (0, 8)
    g = Request("g", a.prompt_token_ids + shared + tok(2), 3)
    h.run(g)
    assert (g.local_hit_tokens, g.external_tokens) == ([32], [0])   # S as f wrote it
    h.close()


# ------------------------------------------------------------------ misuse


def _engine_parts(model, g1=32):
    m = make_manager(g1=g1)
    kv = KvbmCacheManager(m)
    sched = KvbmConnector(KVConnectorRole.SCHEDULER, kv)
    worker = KvbmConnector(KVConnectorRole.WORKER, kv)
    return m, kv, sched, worker


def _so(new=(), scheduled=None, finished=()):
    from tiny_engine import CachedRequestData, NewRequestData, SchedulerOutput
    scheduled = scheduled or {}
    return SchedulerOutput([NewRequestData(rid, [], ([],), c) for rid, c in new],
                           CachedRequestData([], [], []), scheduled, sum(scheduled.values()),
                           set(finished), set(), {})


def test_scheduler_side_misuse(model):
    m, kv, sched, worker = _engine_parts(model)
    r = Request("r", list(range(10)), 2)
    with pytest.raises(kvbm.NotFoundError, match="unknown request 'r'"):
        sched.get_num_new_matched_tokens(r, 0)
    with pytest.raises(kvbm.NotFoundError, match="'r'"):
        sched.update_state_after_alloc(r, KvbmBlocks(), 0)
    with pytest.raises(kvbm.NotFoundError, match="in get_computed_blocks, which must come first"):
        kv.allocate_slots(r, 10)
    with pytest.raises(TypeError):
        sched.get_num_new_matched_tokens(object(), 0)
    blocks, local = kv.get_computed_blocks(r)
    assert (blocks.get_block_ids(), local) == (([],), 0)
    with pytest.raises(kvbm.InvalidArgumentError, match="local G1 hit is 0 tokens") as ei:
        sched.get_num_new_matched_tokens(r, 4)
    assert (ei.value.status, ei.value.code) == ("KVBM_EINVAL", -1)
    assert sched.get_num_new_matched_tokens(r, 0) == (0, False)
    assert kv.allocate_slots(r, 10) is not None
    with pytest.raises(kvbm.InvalidArgumentError, match="not its kvbm block table"):
        sched.update_state_after_alloc(r, KvbmBlocks([31, 30, 29]), 0)
    with pytest.raises(kvbm.InvalidArgumentError, match="get_num_new_matched_tokens reported 0"):
        sched.update_state_after_alloc(r, kv.get_blocks("r"), 8)
    with pytest.raises(kvbm.InvalidArgumentError, match="num_external_tokens"):
        sched.update_state_after_alloc(r, kv.get_blocks("r"), -1)
    sched.update_state_after_alloc(r, kv.get_blocks("r"), 0)
    # Scheduling what was never admitted, or more tokens than allocated.
    with pytest.raises(kvbm.NotFoundError, match="unknown request 'ghost'"):
        sched.build_connector_meta(_so(new=[("ghost", 0)], scheduled={"ghost": 3}))
    with pytest.raises(kvbm.InvalidArgumentError, match="slots for 10"):
        sched.build_connector_meta(_so(new=[("r", 0)], scheduled={"r": 11}))
    with pytest.raises(kvbm.InvalidArgumentError, match="neither"):
        sched.build_connector_meta(_so(scheduled={"r": 1}))
    # Worker methods on the scheduler's connector, and the reverse.
    with pytest.raises(kvbm.StateError, match="worker-side method; this connector's role is SCHEDULER"):
        sched.start_load_kv(None)
    with pytest.raises(kvbm.StateError, match="scheduler-side method"):
        worker.request_finished(r, [])
    # request_finished: once per request; an id kvbm never saw is fine (vLLM
    # finishes requests aborted before scheduling).
    assert sched.request_finished(r, kv.get_block_ids("r")[0]) == (False, None)
    with pytest.raises(kvbm.StateError, match="finished already"):
        sched.request_finished(r, [])
    assert sched.request_finished(Request("never", [1], 1), []) == (False, None)
    with pytest.raises(TypeError):
        sched.request_finished(r, "not blocks")
    kv.free(r)
    with pytest.raises(kvbm.NotFoundError, match="free: request 'r'"):
        kv.free(r)
    with pytest.raises(TypeError):
        KvbmConnector("LEADER", kv)
    with pytest.raises(TypeError):
        KvbmConnector(KVConnectorRole.WORKER, m)
    sched.shutdown()
    with pytest.raises(kvbm.StateError, match="shut down"):
        sched.get_num_new_matched_tokens(r, 0)
    m.close()


def test_load_misuse_and_order(model, tmp_path):
    """A request with external tokens: its load is recorded once, and it
    cannot be scheduled before the worker reports the load finished."""
    m = make_manager(tmp_path, g1=12, g2=32)
    kv = KvbmCacheManager(m)
    sched = KvbmConnector(KVConnectorRole.SCHEDULER, kv)
    a = Request("a", list(range(100, 117)), 1)   # 4 full blocks
    kv.get_computed_blocks(a)
    kv.allocate_slots(a, 17)
    kv.commit("a", 17)
    m.flush()
    kv.free(a)
    filler = Request("filler", list(range(300, 347)), 1)  # 12 blocks: a leaves G1
    kv.get_computed_blocks(filler)
    kv.free(filler)
    b = Request("b", list(range(100, 113)) + [1, 2, 3], 1)
    _, local = kv.get_computed_blocks(b)
    ext, load_async = sched.get_num_new_matched_tokens(b, local)
    assert (local, ext, load_async) == (0, 12, True)
    assert sched.get_num_new_matched_tokens(b, local) == (12, True)  # side-effect free
    kv.allocate_slots(b, 0, num_new_computed_tokens=0, num_external_computed_tokens=12, delay_cache_blocks=True)
    sched.update_state_after_alloc(b, kv.get_blocks("b"), 12)
    with pytest.raises(kvbm.StateError, match="recorded already"):
        sched.update_state_after_alloc(b, kv.get_blocks("b"), 12)
    with pytest.raises(kvbm.StateError, match="still loading"):
        sched.build_connector_meta(_so(new=[("b", 12)], scheduled={"b": 4}))
    meta = sched.build_connector_meta(_so())
    assert [(l.request_id, l.local_tokens, l.expected_tokens, len(l.block_ids)) for l in meta.loads] == \
        [("b", 0, 12, 3)]
    assert pickle.loads(pickle.dumps(meta)) == meta     # plain data, as vLLM ships it to workers
    assert sched.build_connector_meta(_so()).loads == []  # reset by the call
    assert kv.usage == 4 / 12                           # b's four G1 blocks in use
    kv.free(b)
    assert kv.usage == 0
    m.close()


def test_worker_side_misuse(model):
    m, kv, sched, worker = _engine_parts(model)
    names = ["l0", "l1"]
    caches = g1_kv_caches(m, names, num_kv_heads=HEADS)
    meta = KvbmConnectorMetadata(step=0)
    with pytest.raises(kvbm.StateError, match="no connector metadata bound"):
        worker.start_load_kv(None)
    with pytest.raises(TypeError, match="KvbmConnectorMetadata"):
        worker.bind_connector_metadata({"loads": []})
    worker.bind_connector_metadata(meta)
    with pytest.raises(kvbm.StateError, match="register_kv_caches first"):
        worker.start_load_kv(None)
    # KV caches that are not kvbm's G1: a plain tensor, a copy, one layer twice.
    with pytest.raises(kvbm.InvalidArgumentError, match="not a view of kvbm's G1"):
        worker.register_kv_caches({"l0": torch.zeros(32, 2, BS, HEADS, HEAD_DIM), "l1": caches["l1"]})
    with pytest.raises(kvbm.InvalidArgumentError, match="not a view of kvbm's G1"):
        worker.register_kv_caches({"l0": caches["l0"].clone(), "l1": caches["l1"]})
    with pytest.raises(kvbm.InvalidArgumentError, match="another name views too"):
        worker.register_kv_caches({"l0": caches["l0"], "l1": caches["l0"]})
    with pytest.raises(kvbm.InvalidArgumentError, match="1 layers for a manager of 2"):
        worker.register_kv_caches({"l0": caches["l0"]})
    with pytest.raises(kvbm.InvalidArgumentError, match="not as \\[num_blocks"):
        worker.register_kv_caches({"l0": caches["l0"][1:], "l1": caches["l1"]})
    worker.register_kv_caches(caches)
    with pytest.raises(kvbm.StateError, match="registered already"):
        worker.register_kv_caches(caches)
    with pytest.raises(kvbm.StateError, match="start_load_kv has not run"):
        worker.wait_for_layer_load("l0")
    worker.start_load_kv(None)
    with pytest.raises(kvbm.StateError, match="called twice"):
        worker.start_load_kv(None)
    with pytest.raises(kvbm.NotFoundError, match="unknown layer 'l9'"):
        worker.wait_for_layer_load("l9")
    worker.wait_for_layer_load("l0")
    with pytest.raises(kvbm.InvalidArgumentError, match="not its registered G1 view"):
        worker.save_kv_layer("l0", caches["l1"], None)
    worker.save_kv_layer("l0", caches["l0"], None)
    with pytest.raises(kvbm.StateError, match="saved twice"):
        worker.save_kv_layer("l0", caches["l0"], None)
    with pytest.raises(kvbm.StateError, match="still bound"):
        worker.bind_connector_metadata(meta)
    assert worker.get_finished(set()) == (None, None)
    assert worker.get_block_ids_with_load_errors() == set()
    worker.clear_connector_metadata()

    # A step that computes a request must save every layer before wait_for_save.
    r = Request("r", list(range(9)), 1)
    kv.get_computed_blocks(r)
    kv.allocate_slots(r, 9)
    step = sched.build_connector_meta(_so(new=[("r", 0)], scheduled={"r": 9}))
    worker.bind_connector_metadata(step)
    worker.start_load_kv(None)
    worker.save_kv_layer("l0", caches["l0"], None)
    with pytest.raises(kvbm.StateError, match=r"save_kv_layer was not called for \['l1'\]"):
        worker.wait_for_save()
    worker.save_kv_layer("l1", caches["l1"], None)
    worker.wait_for_save()                     # commits r: its 2 full blocks are registered, valid
    worker.clear_connector_metadata()
    kv.free(r)
    r2 = Request("r2", list(range(9)), 1)
    assert kv.get_computed_blocks(r2)[1] == 8
    kv.free(r2)

    with pytest.raises(kvbm.BusyError):
        m.close()                              # the G1 views are alive
    del caches
    worker.shutdown()
    m.close()


@pytest.mark.parametrize("layout", ["fully_contiguous", "layer_separate"])
def test_g1_views_are_zero_copy(model, layout):
    m = make_manager(g1=8, layout=layout)
    caches = g1_kv_caches(m, ["a", "b"], num_kv_heads=HEADS)
    assert caches["a"].shape == (8, 2, BS, HEADS, HEAD_DIM)
    caches["b"][3, 1, 2, 0, 5] = 42.0           # block 3, V, token 2, head 0, dim 5 of layer 1
    raw = m.read_layer(Tier.G1, 3, 1)
    floats = torch.frombuffer(bytearray(raw), dtype=torch.float32)
    assert floats[BS * HEADS * HEAD_DIM + 2 * HEADS * HEAD_DIM + 5] == 42.0
    with pytest.raises(kvbm.InvalidArgumentError, match="num_kv_heads 3"):
        g1_kv_caches(m, ["a", "b"], num_kv_heads=3)
    with pytest.raises(kvbm.InvalidArgumentError, match="1 layer names"):
        g1_kv_caches(m, ["a"], num_kv_heads=HEADS)
    with pytest.raises(kvbm.InvalidArgumentError, match="2-byte|4-byte"):
        g1_kv_caches(m, ["a", "b"], num_kv_heads=HEADS, dtype=torch.float16)
    del caches, floats
    m.close()
