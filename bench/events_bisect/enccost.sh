#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/enccost.sh BUILD [K] [VOCAB...]: enccost.c compiled
# against BUILD's event codec, run once per VOCAB (default: 0, the
# bench_events ids, and 32000 128256 201088, random ids of those
# vocabularies). Two builds are compared by running this for each in turn,
# alternately, while the machine is quiet.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd) k=${2:-16}
shift $(($# < 2 ? $# : 2))
vocabs=${*:-0 32000 128256 201088}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cc -O2 -g -D_GNU_SOURCE -std=c11 -I"$here/../../include" -I"$here/../../src" "$here/enccost.c" \
  -o "$d/enccost" "$build/libkvbm_event_codec.a" "$build/libkvbm_common.a" -lm
for v in $vocabs; do "$d/enccost" "$k" "$v"; done
