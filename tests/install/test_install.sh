#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_install.sh: kvbm as an engine builder picks it up. Installs the
# build into a fresh prefix (cmake --install), then, out of tree:
#   - every installed header compiles on its own, as C11 and as C++, and
#     includes nothing but kvbm/ headers and the standard library;
#   - libkvbm.so has a versioned SONAME and exports only kvbm_* (no kvbm__
#     internals, no helper symbols);
#   - the README's C example builds through `pkg-config --cflags --libs
#     kvbm`, through `find_package(kvbm)` (kvbm::kvbm), and statically
#     against libkvbm.a, and each binary runs and finds its prefix shared.
set -euo pipefail
: "${KVBM_BINARY_DIR:?}" "${KVBM_SOURCE_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$tmp/prefix
cmake --install "$KVBM_BINARY_DIR" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log" >&2; fail "cmake --install"; }
libdir=$(ls -d "$prefix"/lib*/ | head -1)
libdir=${libdir%/}

san=()
if [ "${KVBM_SANITIZE:-}" = address ]; then san=(-fsanitize=address,undefined); fi
if [ "${KVBM_SANITIZE:-}" = thread ]; then san=(-fsanitize=thread); fi

for f in include/kvbm/manager.h include/kvbm/pool.h include/kvbm/tier.h \
         include/kvbm/version.h bin/kvbm; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
for f in libkvbm.a pkgconfig/kvbm.pc cmake/kvbm/kvbmConfig.cmake \
         cmake/kvbm/kvbmConfigVersion.cmake cmake/kvbm/kvbmTargets.cmake; do
  [ -e "$libdir/$f" ] || fail "not installed: lib/$f"
done
[ ! -e "$prefix/include/kvbm/disk.h" ] || fail "the private disk.h was installed"
"$prefix/bin/kvbm" version >/dev/null || fail "installed kvbm command does not run"

# Headers: self-contained, C and C++, only kvbm/ and system includes.
n=0
for h in "$prefix"/include/kvbm/*.h; do
  name=kvbm/$(basename "$h")
  bad=$(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$h" | grep -v '"kvbm/' || true)
  [ -z "$bad" ] || fail "$name includes outside kvbm/: $bad"
  printf '#include <%s>\nint main(void) { return 0; }\n' "$name" >"$tmp/h.c"
  cc -std=c11 -Wall -Wextra -Werror -pedantic -I"$prefix/include" -fsyntax-only "$tmp/h.c" \
    2>"$tmp/h.err" || { cat "$tmp/h.err" >&2; fail "$name does not compile alone (C11)"; }
  cp "$tmp/h.c" "$tmp/h.cc"
  c++ -std=c++17 -Wall -Wextra -Werror -I"$prefix/include" -fsyntax-only "$tmp/h.cc" \
    2>"$tmp/h.err" || { cat "$tmp/h.err" >&2; fail "$name does not compile alone (C++)"; }
  n=$((n + 1))
done
[ "$n" -ge 14 ] || fail "only $n headers installed"

# The shared library: SONAME and exports.
so=$(ls "$libdir"/libkvbm.so.*.*.* | head -1)
soname=$(objdump -p "$so" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = libkvbm.so.0 ] || fail "SONAME is '$soname'"
[ -L "$libdir/libkvbm.so" ] && [ -L "$libdir/libkvbm.so.0" ] || fail "missing libkvbm.so symlinks"
nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sort >"$tmp/exports"
grep -vE '^kvbm_' "$tmp/exports" >"$tmp/foreign" || true
grep -E '^kvbm__' "$tmp/exports" >>"$tmp/foreign" || true
# the sanitizers' runtime adds no exports of its own to our library, but
# allow the linker's usual markers
grep -vE '^(_init|_fini|__bss_start|_edata|_end)$' "$tmp/foreign" >"$tmp/foreign2" || true
[ ! -s "$tmp/foreign2" ] || fail "libkvbm.so exports non-API symbols: $(head -5 "$tmp/foreign2" | tr '\n' ' ')"
for s in kvbm_pool_create kvbm_manager_prefill kvbm_tier_name kvbm_version; do
  grep -qx "$s" "$tmp/exports" || fail "libkvbm.so does not export $s"
done

run() { # run NAME BINARY: the example must succeed and report reuse
  local out
  out=$(LD_LIBRARY_PATH="$libdir" "$2") || fail "$1: the example failed: $out"
  grep -q "second request reused 96 of 100 prompt tokens" <<<"$out" || fail "$1: $out"
  echo "$1: ok"
}

# pkg-config
export PKG_CONFIG_PATH=$libdir/pkgconfig
cflags=$(pkg-config --cflags kvbm) && libs=$(pkg-config --libs kvbm) || fail "pkg-config kvbm"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror "${san[@]}" "$KVBM_SOURCE_DIR/examples/c/quickstart.c" \
  $cflags $libs -o "$tmp/qs_pc" || fail "pkg-config build"
ldd "$tmp/qs_pc" | grep "libkvbm.so.0 => $libdir" >/dev/null ||
  LD_LIBRARY_PATH="$libdir" ldd "$tmp/qs_pc" | grep "libkvbm.so.0 => $libdir" >/dev/null ||
  fail "the pkg-config build does not link the installed libkvbm.so"
run pkg-config "$tmp/qs_pc"

# static: libkvbm.a, with its dependencies' shared libraries (Debian ships
# no static libnats, and libzmq's --static flags name a missing archive, so
# `pkg-config --static` cannot be the whole answer there): the libraries of
# Requires.private, and Libs.private.
reqs=$(pkg-config --print-requires-private kvbm | awk '{print $1}' | tr '\n' ' ')
privs=$(sed -n 's/^Libs.private:[[:space:]]*//p' "$PKG_CONFIG_PATH/kvbm.pc")
# shellcheck disable=SC2086
static_libs="$(pkg-config --libs $reqs) $privs"
# shellcheck disable=SC2086
cc -std=c11 "${san[@]}" "$KVBM_SOURCE_DIR/examples/c/quickstart.c" $cflags \
  "$libdir/libkvbm.a" $static_libs -o "$tmp/qs_static" || fail "static build"
if ldd "$tmp/qs_static" | grep libkvbm >/dev/null; then fail "the static build loads libkvbm.so"; fi
run static "$tmp/qs_static"

# find_package(kvbm)
cmake -S "$KVBM_SOURCE_DIR/examples/c" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="${san[*]}" >"$tmp/cm.log" 2>&1 || { cat "$tmp/cm.log" >&2; fail "find_package(kvbm)"; }
cmake --build "$tmp/cm" >"$tmp/cmb.log" 2>&1 || { cat "$tmp/cmb.log" >&2; fail "CMake example build"; }
run find_package "$tmp/cm/quickstart"
echo "install: ok ($n headers)"
