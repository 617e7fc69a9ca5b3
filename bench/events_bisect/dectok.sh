#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/dectok.sh BUILD OUT: compiles dectok.c against the
# event codec of a build folder (old or new), then
#   OUT V K 320 7 [NB]     # ns per block event, best of 7 (V: vocabulary, 0 bench_events' ids; NB batches of different ids, 16 or 256/K)
#   dectok.sh BUILD OUT cg V K   # decoder Ir per block event under callgrind
#                                # ((Ir at 300 decodes - Ir at 100) / block events between)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd) out=$2
cc -O2 -g -D_GNU_SOURCE -std=c11 -I"$here/../../include" -I"$here/../../src" "$here/dectok.c" -o "$out" \
  "$build/libkvbm_event_codec.a" "$build/libkvbm_common.a" -lm
if [ "${3:-}" = cg ]; then
  v=$4 k=$5 d=$(mktemp -d)
  trap 'rm -rf "$d"' EXIT
  for n in 100 300; do
    valgrind --tool=callgrind --callgrind-out-file="$d/cg.$n" "$out" "$v" "$k" $n 1 >/dev/null 2>"$d/err.$n" ||
      { cat "$d/err.$n" >&2; exit 1; }
  done
  a=$(grep -m1 "^summary\|^totals" "$d/cg.100" | awk '{print $2}')
  b=$(grep -m1 "^summary\|^totals" "$d/cg.300" | awk '{print $2}')
  awk -v a="$a" -v b="$b" -v k="$k" -v v="$v" 'BEGIN { printf "V=%s K=%s decode Ir/block %.1f\n", v, k, (b - a) / (200 * 64 * k) }'
fi
