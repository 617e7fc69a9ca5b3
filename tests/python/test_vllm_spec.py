# SPDX-License-Identifier: Apache-2.0
"""kvbm.vllm in one process: the spec as vLLM's factory loads it, what the
scheduler sends the workers (pickled), the manager's policies, its events
against kvbm's own KV events, layouts that cannot be bridged, and hostile
calls to the handler (docs/areas/engines.md, "vLLM")."""

import importlib
import pickle
import time
import uuid

import pytest
import torch

import kvbm
from kvbm import vllm as kv
from tiny_engine_tp import ConnectorMetadata, TransferJob, vllm_config

BS, HEADS, HD, LAYERS = 4, 4, 8, 2


def layout(**kw):
    d = dict(model_fingerprint="m", dtype="float32", num_kv_heads=HEADS, head_dim=HD,
             block_size=BS, num_layers=LAYERS, tp_rank=0, tp_size=1)
    d.update(kw)
    return kv.KvLayout(**d)


def hashes(*ids):
    return [i.to_bytes(8, "little") for i in ids]


def caches(num_blocks=16, heads=HEADS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}": torch.randn(2, num_blocks, BS, heads, HD, generator=g)
            for i in range(LAYERS)}


def run(handler, job_id, src, dst):
    assert handler.transfer_async(job_id, (src, dst)) is True
    handler.wait({job_id})
    (res,) = handler.get_finished()
    assert res.job_id == job_id
    return res.success


def test_spec_loads_as_vllm_factory_does(tmp_path):
    cfg = vllm_config(BS, dict(spec_name="KvbmOffloadingSpec", spec_module_path="kvbm.vllm",
                               kvbm_g2_blocks=4, kvbm_model_fingerprint="m",
                               kvbm_num_kv_heads=HEADS, kvbm_head_dim=HD,
                               kvbm_num_layers=LAYERS, kvbm_dtype="float32", kvbm_tp_size=1))
    x = cfg.kv_transfer_config.kv_connector_extra_config
    cls = getattr(importlib.import_module(x["spec_module_path"]), x["spec_name"])
    assert issubclass(cls, kv.OffloadingSpec)
    spec = cls(cfg)
    mgr = spec.get_manager()
    assert isinstance(mgr, kv.OffloadingManager) and spec.get_manager() is mgr
    pairs = list(spec.get_handlers(caches()))
    assert [(s.medium(), d.medium()) for s, d, _ in pairs] == [("GPU", "KVBM"), ("KVBM", "GPU")]
    assert isinstance(pairs[0][2], kv.OffloadingHandler)
    pairs[0][2].close()
    mgr.close()
    with pytest.raises(kvbm.InvalidArgumentError, match="kvbm_g2_blocks"):
        cls(vllm_config(BS, {}))


def test_metadata_is_plain_data_that_pickles():
    mgr = kv.KvbmOffloadingManager(layout(), g2_blocks=4)
    out = mgr.prepare_store(hashes(1, 2))
    meta = ConnectorMetadata(load_jobs={}, store_jobs={
        7: TransferJob("r", kv.GPULoadStoreSpec([3, 4]), out.store_spec)})
    back = pickle.loads(pickle.dumps(meta))
    spec = back.store_jobs[7].dst_spec
    assert (spec.kind, spec.keys, spec.g2_slots, spec.g3_slots, spec.g4) == (
        "store", out.store_spec.keys, out.store_spec.g2_slots, [-1, -1], [False, False])
    assert list(back.store_jobs[7].src_spec.block_ids) == [3, 4]
    mgr.complete_store(hashes(1, 2))
    load = pickle.loads(pickle.dumps(mgr.prepare_load(hashes(1, 2))))
    assert (load.tiers, load.slots) == ([kv.G2, kv.G2], out.store_spec.g2_slots)


