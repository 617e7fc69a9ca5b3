#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/cgprod.sh BIN K FORM: the producer thread's marginal
# instructions per block event under callgrind, (Ir at 300k blocks - Ir at
# 100k) / 200k, thread 1 of the publisher process only. cg.sh counts the
# whole process, whose sender thread's trylocks (thread_lock) fail under
# valgrind as often as the scheduler lets them, a spread of +-15 Ir a block
# between runs; the producer's own count moves by under 1.
set -eu
bin=$1 k=$2 form=$3
d=$(mktemp -d)
for n in 100000 300000; do
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=$d/cg.$n.%p "$bin" "$k" $n "$form" 0 >/dev/null 2>$d/err.$n || { cat $d/err.$n >&2; exit 1; }
done
/usr/bin/python3 - "$d" <<'P'
import glob, sys
d = sys.argv[1]
def tot(n):
    fs = sorted(glob.glob(f"{d}/cg.{n}.*-01"), key=lambda f: int(f.rsplit(".", 1)[1].split("-")[0]))
    for line in open(fs[0]):  # the parent (lower pid), thread 1: the producer
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
print(f"producer Ir/block {(tot(300000) - tot(100000)) / 200000:.1f}")
P
rm -rf "$d"
