#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The W1-hybrid reference (tests/workload/hybrid_ref.py) states vLLM's hybrid
# KV cache rules; this test pins it down:
#  1. with --groups full its counts equal W1's oracle (../shared/tools/
#     ref_replay.py) on the bundled trace and on a synthetic one;
#  2. tiny synthetic traces with every number derived by hand below: the
#     sliding-window release between chunks, the hit rules of sw, chunk and
#     mamba groups (both of vLLM's Mamba caching modes), and a request that
#     cannot fit refused with nothing changed;
#  3. hostile group lists refused with a message.
# Block size 4 in the synthetic cases; a trace line's prompt is
# hash_ids[0]*512 + i, so equal hash ids give equal prompts.
set -euo pipefail
PY=/usr/bin/python3
REF="$KVBM_SOURCE_DIR/tests/workload/hybrid_ref.py"
ORACLE="$KVBM_SHARED_DIR/tools/ref_replay.py"
BUNDLED="$KVBM_SOURCE_DIR/data/mooncake_conversation_trace.jsonl.gz"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

trace() { # FILE "L O HASH" ...  -> one request a line
  local f=$1; shift
  : >"$f"
  for r in "$@"; do
    set -- $r
    echo "{\"timestamp\": 0, \"input_length\": $1, \"output_length\": $2, \"hash_ids\": [$3]}" >>"$f"
  done
}

expect() { # "k=v k=v ..." then reference arguments (dense retention unless they say)
  local want=$1; shift
  local got ret=(--prefix-cache-retention-interval none)
  case " $* " in *" --prefix-cache-retention-interval "*) ret=() ;; esac
  got=$($PY "$REF" "$@" "${ret[@]}" --json)
  $PY - "$want" "$got" "$*" <<'PY'
import json, sys
want, got, args = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
bad = []
for kv in want.split():
    k, v = kv.split("=")
    if json.loads(v) != got[k]:
        bad.append("%s: want %s got %s" % (k, v, got[k]))
if bad:
    sys.exit("hybrid_ref %s\n  " % args + "\n  ".join(bad))
print("ok", args)
PY
}

same_as_w1() { # TRACE ref_replay-args... : hybrid_ref --groups full == oracle
  local t=$1; shift
  local want got
  want=$($PY "$ORACLE" "$t" "$@")
  got=$($PY "$REF" "$t" --groups full "$@" --json)
  $PY - "$want" "$got" "$*" <<'PY'
import json, sys
want, got = json.loads(sys.argv[1]), json.loads(sys.argv[2])
keys = ["requests", "prompt_tokens", "hit_tokens", "blocks_allocated"]
diff = {k: (want[k], got[k]) for k in keys if want[k] != got[k]}
if diff:
    sys.exit("--groups full differs from W1 (oracle, reference) %s: %r" % (sys.argv[3], diff))
assert got["refused"] == 0 and want["hit_tokens"] > 0, (want, got)
print("ok W1", sys.argv[3], {k: got[k] for k in keys})
PY
}

# ---- 1. --groups full is W1 (the oracle reads plain jsonl)
zcat "$BUNDLED" >"$TMP/trace.jsonl"
same_as_w1 "$TMP/trace.jsonl" --limit 300
same_as_w1 "$TMP/trace.jsonl" --limit 400 --capacity 8000
same_as_w1 "$TMP/trace.jsonl" --limit 300 --block-size 32 --capacity 9000
# and the gz reader gives the same as the plain file
a=$($PY "$REF" "$BUNDLED" --groups full --limit 50 --json)
b=$($PY "$REF" "$TMP/trace.jsonl" --groups full --limit 50 --json)
[ "$a" = "$b" ] || { echo "gz and plain trace differ"; exit 1; }

# ---- 2a. sliding-window hit: only the last ceil((W-1)/B) blocks are needed.
# sw:8, B 4 -> 2 contiguous blocks. Capacity 5, chunks of 4 tokens.
# r0 (L16,O1,id1): chunks [0,4) [4,8) [8,12) [12,16) take blocks b0..b3; the
#   window frees b0 before the 4th chunk and b1 before the decode step
#   (remove_skipped_blocks: skipped = computed - 8 + 1), the decode takes b4.
#   Held at most 3; 5 allocated; end: LRU = b0 b1 b3 b2 (b4, unfilled, fresh).
# r1 (L5,O0,id2): 2 blocks: the fresh one, then evicts b0. No hit.
# r2 (L16,O1,id1): max hit 15 -> blocks 0..2; right to left: b2, b1 cached
#   = 2 contiguous -> hit 12 tokens although b0 is gone (full attention would
#   stop at block 0). Its chunk [12,16) needs 1 new block (its content is b3,
#   still cached: dedup shares b3) and the decode 1 more: 2 allocated.
# Totals: prompt 37, hits 12, allocated 5+2+2 = 9, peak 3.
trace "$TMP/sw.jsonl" "16 1 1" "5 0 2" "16 1 1"
expect "requests=3 prompt_tokens=37 hit_tokens=12 blocks_allocated=9 peak_blocks_held=3 refused=0" \
  "$TMP/sw.jsonl" --groups sw:8 --block-size 4 --capacity 5 --max-num-batched-tokens 4