def test_g2_lru_pins_and_refusal():
    mgr = kv.KvbmOffloadingManager(layout(), g2_blocks=3)
    mgr.prepare_store(hashes(1, 2, 3))
    assert mgr.lookup(hashes(1)) == 0                  # loadable only once stored
    mgr.complete_store(hashes(1, 2, 3))
    assert mgr.lookup(hashes(1, 2, 3, 4)) == 3
    mgr.touch(hashes(1))                               # 2 is now the oldest
    out = mgr.prepare_store(hashes(4))
    assert out.block_hashes_evicted == hashes(2) and out.block_hashes_to_store == hashes(4)
    mgr.complete_store(hashes(4))
    assert mgr.lookup(hashes(1, 2)) == 1
    assert mgr.prepare_store(hashes(4)).block_hashes_to_store == []  # already there
    mgr.prepare_load(hashes(1, 3, 4))                   # all pinned: nothing evictable
    assert mgr.prepare_store(hashes(5)) is None and mgr.stats["store_refused"] == 1
    mgr.complete_load(hashes(1, 3, 4))
    assert mgr.prepare_store(hashes(5)) is not None
    with pytest.raises(kvbm.NotFoundError, match="not offloaded"):
        mgr.prepare_load(hashes(99))


def test_manager_state_stays_bounded(tmp_path):
    g4 = f"file://{tmp_path}/g4"
    mgr = kv.KvbmOffloadingManager(layout(), g2_blocks=4, g3_blocks=4, g4_url=g4,
                                   g4_index_entries=8, freq_entries=16)
    for i in range(200):                               # 50x the tiers' slots, all distinct
        hs = hashes(i)
        mgr.touch(hs)
        assert mgr.lookup(hs) == 0
        mgr.prepare_store(hs)
        mgr.complete_store(hs)
        assert mgr.lookup(hs) == 1
    assert len(mgr._hash_of) <= 4 + 4 + 8 and len(mgr._freq) == 16
    assert len(mgr._g4_known) == 8 and not mgr._g2.pins and not mgr._g4_pending
    assert mgr.lookup(hashes(199, 198)) == 2
    mgr.close()


def test_g3_frequency_admission(tmp_path):
    mgr = kv.KvbmOffloadingManager(layout(), g2_blocks=8, g3_blocks=8, g3_policy="frequency",
                                   freq_threshold=2)
    mgr.touch(hashes(2))                                # seen once before: 2nd sight at store
    out = mgr.prepare_store(hashes(1, 2))
    assert out.store_spec.g3_slots[0] == -1 and out.store_spec.g3_slots[1] >= 0
    with pytest.raises(kvbm.InvalidArgumentError, match="g3_policy"):
        kv.KvbmOffloadingManager(layout(), g2_blocks=1, g3_policy="lru")


def test_take_events_and_kvbm_events_describe_the_same_blocks(tmp_path):
    ep = f"ipc://{tmp_path}/ev-{uuid.uuid4().hex[:8]}"
    mgr = kv.KvbmOffloadingManager(layout(), g2_blocks=2, g3_blocks=4, events_endpoint=ep,
                                   events_replay_endpoint=ep + "-replay")
    sub = kvbm.Subscriber(ep, replay_endpoint=ep + "-replay", start_seq=0)
    try:
        mgr.prepare_store(hashes(1, 2))
        mgr.complete_store(hashes(1, 2))
        mgr.prepare_store(hashes(3))                    # evicts 1 from G2
        mgr.complete_store(hashes(3))
        mine = [(e.removed, e.medium, [kv.block_key(h) for h in e.block_hashes])
                for e in mgr.take_events()]
        assert list(mgr.take_events()) == []           # taken once
        assert (True, "CPU", [kv.block_key(hashes(1)[0])]) in mine
        mgr.flush_events(10)
        theirs, deadline = [], time.monotonic() + 30
        while len(theirs) < len(mine) and time.monotonic() < deadline:
            batch = sub.recv(1.0)
            if batch is not None:
                theirs += [(ev["type"] == "BlockRemoved", ev["medium"], ev["block_hashes"])
                           for ev in batch.events]
        assert theirs == mine
    finally:
        sub.close()
        mgr.close()


