#!/usr/bin/env bash
# events_fuzz.sh: libFuzzer on the KV event payload decoder
# (tests/events/fuzz/fuzz_decode.c) for EVENTS_FUZZ_SECONDS (default 30),
# with ASan+UBSan, seeded with payloads in both wire forms. Only the codec
# files are compiled (no sockets). A crash, leak, UB report or timeout
# fails the step; the reproducer is left in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${EVENTS_FUZZ_SECONDS:-30}
out=build-fuzz
CC=${FUZZ_CC:-clang}
command -v "$CC" >/dev/null || { echo "events_fuzz: $CC not found" >&2; exit 1; }
mkdir -p "$out/corpus/events_decode"
"$CC" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -fno-omit-frame-pointer -Iinclude -Isrc \
  src/common/*.c src/events/codec.c src/events/event.c tests/events/fuzz/fuzz_decode.c \
  $(pkg-config --cflags msgpack) -o "$out/fuzz_events_decode"
# seeds: a vLLM-style payload in each form, written by python3-msgpack
/usr/bin/python3 - "$out/corpus/events_decode" <<'PY'
import msgpack, sys, os
d = sys.argv[1]
pos = [1.5, [["BlockStored", [1, 2**64 - 1, b"\x01" * 32], None, [1, 2, 300, 70000], 2, None, "GPU", None],
             ["BlockRemoved", [-5], "CPU", 3], ["AllBlocksCleared"]], 0]
mp = [2.0, [{"type": "BlockStored", "block_hashes": [7], "parent_block_hash": 6, "token_ids": [1],
             "block_size": 1, "lora_id": 3, "medium": "NVME", "lora_name": "x", "group_idx": 1},
            {"type": "BlockRemoved", "block_hashes": [7], "medium": None}], 4]
bm = {"ts": 3, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 1}
for name, obj in (("pos", pos), ("map", mp), ("batchmap", bm)):
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(msgpack.packb(obj, use_bin_type=True))
PY
if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$out/fuzz_events_decode" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
     -print_final_stats=1 -artifact_prefix="$out/fuzz_events_decode-" \
     "$out/corpus/events_decode" >"$out/fuzz_events_decode.log" 2>&1; then
  echo "events fuzz FAILED; log $out/fuzz_events_decode.log:" >&2
  tail -n 40 "$out/fuzz_events_decode.log" >&2
  exit 1
fi
grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$out/fuzz_events_decode.log" | tr '\n' ' '
echo
