#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Hostile peers against `kvbm fabric-node` (fake_peer.py plays them):
#  - a receiver takes, one after another, a peer that hangs up, the old
#    hello with a 0xff worker address (it made UCX abort the receiver), 4 KiB
#    of garbage, its own challenge reflected, and a real sender with a wrong
#    key, while a silent connection stays open; each is refused and named on
#    stderr, and the good sender after them transfers every block;
#  - a sender facing a fake receiver (the 0xff hello) or a receiver with
#    another key fails with a clear message, not a crash; that receiver
#    refuses it and gives up when its wait ends;
#  - the key: files other users can read, links and short keys are refused,
#    a missing key is a usage error, $KVBM_FABRIC_KEY works.
set -euo pipefail
: "${KVBM_BIN:?}"
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
FAKE="$HERE/fake_peer.py"
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
unset KVBM_FABRIC_KEY KVBM_FABRIC_KEY_FILE
GEOM=(--layers 2 --inner 64 --page-size 16 --tls shm,self)
fail() { echo "FAIL: $*" >&2; for f in "$T"/*.out "$T"/*.err; do [ -e "$f" ] && { echo "== $f" >&2; cat "$f" >&2; }; done; exit 1; }
jget() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2"; }
newkey() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"; chmod 600 "$1"; }
newkey "$T/key"
newkey "$T/other"

# start_b NAME ARGS...: a receiver in the background, waits for its port
start_b() {
  local name=$1; shift
  rm -f "$T/port"
  "$KVBM_BIN" fabric-node recv --port-file "$T/port" --json "$@" >"$T/$name.b.out" 2>"$T/$name.b.err" &
  B_PID=$!
  for _ in $(seq 200); do [ -s "$T/port" ] && return 0; sleep 0.05; done
  fail "$name: receiver never listened"
}

# 1. a receiver survives every bad peer and serves the good one after them
start_b hostile "${GEOM[@]}" --key-file "$T/key" --capacity 16 --timeout-ms 60000
P=$(cat "$T/port")
"$PY" "$FAKE" silent "$P" 60 & PIDS+=($!)
for mode in connect-close ff-hello junk reflect; do
  "$PY" "$FAKE" "$mode" "$P" || fail "fake peer $mode"
done
rc=0
"$KVBM_BIN" fabric-node send --port "$P" "${GEOM[@]}" --key-file "$T/other" --blocks 4 \
  >"$T/wrongkey.a.out" 2>"$T/wrongkey.a.err" || rc=$?
[ "$rc" = 1 ] || fail "wrong key: sender exit $rc"
grep -q "KVBM_EAUTH\|shared key" "$T/wrongkey.a.err" || fail "wrong key: sender's message"
KVBM_FABRIC_KEY="$(cat "$T/key")" "$KVBM_BIN" fabric-node send --port "$P" "${GEOM[@]}" --blocks 12 --json \
  >"$T/good.a.out" 2>"$T/good.a.err" || fail "good sender failed after the hostile ones"
rc=0; wait "$B_PID" || rc=$?
[ "$rc" = 0 ] || fail "hostile: receiver exit $rc"
[ "$(jget "$T/hostile.b.out" "(d['verified'], d['registered'], d['rejected'])")" = "(12, 12, 0)" ] ||
  fail "hostile: the good sender's blocks"
[ "$(jget "$T/hostile.b.out" "d['refused_peers']")" = 5 ] || fail "hostile: refused_peers"
[ "$(grep -c "refused a peer from 127.0.0.1:" "$T/hostile.b.err")" = 5 ] || fail "hostile: refusals on stderr"
grep -q "KVBM_ECLOSED" "$T/hostile.b.err" || fail "hostile: hang-up not named"
[ "$(grep -c "KVBM_EPROTO" "$T/hostile.b.err")" = 3 ] || fail "hostile: garbage not named"
grep -q "KVBM_EAUTH" "$T/hostile.b.err" || fail "hostile: wrong key not named"

# 2. a fake receiver cannot crash the sender
rm -f "$T/fport"
"$PY" "$FAKE" listen-ff "$T/fport" & PIDS+=($!)
for _ in $(seq 200); do [ -s "$T/fport" ] && break; sleep 0.05; done
rc=0
"$KVBM_BIN" fabric-node send --port "$(cat "$T/fport")" "${GEOM[@]}" --key-file "$T/key" --blocks 2 \
  >"$T/fake.a.out" 2>"$T/fake.a.err" || rc=$?
[ "$rc" = 1 ] || fail "fake receiver: sender exit $rc (134/139: it crashed)"
grep -q "not a kvbm fabric" "$T/fake.a.err" || fail "fake receiver: message"

# 3. a receiver with another key: the sender is told, the receiver refuses
# it and ends when its wait does
start_b otherkey "${GEOM[@]}" --key-file "$T/other" --capacity 4 --timeout-ms 3000
rc=0
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" "${GEOM[@]}" --key-file "$T/key" --blocks 2 \
  >"$T/ok.a.out" 2>"$T/ok.a.err" || rc=$?
[ "$rc" = 1 ] || fail "other key: sender exit $rc"
grep -q "shared key" "$T/ok.a.err" || fail "other key: sender's message"
rc=0; wait "$B_PID" || rc=$?
[ "$rc" = 1 ] || fail "other key: receiver exit $rc"
grep -q "1 refused" "$T/otherkey.b.err" || fail "other key: receiver's message"

# 4. the key itself
rc=0; "$KVBM_BIN" fabric-node recv "${GEOM[@]}" >/dev/null 2>"$T/nokey.err" || rc=$?
[ "$rc" = 2 ] && grep -q "no shared key" "$T/nokey.err" || fail "no key: exit $rc"
cp "$T/key" "$T/open"; chmod 644 "$T/open"
rc=0; "$KVBM_BIN" fabric-node recv "${GEOM[@]}" --key-file "$T/open" >/dev/null 2>"$T/open.err" || rc=$?
[ "$rc" = 2 ] && grep -q "chmod 600" "$T/open.err" || fail "readable key file: exit $rc"
ln -s "$T/key" "$T/link"
rc=0; "$KVBM_BIN" fabric-node recv "${GEOM[@]}" --key-file "$T/link" >/dev/null 2>"$T/link.err" || rc=$?
[ "$rc" = 2 ] && grep -q "symbolic link" "$T/link.err" || fail "linked key file: exit $rc"
printf 'short' >"$T/short"; chmod 600 "$T/short"
rc=0; "$KVBM_BIN" fabric-node recv "${GEOM[@]}" --key-file "$T/short" >/dev/null 2>"$T/short.err" || rc=$?
[ "$rc" = 2 ] && grep -q "16..4096" "$T/short.err" || fail "short key: exit $rc"
rc=0; KVBM_FABRIC_KEY_FILE="$T/open" "$KVBM_BIN" fabric-node recv "${GEOM[@]}" >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "KVBM_FABRIC_KEY_FILE not checked: exit $rc"
echo "fabric hostile peers: ok"
