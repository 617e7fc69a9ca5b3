#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-compare.sh: two commits' CPU benchmarks side by side on the device
# machine's quiet cores.
#
#   here:   scripts/gpu-check.sh --prepare
#           mkdir .gpu-old .gpu-new   (both in .git/info/exclude)
#           git archive OLD | tar -x -C .gpu-old; git archive NEW | tar -x -C .gpu-new
#   there:  scripts/gpu-compare.sh .gpu-old .gpu-new      (carry .gpu-debs
#           .gpu-shared .gpu-old .gpu-new)
#
# The device machines lent to some sessions have 16 cores and run nothing
# else, where this project's own machines have 2 shared, noisy ones. So
# the speed issue's figures are best taken there, and, as everywhere, two
# commits side by side in one run (bench/compare.sh, A B A B), never
# against a figure of another day. Each snapshot is built by its own copy
# of this checkout's gpu-check.sh (the old snapshot's may predate the
# targets named here) with no GPU step, into a folder under /tmp; then
# bench/compare.sh --builds runs each benchmark of KVBM_COMPARE_BENCHES
# alternately. Output under $OUT: one file per benchmark, build.log (both
# builds) and compare.log (the runs' stderr): few files, as the device
# tool brings back at most 8. No CUDA call is made; the GPU checks are gpu-check.sh's.
set -uo pipefail
if [ $# -ne 2 ] || [ ! -f "$1/CMakeLists.txt" ] || [ ! -f "$2/CMakeLists.txt" ]; then
  echo "usage: scripts/gpu-compare.sh OLD_SNAPSHOT NEW_SNAPSHOT (two source trees)" >&2
  exit 2
fi
set -- "$(cd "$1" && pwd)" "$(cd "$2" && pwd)"
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-compare-out}
ROUNDS=${KVBM_COMPARE_ROUNDS:-5}
# where the two builds go: a second compare in the same session (another
# pair of snapshots) names its own, as CMake keeps one source per build
BUILDS=${KVBM_COMPARE_BUILDS:-/tmp/kvbm-compare}
mkdir -p "$OUT"
rc=0
for side in old new; do
  src=$1; [ $side = new ] && src=$2
  cp "$ROOT/scripts/gpu-check.sh" "$src/scripts/gpu-check.sh"
  echo "gpu-compare: building $side ($src)" >&2
  KVBM_GPU_DEBS=${KVBM_GPU_DEBS:-$ROOT/.gpu-debs} KVBM_SHARED_DIR=${KVBM_SHARED_DIR:-$ROOT/.gpu-shared} \
    KVBM_GPU_STEPS=none KVBM_GPU_BUILD=$BUILDS/$side OUT=/tmp/kvbm-compare-out-$side \
    bash "$src/scripts/gpu-check.sh" >>"$OUT/build.log" 2>&1 || { rc=1; tail -20 "$OUT/build.log" >&2; }
done
[ $rc = 0 ] || exit 1
# The binaries load the carried Debian libraries (libsodium, libzmq ...)
# from gpu-check.sh's prefix, as its own runs do (its deps_env).
P=${KVBM_GPU_PREFIX:-/tmp/kvbm-gpu-deps}
export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu:$P/usr/lib/x86_64-linux-gnu/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NAME|ARGS[|ROUNDS]: each run's own bound or peer is measured in the same
# process; the router's runs take 12 s each, hence fewer rounds
BENCHES=${KVBM_COMPARE_BENCHES:-"bench_replay|--repeat 3
bench_events|--runs 1 --k 1,16,64 --form map --wire tcp --json
bench_router|--repeat 1 --json|3
bench_router|--repeat 1 --workers 64 --json|3"}
i=0
while IFS='|' read -r name args rounds; do
  [ -n "$name" ] || continue
  i=$((i + 1))
  rounds=${rounds:-$ROUNDS}
  echo "gpu-compare: $name $args ($rounds rounds)" >&2
  # shellcheck disable=SC2086
  bench/compare.sh --rounds "$rounds" --builds "$BUILDS/old" "$BUILDS/new" "$name" $args \
    >"$OUT/$i-$name.txt" 2>>"$OUT/compare.log" || { rc=1; tail -5 "$OUT/compare.log" >&2; }
done <<<"$BENCHES"
exit $rc
