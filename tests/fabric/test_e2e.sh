#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end over UCX on loopback, two processes: node A (kvbm fabric-node
# send) prefills blocks and sends them framed, either pushed whole or
# written one-sided into blocks node B granted and announced by their frame
# headers; node B (kvbm fabric-node recv) verifies each frame, places the
# bytes in its storage (or checks them where they landed) and registers the
# blocks in its pool. Checks: every block arrives and is registered with the
# right bytes; blocks corrupted in flight are rejected (and only those);
# layouts that do not fit are refused.
set -euo pipefail
: "${KVBM_BIN:?}"
PY=/usr/bin/python3
T=$(mktemp -d)
B_PID=
cleanup() { [ -n "$B_PID" ] && kill "$B_PID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
GEOM=(--layers 4 --inner 64 --page-size 16 --timeout-ms 20000)
# Both nodes hold the same key (test_hostile.sh covers the others).
unset KVBM_FABRIC_KEY
head -c 32 /dev/urandom >"$T/key"; chmod 600 "$T/key"
export KVBM_FABRIC_KEY_FILE="$T/key"
fail() { echo "FAIL: $*" >&2; for f in "$T"/*.out "$T"/*.err; do echo "== $f" >&2; cat "$f" >&2; done; exit 1; }

# start_b NAME ARGS...: node B in the background, waits for its port
start_b() {
  local name=$1; shift
  rm -f "$T/port"
  "$KVBM_BIN" fabric-node recv --port-file "$T/port" --json "$@" >"$T/$name.b.out" 2>"$T/$name.b.err" &
  B_PID=$!
  for _ in $(seq 200); do [ -s "$T/port" ] && return 0; sleep 0.05; done
  fail "$name: node B never listened"
}
wait_b() { RC=0; wait "$B_PID" || RC=$?; B_PID=; }

# jget FILE EXPR: a value from a JSON object
jget() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2"; }

# 1. clean transfer, shared memory
start_b clean "${GEOM[@]}" --capacity 32 --tls shm,self
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" "${GEOM[@]}" --blocks 24 --tls shm,self --json \
  >"$T/clean.a.out" 2>"$T/clean.a.err" || fail "clean: node A failed"
wait_b; [ "$RC" = 0 ] || fail "clean: node B exit $RC"
for k in received onboarded verified registered; do
  [ "$(jget "$T/clean.b.out" "d['$k']")" = 24 ] || fail "clean: $k"
done
[ "$(jget "$T/clean.b.out" "d['rejected']")" = 0 ] || fail "clean: rejected"
[ "$(jget "$T/clean.b.out" "d['peer']")" = node-a ] || fail "clean: peer label"
[ "$(jget "$T/clean.a.out" "d['sent']")" = 24 ] || fail "clean: sent"

# 2. two blocks corrupted in flight: exactly those are rejected, by checksum
start_b corrupt "${GEOM[@]}" --capacity 32 --tls shm,self
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" "${GEOM[@]}" --blocks 24 --corrupt 3 --corrupt 10 \
  --tls shm,self --json >"$T/corrupt.a.out" 2>"$T/corrupt.a.err" || fail "corrupt: node A failed"
wait_b; [ "$RC" = 1 ] || fail "corrupt: node B should report failure, exit $RC"
[ "$(jget "$T/corrupt.b.out" "d['rejected']")" = 2 ] || fail "corrupt: rejected"
[ "$(jget "$T/corrupt.b.out" "d['onboarded']")" = 22 ] || fail "corrupt: onboarded"
[ "$(jget "$T/corrupt.b.out" "d['verified']")" = 22 ] || fail "corrupt: verified"
[ "$(jget "$T/corrupt.b.out" "d['registered']")" = 22 ] || fail "corrupt: registered"
[ "$(jget "$T/corrupt.b.out" "sorted(r['hash'] for r in d['rejected_blocks'])")" = \
  "$(jget "$T/corrupt.a.out" "sorted(d['corrupted_blocks'])")" ] || fail "corrupt: wrong blocks rejected"
[ "$(jget "$T/corrupt.b.out" "set(r['error'] for r in d['rejected_blocks'])")" = "{'KVBM_ECHECKSUM'}" ] ||
  fail "corrupt: not a checksum error"
grep -q "ECHECKSUM" "$T/corrupt.b.err" || fail "corrupt: no message"

# 2b. the same with one-sided placement: blocks written into blocks the
# receiver granted, announced by frame headers, verified where they landed
start_b placed "${GEOM[@]}" --layer-separate --capacity 32 --tls shm,self
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" "${GEOM[@]}" --layer-separate --blocks 24 --mode put \
  --corrupt 0 --corrupt 23 --tls shm,self --json >"$T/placed.a.out" 2>"$T/placed.a.err" || fail "placed: node A failed"
wait_b; [ "$RC" = 1 ] || fail "placed: node B should report failure, exit $RC"
[ "$(jget "$T/placed.a.out" "d['mode']")" = put ] || fail "placed: mode"
[ "$(jget "$T/placed.b.out" "(d['rejected'], d['onboarded'], d['verified'], d['registered'])")" = "(2, 22, 22, 22)" ] ||
  fail "placed: counts"
[ "$(jget "$T/placed.b.out" "sorted(r['hash'] for r in d['rejected_blocks'])")" = \
  "$(jget "$T/placed.a.out" "sorted(d['corrupted_blocks'])")" ] || fail "placed: wrong blocks rejected"

# 2c. placed, W4's real block (32 layers x 16 tokens x 2048 x 2 bytes = 2 MiB), clean
start_b w4 --capacity 12 --tls shm,self --timeout-ms 20000
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" --blocks 12 --mode put --tls shm,self --timeout-ms 20000 \
  --json >"$T/w4.a.out" 2>"$T/w4.a.err" || fail "w4: node A failed"
wait_b; [ "$RC" = 0 ] || fail "w4: node B exit $RC"
[ "$(jget "$T/w4.a.out" "d['block_bytes']")" = 2097152 ] || fail "w4: block size"
[ "$(jget "$T/w4.b.out" "(d['verified'], d['registered'])")" = "(12, 12)" ] || fail "w4: counts"

# 3. layer-separate layouts, over TCP on the loopback device
start_b tcp "${GEOM[@]}" --layer-separate --capacity 16 --tls tcp,self --net-devices lo
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" "${GEOM[@]}" --layer-separate --blocks 16 \
  --tls tcp,self --net-devices lo --json >"$T/tcp.a.out" 2>"$T/tcp.a.err" || fail "tcp: node A failed"
wait_b; [ "$RC" = 0 ] || fail "tcp: node B exit $RC"
[ "$(jget "$T/tcp.b.out" "d['verified']")" = 16 ] || fail "tcp: verified"

# 3b. layouts that differ in kind are bridged: a LayerSeparate sender puts
# into a FullyContiguous receiver, layer by layer
start_b bridge "${GEOM[@]}" --capacity 16 --tls shm,self
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" "${GEOM[@]}" --layer-separate --blocks 12 --mode put \
  --tls shm,self --json >"$T/bridge.a.out" 2>"$T/bridge.a.err" || fail "bridge: node A failed"
wait_b; [ "$RC" = 0 ] || fail "bridge: node B exit $RC"
[ "$(jget "$T/bridge.b.out" "d['verified']")" = 12 ] || fail "bridge: verified"

# 4. a sender whose blocks do not match the receiver's layout is refused
start_b mismatch "${GEOM[@]}" --capacity 8 --tls shm,self
rc=0
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" --layers 8 --inner 64 --page-size 16 --blocks 4 \
  --tls shm,self >"$T/mismatch.a.out" 2>"$T/mismatch.a.err" || rc=$?
[ "$rc" = 2 ] || fail "mismatch: node A exit $rc"
grep -q "layout mismatch: num_layers 8 here, 4 at the peer" "$T/mismatch.a.err" || fail "mismatch: message"
wait_b; [ "$RC" = 0 ] || fail "mismatch: node B exit $RC"
[ "$(jget "$T/mismatch.b.out" "d['received']")" = 0 ] || fail "mismatch: B received blocks"

# 5. more blocks than the receiver holds: refused before sending
start_b small "${GEOM[@]}" --capacity 4 --tls shm,self
rc=0
"$KVBM_BIN" fabric-node send --port "$(cat "$T/port")" "${GEOM[@]}" --blocks 5 --tls shm,self \
  >"$T/small.a.out" 2>"$T/small.a.err" || rc=$?
[ "$rc" = 2 ] || fail "small: node A exit $rc"
grep -q "holds 4 blocks" "$T/small.a.err" || fail "small: message"
wait_b

# 6. usage errors
rc=0; "$KVBM_BIN" fabric-node >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "usage: no role"
rc=0; "$KVBM_BIN" fabric-node send --blocks 3 >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "usage: no port"
rc=0; "$KVBM_BIN" fabric-node recv --capacity 0 >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "usage: capacity"
rc=0; "$KVBM_BIN" fabric-node recv --bogus >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "usage: bogus"
rc=0; "$KVBM_BIN" fabric-node send --port 1 --mode teleport >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "usage: mode"
echo "fabric e2e: ok"
