# SPDX-License-Identifier: Apache-2.0
"""kvbm.vllm in vLLM's process model: a scheduler process and TP worker
processes (tests/python/tiny_engine_tp.py) drive KvbmOffloadingSpec in the
order of vLLM's OffloadingConnector.

Every check is exact: generated tokens equal the plain forward pass
(``TPModel.generate``, no cache at all), and the KV bytes every rank holds
for a request's full blocks equal the plain forward pass's K and V of that
rank's heads, whichever tier (G2, G3, G4) the blocks came from and whatever
TP size wrote them. The manager's per-tier hit counters say which tier
served each load.
"""

import os
import signal
import threading

import pytest
import torch

import kvbm
from kvbm import vllm as kv
from tiny_engine_tp import TPEngine, TPModel, block_hash_bytes

BS = 4
HEADS, HEAD_DIM, LAYERS = 4, 8, 2


@pytest.fixture(scope="module")
def model():
    return TPModel(num_heads=HEADS, head_dim=HEAD_DIM, num_layers=LAYERS)


def prompt(seed, n=18):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def extra(tmp, tp, g3, **kw):
    e = dict(spec_name="KvbmOffloadingSpec", spec_module_path="kvbm.vllm",
             kvbm_g2_blocks=8, kvbm_g3_blocks=64, kvbm_g3_url=f"file://{tmp}/{g3}",
             kvbm_g4_url=f"file://{tmp}/g4", kvbm_model_fingerprint="tiny-tp/seed0",
             kvbm_num_kv_heads=HEADS, kvbm_head_dim=HEAD_DIM, kvbm_num_layers=LAYERS,
             kvbm_dtype="float32", kvbm_tp_size=tp)
    e.update(kw)
    return e


def check(engine, model, p, result, max_tokens=4):
    """Tokens and every rank's KV bytes equal the plain forward pass."""
    assert result.tokens == model.generate(p, max_tokens)
    seq = p + result.tokens[:-1]            # the last sampled token has no KV yet
    _, kvs = model.forward(seq)
    nfull = len(seq) // BS
    lh = HEADS // engine.tp
    dumps = engine.dump_kv(result.block_table[:nfull])
    for rank, layers in enumerate(dumps):
        heads = slice(rank * lh, (rank + 1) * lh)
        for layer, t in enumerate(layers):
            for kvi in (0, 1):
                want = kvs[layer][kvi][:nfull * BS].reshape(nfull, BS, HEADS, HEAD_DIM)[:, :, heads]
                assert torch.equal(t[kvi], want), (rank, layer, kvi)


def hits(engine):
    return list(engine.manager.stats["hit_blocks"])


MODES = ("offloading", "connector")   # KvbmOffloadingSpec under vLLM's OffloadingConnector,
                                      # or kvbm's own KVConnectorBase_V1 (KvbmConnectorV1)


