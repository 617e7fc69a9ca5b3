# SPDX-License-Identifier: Apache-2.0
"""KvbmOffloadingManager under vLLM's per-key offloading interface (issue
20; docs/areas/engines.md, "The per-key interface").

vLLM is not installed here, so the interface is written down below as
facts, read from vllm-project/vllm's vllm/v1/kv_offload/base.py (commit
0105e232b7fa4e1b59ec87531f167c0443a5095d, the newest of the index's copies
with it; 14d6506e258a4e59702f2690c05de70cbcec87f1 has the first per-key
form, lookup -> bool | None), and the scheduler's use of it from
vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py
(_maximal_prefix_lookup, _sliding_window_lookup, get_sliding_window_size_
in_blocks: a Mamba group is a window of one block). The tests check that
the manager has every call of the interface under vLLM's parameter names,
then drive it as that scheduler does: per-key lookups over a full and a
Mamba group, loads, stores, events, eviction and the request hooks; and
that the older batch form still works on the same class.
"""
import inspect

import pytest

import kvbm
from kvbm import vllm as kv

BS = 4

# vllm/v1/kv_offload/base.py @ 0105e232, class OffloadingManager: each
# method's parameters (self left out) and whether it is abstract there.
PER_KEY_INTERFACE = {
    "lookup": (["key", "req_context"], True),          # -> LookupResult
    "prepare_load": (["keys", "req_context"], True),   # -> LoadStoreSpec
    "touch": (["keys", "req_context"], False),
    "complete_load": (["keys", "req_context"], False),
    "prepare_store": (["keys", "req_context"], True),  # -> PrepareStoreOutput | None
    "complete_store": (["keys", "req_context", "success"], False),  # success=True
    "on_new_request": (["req_context"], True),         # -> RequestOffloadingContext
    "on_request_finished": (["req_context"], False),
    "take_events": ([], False),                        # -> Iterable[OffloadingEvent]
    "on_schedule_end": (["context"], False),           # ScheduleEndContext
    "has_pending_work": ([], False),                   # -> bool
    "reset_cache": ([], False),
    "get_stats": ([], False),                          # -> OffloadingConnectorStats | None
    "shutdown": ([], False),
}
# LookupResult members; PrepareStoreOutput(keys_to_store, store_spec,
# evicted_keys); OffloadingEvent(keys, medium: Medium, removed, locality,
# ownership, removal_expected); Medium CPU / STORAGE; Locality LOCAL /
# REMOTE; OffloadPolicy CHUNK_LEVEL / REQUEST_LEVEL; ReqContext(req_id,
# kv_transfer_params, ...); make_offload_key(hash, g) = hash + g as 4 bytes
# big endian.
LOOKUP_RESULTS = ["MISS", "HIT", "HIT_PENDING", "RETRY"]


def make_offload_key(block_hash: bytes, group_idx: int) -> bytes:
    return block_hash + group_idx.to_bytes(4, "big", signed=False)


def maximal_prefix_lookup(manager, keys, ctx):
    """vLLM's OffloadingConnectorScheduler._maximal_prefix_lookup: leading
    hits, None when the backend asks to defer (HIT_PENDING, RETRY)."""
    hits, defer = 0, False
    for key in keys:
        r = manager.lookup(key, ctx)
        if r is kv.LookupResult.HIT:
            hits += 1
        elif r is kv.LookupResult.HIT_PENDING:
            defer, hits = True, hits + 1
        elif r is kv.LookupResult.RETRY:
            defer = True
        else:
            break
    return None if defer else hits


def sliding_window_lookup(manager, keys, window, ctx):
    """vLLM's _sliding_window_lookup: from the end, the end index of the
    last run of `window` hits (a Mamba group: window 1)."""
    defer, run = False, 0
    for idx in range(len(keys) - 1, -1, -1):
        r = manager.lookup(keys[idx], ctx)
        if r is kv.LookupResult.HIT:
            run += 1
        elif r is kv.LookupResult.HIT_PENDING:
            defer, run = True, run + 1
        else:
            defer, run = defer or r is kv.LookupResult.RETRY, 0
        if run == window:
            return None if defer else idx + window
    return None if defer else run


def manager(g2_blocks=8, **kw):
    lay = kv.KvLayout(model_fingerprint="m", dtype="float32", num_kv_heads=2, head_dim=8,
                      block_size=BS, num_layers=2)
    return kv.KvbmOffloadingManager(lay, g2_blocks=g2_blocks,
                                    groups=[("full", None), ("mamba", None)], **kw)


def test_manager_has_the_per_key_interface():
    assert [m.name for m in kv.LookupResult] == LOOKUP_RESULTS
    for name, (params, _) in PER_KEY_INTERFACE.items():
        method = getattr(kv.KvbmOffloadingManager, name)
        got = list(inspect.signature(method).parameters)[1:]
        assert got[:len(params)] == params or (
            # the batch form's first parameter keeps its name (block_hashes)
            name in ("lookup", "prepare_load", "touch", "complete_load", "prepare_store",
                     "complete_store") and got[1:len(params)] == params[1:]), (name, got)
        inspect.signature(method).bind(None, *range(len(params)))  # callable positionally
    default = inspect.signature(kv.KvbmOffloadingManager.complete_store).parameters["success"]
    assert default.default is True


