#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every subcommand `kvbm --help` lists answers `kvbm CMD --help` with its
# usage on stdout and exit 0 (`events` and `transfer-bench` used to call
# --help an unknown option and exit 2); `kvbm replay --help` lists the
# flags that select and shape W2 as well as W1's.
set -euo pipefail
: "${KVBM_BIN:?}"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$KVBM_BIN" --help >"$T/top"
cmds=$(sed -n '/^commands:/,$p' "$T/top" | awk 'NR > 1 && NF {print $1}')
[ "$(wc -w <<<"$cmds")" -ge 9 ] || fail "kvbm --help lists too few commands: $cmds"
for c in $cmds; do
  rc=0
  "$KVBM_BIN" "$c" --help >"$T/out" 2>"$T/err" || rc=$?
  [ "$rc" = 0 ] || fail "kvbm $c --help exits $rc: $(cat "$T/err")"
  [ ! -s "$T/err" ] || fail "kvbm $c --help writes to stderr: $(cat "$T/err")"
  [ "$c" = version ] && continue
  grep -q "^usage: kvbm $c" "$T/out" || fail "kvbm $c --help: no usage on stdout"
done
# -h too, and --help after a subcommand's own words
for args in "events -h" "events tail --help" "transfer-bench -h" "fabric-node recv --help"; do
  rc=0
  # shellcheck disable=SC2086
  "$KVBM_BIN" $args >"$T/out" 2>/dev/null || rc=$?
  [ "$rc" = 0 ] && grep -q "^usage:" "$T/out" || fail "kvbm $args: exit $rc"
done

"$KVBM_BIN" replay --help >"$T/replay"
for flag in --g2-blocks --g3-blocks --g3-dir --block-bytes --g2-policy --g3-policy --g3-buffered --g1-memory \
            --block-size --capacity --limit --hash --json --no-progress; do
  grep -q -- "$flag" "$T/replay" || fail "kvbm replay --help does not list $flag"
done
# the W2 path prints the same usage
"$KVBM_BIN" replay --g2-blocks 4 --help | cmp -s - "$T/replay" || fail "W2's --help differs from W1's"
echo "help: ok"
