#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python package as `cmake --install` lays it out: installed into a
# fresh prefix, /usr/bin/python3 imports kvbm from <prefix>'s platlib (not
# from the build tree), the extension finds the prefix's libkvbm.so through
# its relative RUNPATH (the prefix is moved first to prove it), and the
# quick start runs.
set -euo pipefail
. "$(dirname "$0")/pyenv.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$KVBM_BINARY_DIR" --prefix "$tmp/first" >"$tmp/install.log" || {
  cat "$tmp/install.log" >&2; fail "cmake --install"; }
mv "$tmp/first" "$tmp/prefix"
prefix=$tmp/prefix
rel=$(sed -n 's/^KVBM_PYTHON_INSTALL_DIR:STRING=//p' "$KVBM_BINARY_DIR/CMakeCache.txt")
pkg=$prefix/$rel/kvbm
for f in __init__.py __init__.pyi py.typed minivllm.py; do
  [ -e "$pkg/$f" ] || fail "not installed: $rel/kvbm/$f"
done
ls "$pkg"/_kvbm.*.so >/dev/null || fail "the extension was not installed"
readelf -d "$pkg"/_kvbm.*.so | grep 'RUNPATH.*\$ORIGIN' >/dev/null || fail "no relative RUNPATH"

export PYTHONPATH="$prefix/$rel"
cd "$tmp"
kvbm_python - "$pkg" "$prefix" <<'PY'
import os, sys
import kvbm
pkg, prefix = sys.argv[1], sys.argv[2]
assert os.path.dirname(kvbm.__file__) == pkg, kvbm.__file__
maps = open("/proc/self/maps").read()
libs = {l.split()[-1] for l in maps.splitlines() if "libkvbm.so" in l}
assert libs and all(p.startswith(prefix + "/") for p in libs), libs
pool = kvbm.Pool(64, 16)
s = pool.sequence(); s.prefill(range(40)); t = pool.sequence()
assert t.prefill(range(40)) == 32
print("installed kvbm", kvbm.__version__, "from", kvbm.__file__, "with", sorted(libs)[0])
PY
kvbm_python "$KVBM_SOURCE_DIR/examples/python/quickstart.py" >/dev/null
