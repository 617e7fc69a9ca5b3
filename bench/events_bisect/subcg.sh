#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/subcg.sh BIN K FORM: the decoding subscriber's marginal instructions per
# block event under callgrind (its own process; the publisher runs natively).
set -eu
bin=$1 k=$2 form=$3
d=$(mktemp -d)
for n in 100000 300000; do
  valgrind --tool=callgrind --callgrind-out-file=$d/cg.$n "$bin" "$k" $n "$form" 1 2 >$d/out.$n 2>$d/err.$n &
  v=$!
  sleep 1
  "$bin" "$k" $n "$form" 1 1 >/dev/null
  wait $v || true
  grep -q "sub got $n" $d/out.$n || { echo "subscriber did not get all: $(cat $d/out.$n)" >&2; }
done
a=$(grep -m1 "^summary\|^totals" $d/cg.100000 | awk '{print $2}')
b=$(grep -m1 "^summary\|^totals" $d/cg.300000 | awk '{print $2}')
echo "sub Ir/block $(( (b - a) / 200000 ))"
rm -rf "$d"
