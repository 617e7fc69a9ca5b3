#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# fuzz.sh: build every libFuzzer target fuzz/fuzz_<x>.c with clang
# (-fsanitize=fuzzer,address,undefined) and run each for a bounded time.
#
# A target names the modules it needs on a line of its opening comment:
#     * fuzz-modules: common blake3 frame
# and is compiled together with every .c file of those src/<module>/
# folders (no CMake involved, so a fuzz build never disturbs the others);
# an entry <module>/<file>.c takes that one file of a module.
# Without such a line it gets "common blake3 frame layout". A line
#     * fuzz-libs: z xxhash
# adds -l flags for the libraries those modules use. Seeds come from
# fuzz/corpus/<x>/ (read only); new inputs go to build-fuzz/corpus/<x>/.
# A crash, leak, UB report or timeout fails the step; the reproducer is
# left in build-fuzz/ (crash-*, leak-*, timeout-*).
#
#   FUZZ_SECONDS=30   time per target
#   FUZZ_TARGETS="frame layout"   only these targets
set -euo pipefail
cd "$(dirname "$0")/../.."

secs=${FUZZ_SECONDS:-30}
out=build-fuzz
CC=${FUZZ_CC:-clang}
command -v "$CC" >/dev/null || { echo "fuzz: $CC not found (install clang and libclang-rt-14-dev)" >&2; exit 1; }
mkdir -p "$out"

status=0
for src in fuzz/fuzz_*.c; do
  [ -e "$src" ] || continue
  name=$(basename "$src" .c)
  x=${name#fuzz_}
  if [ -n "${FUZZ_TARGETS:-}" ] && [[ " $FUZZ_TARGETS " != *" $x "* ]]; then
    continue
  fi
  mods=$(sed -n '1,20{s/.*fuzz-modules:[[:space:]]*\([a-z0-9_ ./]*\).*/\1/p}' "$src" | head -n 1)
  [ -n "$mods" ] || mods="common blake3 frame layout"
  libs=()
  for l in $(sed -n '1,20{s/.*fuzz-libs:[[:space:]]*\([a-z0-9_ ]*\).*/\1/p}' "$src" | head -n 1); do
    libs+=("-l$l")
  done
  srcs=()
  for m in $mods; do
    if [[ $m == */*.c ]]; then
      srcs+=("src/$m")
      continue
    fi
    for f in src/"$m"/*.c; do
      [ -e "$f" ] && srcs+=("$f")
    done
  done
  echo "== fuzz $x: modules: $mods"
  "$CC" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -fno-omit-frame-pointer -Iinclude -Isrc \
    "${srcs[@]}" "$src" -o "$out/$name" "${libs[@]}" -lm
  mkdir -p "$out/corpus/$x"
  seeds=()
  [ -d "fuzz/corpus/$x" ] && seeds+=("fuzz/corpus/$x")
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
       UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       "$out/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$out/$name-" \
       "$out/corpus/$x" "${seeds[@]}" >"$out/$name.log" 2>&1; then
    echo "fuzz $x FAILED; log $out/$name.log:" >&2
    tail -n 40 "$out/$name.log" >&2
    status=1
  else
    grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$out/$name.log" | tr '\n' ' '
    echo
  fi
done
exit $status