same_as_w1 "$TMP/sw.jsonl" --block-size 4 --capacity 5

# ---- 2b. the window is released between chunks.
# full,sw:8, B 4, one request L32 O1 (33 tokens, 9 blocks a group).
# One step: the prompt takes 8+8 = 16 blocks at once (peak 16); before the
#   decode step the window frees sw blocks 0..5, the decode adds 1 a group.
# Chunks of 8: before chunk k (computed 8k) the sw group frees every block
#   below (8k-7)//4, so it holds at most 2 old + 2 new = 4; full grows to 9;
#   peak total 12 (after chunk 4 and after the decode). 18 allocated either way.
trace "$TMP/one.jsonl" "32 1 5"
expect "hit_tokens=0 blocks_allocated=18 blocks_allocated_per_group=[9,9] peak_blocks_held=16 peak_blocks_held_per_group=[9,8]" \
  "$TMP/one.jsonl" --groups full,sw:8 --block-size 4 --capacity 100
expect "hit_tokens=0 blocks_allocated=18 blocks_allocated_per_group=[9,9] peak_blocks_held=12 peak_blocks_held_per_group=[9,4]" \
  "$TMP/one.jsonl" --groups full,sw:8 --block-size 4 --capacity 100 --max-num-batched-tokens 8

# ---- 2c. a request that cannot fit is refused, nothing changed; full blocks
# alone are no hit for a sliding-window model.
# Capacity 12, r0 = the request above, r1 (L8,O1, same id: same first 8 tokens).
# One step: r0 needs 16 > 12 blocks: refused, so r1 finds nothing cached: hit
#   0, 2+2 blocks for its prompt and 1+1 for its 9th token: 6 allocated.
# Chunks of 8: r0 fits (peak 12 = capacity) but its later chunks evict the sw
#   blocks it freed (0..5); r1's max hit is 1 block: full has it, sw does not
#   -> hit 0. r1 allocates 6 again (its full block 0 dedups onto r0's): 24.
trace "$TMP/refuse.jsonl" "32 1 5" "8 1 5"
expect "requests=2 prompt_tokens=40 hit_tokens=0 refused=1 blocks_allocated=6 peak_blocks_held=6" \
  "$TMP/refuse.jsonl" --groups full,sw:8 --block-size 4 --capacity 12
expect "requests=2 prompt_tokens=40 hit_tokens=0 refused=0 blocks_allocated=24 peak_blocks_held=12 peak_blocks_held_per_group=[9,4]" \
  "$TMP/refuse.jsonl" --groups full,sw:8 --block-size 4 --capacity 12 --max-num-batched-tokens 8

# ---- 2d. mamba ("all" mode, vLLM's default for models declaring
# SupportsMambaPrefixCaching): a state block per block of tokens; a hit needs
# the state saved at that boundary. full,mamba, B 4, no chunk limit.
# r0 (L10,O2,id7): one step: full 3 blocks, mamba 3 (states at 4, 8 cached,
#   the third running); before the first decode the mamba group frees all
#   but its last block (skipped = computed - 1). Peak 3+3 = 6.
# r1 (L10,O1,id7): max hit 9 -> 2 blocks: full has both, mamba has the state
#   at 8 -> hit 8. New: 1 a group.
# r2 (L6,O1,id7): max hit 5 -> 1 block: full has it, mamba has the state at
#   4 -> hit 4. New: 1 a group.
# Totals: prompt 26, hits 12, allocated full 3+1+1, mamba 3+1+1.
trace "$TMP/mamba.jsonl" "10 2 7" "10 1 7" "6 1 7"
expect "prompt_tokens=26 hit_tokens=12 blocks_allocated_per_group=[5,5] peak_blocks_held=6 peak_blocks_held_per_group=[3,3]" \
  "$TMP/mamba.jsonl" --groups full,mamba --block-size 4 --capacity 100
# mamba-align ("align" mode, the default for the other Mamba models), same
# trace; the scheduler cuts a prompt at its last block boundary
# (_mamba_block_aligned_split) even without a chunk limit.
# r0: steps [0,8) [8,10) then 2 decodes. Mamba: [null, m1] then m2 at index
#   2; m1 (state after 8 tokens) is cached and freed before the first decode.
#   Full 3 blocks, mamba 2; peak 3+2 = 5.
# r1: full has blocks 0,1, mamba the state at 8 -> hit 8. New: 1 a group.
# r2: max hit 1 block; full has it, mamba has no state at 4 -> hit 0.
#   Steps [0,4) [4,6): full 2 blocks (block 0 dedups), mamba 2.
# Totals: prompt 26, hits 8, allocated full 3+1+2 = 6, mamba 2+1+2 = 5.
expect "prompt_tokens=26 hit_tokens=8 blocks_allocated_per_group=[6,5] peak_blocks_held=5 peak_blocks_held_per_group=[3,2]" \
  "$TMP/mamba.jsonl" --groups full,mamba-align --block-size 4 --capacity 100

