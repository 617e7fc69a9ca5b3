#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm transfer-bench runs end to end on a small configuration: both modes
# move every block (the checked mode verifies each one, or the command
# fails), with 0 and 2 hash threads; the JSON names the fabric ("ucx"),
# carries the memcpy bound and the modes' gbps with their spread (min <=
# median <= max), plain's ratio to memcpy and to ucx_perftest, checked's
# ratio to plain and its CPU bound, and the load. No speed is asserted
# here (that is the bench's job, on a quiet machine).
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
for m in ("memcpy", "blake3_1thread", "plain", "checked"):
    r = d[m]
    assert 0 < r["min_gbps"] <= r["gbps"] <= r["max_gbps"], d
for m in ("plain", "checked"):
    assert "ratio" not in d[m], d
p, c = d["plain"], d["checked"]
assert 0 < p["min_memcpy_ratio"] <= p["memcpy_ratio"] <= p["max_memcpy_ratio"], d
assert 0 < c["min_plain_ratio"] <= c["plain_ratio"] <= c["max_plain_ratio"], d
assert 0 < c["cpu_bound_plain_ratio"] <= 1, d
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
for bad in "--slots 10 --batch 4" "--blocks 0" "--rounds 0" "--bogus" "--layer-separate" "--batch 2 --slots 256" "--hash-threads 257" "--hash-threads x"; do
  rc=0
  # shellcheck disable=SC2086
  "$KVBM_BIN" transfer-bench $bad --no-reference >/dev/null 2>&1 || rc=$?
  [ "$rc" = 2 ] || { echo "usage '$bad': exit $rc" >&2; exit 1; }
done
echo "transfer-bench: ok"
