# SPDX-License-Identifier: Apache-2.0
# Sourced by the Python test scripts: `kvbm_python ARGS...` runs
# /usr/bin/python3 on the build tree's package (build/python/kvbm).
#
# In an AddressSanitizer build the extension is instrumented but the
# interpreter is not, so the ASan runtime (and UBSan's) is preloaded into
# the interpreter, and only there (other tools, cmake included, must not
# run under it); leak detection is off there because the interpreter keeps
# allocations until exit that LeakSanitizer would report. A ThreadSanitizer
# extension cannot be loaded into the uninstrumented interpreter at all: the
# caller skips (77).
: "${KVBM_BINARY_DIR:?set by ctest}" "${KVBM_SOURCE_DIR:?set by ctest}"

kvbm_preload=""
kvbm_sanitize=$(sed -n 's/^KVBM_SANITIZE:STRING=//p' "$KVBM_BINARY_DIR/CMakeCache.txt")
case "$kvbm_sanitize" in
  address)
    kvbm_preload="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    ;;
  thread)
    echo "skipped: a ThreadSanitizer extension cannot load into the uninstrumented /usr/bin/python3"
    exit 77
    ;;
esac

export PYTHONPATH="$KVBM_BINARY_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

kvbm_python() {
  if [ -n "$kvbm_preload" ]; then
    LD_PRELOAD="$kvbm_preload${LD_PRELOAD:+:$LD_PRELOAD}" /usr/bin/python3 "$@"
  else
    /usr/bin/python3 "$@"
  fi
}
