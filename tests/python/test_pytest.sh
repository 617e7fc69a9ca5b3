#!/usr/bin/env bash
# Runs the Python package's tests (tests/python/test_*.py, pytest) against
# the build tree's package (build/python/kvbm). In an AddressSanitizer build
# the extension is instrumented but /usr/bin/python3 is not, so the ASan
# runtime is preloaded; leak detection is off there because the interpreter
# keeps its own allocations until exit. A ThreadSanitizer build cannot load
# an instrumented module into an uninstrumented interpreter: skipped (77).
set -euo pipefail
: "${KVBM_BINARY_DIR:?set by ctest}" "${KVBM_SOURCE_DIR:?set by ctest}"

sanitize=$(sed -n 's/^KVBM_SANITIZE:STRING=//p' "$KVBM_BINARY_DIR/CMakeCache.txt")
case "$sanitize" in
  address)
    asan=$(gcc -print-file-name=libasan.so)
    ubsan=$(gcc -print-file-name=libubsan.so)
    export LD_PRELOAD="$asan:$ubsan${LD_PRELOAD:+:$LD_PRELOAD}"
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export KVBM_TEST_ASAN=1
    ;;
  thread)
    echo "skipped: a ThreadSanitizer extension cannot load into the uninstrumented /usr/bin/python3"
    exit 77
    ;;
esac

export PYTHONPATH="$KVBM_BINARY_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
cd "$KVBM_SOURCE_DIR/tests/python"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@" .
