# SPDX-License-Identifier: Apache-2.0
"""KvbmConnectorV1 with a hybrid model's KV cache groups (issue 20;
docs/areas/engines.md, "Hybrid models in vLLM's offloading").

vLLM hands a connector one block table per KV cache group (KVCacheBlocks.
get_block_ids(), SchedulerOutput's block_ids tuples) and the request's
block hashes once for all groups. What the tests hold the connector to:

- a request of two attention groups (full + sliding window of 8 tokens,
  block size 4) stores every full block of the full group and the blocks
  the window group still holds after the step; a later request with the
  same prompt gets the hit every group can serve, and its load puts each
  block's bytes into its own group's layers and GPU blocks, the window
  group only the window's blocks, nothing anywhere else;
- the hit follows vLLM's rule: a prefix whose window blocks were never
  stored is no hit even though the full group holds every block;
- hostile group layouts (a table count that is not the config's, null
  blocks where a load must write, a MambaSpec without its state shapes) are refused with messages;
- kvbm.connector's G1-owning cache manager refuses a Manager of several
  groups, naming why;
- kvbm's own events of a hybrid offloading manager name each block by its
  hash and group_idx (and spec kind), not by the OffloadKey's BLAKE3.
"""
import pickle
from types import SimpleNamespace as NS

import pytest
import torch

import kvbm
from kvbm import vllm as kv
from tiny_engine_tp import EngineRequest, vllm_config

BS, HEADS, HD, LAYERS, NB = 4, 2, 8, 2, 32


class FullAttentionSpec:  # vLLM's classes, known by name
    pass


class SlidingWindowSpec:
    def __init__(self, sliding_window):
        self.sliding_window = sliding_window


class MambaSpec:
    mamba_cache_mode = "all"


class Blocks:
    """vLLM's KVCacheBlocks: get_block_ids() -> one list per group."""

    def __init__(self, *tables):
        self.tables = tables

    def get_block_ids(self):
        return tuple(list(t) for t in self.tables)


def kv_cache_config(*specs):
    names = [[f"g{g}.layer{i}" for i in range(LAYERS)] for g in range(len(specs))]
    return NS(kv_cache_groups=[NS(layer_names=n, kv_cache_spec=s) for n, s in zip(names, specs)])


def config():
    return vllm_config(BS, dict(kvbm_g2_blocks=32, kvbm_model_fingerprint="m",
                                kvbm_num_kv_heads=HEADS, kvbm_head_dim=HD,
                                kvbm_num_layers=LAYERS, kvbm_dtype="float32", kvbm_tp_size=1,
                                kvbm_tp_rank=0))


def caches(cfg):
    g = torch.Generator().manual_seed(1)
    return {n: torch.randn(2, NB, BS, HEADS, HD, generator=g)
            for grp in cfg.kv_cache_groups for n in grp.layer_names}


def new(rid, tables, computed, n):
    return NS(scheduled_new_reqs=[NS(req_id=rid, block_ids=tuple(tables),
                                     num_computed_tokens=computed)],
              scheduled_cached_reqs=None, num_scheduled_tokens={rid: n})


EMPTY = NS(scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={})


class Pair:
    """A scheduler and a worker connector driven step by step as vLLM does."""

    def __init__(self, cfg):
        self.sched = kv.KvbmConnectorV1(config(), kv.KVConnectorRole.SCHEDULER, cfg)
        self.worker = kv.KvbmConnectorV1(config(), kv.KVConnectorRole.WORKER, cfg)
        self.gpu = caches(cfg)
        self.worker.register_kv_caches(self.gpu)

    def step(self, so, finished=()):
        meta = pickle.loads(pickle.dumps(self.sched.build_connector_meta(so)))  # plain data
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        w.wait_for_save()
        w.handler.wait(set(w.handler._jobs))
        sending, recving = w.get_finished(set(finished))
        errors = w.get_block_ids_with_load_errors()
        wmeta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        self.sched.update_connector_output(NS(finished_sending=sending, finished_recving=recving,
                                              kv_connector_worker_meta=wmeta))
        return meta, sending, recving, errors

    def close(self):
        self.worker.shutdown()
        self.sched.shutdown()


