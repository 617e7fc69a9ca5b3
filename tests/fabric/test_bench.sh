#!/usr/bin/env bash
# kvbm transfer-bench runs end to end on a small configuration: both modes
# move every block (the checked mode verifies each one, or the command
# fails), the JSON carries gbps / reference_gbps / ratio for each mode, and
# the ratio is the quotient of the two. No speed is asserted here (that is
# the bench's job, on a quiet machine).
set -euo pipefail
: "${KVBM_BIN:?}"
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
SMALL=(--layers 2 --inner 256 --page-size 16 --blocks 64 --slots 16 --batch 4 --rounds 2 --tls shm,self)

"$KVBM_BIN" transfer-bench "${SMALL[@]}" --no-reference --json >"$T/noref.json"
"$PY" - "$T/noref.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["workload"] == "W4 remote", d
assert d["block_bytes"] == 2 * 16 * 256 * 2, d
assert d["blocks"] == 64
for m in ("plain", "checked"):
    assert d[m]["gbps"] > 0, d
    assert "ratio" not in d[m], d
PY

if command -v ucx_perftest >/dev/null; then
  "$KVBM_BIN" transfer-bench "${SMALL[@]}" --json >"$T/ref.json"
  "$PY" - "$T/ref.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for m in ("plain", "checked"):
    r = d[m]
    assert r["gbps"] > 0 and r["reference_gbps"] > 0, d
    assert abs(r["ratio"] - r["gbps"] / r["reference_gbps"]) < 0.01 * r["ratio"] + 0.002, d
assert d["plain"]["reference_gbps"] == d["checked"]["reference_gbps"]
PY
fi

# a missing reference tool is an error, not a silent ratio-less run
rc=0
"$KVBM_BIN" transfer-bench "${SMALL[@]}" --perftest /nonexistent/ucx_perftest >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 1 ] || { echo "missing perftest: exit $rc" >&2; exit 1; }
grep -q "ucx_perftest" "$T/err"

# usage errors
for bad in "--slots 10 --batch 4" "--blocks 0" "--rounds 0" "--bogus" "--layer-separate" "--batch 2 --slots 256"; do
  rc=0
  # shellcheck disable=SC2086
  "$KVBM_BIN" transfer-bench $bad --no-reference >/dev/null 2>&1 || rc=$?
  [ "$rc" = 2 ] || { echo "usage '$bad': exit $rc" >&2; exit 1; }
done
echo "transfer-bench: ok"
