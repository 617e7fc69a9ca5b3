#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/compare.sh: two commits side by side, in one run.
#
#   bench/compare.sh [--rounds N (5)] [--dir DIR (build-compare)] OLD NEW BENCH [ARGS...]
#   bench/compare.sh [--rounds N (5)] --builds OLDDIR NEWDIR BENCH [ARGS...]
#
# Builds OLD and NEW (any git revisions) into folders of their own
# (DIR/<sha>, from worktrees under DIR/src-<sha>, kept for the next call;
# DIR relative to the project root, so that engineers sharing a checkout
# each keep their own), then runs `build/<BENCH> ARGS` of each alternately,
# A B A B ..., N rounds, so that whatever else the machine does falls on
# both alike. This is how to tell a regression from noise on a shared
# 2-core machine: never against a figure taken on another day.
#
# Figures: when a run prints JSON (pass the bench's own --json), every
# numeric leaf is a figure, named by its path (stores.trickle.wait_s);
# otherwise every number in the output is, named by its line and place
# (L3.2: the second number of line 3). For each figure it prints OLD's
# and NEW's median [min..max] over the rounds and NEW/OLD of the medians.
# A figure the two builds do not both print is left out. BENCH is the
# target's name (bench_events, bench_replay, kvbm ...); the build is the
# plain RelWithDebInfo one of scripts/dev.sh.
#
# --builds takes two build folders made elsewhere (no git there: the device
# machine builds two `git archive` snapshots with scripts/gpu-check.sh) and
# runs their BENCH alternately in the same way; the folders' names label
# the columns.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5
dir=build-compare
prebuilt=0
while [ $# -ge 2 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --builds) prebuilt=1; shift ;;
    *) break ;;
  esac
done
if [ $# -lt 3 ]; then
  echo "usage: bench/compare.sh [--rounds N] [--dir DIR] OLD NEW BENCH [ARGS...]" >&2
  echo "       bench/compare.sh [--rounds N] --builds OLDDIR NEWDIR BENCH [ARGS...]" >&2
  exit 2
fi
case "$rounds" in '' | *[!0-9]* | 0) echo "compare: --rounds must be a positive integer" >&2; exit 2 ;; esac
bench=$3
case "$bench" in '' | */* | .*) echo "compare: BENCH is a target name, not a path" >&2; exit 2 ;; esac
if [ $prebuilt = 1 ]; then
  for d in "$1" "$2"; do
    [ -x "$d/$bench" ] || { echo "compare: $d/$bench is not an executable" >&2; exit 2; }
  done
  a=$(cd "$1" && pwd)/$bench
  b=$(cd "$2" && pwd)/$bench
  old=$(basename "$1")
  new=$(basename "$2")
else
  old=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "compare: $1 is not a commit" >&2; exit 2; }
  new=$(git rev-parse --verify --quiet "$2^{commit}") || { echo "compare: $2 is not a commit" >&2; exit 2; }
fi
shift 3
case "$dir" in '' | /* | *..*) echo "compare: --dir is a folder name under the project root" >&2; exit 2 ;; esac
root=$PWD/$dir
[ $prebuilt = 1 ] || mkdir -p "$root"

# build SHA: a worktree at SHA and its build folder; prints the binary.
build() {
  local sha=$1 src="$root/src-$1" out="$root/$1"
  if [ ! -d "$src" ]; then
    git worktree add --detach --force "$src" "$sha" >/dev/null 2>&1 ||
      { echo "compare: cannot check out $sha" >&2; return 1; }
  fi
  # ../shared beside the worktree, as beside the project (benches read it)
  [ -e "$root/shared" ] || [ ! -d ../shared ] || ln -s "$(cd ../shared && pwd)" "$root/shared"
  local launcher=()
  if command -v ccache >/dev/null; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
  cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
  cmake --build "$out" -j "$(nproc 2>/dev/null || echo 2)" --target "$bench" >"$out.log" 2>&1 ||
    { echo "compare: building $bench at $sha failed (see $out.log)" >&2; return 1; }
  echo "$out/$bench"
}

if [ $prebuilt = 0 ]; then
  echo "compare: building $bench at ${old:0:12} and ${new:0:12}" >&2
  a=$(build "$old")
  b=$(build "$new")
fi
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for side in a b; do
    bin=$a
    [ $side = b ] && bin=$b
    echo "compare: round $r/$rounds, $side" >&2
    (cd "$(dirname "$bin")" && "$bin" "$@") >"$runs/$side.$r" 2>"$runs/$side.$r.err" ||
      { echo "compare: $bench failed at $side round $r:" >&2; tail -5 "$runs/$side.$r.err" >&2; exit 1; }
  done
done

/usr/bin/python3 - "$runs" "$rounds" "${old:0:12}" "${new:0:12}" <<'EOF'
import json, re, statistics, sys
runs, rounds, old, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
NUM = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")

def figures(text):
    """Named numbers of one run: JSON leaves, or numbers by line and place."""
    out = {}
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if doc is not None:
        def walk(v, path):
            if isinstance(v, bool):
                return
            if isinstance(v, (int, float)):
                out[path or "value"] = float(v)
            elif isinstance(v, dict):
                for k, x in v.items():
                    walk(x, f"{path}.{k}" if path else str(k))
            elif isinstance(v, list):
                for i, x in enumerate(v):
                    walk(x, f"{path}[{i}]")
        walk(doc, "")
        return out
    for ln, line in enumerate(text.splitlines(), 1):
        for i, m in enumerate(NUM.findall(line), 1):
            out[f"L{ln}.{i}"] = float(m)
    return out

side = {}
for s in "ab":
    per = [figures(open(f"{runs}/{s}.{r}").read()) for r in range(1, rounds + 1)]
    keys = [k for k in per[0] if all(k in p for p in per[1:])]  # in the output's order
    side[s] = {k: [p[k] for p in per] for k in keys}
names = [k for k in side["a"] if k in side["b"]]
if not names:
    sys.exit("compare: the two builds print no figure in common")
w = max(len(n) for n in names)
print(f"{'figure':<{w}}  {old + ' median [min..max]':>34}  {new + ' median [min..max]':>34}  new/old")
for n in names:
    cells = []
    for s in "ab":
        v = side[s][n]
        cells.append(f"{statistics.median(v):.6g} [{min(v):.6g}..{max(v):.6g}]")
    ma, mb = statistics.median(side["a"][n]), statistics.median(side["b"][n])
    ratio = f"{mb / ma:.4g}" if ma else "-"
    print(f"{n:<{w}}  {cells[0]:>34}  {cells[1]:>34}  {ratio}")
EOF
