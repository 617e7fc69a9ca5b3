#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_cli_coalesce.sh: `kvbm events relay --coalesce` (issue 22). An engine
# that sends one block an event, as a kvbm pool link does (chained one-block
# BlockStored events, one-block BlockRemoved events between them, a medium
# change in one chain; tests/events/coalesce_peer.py), is relayed to our own
# ZMQ endpoint and read back with `kvbm events tail`:
#  - without --coalesce the relayed events are the engine's, one for one, in
#    order (the option is off by default);
#  - with --coalesce they are fewer, some of several blocks, and carry
#    exactly the same blocks: stored hashes and tokens in order, each stored
#    event a chain with its first block's parent and one medium, removed
#    hashes in order, every hash's store before its removal.
# The relay's publisher holds a batch for 200 ms, so an engine batch (one
# request) is one publisher batch and has something to merge.
set -euo pipefail
KVBM=${KVBM_BIN:?}
PEER="$KVBM_SOURCE_DIR/tests/events/coalesce_peer.py"
NREQ=12
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# the option is relay's: tail refuses it
set +e
"$KVBM" events tail tcp://127.0.0.1:9 --coalesce >/dev/null 2>&1
[ $? -eq 2 ] || fail "tail --coalesce should exit 2"
set -e
"$KVBM" events --help | grep -q -- "--coalesce" || fail "events --help does not mention --coalesce"

# Waits until a TCP connection to or from 127.0.0.1:PORT is established
# (/proc/net/tcp, state 01): a subscriber that has connected to a PUB.
wait_connected() { # PORT
  local hex
  hex=$(printf '%04X' "$1")
  for _ in $(seq 600); do
    awk -v p=":$hex" 'NR > 1 && $4 == "01" && (substr($2, length($2) - 4) == p ||
      substr($3, length($3) - 4) == p) { found = 1 } END { exit !found }' /proc/net/tcp && return 0
    sleep 0.1
  done
  fail "nothing connected to port $1 in 60 s"
}

relay_check() { # MODE RELAY_OPTIONS...
  local mode=$1
  shift
  rm -f "$tmp"/relay.* "$tmp"/relayed.* "$tmp/sent.json"
  coproc ENGINE { exec /usr/bin/python3 "$PEER" engine "$NREQ" "$tmp/sent.json"; }
  local engine_pid=$ENGINE_PID
  pids+=("$engine_pid")
  read -r ep rep <&"${ENGINE[0]}"
  "$KVBM" events relay "$ep" --replay "$rep" --from 0 --zmq 'tcp://127.0.0.1:*' \
    --zmq-replay 'tcp://127.0.0.1:*' --batch 4096 --delay-us 200000 --count "$NREQ" \
    --idle-ms 30000 "$@" >"$tmp/relay.out" 2>"$tmp/relay.err" &
  local relay_pid=$!
  pids+=("$relay_pid")
  for _ in $(seq 100); do [ -s "$tmp/relay.out" ] && break; sleep 0.1; done
  read -r _ _ out_ep _ out_rep <"$tmp/relay.out"
  [ -n "$out_rep" ] || fail "relay did not say where it publishes: $(cat "$tmp/relay.out" "$tmp/relay.err")"
  "$KVBM" events tail "$out_ep" --replay "$out_rep" --from 0 --idle-ms 120000 \
    >"$tmp/relayed.jsonl" 2>"$tmp/relayed.err" &
  local tail_pid=$!
  pids+=("$tail_pid")
  wait_connected "${out_ep##*:}"
  sleep 0.5
  echo go >&"${ENGINE[1]}"
  wait "$relay_pid" || fail "relay exited $? ($(cat "$tmp/relay.err"))"
  grep -q "$NREQ batches" "$tmp/relay.err" || fail "relay summary: $(cat "$tmp/relay.err")"
  grep -q " 0 refused" "$tmp/relay.err" || fail "relay refused events: $(cat "$tmp/relay.err")"
  local verdict rc=0
  verdict=$(/usr/bin/python3 "$PEER" check "$tmp/sent.json" "$tmp/relayed.jsonl" "$mode") || rc=$?
  kill -TERM "$tail_pid" 2>/dev/null || true
  wait "$tail_pid" || true
  [ "$rc" -eq 0 ] || fail "$mode: $verdict ($(cat "$tmp/relayed.err"))"
  echo "$mode: $verdict"
  kill "$engine_pid" 2>/dev/null || true  # it serves replay until then
  wait "$engine_pid" 2>/dev/null || true
}
relay_check exact
relay_check coalesced --coalesce
relay_check coalesced --coalesce --form map
echo "events relay --coalesce: ok"
