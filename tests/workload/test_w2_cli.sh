#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `kvbm replay` with tier flags runs W2: with G2 = G3 = 0 its W1 keys equal
# W1's own output; --json has the tiers and verify_failures; bad tier flags
# are named (exit 2); W1's output is unchanged without tier flags.
set -uo pipefail
tmp=$(mktemp -d "${KVBM_BINARY_DIR:-/tmp}/w2cli-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$KVBM_BIN" replay --limit 200 --json --no-progress > "$tmp/w1.json" || fail "W1 run"
"$KVBM_BIN" replay --limit 200 --json --no-progress --g2-blocks 0 --g3-blocks 0 --block-bytes 32 \
  > "$tmp/w2zero.json" || fail "W2 run with no lower tiers"
"$KVBM_BIN" replay --limit 300 --json --no-progress --capacity 8192 --g2-blocks 300000 \
  --g3-blocks 4096 --g3-dir "$tmp" --g3-policy all --block-bytes 32 > "$tmp/w2.json" || fail "W2 run"
/usr/bin/python3 - "$tmp" <<'PY' || fails=$((fails + 1))
import json, sys
d = sys.argv[1]
w1 = json.load(open(d + "/w1.json"))
z = json.load(open(d + "/w2zero.json"))
w2 = json.load(open(d + "/w2.json"))
bad = []
for k in ("requests", "prompt_tokens", "hit_tokens", "blocks_allocated", "block_size", "capacity", "hash"):
    if w1[k] != z[k]: bad.append(f"{k}: W1 {w1[k]} vs W2 {z[k]}")
for k in w1:
    if k not in z: bad.append(f"W2 lacks W1 key {k}")
for doc in (z, w2):
    for t in ("g1", "g2", "g3"):
        for k in ("hit_tokens", "offloaded_blocks", "onboarded_blocks"):
            if not isinstance(doc["tiers"][t].get(k), int): bad.append(f"tiers.{t}.{k} missing")
    if doc["verify_failures"] != 0: bad.append("verify failures")
    if sum(doc["tiers"][t]["hit_tokens"] for t in ("g1", "g2", "g3")) != doc["hit_tokens"]:
        bad.append("hit_tokens is not the sum over tiers")
if w2["tiers"]["g2"]["hit_tokens"] <= 0: bad.append("no G2 hits with a large G2")
if w2["tiers"]["g3"]["offloaded_blocks"] <= 0: bad.append("nothing written to G3")
if w2["hit_tokens"] < w1["hit_tokens"]: bad.append("W2 hits below W1's")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY

expect() { # expected-exit expected-substring args...
  local code=$1 want=$2; shift 2
  local out rc
  out=$("$KVBM_BIN" replay "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$want" <<<"$out"; then
    fail "replay $* -> exit $rc, stderr: $out (wanted exit $code and '$want')"
  fi
}
expect 2 "--g2-blocks" --g2-blocks x
expect 2 "--g3-blocks" --g3-blocks -1
expect 2 "not a multiple of 16" --g2-blocks 1 --block-bytes 17
expect 2 "--g3-policy" --g3-policy sometimes
expect 2 "not a writable directory" --g3-dir "$tmp/none" --g3-blocks 4
expect 2 "unknown option" --g2-blocks 1 --bogus
expect 1 "does not fit" --limit 5 --capacity 4 --g2-blocks 16
expect 2 "--g1-memory" --g1-memory gpu

# Device G1 (copies on CUDA streams): without a GPU (or a CUDA build) it
# fails cleanly and says why; with one, every onboard verifies.
out=$("$KVBM_BIN" replay --limit 100 --json --no-progress --g1-memory device --g2-blocks 4096 \
  --block-bytes 4096 2>"$tmp/dev.err"); rc=$?
if [ "$rc" -eq 0 ]; then
  grep -q '"verify_failures":0' <<<"$out" || fail "device G1 run: $out"
elif [ "$rc" -ne 1 ] || ! grep -q "needs a CUDA build and a GPU" "$tmp/dev.err"; then
  fail "device G1 -> exit $rc: $(cat "$tmp/dev.err")"
else
  echo "device G1 not run here: $(head -1 "$tmp/dev.err")"
fi

# Text output names the tiers.
out=$("$KVBM_BIN" replay --limit 50 --no-progress --g2-blocks 1024 --block-bytes 32) || fail "text run"
grep -q "W2 replay" <<<"$out" && grep -q "G2 " <<<"$out" || fail "text output: $out"

[ "$fails" -eq 0 ] && echo "ok" || exit 1
