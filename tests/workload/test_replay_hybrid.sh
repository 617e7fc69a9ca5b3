#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# W1-hybrid (issue 20): `kvbm replay --groups ... --json` gives the counts of
# the Python reference tests/workload/hybrid_ref.py (vLLM's KVCacheManager
# rules, docs/areas/hybrid.md) on the bundled trace, for the three mixes of
# hybrid.md (gpt-oss-like, Gemma-3-like, a Mamba hybrid) with and without
# --max-num-batched-tokens 8192, plus chunked local attention and Mamba's
# align mode; `--groups full` equals W1; a pool too small refuses requests
# without changing anything; hostile command lines are refused with a
# message and nothing printed on stdout.
set -euo pipefail
TRACE="$KVBM_SOURCE_DIR/data/mooncake_conversation_trace.jsonl.gz"
REF="$KVBM_SOURCE_DIR/tests/workload/hybrid_ref.py"
LIMIT=${KVBM_HYBRID_LIMIT:-150}

GPT_OSS="full,sw:128"
GEMMA3="full,sw:1024,sw:1024,sw:1024,sw:1024,sw:1024"
MAMBA_HYBRID="full,mamba,mamba,mamba,mamba,mamba,mamba"

compare() { # groups limit capacity mbt(0 = none) [retention: none or 0; default: both tools' own]
  local extra=() want got
  [ "$4" != 0 ] && extra=(--max-num-batched-tokens "$4")
  [ -n "${5:-}" ] && extra+=(--prefix-cache-retention-interval "$5")
  want=$(/usr/bin/python3 "$REF" "$TRACE" --groups "$1" --limit "$2" --capacity "$3" "${extra[@]}" --json)
  got=$("$KVBM_BIN" replay "$TRACE" --groups "$1" --limit "$2" --capacity "$3" "${extra[@]}" --json --no-progress 2>/dev/null)
  /usr/bin/python3 - "$want" "$got" "$1 cap $3 mbt $4 retention ${5:-default}" <<'PY'
import json, sys
want, got, what = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
keys = ["requests", "prompt_tokens", "hit_tokens", "refused", "blocks_allocated",
        "blocks_allocated_per_group", "peak_blocks_held", "peak_blocks_held_per_group"]
diff = {k: (want[k], got[k]) for k in keys if want[k] != got[k]}
if diff:
    sys.exit("%s: mismatch (reference, kvbm): %r" % (what, diff))
assert got["workload"] == "W1-hybrid" and got["requests"] > 0, got
assert len(got["blocks_allocated_per_group"]) == len(got["groups"].split(",")), got
print("ok", what, {k: got[k] for k in ["hit_tokens", "blocks_allocated", "peak_blocks_held", "refused"]})
PY
}

# dense retention (prefix_cache_retention_interval None: every full block
# cached)
for mbt in 0 8192; do
  compare "$GPT_OSS" "$LIMIT" 16384 "$mbt" none
  compare "$GEMMA3" "$LIMIT" 16384 "$mbt" none
  compare "$MAMBA_HYBRID" "$LIMIT" 16384 "$mbt" none
done
# other kinds and a small pool (eviction across groups, refusals)
compare "full,chunk:8192,mamba-align" 60 16384 8192 none
compare "full,chunk:1000,sw:100,mamba-align" 60 16384 0 none
compare "$GPT_OSS" 80 3000 2048 none
compare "$GEMMA3" 80 4000 0 none
# vLLM's default, sparse retention (prefix_cache_retention_interval 0, the
# default of both): window and Mamba blocks cached only at the prompt's
# end and the shared-prefix junction; the three mixes, both Mamba modes
# and small pools
for mix in "$GPT_OSS" "$GEMMA3" "$MAMBA_HYBRID"; do
  compare "$mix" "$LIMIT" 16384 8192
