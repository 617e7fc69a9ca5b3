#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""W4 (../shared/WORKLOADS.md, data movement) through kvbm.sglang's
zero-copy page calls, as a ratio to the same run's bound.

Pages are W4's 2 MiB blocks: 32 layers x 16 tokens x 8 KV heads x 128 dims
x bf16, K and V (an SGLang host pool in page_first layout, so a page is two
1 MiB components). Each repetition stores N pages with batch_set_v1 (into
a fresh namespace, so every page is written) and loads them into other
host pages with batch_get_v1, in SGLang's batches of 128 pages at most;
the bound is a torch copy of the same bytes (host memory to host memory),
timed in the same repetition, and the store's own speed: the same bytes
put and read unframed (Volume.put / get_into straight from and to the
pool), so the second ratio is the cost of the frames alone. The store is file:// under /dev/shm by
default (tmpfs: the page cache, no disk), so the ratio is what framing
costs on top of the copies a store must make (the file system's copy in
and out, one copy through the frame check's scratch, BLAKE3 both ways).
Byte equality of the loaded pages is checked once per run.

    ratio = bound seconds / kvbm seconds  (1.0: as fast as one copy;
                                          vs the unframed volume: framing free)

usage: PYTHONPATH=build/python /usr/bin/python3 bench/bench_sglang_w4.py
           [--pages 64] [--reps 5] [--url file:///dev/shm/...] [--threads 2]
           [--hash-threads 0]
"""
import argparse
import shutil
import statistics
import tempfile
import time
import uuid

import torch

import kvbm
import kvbm.sglang as S


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--url", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hash-threads", type=int, default=0)
    a = ap.parse_args()
    tmp = None
    url = a.url
    if url is None:
        tmp = tempfile.mkdtemp(prefix="kvbm-w4-", dir="/dev/shm")
        url = f"file://{tmp}"
    pool = S.HostPoolStandIn(layers=32, heads=8, head_dim=128, page_size=16,
                             pages=2 * a.pages, layout="page_first")
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape).to(pool.dtype))
    page_bytes = pool.get_dummy_flat_data_page().numel() * 2
    src, dst = pool.alloc(16 * a.pages), pool.alloc(16 * a.pages)
    flat = pool.kv_buffer.view(-1)
    bound_dst = torch.empty_like(flat[: flat.numel() // 2])
    total = page_bytes * a.pages
    rows = {"store": [], "load": [], "bound": [], "raw_put": [], "raw_get": []}

    def comps(idx):  # a page's K and V as uint8 numpy views of the pool (no copy)
        return [pool.kv_buffer[c, i:i + 16].view(torch.uint8).numpy()
                for i in idx[::16].tolist() for c in (0, 1)]
    try:
        for rep in range(a.reps):
            ns = f"w4-{uuid.uuid4().hex[:8]}"
            cfg = S.HiCacheStorageConfig(
                tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                model_name="w4", extra_config={"kvbm_url": url, "interface_v1": 1,
                                               "kvbm_namespace": ns, "kvbm_threads": a.threads,
                                               "kvbm_hash_threads": a.hash_threads,
                                               "kvbm_disk_slots": a.pages + 8})
            b = S.KvbmHiCacheStorage(cfg, {})
            b.register_mem_pool_host(pool)
            keys = [f"{rep:08x}{i:056x}" for i in range(a.pages)]
            t = time.perf_counter()
            for i in range(0, a.pages, 128):
                assert all(b.batch_set_v1(keys[i:i + 128], src[16 * i:16 * (i + 128)]))
            rows["store"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for i in range(0, a.pages, 128):
                assert all(b.batch_get_v1(keys[i:i + 128], dst[16 * i:16 * (i + 128)]))
            rows["load"].append(time.perf_counter() - t)
            t = time.perf_counter()
            bound_dst.copy_(flat[: flat.numel() // 2])
            rows["bound"].append(time.perf_counter() - t)
            # the store's own speed: the same bytes, unframed, straight from/to the pool
            raw = kvbm.Volume(url, namespace=ns + "-raw", threads=a.threads,
                              **({"slots": 2 * a.pages + 8, "block_bytes": page_bytes}
                                 if url.startswith("disk:") else {}))
            rk = list(range(1, 2 * a.pages + 1))
            t = time.perf_counter()
            assert raw.put(rk, comps(src)) == [0] * len(rk)
            rows["raw_put"].append(time.perf_counter() - t)
            t = time.perf_counter()
            assert min(raw.get_into(rk, comps(dst))) > 0
            rows["raw_get"].append(time.perf_counter() - t)
            raw.delete(rk)
            raw.close()
            if rep == 0:
                for i in range(a.pages):
                    assert torch.equal(pool.get_data_page(src[16 * i].item()),
                                       pool.get_data_page(dst[16 * i].item()))
            b.clear()
            b.close()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    bound = statistics.median(rows["bound"])
    print(f"W4 kvbm.sglang: {a.pages} pages x {page_bytes >> 20} MiB over {url.split('://')[0]}://, "
          f"{a.threads} I/O threads, {a.hash_threads} hash workers, {a.reps} reps (median, min..max)")
    for k, peer in (("store", "raw_put"), ("load", "raw_get")):
        xs = sorted(rows[k])
        gbs = [total / x / 1e9 for x in xs]
        raw = statistics.median(rows[peer])
        print(f"  {k:5s} {total / statistics.median(xs) / 1e9:6.2f} GB/s ({min(gbs):.2f}..{max(gbs):.2f})"
              f"  ratio to memcpy bound {bound / statistics.median(xs):.2f} "
              f"({min(rows['bound']) / xs[-1]:.2f}..{max(rows['bound']) / xs[0]:.2f})"
              f"  ratio to the unframed volume {raw / statistics.median(xs):.2f} "
              f"({min(rows[peer]) / xs[-1]:.2f}..{max(rows[peer]) / xs[0]:.2f})")
    print(f"  memcpy bound (torch copy of the same bytes) {total / bound / 1e9:.2f} GB/s; "
          f"unframed volume put {total / statistics.median(rows['raw_put']) / 1e9:.2f} GB/s, "
          f"get_into {total / statistics.median(rows['raw_get']) / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