def test_layouts_that_cannot_be_bridged(tmp_path):
    with pytest.raises(kv.LayoutError) as e:
        layout(tp_size=3)
    assert e.value.field == "num_kv_heads" and e.value.status == "KVBM_EINVAL"
    with pytest.raises(kv.LayoutError, match="dtype"):
        layout(dtype="complex64")
    g4 = f"file://{tmp_path}/g4"
    h = kv.KvbmOffloadingHandler(caches(heads=2), layout(tp_rank=0, tp_size=2), g2_blocks=2,
                                 g4_url=g4)             # rank 0 writes the descriptor
    h.close()
    kv.KvbmOffloadingManager(layout(tp_size=4), g2_blocks=1, g4_url=g4).close()  # bridges
    for field, kw in (("model_fingerprint", dict(model_fingerprint="other")),
                      ("dtype", dict(dtype="float16")), ("head_dim", dict(head_dim=16)),
                      ("num_kv_heads", dict(num_kv_heads=8)), ("block_size", dict(block_size=8)),
                      ("num_layers", dict(num_layers=3))):
        with pytest.raises(kv.LayoutError) as e:
            kv.KvbmOffloadingManager(layout(**kw), g2_blocks=1, g4_url=g4)
        assert e.value.field == field and field in str(e.value)
    with pytest.raises(kv.LayoutError, match="model_fingerprint"):
        kv.KvbmOffloadingHandler(caches(), layout(model_fingerprint="x"), g2_blocks=1, g4_url=g4)


def test_hostile_handler_calls(tmp_path):
    with pytest.raises(kvbm.InvalidArgumentError, match="layer1"):
        bad = caches()
        bad["layer1"] = torch.zeros(2, 16, BS, HEADS, HD + 1)
        kv.KvbmOffloadingHandler(bad, layout(), g2_blocks=2)
    with pytest.raises(kvbm.InvalidArgumentError, match="float16"):
        kv.KvbmOffloadingHandler({k: v.half() for k, v in caches().items()}, layout(),
                                 g2_blocks=2)
    with pytest.raises(kvbm.InvalidArgumentError, match="rank 1 of 2"):
        kv.KvbmOffloadingHandler(caches(), layout(tp_rank=1, tp_size=2), g2_blocks=2)
    with pytest.raises(kvbm.InvalidArgumentError, match="num_layers"):
        kv.KvbmOffloadingHandler({"l0": caches()["layer0"]}, layout(), g2_blocks=2)

    h = kv.KvbmOffloadingHandler(caches(), layout(), g2_blocks=2)
    store = kv.KvbmLoadStoreSpec("store", [1, 2], g2_slots=[0, 1], g3_slots=[-1, -1],
                                 g4=[False, False])
    with pytest.raises(kvbm.RangeError, match="GPU block id 16"):
        h.transfer_async(1, (kv.GPULoadStoreSpec([0, 16]), store))
    with pytest.raises(kvbm.RangeError, match="GPU block id -1"):
        h.transfer_async(1, (kv.GPULoadStoreSpec([-1, 0]), store))
    with pytest.raises(kvbm.RangeError, match="G2 slot 2"):
        h.transfer_async(1, (kv.KvbmLoadStoreSpec("load", [1], tiers=[kv.G2], slots=[2]),
                             kv.GPULoadStoreSpec([0])))
    with pytest.raises(kvbm.InvalidArgumentError, match="1 GPU blocks for 2"):
        h.transfer_async(1, (kv.GPULoadStoreSpec([0]), store))
    with pytest.raises(kvbm.InvalidArgumentError, match="no transfer"):
        h.transfer_async(1, (store, kv.GPULoadStoreSpec([0, 1])))     # a store spec as a load
    with pytest.raises(kvbm.InvalidArgumentError, match="tier 2"):
        h.transfer_async(1, (kv.KvbmLoadStoreSpec("load", [1], tiers=[kv.G3], slots=[0]),
                             kv.GPULoadStoreSpec([0])))               # no G3 on this worker
    with pytest.raises(TypeError):
        h.transfer_async("1", (kv.GPULoadStoreSpec([0, 1]), store))
    assert h.get_finished() == []                       # nothing was queued
    h.close()


