# SPDX-License-Identifier: Apache-2.0
"""kvbm.vllm with a Mamba hybrid's KV cache groups (issue 20;
docs/areas/engines.md, "Mamba groups in kvbm.vllm").

A small Mamba2 hybrid as vLLM builds it: one full-attention group and one
Mamba group of 2 layers each, block size 4 tokens. vLLM keeps each Mamba
layer's state per block id: a (conv, temporal) pair of tensors
[num_blocks, *shape] (MambaStateShapeCalculator.mamba2_state_shape with
tp 1, intermediate 64, n_groups 1, 4 heads of 16, state 8, conv kernel 4:
conv (3, 80) in the "SD" layout, temporal (4, 16, 8)), both views of one
byte page per block (newer runners hand the layer the page view
[num_blocks, 1, 1, page_bytes] itself). CPU tensors stand in for the GPU.

What the tests hold kvbm.vllm to:
- a store of both groups' blocks and a load into other block ids give
  byte-identical attention blocks and states, nothing else written
  (KvbmOffloadingSpec's handler; the page view and the state list alike);
- KvbmConnectorV1: engine A computes a prompt in two steps, B (another
  scheduler and worker, its own G2, the same G4) gets the hit every group
  can serve: shortened to the last block boundary where A saved a state
  (vLLM's Mamba prefix-caching rule), and its load lands byte-identical;
- layout mismatches are refused with a message: state tensors that are not
  the MambaSpec's (at the handler), a MambaSpec without shapes (at the
  spec), and a stored state of another layout (the load fails, the
  engine's blocks untouched, the blocks reported as load errors).
"""
import pickle
from types import SimpleNamespace as NS

import pytest
import torch

import kvbm
from kvbm import vllm as kv
from tiny_engine_tp import EngineRequest, vllm_config

BS, HEADS, HD, LAYERS, NB = 4, 2, 8, 2, 32
CONV, TEMPORAL = (3, 80), (4, 16, 8)     # mamba2_state_shape, see above
DTYPES = (torch.bfloat16, torch.float32)  # mamba_cache_dtype, mamba_ssm_cache_dtype
STATE = 3 * 80 * 2 + 4 * 16 * 8 * 4       # one layer's state bytes (2,528)
PAGE = STATE + 32                         # one page size for every group (vLLM pads them)


class FullAttentionSpec:  # vLLM's classes, known by name
    pass


class MambaSpec:
    def __init__(self, shapes=(CONV, TEMPORAL), dtypes=DTYPES, mode="all"):
        self.shapes, self.dtypes, self.mamba_cache_mode = shapes, dtypes, mode
        self.block_size = BS


class Blocks:
    def __init__(self, *tables):
        self.tables = tables

    def get_block_ids(self):
        return tuple(list(t) for t in self.tables)


def kv_cache_config(mamba=None):
    names = [[f"attn.{i}" for i in range(LAYERS)], [f"mamba.{i}" for i in range(LAYERS)]]
    specs = [FullAttentionSpec(), mamba or MambaSpec()]
    return NS(kv_cache_groups=[NS(layer_names=n, kv_cache_spec=s) for n, s in zip(names, specs)])


def extra(**kw):
    d = dict(kvbm_g2_blocks=32, kvbm_model_fingerprint="m", kvbm_num_kv_heads=HEADS,
             kvbm_head_dim=HD, kvbm_num_layers=LAYERS, kvbm_dtype="float32", kvbm_tp_size=1,
             kvbm_tp_rank=0)
    d.update(kw)
    return d


ATTN = 2 * BS * HEADS * HD * 4           # an attention block's K and V bytes in a page


