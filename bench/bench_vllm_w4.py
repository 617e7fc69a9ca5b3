#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""W4 (../shared/WORKLOADS.md, data movement) through kvbm.vllm's handler,
as a ratio to a plain torch copy of the same tensors in the same run.

Blocks are W4's 2 MiB: 32 layers x 16 tokens x 8 KV heads x 128 dims x
bf16, K and V, in vLLM's per-layer layout [2, num_blocks, 16, 8, 128] (one
TP rank holding all heads). Each repetition stores N blocks from the
engine's tensors to G2 (``transfer_async`` of a GPU->KVBM job, then
``wait``) and loads them back into N other engine blocks (KVBM->GPU); the
bound is torch's copy of the same bytes between the same tensors, per
layer, timed in the same repetition (the engine blocks to a G2-shaped
tensor and back). Here the "GPU" tensors are host memory (no device on the
development machines), so both sides are host copies. With ``--g4`` the
blocks also go to a file:// G4 under /dev/shm and are loaded from it: one
framed, BLAKE3-checked value per (block, KV head), so that ratio is what
TP-portable, verified remote blocks cost on top of a copy.

    ratio = bound seconds / kvbm seconds   (1.0: as fast as torch's copy)

Both are timed twice: wall clock, and CPU time of the process (all its
threads: the handler copies on its own thread), which the other work on
a shared machine disturbs less.

usage: PYTHONPATH=build/python /usr/bin/python3 bench/bench_vllm_w4.py
           [--blocks 32] [--reps 5] [--g4]
"""
import argparse
import shutil
import statistics
import tempfile
import time

import torch

from kvbm import vllm as kv

LAYERS, BS, HEADS, HD = 32, 16, 8, 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--g4", action="store_true")
    a = ap.parse_args()
    n = a.blocks
    tmp = tempfile.mkdtemp(prefix="kvbm-vllm-w4-", dir="/dev/shm")
    layout = kv.KvLayout("w4", "bfloat16", HEADS, HD, BS, LAYERS)
    kvc = [torch.randn(2, 2 * n, BS, HEADS, HD).to(torch.bfloat16) for _ in range(LAYERS)]
    h = kv.KvbmOffloadingHandler(kvc, layout, g2_blocks=n,
                                 g4_url=f"file://{tmp}/g4" if a.g4 else None)
    bound_g2 = [torch.empty(2, n, BS, HEADS, HD, dtype=torch.bfloat16) for _ in range(LAYERS)]
    nbytes = n * LAYERS * 2 * BS * HEADS * HD * 2
    src_ids, dst_ids = list(range(n)), list(range(n, 2 * n))
    rows, job = [], 0
    for rep in range(a.reps):
        keys = [rep << 32 | i for i in range(n)]
        c0, t0 = time.process_time(), time.perf_counter()
        for t, g in zip(kvc, bound_g2):                      # the bound: store ...
            g.copy_(t[:, :n])
        for t, g in zip(kvc, bound_g2):                      # ... and load
            t[:, n:].copy_(g)
        bound, bound_cpu = time.perf_counter() - t0, time.process_time() - c0
        store = kv.KvbmLoadStoreSpec("store", keys, g2_slots=range(n), g3_slots=[-1] * n,
                                     g4=[a.g4] * n)
        load = kv.KvbmLoadStoreSpec("load", keys, tiers=[kv.G4 if a.g4 else kv.G2] * n,
                                    slots=[-1 if a.g4 else i for i in range(n)])
        c0, t0 = time.process_time(), time.perf_counter()
        job += 1
        h.transfer_async(job, (kv.GPULoadStoreSpec(src_ids), store))
        h.wait({job})
        t1 = time.perf_counter()
        job += 1
        h.transfer_async(job, (load, kv.GPULoadStoreSpec(dst_ids)))
        h.wait({job})
        t2, c2 = time.perf_counter(), time.process_time()
        assert all(r.success for r in h.get_finished()), h.last_error
        rows.append((bound, t1 - t0, t2 - t1, bound_cpu / (c2 - c0)))
    assert all(torch.equal(t[:, n:], t[:, :n]) for t in kvc)  # the loaded bytes
    h.close()
    shutil.rmtree(tmp)
    bound = statistics.median(r[0] for r in rows)
    ratios = [r[0] / (r[1] + r[2]) for r in rows]
    print(f"W4 kvbm.vllm handler, {n} blocks of 2 MiB, {'G4 file:// on /dev/shm' if a.g4 else 'G2'}"
          f", {a.reps} reps")
    print(f"  bound (torch copy, store+load): {2 * nbytes / bound / 1e9:.2f} GB/s")
    print(f"  kvbm store {nbytes / statistics.median(r[1] for r in rows) / 1e9:.2f} GB/s, "
          f"load {nbytes / statistics.median(r[2] for r in rows) / 1e9:.2f} GB/s")
    print(f"  ratio median {statistics.median(ratios):.2f} min {min(ratios):.2f} "
          f"max {max(ratios):.2f}")
    cpu = [r[3] for r in rows]
    print(f"  cpu-time ratio median {statistics.median(cpu):.2f} min {min(cpu):.2f} "
          f"max {max(cpu):.2f}")


if __name__ == "__main__":
    main()