@pytest.mark.parametrize("mode", MODES)
def test_tp2_tiers_then_tp1_and_tp4_read_its_g4(model, tmp_path, mode):
    p1, p2, p3 = prompt(1), prompt(2), prompt(3)
    a = TPEngine(tp=2, extra=extra(tmp_path, 2, "g3a"), tmpdir=tmp_path, mode=mode)
    try:
        r = a.generate("p1", p1, 4)                   # cold: computed, stored to G2/G3/G4
        assert (r.gpu_hit_tokens, r.external_tokens) == (0, 0)
        check(a, model, p1, r)
        r = a.generate("p1-gpu", p1, 4)               # the engine's own prefix cache
        assert r.gpu_hit_tokens == 16 and r.external_tokens == 0
        check(a, model, p1, r)

        a.pool.reset_prefix_cache()                   # G2 hits
        r = a.generate("p1-g2", p1, 4)
        assert (r.gpu_hit_tokens, r.external_tokens, r.load_failed) == (0, 16, False)
        assert hits(a) == [0, 4, 0, 0]
        check(a, model, p1, r)

        for i, p in enumerate((p2, p3)):              # fill G2 (8 blocks): p1 evicted
            check(a, model, p, a.generate(f"fill{i}", p, 4))
        assert a.manager.stats["evicted_blocks"][kv.G2] >= 5
        a.pool.reset_prefix_cache()
        r = a.generate("p1-g3", p1, 4)                # G3 hits
        assert (r.external_tokens, r.load_failed) == (16, False)
        assert hits(a) == [0, 4, 4, 0]
        check(a, model, p1, r)
        assert all(n < 4096 for n in a.meta_bytes)   # each step pickled, small
    finally:
        a.close()

    for tp in (1, 4):                                 # other TP sizes, same G4
        b = TPEngine(tp=tp, extra=extra(tmp_path, tp, f"g3-tp{tp}"), tmpdir=tmp_path, mode=mode)
        try:
            r = b.generate("p1", p1, 4)
            assert (r.gpu_hit_tokens, r.external_tokens, r.load_failed) == (0, 16, False)
            assert hits(b) == [0, 0, 0, 4]
            check(b, model, p1, r)
            fresh = prompt(40 + tp)                   # never stored: no hit
            r = b.generate("fresh", fresh, 4)
            assert r.external_tokens == 0 and hits(b) == [0, 0, 0, 4]
            check(b, model, fresh, r)
            if tp == 4:                               # the TP=1 engine's blocks, at TP=4
                r = b.generate("tp1", prompt(41), 4)
                assert (r.external_tokens, r.load_failed) == (16, False)
                assert hits(b) == [0, 0, 0, 8]
                check(b, model, prompt(41), r)
        finally:
            b.close()


@pytest.mark.parametrize("mode", MODES)
def test_corrupt_g4_slice_is_a_failed_load_and_recomputed(model, tmp_path, mode):
    p1 = prompt(5)
    a = TPEngine(tp=2, extra=extra(tmp_path, 2, "g3a"), tmpdir=tmp_path, mode=mode)
    try:
        check(a, model, p1, a.generate("w", p1, 4))
    finally:
        a.close()
    # head 3 of block 2 now holds head 3 of block 1's (valid) frame
    keys = [kv.block_key(h) for h in block_hash_bytes(p1[:-1], BS)]
    ns = tmp_path / "g4" / "kvbm-vllm"
    victim = ns / f"{kv.slice_key(keys[2], 3):016x}"
    victim.write_bytes((ns / f"{kv.slice_key(keys[1], 3):016x}").read_bytes())
    b = TPEngine(tp=4, extra=extra(tmp_path, 4, "g3b"), tmpdir=tmp_path, mode=mode)
    try:
        r = b.generate("r", p1, 4)
        assert r.load_failed and r.external_tokens == 0      # never the wrong bytes
        check(b, model, p1, r)                                # recomputed
    finally:
        b.close()


def test_worker_killed_mid_transfer(model, tmp_path):
    p1 = prompt(6)
    e = TPEngine(tp=2, extra=extra(tmp_path, 2, "g3a", kvbm_g4_url=None), tmpdir=tmp_path)
    try:
        check(e, model, p1, e.generate("w", p1, 4))
        e.pool.reset_prefix_cache()
        e.command(1, "stall_loads")               # rank 1's next load stops halfway

        def kill():
            if e.stall_event.wait(60):
                os.kill(e.procs[1].pid, signal.SIGKILL)
        t = threading.Thread(target=kill)
        t.start()
        with pytest.raises(kv.TransferFailedError) as err:
            e.generate("r", p1, 4)
        t.join()
        assert isinstance(err.value, kvbm.IoError) and err.value.status == "KVBM_EIO"
        assert "rank 1" in str(err.value)
        assert not any(e.manager._g2.pins.values())        # the failed load's pins are gone
        assert e.manager.lookup(block_hash_bytes(p1[:-1], BS)) == 4
    finally:
        e.close()
