#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `kvbm replay` rejects bad traces and options with an error naming the
# problem (exit 2), and fails cleanly when a request does not fit (exit 1).
set -uo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

expect() { # expected-exit expected-substring args...
  local code=$1 want=$2; shift 2
  local out rc
  out=$("$KVBM_BIN" replay "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL: replay $* -> exit $rc, stderr: $out (wanted exit $code and '$want')"
    fails=$((fails + 1))
  fi
}

good='{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1]}'
printf '%s\n%s\n' "$good" 'not json' > "$tmp/notjson"
printf '%s\n%s\n' "$good" '{"timestamp": 0, "input_length": 20, "hash_ids": [1]}' > "$tmp/missing"
printf '%s\n' '{"timestamp": 0, "input_length": 513, "output_length": 3, "hash_ids": [1]}' > "$tmp/toolong"
printf '%s\n' '{"timestamp": 0, "input_length": -5, "output_length": 3, "hash_ids": [1]}' > "$tmp/negative"
printf '%s\n' '{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [1, -2]}' > "$tmp/negid"
printf '%s\n' '{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [1' > "$tmp/unterminated"
printf '%s\n' '{"timestamp": 0, "input_length": 5.5, "output_length": 3, "hash_ids": [1]}' > "$tmp/fraction"
printf '%s\n' '{"timestamp": 0, "input_length": 5, "input_length": 5, "output_length": 3, "hash_ids": [1]}' > "$tmp/dup"
printf '%s\n' '{"timestamp": 0, "input_length": 4000, "output_length": 3, "hash_ids": [1,2,3,4,5,6,7,8]}' > "$tmp/big"

expect 2 "line 2: not a JSON object" "$tmp/notjson"
expect 2 "line 2: missing field 'output_length'" "$tmp/missing"
expect 2 "line 1: input_length 513 is beyond 512 * 1 hash_ids" "$tmp/toolong"
expect 2 "line 1: input_length: -5 is negative" "$tmp/negative"
expect 2 "line 1: hash_ids: -2 is negative" "$tmp/negid"
expect 2 "line 1: hash_ids: expected ',' or ']'" "$tmp/unterminated"
expect 2 "line 1: input_length: 5.5 is not an integer" "$tmp/fraction"
expect 2 "line 1: field 'input_length' appears twice" "$tmp/dup"
expect 2 "cannot open" "$tmp/does-not-exist"
expect 1 "does not fit in the pool" "$tmp/big" --capacity 10
expect 2 "--capacity: '0x10' is not a non-negative integer" "$tmp/big" --capacity 0x10
expect 2 "--capacity: 0 is out of range" "$tmp/big" --capacity 0
expect 2 "--block-size needs a value" "$tmp/big" --block-size
expect 2 "unknown option '--frobnicate'" --frobnicate
expect 2 "--hash: 'sha' is not native or dynamo" --hash sha

# A good trace with unknown extra fields and blank lines works.
printf '\n%s\n\n{"timestamp": 1.5, "extra": {"a": [1, "x\\"y", null]}, "input_length": 40, "output_length": 0, "hash_ids": [1]}\n' "$good" > "$tmp/good"
out=$("$KVBM_BIN" replay "$tmp/good" --json) || { echo "FAIL: good trace: $out"; fails=$((fails+1)); }
/usr/bin/python3 -c '
import json, sys
o = json.loads(sys.argv[1])
# 20 tokens then 40 tokens over the same hash id 1: the second matches one
# full block of 16 (at most L-1 = 39 tokens, so 2 blocks = 32 would need L > 32... 39//16 = 2)
assert o["requests"] == 2 and o["prompt_tokens"] == 60, o
assert o["hit_tokens"] == 16, o
' "$out" || fails=$((fails+1))

# The default run replays the bundled trace.
out=$("$KVBM_BIN" replay --limit 3 --json) || fails=$((fails+1))
grep -q '"requests":3' <<<"$out" || { echo "FAIL: default trace: $out"; fails=$((fails+1)); }
[ "$fails" -eq 0 ] && echo "all ok"
exit "$fails"
