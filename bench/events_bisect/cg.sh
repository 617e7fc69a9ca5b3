#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/events_bisect/cg.sh BIN K FORM [DECODE]: the publisher process's marginal instructions per block
# event under callgrind: (Ir at 300k blocks - Ir at 100k) / 200k.
set -eu
bin=$1 k=$2 form=$3
d=$(mktemp -d)
for n in 100000 300000; do
  valgrind --tool=callgrind --callgrind-out-file=$d/cg.$n.%p "$bin" "$k" $n "$form" ${4:-0} >/dev/null 2>$d/err.$n || { cat $d/err.$n >&2; exit 1; }
done
/usr/bin/python3 - "$d" <<'P'
import glob, os, sys
d = sys.argv[1]
def tot(n):
    fs = sorted(glob.glob(f"{d}/cg.{n}.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    vals = []
    for f in fs:
        for line in open(f):
            if line.startswith("totals:") or line.startswith("summary:"):
                vals.append(int(line.split()[1])); break
    return vals  # parent first (lower pid), then the child
a, b = tot(100000), tot(300000)
print(f"pub Ir/block {(b[0]-a[0])/200000:.0f}   sub Ir/block {(b[1]-a[1])/200000 if len(a)>1 and len(b)>1 else -1:.0f}")
P
rm -rf "$d"
