#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_cli.sh: `kvbm layout` sizes a layout, and encodes / decodes the
# serialized form with the decoder's errors reaching the operator.
set -euo pipefail
K=${KVBM_BIN:?}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Strides of a Llama-like config, checked by python from the JSON.
"$K" layout --blocks 1024 --layers 32 --page-size 16 --inner 1024 --json > "$T/fc.json"
"$K" layout --blocks 1024 --layers 32 --page-size 16 --inner 1024 --kind layer-separate --json > "$T/ls.json"
/usr/bin/python3 - "$T/fc.json" "$T/ls.json" <<'PY'
import json, sys
fc = json.load(open(sys.argv[1])); ls = json.load(open(sys.argv[2]))
slice_ = 16 * 1024 * 2
assert fc["kind"] == "fully-contiguous" and ls["kind"] == "layer-separate"
assert fc["outer_stride"] == ls["outer_stride"] == slice_
assert fc["layer_stride"] == ls["layer_stride"] == 2 * slice_
assert fc["block_stride"] == 32 * 2 * slice_ and ls["block_stride"] == 2 * slice_
assert fc["num_regions"] == 1 and ls["num_regions"] == 32
assert fc["total_size"] == ls["total_size"] == 1024 * 32 * 2 * slice_
assert fc["fingerprint"] != ls["fingerprint"] and len(fc["fingerprint"]) == 16
PY

# Alignment pads each block (FullyContiguous) or each layer of a block.
out=$("$K" layout --blocks 3 --layers 5 --page-size 3 --inner 4 --dtype-size 1 --alignment 64)
grep -qx 'block_stride: 128' <<<"$out" || fail "fc block_stride: $out"
out=$("$K" layout --blocks 3 --layers 5 --page-size 3 --inner 4 --dtype-size 1 --alignment 64 --kind layer-separate)
grep -qx 'block_stride: 64' <<<"$out" || fail "ls block_stride: $out"

# Invalid configs: exit 2 and the field named.
expect_bad() { # expect_bad NEEDLE ARGS...
  local needle=$1; shift
  set +e; "$K" layout "$@" >/dev/null 2>"$T/err"; local rc=$?; set -e
  [ $rc -eq 2 ] || fail "layout $* exited $rc, want 2"
  grep -q -- "$needle" "$T/err" || fail "layout $*: no '$needle' in: $(cat "$T/err")"
}
base=(--blocks 4 --layers 3 --page-size 16 --inner 8)
expect_bad "alignment 24" "${base[@]}" --alignment 24
expect_bad "alignment 0" "${base[@]}" --alignment 0
expect_bad "num_blocks is 0" --blocks 0 --layers 3 --page-size 16 --inner 8
expect_bad "outer_dim is 0" "${base[@]}" --outer 0
expect_bad "overflows" --blocks 18446744073709551615 --layers 3 --page-size 16 --inner 8
expect_bad "num_layers" --blocks 1 --layers 65537 --page-size 1 --inner 1
expect_bad "--layers is required" --blocks 4
expect_bad "not fully-contiguous" "${base[@]}" --kind sideways
expect_bad "not system" "${base[@]}" --memory floppy
expect_bad "not a non-negative integer" "${base[@]}" --dtype-size two
expect_bad "unknown argument" "${base[@]}" --frobnicate

# Encode then decode.
"$K" layout --blocks 10 --layers 5 --page-size 16 --inner 12 --kind layer-separate \
  --memory device --device 3 --block-set 77 --alignment 512 --encode "$T/l.bin" > /dev/null
[ "$(stat -c %s "$T/l.bin")" -eq $((128 + 5 * 8)) ] || fail "encoded size"
[ "$(head -c 4 "$T/l.bin")" = KVLY ] || fail "magic"
"$K" layout --decode "$T/l.bin" --json > "$T/d.json"
/usr/bin/python3 - "$T/d.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["kind"] == "layer-separate" and d["num_blocks"] == 10 and d["num_layers"] == 5
assert d["memory"] == "device" and d["device_id"] == 3 and d["block_set_id"] == 77
assert d["block_stride"] == 1024 and d["region_base"] == [0] * 5
PY
"$K" layout --decode - < "$T/l.bin" | grep -qx 'memory: device' || fail "decode from stdin"

# Malformed files: exit 2 with the decoder's error.
expect_decode_bad() { # expect_decode_bad NAME STATUS
  set +e; "$K" layout --decode "$T/$1" >/dev/null 2>"$T/err"; local rc=$?; set -e
  [ $rc -eq 2 ] || fail "decode $1 exited $rc"
  grep -q "$2" "$T/err" || fail "decode $1: no $2 in: $(cat "$T/err")"
}
head -c 100 "$T/l.bin" > "$T/short.bin"; expect_decode_bad short.bin KVBM_ETRUNCATED
head -c 150 "$T/l.bin" > "$T/short2.bin"; expect_decode_bad short2.bin KVBM_ETRUNCATED
{ cat "$T/l.bin"; printf 'x'; } > "$T/long.bin"; expect_decode_bad long.bin KVBM_ETOOLONG
{ printf 'XVLY'; tail -c +5 "$T/l.bin"; } > "$T/magic.bin"; expect_decode_bad magic.bin KVBM_EMAGIC
{ head -c 8 "$T/l.bin"; printf '\x09\x00\x00\x00'; tail -c +13 "$T/l.bin"; } > "$T/kind.bin"
expect_decode_bad kind.bin KVBM_ERANGE
{ head -c 8 "$T/l.bin"; printf '\x01\x00\x00\x00'; tail -c +13 "$T/l.bin"; } > "$T/flip.bin"
expect_decode_bad flip.bin KVBM_EFORMAT
: > "$T/empty.bin"; expect_decode_bad empty.bin KVBM_ETRUNCATED
set +e; "$K" layout --decode "$T/missing.bin" 2>/dev/null; rc=$?; set -e
[ $rc -eq 1 ] || fail "missing file exited $rc, want 1"
echo "ok"
