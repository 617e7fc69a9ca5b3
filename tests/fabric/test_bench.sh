#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm transfer-bench runs end to end on a small configuration: every mode
# moves every block (the checked modes verify each one, or the command
# fails), with 0 and 2 hash threads; the JSON names the fabric ("ucx"),
# carries the memcpy bound and the modes' gbps with their spread (min <=
# median <= max), plain's ratio to memcpy and to ucx_perftest, the checked
# modes' ratios to plain and to their CPU bounds, and the load. Checked
# (the sum kept since the block was written, issue 22) hashes nothing at
# the sender and the receiver hashes each byte once; rehash hashes every
# block it sends, warm-up included, at both ends; pulled (the receiver
# reads each block from the sender and hashes it as it lands) hashes
# nothing at the sender and each byte once at the receiver; every mode
# reports the CPU each end spent per byte, and the checked modes that
# against the work (one copy + one hash per byte); one
# hash per byte bounds checked no lower than two bound rehash, and neither
# bound is above plain. No speed is asserted here (that is the bench's
# job, on a quiet machine).
set -euo pipefail
: "${KVBM_BIN:?}"
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
SMALL=(--layers 2 --inner 256 --page-size 16 --blocks 64 --slots 16 --batch 4 --rounds 2 --tls shm,self)

for threads in 0 2; do
  "$KVBM_BIN" transfer-bench "${SMALL[@]}" --hash-threads "$threads" --no-reference --json >"$T/noref.json"
  "$PY" - "$T/noref.json" "$threads" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["workload"] == "W4 remote" and d["fabric"] == "ucx", d
assert d["block_bytes"] == 2 * 16 * 256 * 2, d
assert d["blocks"] == 64 and d["hash_threads"] == int(sys.argv[2]) and d["cores"] >= 1, d
assert d["load_before"] >= 0 and d["load_after"] >= 0, d
for m in ("memcpy", "blake3_1thread", "plain", "checked", "pulled", "rehash"):
    r = d[m]
    assert 0 < r["min_gbps"] <= r["gbps"] <= r["max_gbps"], d
for m in ("plain", "checked", "pulled", "rehash"):
    assert "ratio" not in d[m], d
    # CPU per byte moved at each end, and their sum with its spread
    u = d[m]["cpu_ns_per_byte"]
    assert u["sender"] >= 0 and u["receiver"] >= 0, d
    assert 0 < u["min_total"] <= u["total"] <= u["max_total"], d
p, c, h, q = d["plain"], d["checked"], d["rehash"], d["pulled"]
assert 0 < p["min_memcpy_ratio"] <= p["memcpy_ratio"] <= p["max_memcpy_ratio"], d
for x in (c, h, q):
    assert 0 < x["min_plain_ratio"] <= x["plain_ratio"] <= x["max_plain_ratio"], d
    assert 0 < x["min_bound_ratio"] <= x["bound_ratio"] <= x["max_bound_ratio"], d
    assert 0 < x["cpu_bound_plain_ratio"] <= 1, d
assert 0 < c["min_cpu_bound_gbps"] <= c["cpu_bound_gbps"] <= c["max_cpu_bound_gbps"] <= p["max_gbps"], d
assert 0 < h["cpu_bound_gbps"] <= c["cpu_bound_gbps"], d
assert h["cpu_bound_plain_ratio"] <= c["cpu_bound_plain_ratio"], d
# hashed at the sender: nothing with the kept sums; every block sent
# (the warm-up ring of 16 slots and the 64 timed blocks, per round) when rehashing
sent = 2 * (16 + 64) * d["block_bytes"]
assert c["sender_hashed_bytes"] == 0, d
assert h["sender_hashed_bytes"] == sent, d
# and the receiver hashed every byte it checked once, nothing in plain mode
assert c["receiver_hashed_bytes"] == sent and h["receiver_hashed_bytes"] == sent, d
# pulled: the receiver reads and hashes every block, the sender hashes
# nothing; both checked modes have the same work and bound
assert q["sender_hashed_bytes"] == 0 and q["receiver_hashed_bytes"] == sent, d
assert q["cpu_bound_gbps"] == c["cpu_bound_gbps"], d
# the work per byte (one copy + one hash, CPU time) against each checked mode's CPU
assert c["work_ns_per_byte"] > 0, d
for x in (c, q):
    assert 0 < x["min_work_cpu_ratio"] <= x["work_cpu_ratio"] <= x["max_work_cpu_ratio"], d
assert d["plain_receiver_hashed_bytes"] == 0, d
PY
done

if command -v ucx_perftest >/dev/null; then
  "$KVBM_BIN" transfer-bench "${SMALL[@]}" --json >"$T/ref.json"
  "$PY" - "$T/ref.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for m in ("plain", "checked"):
    r = d[m]
    assert r["gbps"] > 0 and r["reference_gbps"] > 0 and r["ratio"] > 0, d
p = d["plain"]
assert p["min_ratio"] <= p["ratio"] <= p["max_ratio"], d
c = d["checked"]
assert abs(c["ratio"] - c["gbps"] / c["reference_gbps"]) < 0.01 * c["ratio"] + 0.002, d
assert d["plain"]["reference_gbps"] == d["checked"]["reference_gbps"]
PY
fi

# a missing reference tool is an error, not a silent ratio-less run
rc=0
"$KVBM_BIN" transfer-bench "${SMALL[@]}" --perftest /nonexistent/ucx_perftest >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 1 ] || { echo "missing perftest: exit $rc" >&2; exit 1; }
grep -q "ucx_perftest" "$T/err"

# usage errors
for bad in "--slots 10 --batch 4" "--blocks 0" "--rounds 0" "--bogus" "--layer-separate" "--batch 2 --slots 256" "--hash-threads 257" "--hash-threads x" "--piece 3000" "--piece 512"; do
  rc=0
  # shellcheck disable=SC2086
  "$KVBM_BIN" transfer-bench $bad --no-reference >/dev/null 2>&1 || rc=$?
  [ "$rc" = 2 ] || { echo "usage '$bad': exit $rc" >&2; exit 1; }
done
echo "transfer-bench: ok"