def test_loads_are_verified_before_a_byte_lands(tmp_path):
    kvc = caches()
    lay = layout()
    h = kv.KvbmOffloadingHandler(kvc, lay, g2_blocks=4, g3_blocks=4,
                                 g3_url=f"file://{tmp_path}/g3", g4_url=f"file://{tmp_path}/g4")
    keys = [kv.block_key(b) for b in hashes(1, 2)]
    store = kv.KvbmLoadStoreSpec("store", keys, g2_slots=[0, 1], g3_slots=[0, 1], g4=[True, True])
    assert run(h, 1, kv.GPULoadStoreSpec([1, 2]), store)
    before = {n: t.clone() for n, t in kvc.items()}

    # G3 and G4 round trips land exactly the stored bytes
    for job, tiers, slots in ((2, [kv.G3, kv.G3], [0, 1]), (3, [kv.G4, kv.G4], [-1, -1]),
                              (4, [kv.G2, kv.G4], [0, -1])):
        assert run(h, job, kv.KvbmLoadStoreSpec("load", keys, tiers=tiers, slots=slots),
                   kv.GPULoadStoreSpec([5, 6]))
        assert all(torch.equal(t[:, 5:7], t[:, 1:3]) for t in kvc.values())

    # G3 slot 1 holds block 1's value: its header names another block
    g3dir = tmp_path / "g3" / "rank0-of-1"
    (g3dir / f"{1:016x}").write_bytes((g3dir / f"{0:016x}").read_bytes())
    for t in kvc.values():
        t[:, 8:10] = 7.0
    assert not run(h, 5, kv.KvbmLoadStoreSpec("load", keys, tiers=[kv.G3, kv.G3], slots=[0, 1]),
                   kv.GPULoadStoreSpec([8, 9]))
    assert isinstance(h.last_error, kvbm.ChecksumError)
    assert all(bool((t[:, 8:10] == 7.0).all()) for t in kvc.values())   # nothing landed

    # a flipped byte in a G4 frame: BLAKE3 fails
    g4file = tmp_path / "g4" / "kvbm-vllm" / f"{kv.slice_key(keys[0], 2):016x}"
    raw = bytearray(g4file.read_bytes())
    raw[-1] ^= 1
    g4file.write_bytes(bytes(raw))
    assert not run(h, 6, kv.KvbmLoadStoreSpec("load", keys, tiers=[kv.G4, kv.G4],
                                               slots=[-1, -1]), kv.GPULoadStoreSpec([8, 9]))
    assert isinstance(h.last_error, kvbm.ChecksumError)
    # a missing G4 slice: a failed load too
    g4file.unlink()
    assert not run(h, 7, kv.KvbmLoadStoreSpec("load", keys[:1], tiers=[kv.G4], slots=[-1]),
                   kv.GPULoadStoreSpec([8]))
    assert isinstance(h.last_error, kvbm.NotFoundError)
    assert all(bool((t[:, 8:10] == 7.0).all()) for t in kvc.values())
    assert all(torch.equal(kvc[n][:, :5], before[n][:, :5]) for n in kvc)
    assert h.stats["failed"] == 3 and h.stats["rejected_slices"] == 2
    h.close()


def connector_config(tmp_path, **kw):
    x = dict(kvbm_g2_blocks=8, kvbm_model_fingerprint="m", kvbm_num_kv_heads=HEADS,
             kvbm_head_dim=HD, kvbm_num_layers=LAYERS, kvbm_dtype="float32", kvbm_tp_size=1,
             kvbm_tp_rank=0)
    x.update(kw)
    return vllm_config(BS, x)