def test_two_groups_stored_and_loaded_into_their_own_layers():
    cfg = kv_cache_config(FullAttentionSpec(), SlidingWindowSpec(8))
    p = Pair(cfg)
    s, gpu = p.sched, p.gpu
    assert s.num_groups == 2
    a = EngineRequest("a", list(range(17)), BS)                 # 4 full blocks + 1 token
    assert s.get_num_new_matched_tokens(a, 0) == (0, False)
    ta = ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    s.update_state_after_alloc(a, Blocks(*ta), 0)
    meta, _, _, _ = p.step(new("a", ta, 0, 17))
    (job,) = meta.store_jobs.values()
    # full: blocks 0..3; sw:8 after 17 tokens holds blocks 2, 3 (skipped 10 tokens)
    assert job.src_spec.group_sizes == [4, 2]
    assert job.src_spec.block_ids == [1, 2, 3, 4, 8, 9]
    assert s.request_finished(a, None) == (True, None)
    _, sending, _, _ = p.step(EMPTY, finished={"a"})
    if not sending:
        _, sending, _, _ = p.step(EMPTY)
    assert sending == {"a"}
    orig = {n: t.clone() for n, t in gpu.items()}

    # the same prompt again: every block of the full group, the window's 2 of the other
    b = EngineRequest("b", list(range(17)), BS)
    assert s.get_num_new_matched_tokens(b, 0) == (16, True)
    tb = ([11, 12, 13, 14, 15], [0, 0, 18, 19, 20])  # vLLM's null block where sw skips
    s.update_state_after_alloc(b, Blocks(*tb), 16)
    for t in gpu.values():
        t[:, 11:21] = 0
    before = p.worker.handler.stats["bytes_loaded"]
    _, _, recving, errors = p.step(EMPTY)
    assert recving == {"b"} and errors == set()
    per_block = LAYERS * 2 * BS * HEADS * HD * 4
    assert p.worker.handler.stats["bytes_loaded"] - before == 6 * per_block
    for i in range(LAYERS):
        full, sw = gpu[f"g0.layer{i}"], gpu[f"g1.layer{i}"]
        for j in range(4):  # group 0's blocks, into group 0's layers only
            assert torch.equal(full[:, 11 + j], orig[f"g0.layer{i}"][:, 1 + j])
            assert not sw[:, 11 + j].any()
        for j in range(2):  # group 1's window blocks (from GPU 8, 9), group 1's layers only
            assert torch.equal(sw[:, 18 + j], orig[f"g1.layer{i}"][:, 8 + j])
            assert not full[:, 18 + j].any()
        assert not full[:, 15:18].any() and not sw[:, 15:18].any() and not sw[:, 20].any()
    # the events name the blocks by their group's key (vLLM's OffloadKey)
    stored = [h for e in s.take_events() if not e.removed for h in e.block_hashes]
    hashes = a.block_hashes[:4]
    assert set(stored) == ({kv.group_key(h, 0) for h in hashes}
                           | {kv.group_key(h, 1) for h in hashes[2:]})

    # vLLM's rule, not the full group's prefix: 13 tokens (3 blocks) need sw
    # blocks 1, 2 for a hit of 3, 0, 1 for 2, 0 for 1: none was stored
    d = EngineRequest("d", list(range(13)), BS)
    assert s.get_num_new_matched_tokens(d, 0) == (0, False)
    p.close()


def test_hostile_group_layouts():
    cfg = kv_cache_config(FullAttentionSpec(), SlidingWindowSpec(8))
    p = Pair(cfg)
    s = p.sched
    a = EngineRequest("a", list(range(17)), BS)
    with pytest.raises(kvbm.InvalidArgumentError, match="expected 2 lists"):
        s.update_state_after_alloc(a, Blocks([1, 2, 3, 4, 5]), 0)   # one table for 2 groups
    with pytest.raises(kvbm.InvalidArgumentError, match="expected 2 lists"):
        s.update_state_after_alloc(a, [1, 2, 3, 4, 5], 0)           # flat ids
    ta = ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    s.update_state_after_alloc(a, Blocks(*ta), 0)
    with pytest.raises(kvbm.InvalidArgumentError, match="expected 2 lists"):
        s.build_connector_meta(new("a", ta + ([1],), 0, 17))        # three tables
    p.step(new("a", ta, 0, 17))
    s.request_finished(a, None)
    p.step(EMPTY, finished={"a"})
    p.step(EMPTY)
    b = EngineRequest("b", list(range(17)), BS)
    assert s.get_num_new_matched_tokens(b, 0) == (16, True)
    with pytest.raises(kvbm.InvalidArgumentError, match="null blocks"):
        s.update_state_after_alloc(b, Blocks([11, 12, 13, 14, 15], [0, 0, 0, 19, 20]), 16)
    p.close()
    with pytest.raises(kv.LayoutError, match="MambaSpec has no shapes/dtypes"):
        kv.KvbmConnectorV1(config(), kv.KVConnectorRole.SCHEDULER,
                           kv_cache_config(FullAttentionSpec(), MambaSpec()))