done
compare "$MAMBA_HYBRID" "$LIMIT" 16384 0 0
compare "full,chunk:8192,mamba-align" 60 16384 8192
compare "full,chunk:1000,sw:100,mamba-align" 60 16384 0 0
compare "$GPT_OSS" 80 3000 2048
compare "$GEMMA3" 80 4000 2048 0
# the orders the fast paths treat apart under sparse retention: a window
# group before full attention (no joint pass), a group that caches every
# block after one that does not, two full groups then a window, and a
# prompt stepped a token at a time (the decode edge meets kept blocks)
compare "sw:128,full" 80 3000 2048
compare "full,sw:64,chunk:512,mamba" 80 3000 2048
compare "full,full,sw:128" 80 4000 0
compare "full,sw:32,mamba" 12 2000 1
sparse=$("$KVBM_BIN" replay "$TRACE" --groups "$GEMMA3" --limit "$LIMIT" --max-num-batched-tokens 8192 --json --no-progress)
dense=$("$KVBM_BIN" replay "$TRACE" --groups "$GEMMA3" --limit "$LIMIT" --max-num-batched-tokens 8192 --prefix-cache-retention-interval none --json --no-progress)
/usr/bin/python3 - "$sparse" "$dense" <<'PY'
import json, sys
s, d = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert s["prefix_cache_retention_interval"] == 0 and d["prefix_cache_retention_interval"] is None, (s, d)
# the counts must differ: the window blocks between the boundaries are not
# cached, so fewer evictions of other blocks (and a different hit count)
assert (s["hit_tokens"], s["blocks_allocated"]) != (d["hit_tokens"], d["blocks_allocated"]), (s, d)
print("ok sparse differs from dense", s["hit_tokens"], d["hit_tokens"])
PY

# --groups full is W1: every count equal to the replay without groups
w1=$("$KVBM_BIN" replay "$TRACE" --limit 300 --capacity 9000 --json --no-progress)
h1=$("$KVBM_BIN" replay "$TRACE" --groups full --limit 300 --capacity 9000 --json --no-progress)
/usr/bin/python3 - "$w1" "$h1" <<'PY'
import json, sys
w, h = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for k in ["requests", "prompt_tokens", "hit_tokens", "blocks_allocated"]:
    assert w[k] == h[k], (k, w[k], h[k])
assert h["refused"] == 0 and h["blocks_allocated_per_group"] == [w["blocks_allocated"]], h
print("ok --groups full == W1", {k: h[k] for k in ["hit_tokens", "blocks_allocated"]})
PY

# a pool too small for every request: all refused, nothing allocated or hit
small=$("$KVBM_BIN" replay "$TRACE" --groups "$GPT_OSS" --limit 5 --capacity 40 --json --no-progress 2>"$KVBM_BINARY_DIR/hybrid_refused.err")
grep -q "request 0 refused: its blocks do not fit" "$KVBM_BINARY_DIR/hybrid_refused.err"
/usr/bin/python3 - "$small" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["requests"] == 5 and r["refused"] == 5, r
assert r["blocks_allocated"] == 0 and r["hit_tokens"] == 0 and r["peak_blocks_held"] == 0, r
print("ok refused without a change", r["refused"])
PY

# hostile command lines: exit 2, a message naming the problem, no report
refused() { # expected-message args...
  local want="$1" out err rc=0
  shift
  out=$("$KVBM_BIN" replay "$TRACE" --limit 3 --no-progress "$@" 2>"$KVBM_BINARY_DIR/hybrid_cli.err") || rc=$?
  err=$(cat "$KVBM_BINARY_DIR/hybrid_cli.err")
  if [ "$rc" != 2 ] || [ -n "$out" ] || ! grep -qF -- "$want" <<<"$err"; then
    echo "FAIL: $* -> rc $rc, stdout '$out', stderr '$err' (wanted '$want')"
    exit 1
  fi
  echo "ok refused: $* ($want)"
}
refused "unknown kind" --groups lstm
refused "unknown kind" --groups full,attention
refused "window must be" --groups full,sw:0
refused "chunk must be" --groups chunk:0
refused "window must be" --groups "full,sw:12abc"
refused "window is missing" --groups full,sw
refused "takes no parameter" --groups full:4
refused "item 1 is empty" --groups full,
refused "the list is empty" --groups ""
refused "more than 16 groups" --groups "$(printf 'full%.0s,' $(seq 16))full"
refused "cannot share a pool of 2 blocks" --groups full,sw:4,mamba --capacity 2
refused "--max-num-batched-tokens" --groups full --max-num-batched-tokens 0
refused "--max-num-batched-tokens" --groups full --max-num-batched-tokens lots
refused "need --groups (W1-hybrid)" --max-num-batched-tokens 8192
refused "need --groups" --prefix-cache-retention-interval 0
refused "want none" --groups full,sw:128 --prefix-cache-retention-interval 512
refused "want none" --groups full,sw:128 --prefix-cache-retention-interval -1
# With tier flags --groups is W2's (test_w2_groups_cli.sh); the chunked
# prefill is W1-hybrid's alone.
refused "unknown option '--max-num-batched-tokens'" --groups full --max-num-batched-tokens 64 --g2-blocks 10
refused "not supported with --groups" --groups full --metrics-port 0
refused "--groups needs a value" --groups