def test_connector_v1_calls_and_misuse(tmp_path):
    from types import SimpleNamespace as NS
    from tiny_engine_tp import EngineRequest, KVCacheBlocks
    sched = kv.KvbmConnectorV1(connector_config(tmp_path), kv.KVConnectorRole.SCHEDULER)
    worker = kv.KvbmConnectorV1(connector_config(tmp_path), kv.KVConnectorRole.WORKER)
    assert isinstance(sched, kv.KVConnectorBase_V1)
    with pytest.raises(kvbm.StateError, match="worker-side"):
        sched.register_kv_caches(caches())
    with pytest.raises(kvbm.StateError, match="scheduler-side"):
        worker.build_connector_meta(None)
    with pytest.raises(kvbm.StateError, match="register_kv_caches"):
        worker.start_load_kv(None)
    kvc = caches()
    worker.register_kv_caches(kvc)
    with pytest.raises(kvbm.StateError, match="already"):
        worker.register_kv_caches(kvc)

    def step(so, finished=()):
        meta = pickle.loads(pickle.dumps(sched.build_connector_meta(so)))  # plain data
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(None)
        worker.wait_for_save()
        worker.handler.wait(set(worker.handler._jobs))
        sending, recving = worker.get_finished(set(finished))
        errors = worker.get_block_ids_with_load_errors()
        wmeta = worker.build_connector_worker_meta()
        worker.clear_connector_metadata()
        sched.update_connector_output(NS(finished_sending=sending, finished_recving=recving,
                                         kv_connector_worker_meta=wmeta))
        return sending, recving, errors

    def new(rid, ids, computed, n):
        return NS(scheduled_new_reqs=[NS(req_id=rid, block_ids=(ids,), num_computed_tokens=computed)],
                  scheduled_cached_reqs=None, num_scheduled_tokens={rid: n})

    empty = NS(scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={})
    a = EngineRequest("a", list(range(17)), BS)                  # 4 full blocks + 1 token
    assert sched.get_num_new_matched_tokens(a, 0) == (0, False)
    sched.update_state_after_alloc(a, KVCacheBlocks([0, 1, 2, 3, 4]), 0)
    step(new("a", [0, 1, 2, 3, 4], 0, 17))                        # stores 4 blocks (deferred)
    assert sched.request_finished(a, [0, 1, 2, 3, 4]) == (True, None)   # stores in flight
    sending, _, _ = step(empty, finished={"a"})
    if not sending:
        sending, _, _ = step(empty)
    assert sending == {"a"}
    assert not sched._jobs                                       # completed on the only rank

    b = EngineRequest("b", list(range(17)), BS)
    assert sched.get_num_new_matched_tokens(b, 4) == (12, True)  # 1 block on "GPU", 3 in G2
    with pytest.raises(kvbm.InvalidArgumentError, match="8 external tokens"):
        sched.update_state_after_alloc(b, KVCacheBlocks([9, 10, 11, 12, 13]), 8)
    assert sched.get_num_new_matched_tokens(b, 4) == (12, True)
    sched.update_state_after_alloc(b, KVCacheBlocks([9, 10, 11, 12, 13]), 12)
    _, recving, errors = step(empty)
    assert recving == {"b"} and errors == set()
    assert all(torch.equal(t[:, 10:13], t[:, 1:4]) for t in kvc.values())
    with pytest.raises(kvbm.NotFoundError, match="zz"):
        sched.build_connector_meta(new("zz", [1], 0, 1))

    # a preemption: the step's stores are deferred; handle_preemptions runs them now
    c = EngineRequest("c", list(range(100, 117)), BS)
    sched.update_state_after_alloc(c, KVCacheBlocks([5, 6, 7, 8, 14]), 0)
    meta = sched.build_connector_meta(new("c", [5, 6, 7, 8, 14], 0, 17))
    assert len(meta.store_jobs) == 1
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    assert worker._deferred                                      # nothing copied yet
    orig = kvc["layer0"][:, 5:9].clone()
    worker.handle_preemptions(None)
    assert not worker._deferred
    kvc["layer0"][:, 5:9] = -1.0                                 # the blocks change hands
    slots = list(meta.store_jobs.values())[0].dst_spec.g2_slots
    assert torch.equal(worker.handler.g2[0][:, slots], orig)     # G2 has the bytes from before
    assert [e.medium for e in sched.take_events()] == ["CPU"]
    worker.shutdown()
    sched.shutdown()


def test_worker_metadata_aggregates_over_ranks():
    a = kv.KvbmWorkerMetadata({1: 1, 2: 1}, {2: 1})
    b = kv.KvbmWorkerMetadata({1: 1}, {})
    c = pickle.loads(pickle.dumps(a.aggregate(b)))
    assert (c.completed, c.failed) == ({1: 2, 2: 1}, {2: 1})