def test_driven_as_vllms_scheduler_drives_it():
    m = manager()
    ctx = kv.ReqContext(req_id="r1")
    assert m.on_new_request(ctx).policy is kv.OffloadPolicy.CHUNK_LEVEL
    hashes = [bytes([i]) * 32 for i in range(1, 5)]
    full = [make_offload_key(h, 0) for h in hashes]
    mamba = [make_offload_key(h, 1) for h in hashes]
    assert full[0] == kv.group_key(hashes[0], 0)          # kvbm's key is vLLM's
    assert maximal_prefix_lookup(m, full, ctx) == 0
    m.touch(full, ctx)

    # a step stores full blocks 0..3 and the Mamba state at block 1
    keys = full + [mamba[1]]
    out = m.prepare_store(keys, ctx)
    assert out.keys_to_store == keys and out.evicted_keys == []
    assert isinstance(out.store_spec, kv.KvbmLoadStoreSpec)
    assert m.lookup(full[0], ctx) is kv.LookupResult.HIT_PENDING   # stored, not readable
    assert maximal_prefix_lookup(m, full, ctx) is None              # the scheduler defers
    m.complete_store(keys, ctx)
    assert m.prepare_store(keys, ctx).keys_to_store == []           # held already
    m.complete_store([], ctx)

    # the hit: the full group's prefix, then the Mamba group as a window of 1
    assert maximal_prefix_lookup(m, full[:4], ctx) == 4
    assert sliding_window_lookup(m, mamba[:4], 1, ctx) == 2
    assert sliding_window_lookup(m, mamba[:1], 1, ctx) == 0         # no state at block 0
    assert m.lookup(make_offload_key(hashes[0], 7), ctx) is kv.LookupResult.MISS
    load = m.prepare_load(full[:2] + [mamba[1]], ctx)
    assert load.tiers == [kv.G2] * 3
    m.complete_load(full[:2] + [mamba[1]], ctx)

    events = list(m.take_events())
    assert [(e.keys, e.medium, e.removed, e.locality) for e in events] == [
        (keys, kv.Medium.CPU, False, kv.Locality.LOCAL)]

    # G2 of 8: storing 4 more evicts the least recently used (kvbm's rule)
    more = [make_offload_key(bytes([9, i]) * 16, 0) for i in range(4)]
    out = m.prepare_store(more, ctx)
    assert len(out.evicted_keys) == 1 and out.evicted_keys[0] in keys
    m.complete_store(more, ctx, success=False)                      # a failed store
    assert all(m.lookup(k, ctx) is kv.LookupResult.MISS for k in more)
    removed = [e for e in m.take_events() if e.removed]
    assert [e.keys for e in removed] == [out.evicted_keys]

    m.on_schedule_end(None)
    assert m.has_pending_work() is False and m.get_stats() is None
    m.on_request_finished(ctx)
    m.reset_cache()
    assert all(m.lookup(k, ctx) is kv.LookupResult.MISS for k in keys)
    gone = [e for e in m.take_events() if e.removed]
    assert sorted(k for e in gone for k in e.keys) == sorted(set(keys) - set(out.evicted_keys))
    m.shutdown()


def test_reset_cache_refused_while_a_load_runs():
    m = manager()
    ctx = kv.ReqContext(req_id="r")
    k = make_offload_key(b"\x01" * 32, 0)
    m.prepare_store([k], ctx)
    with pytest.raises(kvbm.StateError, match="in flight"):
        m.reset_cache()
    m.complete_store([k], ctx)
    m.prepare_load([k], ctx)
    with pytest.raises(kvbm.StateError, match="in flight"):
        m.reset_cache()
    m.complete_load([k], ctx)
    m.reset_cache()
    m.close()


def test_g4_lookup_per_key_knows_mamba_values(tmp_path):
    """A Mamba state in G4 is one value per TP rank (not per KV head): a
    per-key lookup of a second manager finds it there, a missing rank's
    value makes it a miss."""
    g4 = f"file://{tmp_path}/g4"
    vol = kv.Volume(g4, "kvbm-vllm")
    k_full, k_state = make_offload_key(b"\x02" * 32, 0), make_offload_key(b"\x02" * 32, 1)
    key_full, key_state = kv.block_key(k_full), kv.block_key(k_state)
    vol.put_many([(kv.slice_key(key_full, h), b"x") for h in range(2)]
                 + [(kv.state_slice_key(key_state, 0), b"x")])
    m = manager(g4_url=g4)
    ctx = kv.ReqContext(req_id="r")
    assert m.lookup(k_full, ctx) is kv.LookupResult.HIT
    assert m.lookup(k_state, ctx) is kv.LookupResult.HIT
    other = make_offload_key(b"\x03" * 32, 1)          # only a KV head's value: no state
    vol.put_many([(kv.slice_key(kv.block_key(other), 0), b"x")])
    assert m.lookup(other, ctx) is kv.LookupResult.MISS
    m.close()
    vol.close()


def test_the_batch_form_still_works():
    m = manager()
    hashes = [bytes([i]) * 32 for i in range(1, 4)]
    out = m.prepare_store(hashes)
    assert out.block_hashes_to_store == hashes and out.block_hashes_evicted == []
    assert m.lookup(hashes) == 0
    m.complete_store(hashes, True)              # success given positionally, as before
    assert m.lookup(hashes) == 3
    (e,) = m.take_events()
    assert e.block_hashes == hashes and e.medium == "CPU" and e.block_size == BS
    m.close()
