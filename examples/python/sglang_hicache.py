# SPDX-License-Identifier: Apache-2.0
"""kvbm as SGLang's HiCache storage backend (L3), and what SGLang does with it.

What a user passes to SGLang (every rank of the server builds its own
backend in its own process from this one JSON; "backend_name",
"module_path", "class_name" and "interface_v1" are SGLang's keys, the
"kvbm_*" ones are kvbm's):

    python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct \\
        --enable-hierarchical-cache --hicache-ratio 2 \\
        --hicache-mem-layout page_first --page-size 64 \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{
            "backend_name": "kvbm",
            "module_path": "kvbm.sglang",
            "class_name": "KvbmHiCacheStorage",
            "interface_v1": 1,
            "kvbm_url": "redis+cluster://10.0.0.5:7000,10.0.0.6:7000",
            "kvbm_namespace": "prod-qwen",
            "kvbm_timeout_ms": 200
        }'

"interface_v1": 1 makes SGLang call the zero-copy page calls
(batch_get_v1 / batch_set_v1: the volume reads and writes the host pool's
pages in place); without it SGLang uses the plain ones (a tensor per page).
Other URLs: "file:///mnt/nfs/kv" (servers sharing a directory),
"redis://cache:6379", "disk:///nvme/kv-{tp_rank}" (a local slot file, one
per rank; add "kvbm_disk_slots": N).

The runnable part below needs no SGLang: a host pool in SGLang's page_first
layout (kvbm.sglang.HostPoolStandIn, the storage-facing part of SGLang's
MHATokenToKVPoolHost), pages named by SGLang's hash chain, and the calls in
HiCacheController's order: the backup thread stores (batch_set_v1), a second
server's prefetch thread asks what exists (batch_exists) and loads it into
its own host pages (batch_get_v1). A page damaged in the store is a counted
miss, never bytes handed to the engine.
"""
import os
import shutil
import tempfile

import torch

from kvbm.sglang import HiCacheStorageConfig, HostPoolStandIn, KvbmHiCacheStorage, page_hashes

store = tempfile.mkdtemp(prefix="kvbm-sglang-")
extra = {"backend_name": "kvbm", "module_path": "kvbm.sglang", "class_name": "KvbmHiCacheStorage",
         "interface_v1": 1, "kvbm_url": f"file://{store}"}


def server():
    """One SGLang rank: its host pool and the backend SGLang would build."""
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=True, model_name="Qwen/Qwen2.5-7B-Instruct",
                               extra_config=dict(extra))
    pool = HostPoolStandIn(layers=4, heads=2, head_dim=64, page_size=16, pages=32,
                           layout="page_first")
    backend = KvbmHiCacheStorage(cfg, {})     # StorageBackendFactory: class(config, kwargs)
    backend.register_mem_pool_host(pool)      # HiCacheController, right after
    return pool, backend


prompt = list(range(5000, 5000 + 16 * 8))     # 8 pages of 16 tokens
keys = page_hashes(prompt, 16)                # what SGLang's get_hash_str chain gives

# server A computed the prompt; its backup thread writes the pages to L3
pool_a, a = server()
host_a = pool_a.alloc(len(prompt))
pool_a.kv_buffer[:, : len(prompt)] = torch.randn(2, len(prompt), 4, 2, 64).to(pool_a.dtype)
assert all(a.batch_set_v1(keys, host_a))

# someone damages one stored page (bit rot, a stray write)
victim = os.path.join(store, "sglang", os.listdir(os.path.join(store, "sglang"))[5])
with open(victim, "r+b") as f:
    f.seek(100)
    f.write(b"\xff\xff")

# server B gets the same prompt: prefetch thread = batch_exists, then batch_get_v1
pool_b, b = server()
hits = b.batch_exists(keys)
host_b = pool_b.alloc(hits * 16)
ok = b.batch_get_v1(keys[:hits], host_b)
loaded = ok.index(False) if False in ok else len(ok)   # SGLang keeps the leading run
same = all(torch.equal(pool_a.get_data_page(host_a[16 * i].item()),
                       pool_b.get_data_page(host_b[16 * i].item())) for i in range(loaded))
c = b.counters()
print(f"{hits} pages exist, {sum(ok)} loaded and verified, {len(ok) - sum(ok)} failed the check "
      f"(counted: {c['verify_failures']}); the leading {loaded} equal server A's bytes: {same}")
assert hits == 8 and sum(ok) == 7 and c["verify_failures"] == 1 and same
a.close()
b.close()
shutil.rmtree(store)