# A chunk limit below one block: the aligned split rounds a chunk that ends
# before the prompt's last block boundary down to 0 tokens, so vLLM never
# schedules the request; here it is refused. B 4, --max-num-batched-tokens 2.
# r0 (L10,O1): boundary 8, first chunk [0,2) -> 0 tokens: refused.
# r1 (L3,O1): no block boundary inside the prompt: chunks [0,2) [2,3), then
#   the decode fills block 0: 1 block a group, registered, no hit.
trace "$TMP/stall.jsonl" "10 1 7" "3 1 8"
expect "requests=2 prompt_tokens=13 refused=1 hit_tokens=0 blocks_allocated_per_group=[1,1] peak_blocks_held=2" \
  "$TMP/stall.jsonl" --groups full,mamba-align --block-size 4 --capacity 100 --max-num-batched-tokens 2

# ---- 2e. chunked local attention: blocks before the current chunk are skipped.
# full,chunk:8, B 4.
# r0 (L16,O1,id3): 4+4 blocks, all cached; before the decode the chunk group
#   frees all 4 (16//8*8 = 16 skipped) and both groups add 1: peak 8.
# r1 (L13,O1): max hit 12; chunk start 8 -> needs only block 2 -> hit 12.
#   New: 1 a group.
# r2 (L10,O1): max hit 9 -> 8 = a chunk boundary: the chunk group needs no
#   block at all -> hit 8. New: 1 a group.
# Totals: prompt 39, hits 20, allocated 7 + 7.
trace "$TMP/chunk.jsonl" "16 1 3" "13 1 3" "10 1 3"
expect "prompt_tokens=39 hit_tokens=20 blocks_allocated_per_group=[7,7] peak_blocks_held=8 peak_blocks_held_per_group=[5,4]" \
  "$TMP/chunk.jsonl" --groups full,chunk:8 --block-size 4 --capacity 100

# ---- 2g. sparse retention (vLLM's prefix_cache_retention_interval 0, the
# reference's default): full,sw:32, B 16 (a hit needs cdiv(31, 16) = 2
# window blocks ending at it), three prompts of 600 tokens sharing their
# first 512 (hash ids [1,2], [1,3], [1,4]), O 1, capacity 1000 (nothing
# evicted).
# Dense: r0 caches every block; r1 and r2 hit 512 (full blocks 0..31, window
#   blocks 30, 31 cached): 1024.
# Sparse: r0's window group caches only blocks 35, 36 (ending at its prompt
#   end, (600 - 1) // 16 = 37). r1: full attention alone would hit 512, the
#   window has no 2-block run ending at or below block 32 (and block 0 is
#   not cached): hit 0; the junction is 512, so r1 caches window blocks 30,
#   31 (ending at 32) besides 35, 36. r2: full 512, window blocks 30, 31
#   cached: hit 512. Total 512. Mamba (one state block ending at each
#   boundary: block 31 for the junction) gives the same.
printf '%s\n' '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}' \
  '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 3]}' \
  '{"timestamp": 2, "input_length": 600, "output_length": 1, "hash_ids": [1, 4]}' >"$TMP/junction.jsonl"
expect "hit_tokens=1024" "$TMP/junction.jsonl" --groups full,sw:32 --capacity 1000 --prefix-cache-retention-interval none
expect "hit_tokens=512" "$TMP/junction.jsonl" --groups full,sw:32 --capacity 1000 --prefix-cache-retention-interval 0
expect "hit_tokens=512" "$TMP/junction.jsonl" --groups full,mamba --capacity 1000 --prefix-cache-retention-interval 0
got=$($PY "$REF" "$TMP/junction.jsonl" --groups full,sw:32 --capacity 1000 --json)
case "$got" in *'"hit_tokens": 512'*'"prefix_cache_retention_interval": "0"'*) echo "ok sparse is the default" ;;
  *) echo "the reference's default is not vLLM's sparse retention: $got"; exit 1 ;; esac

# ---- 2f. the named mixes expand to vLLM's groups
$PY - "$REF" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("hybrid_ref", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
assert m.parse_groups(m.MIXES["gpt-oss"]) == [("full", 0), ("sw", 128)]
assert m.parse_groups(m.MIXES["gemma3"]) == [("full", 0)] + [("sw", 1024)] * 5
assert m.parse_groups(m.MIXES["mamba-hybrid"]) == [("full", 0)] + [("mamba", 0)] * 6
print("ok mixes")
PY

# ---- 3. hostile group lists are refused with a message
for bad in "" "full,xyz" "sw:0" "sw" "chunk:-4" "mamba:3" "mamba-align:2" "full,,sw:8" "sw:abc" "full:16"; do
  if err=$($PY "$REF" "$TMP/one.jsonl" --groups "$bad" --json 2>&1); then
    echo "--groups '$bad' accepted: $err"; exit 1
  fi
  case "$err" in *--groups*) ;; *) echo "--groups '$bad': no message naming it: $err"; exit 1 ;; esac
done
if $PY "$REF" "$TMP/one.jsonl" --groups full --capacity 0 --json 2>/dev/null; then
  echo "capacity 0 accepted"; exit 1
fi
echo "ok hostile"
