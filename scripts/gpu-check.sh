#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-check.sh: every GPU check of kvbm, in one command, on a bare machine
# with a GPU, CUDA and nothing of ours installed.
#
#   scripts/gpu-check.sh --prepare   here (Debian 12, with the network):
#                                    fetch the Debian packages kvbm builds
#                                    against into .gpu-debs/ and copy
#                                    ../shared into .gpu-shared/ (both kept
#                                    out of git by .git/info/exclude), so the
#                                    device tool can carry them (~11 MiB)
#   scripts/gpu-check.sh --dry-run   everything up to the first CUDA call, on
#                                    CPU: prepare if needed, unpack the
#                                    packages into a private prefix, configure
#                                    and build against that prefix only, list
#                                    the GPU tests and benchmarks, write the
#                                    summary. The test command runs this
#                                    (scripts/ci.d/), so the script cannot rot
#   scripts/gpu-check.sh             on the device machine: the same, then
#                                    the GPU tests (ctest -L gpu with
#                                    KVBM_REQUIRE_GPU=1: a skip is a
#                                    failure), the GPU benchmarks, the tiny
#                                    torch engine on CUDA, and the many-core
#                                    figures (transfer-bench's checked
#                                    transfer, bench_router's readers) and
#                                    the speed issue's single-thread figures
#                                    on a quiet machine (bench_router at 64
#                                    workers, bench_replay, bench_events)
#
# Why packages and not binaries built here: the device runs another
# distribution; Debian 12's libraries (glibc 2.36) load on any newer glibc,
# and building there uses its own nvcc, driver and Python (the torch one).
# The packages are unpacked with dpkg -x into a prefix under /tmp, never
# into /: nothing of the machine is changed. The .pc files are read through
# the prefix (PKG_CONFIG_SYSROOT_DIR); their Requires.private lines are
# dropped, as they name static-link-only dependencies whose -dev packages
# are not carried; absolute symlinks are re-pointed into the prefix.
#
# Output (in $OUT, default ./gpu-check-out; at most 8 files come back from
# the device): summary.json (each step's status and seconds, every
# benchmark's JSON), env.txt, build.log, tests.log, bench.log,
# manycore.log. Each step has a time limit and a failed step does not stop
# the next one; the exit status is 0 only if every step passed. The whole
# run is meant to take under 8 minutes on 16 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=device
case "${1:-}" in
  --prepare) MODE=prepare ;;
  --dry-run) MODE=dry ;;
  "") ;;
  -h|--help) sed -n '3,25p' "$0"; exit 0 ;;
  *) echo "usage: scripts/gpu-check.sh [--prepare | --dry-run]" >&2; exit 2 ;;
esac

DEBS=${KVBM_GPU_DEBS:-$ROOT/.gpu-debs}
SHARED_COPY=$ROOT/.gpu-shared
OUT=${OUT:-$ROOT/gpu-check-out}
PREFIX=${KVBM_GPU_PREFIX:-/tmp/kvbm-gpu-deps}
BUILD=${KVBM_GPU_BUILD:-$ROOT/build-gpu}
JOBS=$(nproc 2>/dev/null || echo 2)
ARCH=x86_64-linux-gnu

# What kvbm builds and runs against: the -dev packages the configure step
# asks pkg-config for, their run-time libraries and everything those load
# (read off `ldd` of libkvbm.so, the kvbm command and ucx_perftest on
# Debian 12), pkgconf itself, and ucx_perftest (transfer-bench's peer).
# Not carried: libc6, libgcc-s1, libstdc++6 (every machine has newer ones).
PACKAGES="libxxhash-dev libmsgpack-dev libzmq3-dev libnats-dev liburing-dev libucx-dev libsodium-dev
  libhiredis-dev libcmocka-dev zlib1g-dev pkgconf-bin libpkgconf3
  libxxhash0 libmsgpackc2 libzmq5 libnats3.4 liburing2 libucx0 libhiredis0.14 libcmocka0
  zlib1g libbsd0 libmd0 libcom-err2 libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3
  libkrb5support0 libnorm1 libnuma1 libpgm-5.3-0 libprotobuf-c1 libsodium23 libssl3
  libgomp1 libibverbs1 librdmacm1 ucx-utils"

