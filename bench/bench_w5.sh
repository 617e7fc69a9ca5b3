#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_w5.sh: W5 (../shared/WORKLOADS.md's Mooncake trace through a whole
# cluster, issue 23), the longer run. For each routing policy (KV-aware via
# the two router replicas, random, round robin), with and without G4 (a
# Redis Cluster shared by the workers), one `kvbm cluster` run with no
# faults; then the KV-aware run with G4 under the full default schedule for
# the recovery times. Each row gives the hit rate, its ratio to the
# KV-aware run with G4 of the same invocation (the peer measured in the
# same run), the routing quality against the ideal router (overlap of the
# chosen worker / the best overlap any worker's /blocks held when the
# request was sent), TTFT p50/p99 of the compute model, failed requests and
# the invariants. --repeat R runs every configuration R times and gives the
# median and the range of each figure.
#
#   bench/bench_w5.sh [--kvbm PATH] [--workers 4] [--limit 2000]
#                     [--time-scale 10] [--repeat 1] [--out DIR] [TRACE]
set -euo pipefail
KVBM=${KVBM_BIN:-build/kvbm}
WORKERS=4 LIMIT=2000 SCALE=10 REPEAT=1 OUT="" TRACE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kvbm) KVBM=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --time-scale) SCALE=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '3,19p' "$0"; exit 0 ;;
    -*) echo "bench_w5: unknown option $1" >&2; exit 2 ;;
    *) TRACE=$1; shift ;;
  esac
done
[ -x "$KVBM" ] || { echo "bench_w5: no kvbm binary at $KVBM (--kvbm)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
common=(--workers "$WORKERS" --limit "$LIMIT" --time-scale "$SCALE" --json --quiet)
[ -n "$TRACE" ] && common=("$TRACE" "${common[@]}")
for rep in $(seq 1 "$REPEAT"); do
  for g4 in g4 nog4; do
    for routing in kv random round-robin; do
      extra=(); [ "$g4" = nog4 ] && extra=(--no-g4)
      echo "bench_w5: $routing $g4 run $rep" >&2
      "$KVBM" cluster "${common[@]}" --routing "$routing" --faults none "${extra[@]}" \
        > "$OUT/$routing-$g4-$rep.json" || true
    done
  done
  echo "bench_w5: kv g4 with the default fault schedule, run $rep" >&2
  "$KVBM" cluster "${common[@]}" --faults default --svg "$OUT/faults-$rep.svg" \
    > "$OUT/faults-$rep.json" || true
done
/usr/bin/python3 - "$OUT" "$REPEAT" "$WORKERS" "$LIMIT" "$SCALE" <<'PY'
import json, os, statistics, sys
out, rep = sys.argv[1], int(sys.argv[2])
def load(name):
    rs = []
    for i in range(1, rep + 1):
        p = os.path.join(out, "%s-%d.json" % (name, i))
        try:
            rs.append(json.load(open(p)))
        except (OSError, ValueError):
            pass
    return rs
def fig(xs, fmt="%.3f"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = statistics.median(xs)
    return (fmt % m) + ("" if len(xs) == 1 else (" [" + fmt % min(xs) + ".." + fmt % max(xs) + "]"))
peer = [r["hit_rate"] for r in load("kv-g4")]
print("W5 (Mooncake trace, first %s requests, time-scale %s, %s workers): no faults\n" %
      (sys.argv[4], sys.argv[5], sys.argv[3]))
print("| routing | G4 | hit rate | / KV-aware with G4 | routing quality vs ideal | TTFT p50 ms | TTFT p99 ms | failed | invariants |")
print("|---|---|---|---|---|---|---|---|---|")
for g4 in ("g4", "nog4"):
    for routing in ("kv", "random", "round-robin"):
        rs = load("%s-%s" % (routing, g4))
        if not rs:
            continue
        ratio = [r["hit_rate"] / p for r, p in zip(rs, peer) if r["hit_rate"] and p]
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            routing, "yes" if g4 == "g4" else "no", fig([r["hit_rate"] for r in rs]), fig(ratio),
            fig([(r["routing_vs_ideal"] or {}).get("quality") for r in rs]),
            fig([r["ttft_ms"]["p50"] for r in rs], "%.0f"), fig([r["ttft_ms"]["p99"] for r in rs], "%.0f"),
            fig([r["requests_failed"] for r in rs], "%d"),
            "ok" if all(not r["violations"] for r in rs) else "BROKEN: " + "; ".join(
                v for r in rs for v in r["violations"][:2])))
fs = load("faults")
if fs:
    print("\nKV-aware with G4 under the default fault schedule: recovery_s (outage_s) per fault\n")
    print("| fault | target | how (real, emulated, skipped) | recovery_s | outage_s |")
    print("|---|---|---|---|---|")
    for i, f in enumerate(fs[0]["faults"]):
        how = sorted({str(r["faults"][i].get("mode") or
                          ("skipped: " + r["faults"][i]["skipped"] if r["faults"][i].get("skipped")
                           else "process" if f["fault"] in ("worker_kill", "redis_master_kill",
                                                            "router_kill", "nats_restart",
                                                            "nats_kill") else "knob"))
                      for r in fs})
        print("| %s | %s | %s | %s | %s |" % (f["fault"], f["target"], "; ".join(how),
              fig([r["faults"][i].get("recovery_s") for r in fs]),
              fig([r["faults"][i].get("outage_s") for r in fs])))
    print("\nhit rate %s, failed %s, invariants %s" % (
        fig([r["hit_rate"] for r in fs]), fig([r["requests_failed"] for r in fs], "%d"),
        "ok" if all(not r["violations"] for r in fs) else "BROKEN: " + "; ".join(
            v for r in fs for v in r["violations"][:3])))
print("\n(reports in %s)" % out)
PY
