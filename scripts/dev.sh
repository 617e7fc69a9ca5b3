#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The project's two commands (see README):
#   scripts/dev.sh run    install what is missing, build, install kvbm (library,
#                         headers, pkg-config and CMake files, the kvbm command,
#                         the Python package) under /usr/local, replay the
#                         bundled trace
#   scripts/dev.sh test   the same set-up, then run every test:
#                         plain, then under ASan+UBSan, then the threaded
#                         tests (label "tsan") under ThreadSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)

build() { # build DIR [cmake args...]
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVBM_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

# Installs the plain build under /usr/local (KVBM_PREFIX overrides), so that
# engines find libkvbm.so, pkg-config and find_package find kvbm, and
# /usr/bin/python3 imports kvbm.
install_kvbm() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo cmake --install build --prefix "${KVBM_PREFIX:-/usr/local}" >/dev/null
  if command -v ldconfig >/dev/null; then $sudo ldconfig; fi
  pkg-config --exists kvbm || echo "note: pkg-config does not search ${KVBM_PREFIX:-/usr/local}; set PKG_CONFIG_PATH" >&2
  echo "installed kvbm under ${KVBM_PREFIX:-/usr/local}"
}

case "${1:-}" in
  run)
    ./scripts/setup.sh
    build build
    install_kvbm
    shift
    exec ./build/kvbm replay "$@"
    ;;
  test)
    ./scripts/setup.sh
    echo "== plain build =="
    build build
    install_kvbm
    (cd build && ctest --output-on-failure -j "$JOBS" --timeout 600)
    echo "== AddressSanitizer + UndefinedBehaviorSanitizer =="
    build build-asan -DKVBM_SANITIZE=address
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       ctest --output-on-failure -j "$JOBS" --timeout 900 -LE nosan)
    echo "== ThreadSanitizer (tests labelled tsan) =="
    build build-tsan -DKVBM_SANITIZE=thread
    # The tier links the fabric, so UCX's memory hooks (libucm patches
    # mmap/madvise) are in every test that links a manager, and they fault
    # under TSan's own interceptors; no TSan test uses them.
    (cd build-tsan && UCX_MEM_MMAP_HOOK_MODE=none ctest --output-on-failure -j "$JOBS" --timeout 900 -L tsan)
    # Further CI steps owned by one area each (fuzzing, ...), in name order.
    for step in scripts/ci.d/*.sh; do
      [ -e "$step" ] || continue
      echo "== $step =="
      bash "$step"
    done
    echo "== all tests passed =="
    ;;
  *)
    echo "usage: scripts/dev.sh run [replay options] | test" >&2
    exit 2
    ;;
esac
