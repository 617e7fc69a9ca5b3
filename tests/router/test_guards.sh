#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm router under hostile load and bad settings (issue 15): refusals at
# start here (duplicate worker ids, bad ports, an unwritable --port-file,
# --max-connections over the descriptor limit), then the live checks of
# tests/router/guards_e2e.py (pipelining, slow readers, approximate-mode
# budget, descriptor exhaustion, active-request cap, idle sockets and the
# per-address bound).
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# refused: exits with status $1 at once (a router that started instead
# would be stopped by timeout: 124) and says $2
refused() {
  local want=$1 msg=$2
  shift 2
  local rc=0
  timeout 20 "$KVBM_BIN" router --listen 127.0.0.1:0 "$@" 2>"$tmp/err" || rc=$?
  if [ "$rc" != "$want" ] || ! grep -q -- "$msg" "$tmp/err"; then
    echo "FAIL: kvbm router $* -> exit $rc (want $want, message '$msg'):" >&2
    cat "$tmp/err" >&2
    exit 1
  fi
}

refused 2 "given to two sources" --zmq 1=tcp://127.0.0.1:5557 --zmq 1=tcp://127.0.0.1:5558
refused 2 "given to two sources" --nats 3=nats://127.0.0.1:4222/a --nats 3=nats://127.0.0.1:4222/b
refused 2 "given to two sources" --zmq 4=tcp://127.0.0.1:5557 --nats 4=nats://127.0.0.1:4222/a
refused 2 "no valid port" --zmq 1=tcp://127.0.0.1:99999
refused 2 "no valid port" --zmq 1=tcp://127.0.0.1:0
refused 2 "no valid port" --zmq 1=tcp://127.0.0.1
refused 2 "no valid port" --zmq 1=tcp://127.0.0.1:5557@tcp://127.0.0.1:70000
refused 2 "no valid port" --nats 1=nats://127.0.0.1:0/kv
refused 2 "no valid port" --nats "1=nats://127.0.0.1:4222,nats://127.0.0.1:x/kv"
refused 2 "out of range" --worker 1 --listen 127.0.0.1:65536
refused 2 "max-per-peer" --worker 1 --max-per-peer 0
refused 1 "port-file" --worker 1 --port-file "$tmp/no/such/dir/port"
refused 1 "port-file" --worker 1 --port-file "$tmp"
# --max-connections against the descriptor limit (ulimit -n sets soft and hard)
(ulimit -n 64; refused 2 "RLIMIT_NOFILE" --worker 1)
(ulimit -n 64; refused 2 "RLIMIT_NOFILE" --worker 1 --max-connections 50)
# what fits starts (and says so in the port file)
(
  ulimit -n 64
  "$KVBM_BIN" router --listen 127.0.0.1:0 --worker 1 --max-connections 30 \
    --port-file "$tmp/port" 2>"$tmp/err" &
  pid=$!
  for _ in $(seq 200); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  [ -s "$tmp/port" ] || { echo "FAIL: router with 30 connections under ulimit -n 64 did not start" >&2; cat "$tmp/err" >&2; kill $pid; exit 1; }
  kill -TERM $pid
  wait $pid
)

exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/router/guards_e2e.py"
