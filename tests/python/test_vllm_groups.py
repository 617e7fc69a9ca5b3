# SPDX-License-Identifier: Apache-2.0
"""kvbm.vllm with a hybrid model's KV cache groups (issue 20;
docs/areas/engines.md, "Hybrid models in vLLM's offloading").

vLLM's hybrid offloading passes keys that carry the group (OffloadKey: the
block hash then 4 bytes of group index) and GPU specs whose block ids are
ordered by group (group_sizes). The spec here has two attention groups
(full + sliding window) over their own layers: a store of both groups'
blocks, then a load of every full-attention block and only the window's
blocks of the sliding-window group, must put each block's bytes back into
its own group's layers, and nowhere else.
"""
import types

import pytest
import torch

import kvbm
from kvbm import vllm as kv
from tiny_engine_tp import vllm_config

BS, HEADS, HD, LAYERS, NB = 4, 2, 8, 2, 32


class FullAttentionSpec:  # vLLM's classes, known by name
    pass


class SlidingWindowSpec:
    def __init__(self, sliding_window):
        self.sliding_window = sliding_window


class MambaSpec:
    mamba_cache_mode = "all"


def kv_cache_config(*specs):
    names = [[f"g{g}.layer{i}" for i in range(LAYERS)] for g in range(len(specs))]
    return types.SimpleNamespace(kv_cache_groups=[
        types.SimpleNamespace(layer_names=n, kv_cache_spec=s) for n, s in zip(names, specs)])


def extra(**kw):
    d = dict(kvbm_g2_blocks=32, kvbm_model_fingerprint="m", kvbm_num_kv_heads=HEADS,
             kvbm_head_dim=HD, kvbm_num_layers=LAYERS, kvbm_dtype="float32", kvbm_tp_size=1)
    d.update(kw)
    return d


def caches(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(2, NB, BS, HEADS, HD, generator=g)
            for grp in cfg.kv_cache_groups for n in grp.layer_names}


def key(h, group):
    """vLLM's make_offload_key: hash bytes, then the group (4 bytes, big endian)."""
    return h.to_bytes(8, "little") + group.to_bytes(4, "big")


def run(handler, job_id, src, dst):
    assert handler.transfer_async(job_id, (src, dst)) is True
    handler.wait({job_id})
    (res,) = handler.get_finished()
    return res.success


def test_two_groups_store_and_load_the_window_only():
    cfg = kv_cache_config(FullAttentionSpec(), SlidingWindowSpec(8))
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra()), cfg)
    mgr = spec.get_manager()
    gpu = caches(cfg)
    orig = {n: t.clone() for n, t in gpu.items()}
    ((_, _, handler), _) = list(spec.get_handlers(gpu))
    hashes = list(range(100, 106))
    keys = [key(h, 0) for h in hashes] + [key(h, 1) for h in hashes]
    out = mgr.prepare_store(keys)
    assert len(out.store_spec.keys) == 12  # the groups' keys are apart
    src = kv.GPULoadStoreSpec(list(range(6)) + list(range(6, 12)), group_sizes=[6, 6],
                              block_indices=[0, 0])
    assert run(handler, 1, src, out.store_spec)
    mgr.complete_store(keys)
    assert mgr.lookup([key(h, 0) for h in hashes]) == 6
    assert mgr.lookup([key(h, 1) for h in hashes]) == 6
    assert mgr.lookup([key(h, 2) for h in hashes]) == 0

    for t in gpu.values():
        t.zero_()
    # full attention: every block; the window of 8 tokens: the last 2 blocks
    want = [key(h, 0) for h in hashes] + [key(h, 1) for h in hashes[4:]]
    load = mgr.prepare_load(want)
    dst = kv.GPULoadStoreSpec(list(range(20, 26)) + [26, 27], group_sizes=[6, 2],
                              block_indices=[0, 4])
    before = handler.stats["bytes_loaded"]
    assert run(handler, 2, load, dst)
    mgr.complete_load(want)
    per_block = LAYERS * 2 * BS * HEADS * HD * 4
    assert handler.stats["bytes_loaded"] - before == 8 * per_block
    for i in range(LAYERS):
        full, sw = gpu[f"g0.layer{i}"], gpu[f"g1.layer{i}"]
        for j in range(6):   # group 0's blocks back in group 0's layers only
            assert torch.equal(full[:, 20 + j], orig[f"g0.layer{i}"][:, j])
            assert not sw[:, 20 + j].any()
        for j in range(2):   # group 1's window blocks (stored from GPU ids 10, 11)
            assert torch.equal(sw[:, 26 + j], orig[f"g1.layer{i}"][:, 10 + j])
            assert not full[:, 26 + j].any()
        assert not full[:, :20].any() and not sw[:, :20].any()
    handler.close()
    mgr.close()


def test_hostile_group_specs():
    cfg = kv_cache_config(FullAttentionSpec(), SlidingWindowSpec(8))
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra()), cfg)
    mgr = spec.get_manager()
    ((_, _, handler), _) = list(spec.get_handlers(caches(cfg)))
    keys = [key(h, 0) for h in (1, 2)] + [key(h, 1) for h in (1, 2)]
    out = mgr.prepare_store(keys)
    for sizes in ([2, 3], [1, 1, 2], [-1, 5]):
        with pytest.raises(kvbm.InvalidArgumentError, match="group_sizes"):
            handler.transfer_async(9, (kv.GPULoadStoreSpec([0, 1, 2, 3], group_sizes=sizes),
                                       out.store_spec))
    handler.close()
    mgr.close()
    # a Mamba group needs its MambaSpec's state shapes and dtypes (test_vllm_mamba.py)
    with pytest.raises(kv.LayoutError, match="no shapes/dtypes"):
        kv.KvbmOffloadingSpec(vllm_config(BS, extra()), kv_cache_config(FullAttentionSpec(), MambaSpec()))
    # a group whose layers do not match the layout, or are not in the caches
    lay = spec.layout
    gpu = caches(cfg)
    with pytest.raises(kvbm.InvalidArgumentError, match="has 1 layers"):
        kv.KvbmOffloadingHandler(gpu, lay, g2_blocks=4, groups=[["g0.layer0"], ["g1.layer0"]])
    with pytest.raises(kvbm.InvalidArgumentError, match="not in the KV tensors"):
        kv.KvbmOffloadingHandler(gpu, lay, g2_blocks=4,
                                 groups=[["g0.layer0", "g0.layer1"], ["g1.layer0", "nope"]])
    with pytest.raises(kvbm.InvalidArgumentError, match="listed twice"):
        kv.KvbmOffloadingHandler(gpu, lay, g2_blocks=4,
                                 groups=[["g0.layer0", "g0.layer1"], ["g0.layer0", "g1.layer1"]])


def test_one_group_config_unchanged():
    cfg = kv_cache_config(FullAttentionSpec())
    spec = kv.KvbmOffloadingSpec(vllm_config(BS, extra()), cfg)
    gpu = caches(cfg)
    ((_, _, handler), _) = list(spec.get_handlers(gpu))
    mgr = spec.get_manager()
    out = mgr.prepare_store([key(5, 0)])
    assert run(handler, 1, kv.GPULoadStoreSpec([3]), out.store_spec)  # no group_sizes: group 0
    handler.close()
    mgr.close()
