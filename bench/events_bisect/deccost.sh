#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/deccost.sh BUILD K FORM [GENERAL [MIXED]]: the decoder's
# instructions per block event under callgrind (deccost.c compiled against
# BUILD's codec; the difference between 300 and 900 decodes of one batch of
# 256 events, over the block events between them). FORM 1 map, 0
# positional; GENERAL 1: the general reader only (no quick path); MIXED 1:
# random ids below 150000 (uint16 and uint32 mixed) instead of bench_events'.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd) k=$2 form=$3 general=${4:-0} mixed=${5:-0}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cc -O2 -g -D_GNU_SOURCE -std=c11 -I"$here/../../include" -I"$here/../../src" "$here/deccost.c" \
  -o "$d/deccost" "$build/libkvbm_event_codec.a" "$build/libkvbm_common.a" -lm
for n in 300 900; do
  valgrind --tool=callgrind --callgrind-out-file="$d/cg.$n" "$d/deccost" "$k" "$form" $n "$general" "$mixed" \
    >/dev/null 2>"$d/err.$n" || { cat "$d/err.$n" >&2; exit 1; }
done
a=$(grep -m1 "^summary\|^totals" "$d/cg.300" | awk '{print $2}')
b=$(grep -m1 "^summary\|^totals" "$d/cg.900" | awk '{print $2}')
awk -v a="$a" -v b="$b" -v k="$k" 'BEGIN { printf "decode Ir/block %.1f\n", (b - a) / (600 * 256 * k) }'
