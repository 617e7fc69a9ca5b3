# SPDX-License-Identifier: Apache-2.0
"""kvbm behind stock vLLM's OffloadingConnector (kvbm.vllm).

What a user passes to vLLM (no patch to vLLM; vLLM's block manager keeps
the GPU cache, kvbm holds G2 host, G3 disk and G4 shared blocks):

    vllm serve MODEL --tensor-parallel-size 2 --kv-transfer-config '{
      "kv_connector": "OffloadingConnector",
      "kv_role": "kv_both",
      "kv_connector_extra_config": {
        "spec_name": "KvbmOffloadingSpec",
        "spec_module_path": "kvbm.vllm",
        "kvbm_g2_blocks": 4096,
        "kvbm_g3_blocks": 65536, "kvbm_g3_url": "file:///nvme/kvbm-g3",
        "kvbm_g3_policy": "frequency", "kvbm_freq_threshold": 2,
        "kvbm_g4_url": "file:///shared/kvbm-g4",
        "kvbm_model_fingerprint": "meta-llama/Llama-3.1-8B@main",
        "kvbm_events_endpoint": "tcp://*:5557"}}'

A second deployment at another TP size pointed at the same kvbm_g4_url
reads the same blocks (G4 stores one value per KV head); one whose model
fingerprint, dtype, head size, block size or layer count differs is
refused with kvbm.vllm.LayoutError naming the field.

The runnable part below plays vLLM's two kinds of process in one: the
scheduler's OffloadingManager and two TP ranks' handlers, each holding its
half of the KV heads in vLLM's FlashAttention layout. Rank tensors are
filled with stand-in KV, stored, then read back into other GPU blocks by a
TP=2 reader and by a TP=1 reader that gathers both halves from G4.
tests/python/test_vllm_engine.py runs the same with real worker processes
and a tiny transformer.
"""
import pickle
import shutil
import tempfile
import types

import torch

import kvbm
from kvbm import vllm as kv

BS, HEADS, HEAD_DIM, LAYERS, GPU_BLOCKS = 16, 8, 64, 2, 32
tmp = tempfile.mkdtemp(prefix="kvbm-vllm-example-")


def config(tp_size, tp_rank, g3):
    extra = {"spec_name": "KvbmOffloadingSpec", "spec_module_path": "kvbm.vllm",
             "kvbm_g2_blocks": 16, "kvbm_g3_blocks": 64, "kvbm_g3_url": f"file://{tmp}/{g3}",
             "kvbm_g4_url": f"file://{tmp}/g4", "kvbm_model_fingerprint": "example-model@main",
             # vLLM's model config gives these; without vLLM they are set here
             "kvbm_num_kv_heads": HEADS, "kvbm_head_dim": HEAD_DIM, "kvbm_num_layers": LAYERS,
             "kvbm_dtype": "float16", "kvbm_tp_size": tp_size, "kvbm_tp_rank": tp_rank}
    return types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(kv_connector="OffloadingConnector",
                                                 kv_role="kv_both",
                                                 kv_connector_extra_config=extra),
        cache_config=types.SimpleNamespace(block_size=BS))


def rank_caches(tp_size):
    lh = HEADS // tp_size
    return [{f"model.layers.{i}.self_attn.attn": torch.zeros(2, GPU_BLOCKS, BS, lh, HEAD_DIM,
                                                            dtype=torch.float16)
             for i in range(LAYERS)} for _ in range(tp_size)]


def handlers(tp_size, caches, g3):
    out = []
    for r in range(tp_size):
        spec = kv.KvbmOffloadingSpec(config(tp_size, r, g3))
        (_, _, h), _ = spec.get_handlers(caches[r])   # (GPU->KVBM, KVBM->GPU): one handler
        out.append(h)
    return out


def transfer(hs, job, src, dst):
    blob = pickle.dumps((src, dst))        # what the scheduler ships to every rank
    for h in hs:
        h.transfer_async(job, pickle.loads(blob))
        h.wait({job})
        assert all(r.success for r in h.get_finished())


# ---- TP=2 writer: its scheduler's manager and its two ranks
scheduler = kv.KvbmOffloadingSpec(config(2, 0, "g3-a")).get_manager()
caches = rank_caches(2)
hs = handlers(2, caches, "g3-a")
tokens = list(range(4 * BS + 3))
hashes = [h.to_bytes(8, "little") for h in kvbm.block_hashes(tokens, BS)]  # vLLM: bytes
full = torch.randn(LAYERS, 2, len(hashes), BS, HEADS, HEAD_DIM).half()     # "computed" KV
for r, c in enumerate(caches):
    for i, t in enumerate(c.values()):
        t[:, 1:1 + len(hashes)] = full[i, :, :, :, r * HEADS // 2:(r + 1) * HEADS // 2]

scheduler.touch(hashes)
out = scheduler.prepare_store(hashes)                       # where each block goes
transfer(hs, 1, kv.GPULoadStoreSpec(list(range(1, 1 + len(hashes)))), out.store_spec)
scheduler.complete_store(hashes)
print("stored", len(hashes), "blocks; events:",
      [(e.medium, len(e.block_hashes)) for e in scheduler.take_events()])

# ---- the same deployment finds them in G2 and loads them into other GPU blocks
assert scheduler.lookup(hashes) == len(hashes)
load = scheduler.prepare_load(hashes)
transfer(hs, 2, load, kv.GPULoadStoreSpec(list(range(10, 10 + len(hashes)))))
scheduler.complete_load(hashes)
assert all(torch.equal(t[:, 10:14], t[:, 1:5]) for c in caches for t in c.values())
print("TP=2 loaded from", {kv.MEDIUM[t] for t in load.tiers})

# ---- a TP=1 deployment sharing G4 gathers both halves
reader = kv.KvbmOffloadingSpec(config(1, 0, "g3-b")).get_manager()
caches1 = rank_caches(1)
hs1 = handlers(1, caches1, "g3-b")
assert reader.lookup(hashes) == len(hashes)
load = reader.prepare_load(hashes)
transfer(hs1, 3, load, kv.GPULoadStoreSpec(list(range(len(hashes)))))
for i, t in enumerate(caches1[0].values()):
    assert torch.equal(t[:, :len(hashes)], full[i])
print("TP=1 loaded from", {kv.MEDIUM[t] for t in load.tiers}, "- all", HEADS, "heads match")

# ---- a deployment of another model is refused, naming the field
bad = config(1, 0, "g3-c")
bad.kv_transfer_config.kv_connector_extra_config["kvbm_model_fingerprint"] = "other-model"
try:
    kv.KvbmOffloadingSpec(bad).get_manager()
except kv.LayoutError as e:
    print("refused:", e.field, "-", e.message)
for h in hs + hs1:
    h.close()
scheduler.close()
reader.close()
shutil.rmtree(tmp)