log() { printf '%s gpu-check: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

exclude() { # keeps a carried folder out of git
  local ex=$ROOT/.git/info/exclude
  if [ -d "$ROOT/.git" ] && ! grep -qxF "/$1/" "$ex" 2>/dev/null; then
    mkdir -p "$(dirname "$ex")" && echo "/$1/" >>"$ex"
  fi
}

prepare() {
  exclude .gpu-debs; exclude .gpu-shared; exclude gpu-check-out; exclude build-gpu
  mkdir -p "$DEBS"
  # apt-get download writes into the current folder.
  (cd "$DEBS" && apt-get download $PACKAGES) || { log "apt-get download failed"; return 1; }
  local shared=${KVBM_SHARED_DIR:-$ROOT/../shared}
  if [ -d "$shared" ]; then
    rm -rf "$SHARED_COPY" && mkdir -p "$SHARED_COPY" && cp -r "$shared"/. "$SHARED_COPY"/
  fi
  log "prepared: $(ls "$DEBS"/*.deb | wc -l) packages, $(du -sh "$DEBS" | cut -f1) in $DEBS"
}

if [ "$MODE" = prepare ]; then prepare; exit $?; fi

mkdir -p "$OUT"
SUMMARY_STEPS=""   # one JSON object per step, comma-separated
BENCH_JSON=""      # "name": {...} per benchmark, comma-separated
FAILED=0

# step NAME LIMIT_S LOGFILE CMD...: runs CMD with a time limit, appends its
# output to LOGFILE and records the step in the summary.
step() {
  local name=$1 limit=$2 logf=$3; shift 3
  local t0=$SECONDS rc
  log "step $name (limit ${limit}s)"
  echo "==== $name: $*" >>"$logf"
  if [ "$(type -t "$1")" = function ]; then
    # A shell function runs in a child bash (exported with export -f), so
    # that timeout can stop it and everything it started.
    timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >>"$logf" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >>"$logf" 2>&1
  fi
  rc=$?
  local secs=$((SECONDS - t0))
  [ $rc -eq 0 ] || FAILED=1
  log "step $name: rc=$rc in ${secs}s"
  SUMMARY_STEPS="${SUMMARY_STEPS:+$SUMMARY_STEPS,}{\"step\":\"$name\",\"rc\":$rc,\"seconds\":$secs}"
  return $rc
}

# ---------------------------------------------------------------- unpack
unpack() {
  if ! ls "$DEBS"/*.deb >/dev/null 2>&1; then
    if [ "$MODE" = dry ]; then prepare || return 1
    else log "no packages in $DEBS (run --prepare where apt works, and carry it)"; return 1; fi
  fi
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  local f
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX" || return 1; done
  # Absolute symlinks (libz.so -> /lib/...) point into the machine; re-point
  # them into the prefix.
  find "$PREFIX" -type l | while read -r l; do
    local t; t=$(readlink "$l")
    case "$t" in /*) ln -sfn "$PREFIX$t" "$l" ;; esac
  done
  # Dynamic linking only: the static-only dependencies go.
  sed -i '/^Requires.private:/d' "$PREFIX"/usr/lib/$ARCH/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc 2>/dev/null
  ln -sfn pkgconf "$PREFIX/usr/bin/pkg-config"
  return 0
}

LIBS="$PREFIX/usr/lib/$ARCH:$PREFIX/lib/$ARCH:$PREFIX/usr/lib/$ARCH/ucx"
deps_env() {
  export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  export PKG_CONFIG_LIBDIR="$PREFIX/usr/lib/$ARCH/pkgconfig:$PREFIX/usr/share/pkgconfig"
  export PATH="$PREFIX/usr/bin:$PATH"
  export UCX_MODULE_DIR=$PREFIX/usr/lib/$ARCH/ucx
  # ucx_perftest (transfer-bench's reference) from the prefix.
  export KVBM_PERFTEST=$PREFIX/usr/bin/ucx_perftest
}

# ---------------------------------------------------------------- env
env_report() {
  {
    echo "date: $(date -u +%FT%TZ)  mode: $MODE"
    echo "uname: $(uname -srm)"
    echo "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
    echo "glibc: $(ldd --version 2>/dev/null | head -1)"
    echo "cpus: $JOBS  memory: $(awk '/MemTotal/{print $2/1048576 " GiB"}' /proc/meminfo)"
    echo "cmake: $(cmake --version 2>/dev/null | head -1)"
    echo "cc: $(cc --version 2>/dev/null | head -1)"
    echo "nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) $( (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -1)"
    echo "python: $PY $("$PY" --version 2>&1) torch: $("$PY" -c 'import torch;print(torch.__version__, torch.version.cuda)' 2>/dev/null || echo none)"
    echo "python headers: $("$PY" -c 'import sysconfig,os;p=sysconfig.get_paths()["include"];print(p, os.path.exists(p+"/Python.h"))' 2>&1)"
    if [ "$MODE" = device ]; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.gen.current,pcie.link.width.max,pcie.link.width.current,clocks.max.sm --format=csv 2>&1
      nvidia-smi topo -m 2>&1 | head -5
    fi
  } >"$OUT/env.txt" 2>&1
}

# ---------------------------------------------------------------- build
configure() {
  local py=(-DPython3_EXECUTABLE="$PY")
  [ "$WITH_PY" = 1 ] || py=(-DKVBM_PYTHON=OFF)
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVBM_WERROR=ON \
    -DPKG_CONFIG_EXECUTABLE="$PREFIX/usr/bin/pkgconf" \
    -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DZLIB_ROOT="$PREFIX/usr" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$LIBS" -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$LIBS" \
    -DKVBM_SHARED_DIR="$SHARED_DIR" "${py[@]}" ${KVBM_GPU_CMAKE_ARGS:-}
}

# The targets the device run needs: the command, the router bench, every
# GPU bench, every GPU test that is an executable, the Python package.
build_targets() {
  local t targets="kvbm bench_router bench_replay bench_events" all
  all=$(cmake --build "$BUILD" --target help | awk '{print $2}')
  for t in $(echo "$all" | grep -E '^bench_gpu_'); do targets="$targets $t"; done
  for t in $(cd "$BUILD" && ctest -N -L gpu | awk '/Test +#/{print $3}'); do
    echo "$all" | grep -qxF "$t" && targets="$targets $t"
  done
  echo "$all" | grep -qxF kvbm_python && targets="$targets kvbm_python"
  echo "$targets"
}

build() {
  local targets; targets=$(build_targets)
  echo "targets: $targets"
  cmake --build "$BUILD" -j "$JOBS" --target $targets
}

# ---------------------------------------------------------------- checks
gpu_tests() {
  (cd "$BUILD" && KVBM_REQUIRE_GPU=1 KVBM_PYTHON="$PY" ctest -L gpu --output-on-failure --timeout 180)
}

list_gpu() {
  (cd "$BUILD" && ctest -N -L gpu) && ls -1 "$BUILD"/bench_gpu_* 2>/dev/null
  local n; n=$(cd "$BUILD" && ctest -N -L gpu | awk '/Total Tests:/{print $3}')
  [ "${n:-0}" -gt 0 ] || { echo "no GPU tests registered"; return 1; }
}

run_bench() { # run_bench NAME ARGS...: the bench's --json goes into the summary
  local name=$1; shift
  local j="$OUT/.$name.json"
  rm -f "$j"
  step "$name" 120 "$OUT/bench.log" "$BUILD/$name" --json "$j" "$@"
  if [ -s "$j" ]; then BENCH_JSON="${BENCH_JSON:+$BENCH_JSON,}\"$name\":$(cat "$j")"; fi
  rm -f "$j"
}

manycore() {
  local tb="$OUT/.transfer.json"
  step transfer-bench 150 "$OUT/manycore.log" sh -c \
    "'$BUILD/kvbm' transfer-bench --json --perftest '$KVBM_PERFTEST' > '$tb'"
  if [ -s "$tb" ]; then cat "$tb" >>"$OUT/manycore.log"; BENCH_JSON="${BENCH_JSON:+$BENCH_JSON,}\"transfer-bench\":$(tail -1 "$tb")"; fi
  rm -f "$tb"
  local r
  for r in ${KVBM_GPU_ROUTER_THREADS:-1 4 8 $((JOBS - 1))}; do
    step "bench_router-threads-$r" 90 "$OUT/manycore.log" "$BUILD/bench_router" --repeat 1 --threads $r
  done
  # The single-thread figures of the speed issue, on a machine where
  # nothing else runs (the 2-core machines are shared and noisy): each
  # bench measures its own bound or peer in the same run.
  step bench_router-64 90 "$OUT/manycore.log" "$BUILD/bench_router" --repeat 3 --workers 64
  step bench_replay 120 "$OUT/manycore.log" "$BUILD/bench_replay" --repeat 5
  # the hybrid row under the dense rule too (the default row is vLLM's
  # sparse retention since session 15)
  step bench_replay-dense 120 "$OUT/manycore.log" "$BUILD/bench_replay" --repeat 3 \
    --prefix-cache-retention-interval none
  # --aa: the raw peer against itself, the noise floor under ours / raw
  # (events.md, Session 17)
  step bench_events 180 "$OUT/manycore.log" "$BUILD/bench_events" --runs 3 --k 1,16,64 --form map --wire both --aa
  # K = 1 through a producer's stage (no lock a publish): whether the
  # producer thread still bounds it with a core a thread (events.md,
  # Session 15)
  step bench_events-stage 90 "$OUT/manycore.log" "$BUILD/bench_events" --runs 3 --k 1,16 --form map --wire tcp --stage
}

write_summary() {
  local dev="" kern=""
  [ "$MODE" = device ] && dev=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  printf '{"mode":"%s","device":"%s","cpus":%s,"failed":%s,"steps":[%s],"bench":{%s}}\n' \
    "$MODE" "$dev" "$JOBS" "$FAILED" "$SUMMARY_STEPS" "$BENCH_JSON" >"$OUT/summary.json"
  log "summary: $OUT/summary.json (failed=$FAILED)"
}

# ---------------------------------------------------------------- main
if [ "$MODE" = dry ]; then PY=${KVBM_PYTHON:-/usr/bin/python3}; else PY=${KVBM_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}; fi
if [ -d "$SHARED_COPY/data" ]; then SHARED_DIR=$SHARED_COPY; else SHARED_DIR=${KVBM_SHARED_DIR:-$ROOT/../shared}; fi
# The Python package is built only where that Python has its headers.
WITH_PY=0
"$PY" -c 'import sysconfig,os,sys;sys.exit(0 if os.path.exists(sysconfig.get_paths()["include"]+"/Python.h") else 1)' 2>/dev/null && WITH_PY=1
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"

export ROOT MODE DEBS SHARED_COPY OUT PREFIX BUILD JOBS ARCH PACKAGES LIBS PY SHARED_DIR WITH_PY
export -f log exclude prepare unpack configure build_targets build gpu_tests list_gpu
env_report
if ! step unpack 120 "$OUT/build.log" unpack; then write_summary; exit 1; fi
deps_env
if ! step configure 180 "$OUT/build.log" configure; then write_summary; exit 1; fi
if ! step build 420 "$OUT/build.log" build; then write_summary; exit 1; fi
step list 60 "$OUT/tests.log" list_gpu

if [ "$MODE" = dry ]; then
  # Up to here nothing called CUDA. The benchmarks must at least parse
  # their arguments: --help needs no device.
  for b in "$BUILD"/bench_gpu_*; do
    [ -x "$b" ] && step "$(basename "$b")-help" 30 "$OUT/bench.log" "$b" --help
  done
  write_summary
  exit $FAILED
fi

# KVBM_GPU_STEPS narrows the device run to some of: tests bench manycore
# (default: all of them). The tiny torch engine on CUDA is one of the GPU
# tests (python_test_gpu_tiny_engine, run with $KVBM_PYTHON: the Python the
# extension was built for).
want() { case " ${KVBM_GPU_STEPS:-tests bench manycore} " in *" $1 "*) return 0 ;; esac; return 1; }
want tests && step gpu-tests 300 "$OUT/tests.log" gpu_tests
if want bench; then
  for b in "$BUILD"/bench_gpu_*; do [ -x "$b" ] && run_bench "$(basename "$b")"; done
fi
want manycore && manycore
write_summary
exit $FAILED