class Engine:
    """The engine's KV as vLLM lays out a hybrid with Mamba: layer i of
    each group shares one byte buffer of a page per block (a block id
    belongs to one group at a time); the attention view is [2, NB, BS,
    heads, hd] with the pages' (num_blocks, 2, ...) memory layout
    (update_hybrid_attention_mamba_layout), the Mamba view the (conv,
    temporal) states at the start of each page. Layer 0's Mamba state goes
    to kvbm as the page view, layer 1's as the state list."""

    def __init__(self, seed, shapes=(CONV, TEMPORAL), dtypes=DTYPES):
        g = torch.Generator().manual_seed(seed)
        self.raw = [torch.randint(-128, 128, (NB, PAGE), generator=g, dtype=torch.int8)
                    for _ in range(LAYERS)]
        self.attn = [torch.as_strided(r.view(torch.float32), (2, NB, BS, HEADS, HD),
                                      (ATTN // 8, PAGE // 4, HEADS * HD, HD, 1))
                     for r in self.raw]
        self.states = []
        for r in self.raw:
            off, views = 0, []
            for shape, dt in zip(shapes, dtypes):
                n = torch.tensor([], dtype=dt).element_size() * int(torch.tensor(shape).prod())
                views.append(r[:, off:off + n].view(dt).view(NB, *shape))
                off += n
            self.states.append(views)

    def caches(self):
        d = {f"attn.{i}": t for i, t in enumerate(self.attn)}
        d["mamba.0"] = self.raw[0].view(NB, 1, 1, PAGE)    # the newer runner's page view
        d["mamba.1"] = list(self.states[1])                # the older runner's (conv, temporal)
        return d

    def zero(self):
        for r in self.raw:
            r.zero_()

    def pages(self):
        return [r.clone() for r in self.raw]


def landed(eng, before, moves):
    """Every layer's pages: block dst holds src's first n bytes of
    `before` (moves: [(src, dst, n)]) and zeros after them; every other
    page is zero."""
    for i in range(LAYERS):
        want = torch.zeros_like(before[i])
        for src, dst, n in moves:
            want[dst, :n] = before[i][src, :n]
        assert torch.equal(eng.raw[i], want), i


def run(handler, job_id, src, dst):
    assert handler.transfer_async(job_id, (src, dst)) is True
    handler.wait({job_id})
    (res,) = handler.get_finished()
    return res.success


def test_spec_maps_mamba_spec_to_kvbm_group_layout():
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra()), kv_cache_config())
    assert spec.group_kinds == [("full", None), ("mamba", None)]
    st = spec.states[1]
    assert spec.states[0] is None
    assert st.layer_bytes == STATE and st.block_bytes == LAYERS * STATE
    # kvbm_group_layout: every layer's conv state, then every layer's SSM state
    assert st.group_layout() == (LAYERS * 3 * 80 * 2, LAYERS * 4 * 16 * 8 * 4)
    # the C manager takes that layout for the same groups (conv + ssm = block <= slot)
    with kvbm.Manager(block_size=BS, g1_blocks=16, inner_dim=320, groups="full,mamba",
                      group_layouts=[None, st.group_layout()]) as m:
        assert m.group_bytes(1) == LAYERS * STATE <= m.block_bytes
    assert kv.KvbmOffloadingSpec(vllm_config(BS, extra()), kv_cache_config(
        MambaSpec(mode="align"))).group_kinds[1] == ("mamba-align", None)


def test_store_and_load_states_byte_identical():
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra()), kv_cache_config())
    mgr = spec.get_manager()
    eng = Engine(0)
    handler = spec.get_worker(eng.caches())        # the newest vLLM's call: one worker
    before = eng.pages()
    hashes = [bytes([i]) * 32 for i in range(1, 5)]
    keys = [kv.group_key(h, 0) for h in hashes] + [kv.group_key(hashes[1], 1),
                                                   kv.group_key(hashes[3], 1)]
    out = mgr.prepare_store(keys)
    assert len(out.store_spec.keys) == 6
    src = kv.GPULoadStoreSpec([1, 2, 3, 4, 9, 11], group_sizes=[4, 2], block_indices=[0, 1])
    with pytest.raises(kvbm.InvalidArgumentError, match="submit_store reads the GPU"):
        handler.submit_store(1, out.store_spec, src)
    assert handler.submit_store(1, src, out.store_spec) is True     # base.py's OffloadingWorker
    handler.wait({1})
    assert [r.success for r in handler.get_finished()] == [True]
    mgr.complete_store(keys)
    per_block = LAYERS * 2 * BS * HEADS * HD * 4
    assert handler.stats["bytes_stored"] == 4 * per_block + 2 * LAYERS * STATE

    eng.zero()
    want = [kv.group_key(h, 0) for h in hashes[:2]] + [kv.group_key(hashes[1], 1)]
    load = mgr.prepare_load(want)
    assert handler.submit_load(2, load, kv.GPULoadStoreSpec([20, 21, 25], group_sizes=[2, 1],
                                                            block_indices=[0, 1]))
    handler.wait({2})
    assert [r.success for r in handler.get_finished()] == [True]
    mgr.complete_load(want)
    # attention blocks 1, 2 into 20, 21; the state of block 9 into 25: byte for byte
    landed(eng, before, [(1, 20, ATTN), (2, 21, ATTN), (9, 25, STATE)])
    handler.close()
    mgr.close()


