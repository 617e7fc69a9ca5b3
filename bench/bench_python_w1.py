#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""W1 (../shared/WORKLOADS.md) driven through the Python binding, as a ratio
to the same replay in C, measured in one run.

Each repetition runs the C replay (`kvbm replay TRACE --limit N --json`,
whose `seconds` is its replay loop: tokens made into reused buffers, hashed,
managed) and then the same requests in this process: per request the
prompt and output tokens are made with numpy per the workload's formula
into reused buffers, and Pool.run_request does the rest in one call
(create, prefill, append, destroy). Both sides exclude loading and parsing
the trace; both include making the tokens. The counts of the two runs must
be equal (the same work), else the run fails. The two sides alternate
which goes first.

    ratio = C seconds / Python seconds   (1.0: as fast as C; target >= 0.5)

usage: PYTHONPATH=build/python /usr/bin/python3 bench/bench_python_w1.py
           [--trace data/mooncake_conversation_trace.jsonl.gz] [--limit 0]
           [--kvbm build/kvbm] [--reps 5] [--block-size 16] [--capacity 16384]
           [--json]
"""
import argparse
import gzip
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

import kvbm

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load(path, limit):
    """The trace as numpy arrays (what the C side has after parsing)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    reqs = []
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            reqs.append((np.asarray(r["hash_ids"], dtype=np.uint32), r["input_length"], r["output_length"]))
            if limit and len(reqs) == limit:
                break
    return reqs


def replay_python(reqs, block_size, capacity):
    pool = kvbm.Pool(capacity, block_size)
    run = pool.run_request
    max_blocks = max(len(ids) for ids, _, _ in reqs) or 1
    max_out = max(m for _, _, m in reqs) or 1
    offsets = np.arange(512, dtype=np.uint32)
    prompt = np.empty(max_blocks * 512, dtype=np.uint32)
    output = np.empty(max_out, dtype=np.uint32)
    ramp = np.arange(max_out, dtype=np.uint32)
    bor = np.bitwise_or
    hits = 0
    t0 = time.perf_counter()
    for r, (ids, n_in, n_out) in enumerate(reqs):
        nb = len(ids)
        # prompt token i = hash_ids[i // 512] * 512 + i % 512, as rows of
        # 512 (numpy's row-wise in-place add is the fastest way here)
        rows = prompt[:nb * 512].reshape(nb, 512)
        rows[:] = offsets
        rows += (ids * 512)[:, None]
        # output token m = 0x80000000 | r << 16 | m
        bor(ramp[:n_out], 0x80000000 | (r << 16), out=output[:n_out])
        hits += run(prompt[:n_in], output[:n_out])
    seconds = time.perf_counter() - t0
    st = pool.stats()
    pool.close()
    return {"seconds": seconds, "hit_tokens": hits, "blocks_allocated": st["allocated"],
            "requests": len(reqs)}


def replay_c(kvbm_bin, trace, limit, block_size, capacity):
    out = subprocess.run([kvbm_bin, "replay", str(trace), "--limit", str(limit), "--block-size",
                          str(block_size), "--capacity", str(capacity), "--json", "--no-progress"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(ROOT / "data" / "mooncake_conversation_trace.jsonl.gz"))
    ap.add_argument("--limit", type=int, default=0, help="first N requests (0: all)")
    ap.add_argument("--kvbm", default=str(ROOT / "build" / "kvbm"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=16384)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    reqs = load(a.trace, a.limit)
    limit = len(reqs)
    load0 = os.getloadavg()[0]
    rows = []
    for rep in range(a.reps):
        # Alternate which side runs first, so that a trend in the machine's
        # load does not favour one of them.
        if rep % 2:
            py = replay_python(reqs, a.block_size, a.capacity)
            c = replay_c(a.kvbm, a.trace, limit, a.block_size, a.capacity)
        else:
            c = replay_c(a.kvbm, a.trace, limit, a.block_size, a.capacity)
            py = replay_python(reqs, a.block_size, a.capacity)
        if (py["hit_tokens"], py["blocks_allocated"], py["requests"]) != \
           (c["hit_tokens"], c["blocks_allocated"], c["requests"]):
            print(f"bench_python_w1: the two replays differ: C {c} Python {py}", file=sys.stderr)
            return 1
        rows.append({"c_seconds": c["seconds"], "py_seconds": py["seconds"],
                     "ratio": c["seconds"] / py["seconds"]})
        if not a.json:
            print(f"rep {rep + 1}: C {c['seconds']:.3f} s, Python {py['seconds']:.3f} s, "
                  f"ratio {rows[-1]['ratio']:.3f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    result = {"workload": "W1", "requests": limit, "block_size": a.block_size, "capacity": a.capacity,
              "hit_tokens": c["hit_tokens"], "reps": rows, "ratio_median": statistics.median(ratios),
              "ratio_min": min(ratios), "ratio_max": max(ratios), "target": 0.5,
              "loadavg_before": load0, "loadavg_after": os.getloadavg()[0]}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"W1, {limit} requests, B {a.block_size}, C {a.capacity}: Python/C speed ratio "
              f"median {result['ratio_median']:.3f} (min {result['ratio_min']:.3f}, "
              f"max {result['ratio_max']:.3f}, {a.reps} reps; target >= 0.5); "
              f"load {load0:.2f} -> {result['loadavg_after']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
