#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm advisor end to end (tests/advisor/advisor_e2e.py): a real
# nats-server, storage and KV publishers over ZMQ and NATS written from the
# wire specifications, hints checked on a trace whose right answer is
# known, hostile events and HTTP; and refusals at start.
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
refused() { # refused EXIT MESSAGE ARGS...: exits at once (not 124: started) saying MESSAGE
  local want=$1 msg=$2
  shift 2
  local rc=0
  timeout 20 "$KVBM_BIN" advisor --listen 127.0.0.1:0 "$@" 2>"$tmp/err" || rc=$?
  if [ "$rc" != "$want" ] || ! grep -qF -- "$msg" "$tmp/err"; then
    echo "FAIL: kvbm advisor $* -> exit $rc (want $want, '$msg'): $(cat "$tmp/err")" >&2
    fails=$((fails + 1))
  fi
}
refused 2 "not NAME=G2|G3|G4" --volume disk=G1
refused 2 "not NAME=G2|G3|G4" --volume =G3
refused 2 "is not nats://HOST:PORT/SUBJECT" --storage-nats nats://127.0.0.1:4222
refused 2 "port is not in 1..65535" --storage-zmq tcp://127.0.0.1:99999
refused 2 "port is not in 1..65535" --kv-nats w=nats://127.0.0.1:4222/s@tcp://127.0.0.1:99999
refused 2 "is not NAME=" --kv-zmq tcp://127.0.0.1:5555
refused 2 "--hint-period-ms" --hint-period-ms 0
refused 2 "--demote-fraction" --demote-fraction 1
refused 2 "unknown option" --bogus
refused 2 "is not HOST:PORT" --listen nowhere
refused 1 "cannot write" --port-file /nonexistent/dir/port
refused 1 "NATS nats://127.0.0.1:1" --storage-nats nats://127.0.0.1:1/s
[ "$fails" -eq 0 ] || exit 1
exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/advisor/advisor_e2e.py"