def test_states_through_g3(tmp_path):
    """G2 of 2 slots: the first store's blocks are pushed out to G3 (a
    framed value per block) and loaded from there, verified, byte-identical."""
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra(
        kvbm_g2_blocks=2, kvbm_g3_blocks=16, kvbm_g3_url=f"file://{tmp_path}/g3")),
        kv_cache_config())
    mgr = spec.get_manager()
    eng = Engine(4)
    handler = spec.get_worker(eng.caches())
    before = eng.pages()
    h = [bytes([i]) * 32 for i in range(1, 4)]
    first = [kv.group_key(h[0], 0), kv.group_key(h[0], 1)]
    out = mgr.prepare_store(first)
    assert run(handler, 1, kv.GPULoadStoreSpec([3, 8], group_sizes=[1, 1], block_indices=[0, 0]),
               out.store_spec)
    mgr.complete_store(first)
    second = [kv.group_key(h[1], 0), kv.group_key(h[2], 0)]
    out = mgr.prepare_store(second)                     # G2 full: the first two go
    assert len(out.block_hashes_evicted) == 2
    assert run(handler, 2, kv.GPULoadStoreSpec([4, 5], group_sizes=[2, 0], block_indices=[1, 0]),
               out.store_spec)
    mgr.complete_store(second)
    eng.zero()
    load = mgr.prepare_load(first)
    assert load.tiers == [kv.G3, kv.G3]
    assert run(handler, 3, load, kv.GPULoadStoreSpec([20, 27], group_sizes=[1, 1],
                                                     block_indices=[0, 0]))
    landed(eng, before, [(3, 20, ATTN), (8, 27, STATE)])
    handler.close()
    mgr.close()


def test_a_model_of_mamba_layers_only():
    """One Mamba group (no attention): the group keys and states alone."""
    cfg = NS(kv_cache_groups=[NS(layer_names=[f"mamba.{i}" for i in range(LAYERS)],
                                 kv_cache_spec=MambaSpec())])
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra()), cfg)
    assert spec.group_kinds == [("mamba", None)] and spec.states[0].block_bytes == LAYERS * STATE
    mgr = spec.get_manager()
    eng = Engine(5)
    caches = {n: v for n, v in eng.caches().items() if n.startswith("mamba")}
    handler = spec.get_worker(caches)
    before = eng.pages()
    key = [kv.group_key(b"\x07" * 32, 0)]
    out = mgr.prepare_store(key)
    assert run(handler, 1, kv.GPULoadStoreSpec([6], group_sizes=[1], block_indices=[0]),
               out.store_spec)
    mgr.complete_store(key)
    eng.zero()
    assert run(handler, 2, mgr.prepare_load(key),
               kv.GPULoadStoreSpec([30], group_sizes=[1], block_indices=[0]))
    landed(eng, before, [(6, 30, STATE)])
    handler.close()
    mgr.close()


def test_state_tensors_that_are_not_the_spec_are_refused():
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra()), kv_cache_config())
    eng = Engine(0)
    bad = eng.caches()
    bad["mamba.1"] = [eng.states[1][0], eng.states[1][1][:, :2]]      # 2 heads, not 4
    with pytest.raises(kv.LayoutError, match=r"Mamba layer 'mamba.1' holds .*MambaSpec wants"):
        list(spec.get_handlers(bad))
    bad["mamba.1"] = [eng.states[1][0].float(), eng.states[1][1]]     # conv in float32
    with pytest.raises(kv.LayoutError, match="bfloat16"):
        list(spec.get_handlers(bad))
    bad["mamba.1"] = eng.states[1][0]                                  # one state of two
    with pytest.raises(kv.LayoutError, match="mamba.1"):
        list(spec.get_handlers(bad))
    nospec = type("MambaSpec", (), {"mamba_cache_mode": "all"})()  # a MambaSpec without shapes
    with pytest.raises(kv.LayoutError, match="no shapes/dtypes"):
        kv.KvbmOffloadingSpec(vllm_config(BS, extra()), kv_cache_config(nospec))


# ---------------------------------------------------------------- KvbmConnectorV1


def new(rid, tables, computed, n):
    return NS(scheduled_new_reqs=[NS(req_id=rid, block_ids=tuple(tables),
                                     num_computed_tokens=computed)],
              scheduled_cached_reqs=None, num_scheduled_tokens={rid: n})


def cached(rid, computed, n):
    return NS(scheduled_new_reqs=[], scheduled_cached_reqs=NS(
        req_ids=[rid], new_block_ids=[None], num_computed_tokens=[computed]),
        num_scheduled_tokens={rid: n})


EMPTY = NS(scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={})