def test_one_group_config_keeps_plain_hashes():
    cfg = kv_cache_config(FullAttentionSpec())
    p = Pair(cfg)
    assert p.sched.num_groups == 1
    a = EngineRequest("a", list(range(9)), BS)
    p.sched.update_state_after_alloc(a, Blocks([1, 2, 3]), 0)
    meta, _, _, _ = p.step(new("a", ([1, 2, 3],), 0, 9))
    (job,) = meta.store_jobs.values()
    assert job.src_spec.block_ids == [1, 2] and job.src_spec.group_sizes is None
    assert [e.block_hashes for e in p.sched.take_events()] == []  # not complete yet
    p.close()


def test_g1_owning_cache_manager_takes_groups(tmp_path):
    """KvbmCacheManager serves a Manager with groups (its tests:
    test_cache_manager_groups.py), and so does its KvbmConnector
    (test_connector_groups.py)."""
    from kvbm.connector import KvbmCacheManager, KvbmConnector, KVConnectorRole
    with kvbm.Manager(block_size=4, g1_blocks=16, groups="full,sw:8") as m:
        cm = KvbmCacheManager(m)
        assert cm.num_groups == 2
        assert KvbmConnector(KVConnectorRole.SCHEDULER, cm).role == KVConnectorRole.SCHEDULER
    with kvbm.Manager(block_size=4, g1_blocks=16) as m:  # one group: as before
        assert KvbmCacheManager(m).block_size == 4


def test_kvbm_events_name_hash_and_group(tmp_path):
    """kvbm's own events of a hybrid offloading manager carry each block's
    hash (what a one-group deployment publishes for it, not the OffloadKey's
    BLAKE3) and its group_idx and spec, as vLLM's events do."""
    import time
    import uuid
    ep = f"ipc://{tmp_path}/ev-{uuid.uuid4().hex[:8]}"
    lay = kv.KvLayout(model_fingerprint="m", dtype="float32", num_kv_heads=HEADS, head_dim=HD,
                      block_size=BS, num_layers=LAYERS, tp_rank=0, tp_size=1)
    mgr = kv.KvbmOffloadingManager(lay, g2_blocks=3, events_endpoint=ep,
                                   events_replay_endpoint=ep + "-replay",
                                   groups=[("full", None), ("sw", 8)])
    sub = kvbm.Subscriber(ep, replay_endpoint=ep + "-replay", start_seq=0)
    try:
        hashes = [bytes([i]) * 32 for i in (1, 2, 3)]       # vLLM's 32-byte BlockHash
        keys = [kv.group_key(h, 0) for h in hashes[:2]] + [kv.group_key(hashes[1], 1)]
        mgr.prepare_store(keys)
        mgr.complete_store(keys)
        mgr.prepare_store([kv.group_key(hashes[2], 1)])     # G2 of 3: evicts the oldest
        mgr.complete_store([kv.group_key(hashes[2], 1)])
        mgr.flush_events(10)
        got, deadline = [], time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            batch = sub.recv(1.0)
            if batch is not None:
                got += batch.events
        plain = [kv.block_key(h) for h in hashes]
        stored = [(e["group_idx"], e["block_hashes"], e.get("kv_cache_spec_kind"),
                   e.get("kv_cache_spec_sliding_window"))
                  for e in got if e["type"] == "BlockStored"]
        assert stored == [(0, plain[:2], "full_attention", None),
                          (1, [plain[1]], "sliding_window", 8),
                          (1, [plain[2]], "sliding_window", 8)]
        removed = [(e["group_idx"], e["block_hashes"]) for e in got if e["type"] == "BlockRemoved"]
        assert removed == [(0, [plain[0]])]
    finally:
        sub.close()
        mgr.close()