class Pair:
    """One engine: a scheduler and a worker connector, driven as vLLM does."""

    def __init__(self, g4, seed, mamba=None, **state):
        cfg, conf = kv_cache_config(mamba), vllm_config(BS, extra(kvbm_g4_url=g4))
        self.sched = kv.KvbmConnectorV1(conf, kv.KVConnectorRole.SCHEDULER, cfg)
        self.worker = kv.KvbmConnectorV1(conf, kv.KVConnectorRole.WORKER, cfg)
        self.eng = Engine(seed, **state)
        self.worker.register_kv_caches(self.eng.caches())

    def step(self, so, finished=()):
        meta = pickle.loads(pickle.dumps(self.sched.build_connector_meta(so)))
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        w.wait_for_save()
        w.handler.wait(set(w.handler._jobs))
        sending, recving = w.get_finished(set(finished))
        errors = w.get_block_ids_with_load_errors()
        self.sched.update_connector_output(NS(finished_sending=sending, finished_recving=recving,
                                              kv_connector_worker_meta=w.build_connector_worker_meta()))
        w.clear_connector_metadata()
        return meta, sending, recving, errors

    def finish(self, req):
        assert self.sched.request_finished(req, None) == (True, None)
        _, sending, _, _ = self.step(EMPTY, finished={req.request_id})
        if not sending:
            _, sending, _, _ = self.step(EMPTY)
        assert sending == {req.request_id}

    def close(self):
        self.worker.shutdown()
        self.sched.shutdown()


def compute_a(g4):
    """Engine A computes a 17-token prompt in two steps, 8 then 9 tokens:
    the first ends on a block boundary (the Mamba state after 8 tokens,
    block 1, is stored), the second does not (the state after 16 tokens was
    freed by vLLM at the next schedule: not stored)."""
    a = Pair(g4, seed=1)
    s = a.sched
    req = EngineRequest("a", list(range(17)), BS)
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    ta = ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])            # "all" mode: a state block per block
    s.update_state_after_alloc(req, Blocks(*ta), 0)
    meta, _, _, _ = a.step(new("a", ta, 0, 8))
    (job,) = meta.store_jobs.values()
    assert job.src_spec.group_sizes == [2, 1] and job.src_spec.block_ids == [1, 2, 7]
    meta, _, _, _ = a.step(cached("a", 8, 9))
    (job,) = meta.store_jobs.values()
    assert job.src_spec.group_sizes == [2, 0] and job.src_spec.block_ids == [3, 4]
    a.finish(req)
    return a


def test_connector_hit_shortened_to_saved_state_and_loaded_byte_identical(tmp_path):
    g4 = f"file://{tmp_path}/g4"
    a = compute_a(g4)
    pages_a = a.eng.pages()
    a.close()

    b = Pair(g4, seed=2)            # another engine: its own G2, nothing of A's in memory
    b.eng.zero()
    s = b.sched
    req = EngineRequest("b", list(range(17)), BS)
    # full attention holds 16 tokens, but a Mamba hit needs the state at its
    # last block: saved after 8 tokens only
    assert s.get_num_new_matched_tokens(req, 0) == (8, True)
    tb = ([11, 12, 13, 14, 15], [0, 17, 18, 19, 20])  # vLLM's null block before the state
    s.update_state_after_alloc(req, Blocks(*tb), 8)
    meta, _, recving, errors = b.step(EMPTY)
    (job,) = meta.load_jobs.values()
    assert job.dst_spec.group_sizes == [2, 1] and job.dst_spec.block_ids == [11, 12, 17]
    assert recving == {"b"} and errors == set()
    assert b.worker.handler.stats["bytes_loaded"] == 2 * LAYERS * 2 * BS * HEADS * HD * 4 + \
        LAYERS * STATE
    # A's attention blocks 1, 2 and its state after 8 tokens (block 7), nothing else
    landed(b.eng, pages_a, [(1, 11, ATTN), (2, 12, ATTN), (7, 17, STATE)])
    assert s.manager.stats["hit_blocks"][kv.G4] == 3
    # a prompt that diverges after the first block: no state at block 0 -> no hit
    other = EngineRequest("c", list(range(4)) + [99] * 13, BS)
    assert s.get_num_new_matched_tokens(other, 0) == (0, False)
    b.close()


def test_connector_refuses_a_state_of_another_layout(tmp_path):
    g4 = f"file://{tmp_path}/g4"
    compute_a(g4).close()
    # same model fingerprint and attention layout, another SSM state size
    temporal = (4, 16, 4)
    c = Pair(g4, seed=3, mamba=MambaSpec(shapes=(CONV, temporal)), shapes=(CONV, temporal))
    before = c.eng.pages()
    req = EngineRequest("c", list(range(17)), BS)
    assert c.sched.get_num_new_matched_tokens(req, 0) == (8, True)   # G4 holds the value...
    c.sched.update_state_after_alloc(req, Blocks([11, 12, 13, 14, 15], [0, 17, 18, 19, 20]), 8)
    _, _, recving, errors = c.step(EMPTY)
    assert recving == {"c"} and errors == {11, 12, 17}               # ...which is refused
    err = c.worker.handler.last_error
    assert isinstance(err, kv.LayoutError) and "state layout" in str(err)
    for x, y in zip(c.eng.pages(), before):   # the engine's pages untouched
        assert torch.equal(x, y)
    c.close()
