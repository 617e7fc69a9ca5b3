#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_cli.sh: `kvbm events tail` and `kvbm events relay` against Python
# engines (tests/events/engine_peer.py): tail prints exactly what the
# engine sent (the engine checks, field by field), across batches it did
# not send live (recovered by replay); relay republishes the stream on our
# own ZMQ endpoint and nothing is lost on the way: tail on that endpoint
# shows the same events with every field the engine sent (SGLang's salt and
# session id, token pairs, vLLM's extra_keys, kind, window, locality,
# ownership, unknown fields) and the engine's dp_rank; with
# --form positional --signed-hashes, Dynamo's shapes; usage errors exit 2.
set -euo pipefail
KVBM=${KVBM_BIN:?}
PEER="$KVBM_SOURCE_DIR/tests/events/engine_peer.py"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

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

# usage errors
set +e
"$KVBM" events >/dev/null 2>&1; [ $? -eq 2 ] || fail "no subcommand should exit 2"
"$KVBM" events tail >/dev/null 2>&1; [ $? -eq 2 ] || fail "tail without endpoint should exit 2"
"$KVBM" events tail tcp://127.0.0.1:9 --from -1 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--from -1"
"$KVBM" events tail bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad endpoint should exit 2"
"$KVBM" events relay tcp://127.0.0.1:9 >/dev/null 2>&1; [ $? -eq 2 ] || fail "relay without a sink"
"$KVBM" events relay tcp://127.0.0.1:9 --nats nats://127.0.0.1:9 >/dev/null 2>&1
[ $? -eq 2 ] || fail "relay --nats without --subject"
"$KVBM" events relay tcp://127.0.0.1:9 --zmq tcp://127.0.0.1:* --form xml >/dev/null 2>&1
[ $? -eq 2 ] || fail "relay --form xml"
set -e

# tail: vLLM's positional form, bytes hashes, 3 and 9 not sent live
coproc ENGINE { exec /usr/bin/python3 "$PEER" engine vllm-v0.2x bytes 25 3,9 -; }
pids+=("$ENGINE_PID")
read -r ep rep <&"${ENGINE[0]}"
"$KVBM" events tail "$ep" --replay "$rep" --from 0 --count 25 --idle-ms 20000 \
  >"$tmp/tail.jsonl" 2>"$tmp/tail.err" &
tail_pid=$!
pids+=("$tail_pid")
sleep 0.5
echo go >&"${ENGINE[1]}"
wait "$tail_pid" || fail "tail exited $? ($(cat "$tmp/tail.err"))"
grep -q "25 batches" "$tmp/tail.err" || fail "tail summary: $(cat "$tmp/tail.err")"
grep -q " 0 lost" "$tmp/tail.err" || fail "tail lost batches: $(cat "$tmp/tail.err")"
echo "check $tmp/tail.jsonl" >&"${ENGINE[1]}"
read -r verdict <&"${ENGINE[0]}"
[ "$verdict" = OK ] || fail "engine says tail output differs"
wait "$ENGINE_PID" || true

# relay: engine -> relay (FORM) -> our ZMQ -> tail; the engine checks every
# field and the dp_rank (2, the engine's: not the relay's 0)
relay_check() { # PROFILE NBATCHES SKIP RELAY_OPTIONS...
  local profile=$1 n=$2 skip=$3
  shift 3
  # The files of the check before must go first: the relay below is started
  # in the background, and the loop that waits for its endpoint could read
  # the last relay's (gone) before the new one truncates the file; tail then
  # subscribed to a dead port and saw nothing.
  rm -f "$tmp/relay.out" "$tmp/relay.err" "$tmp/relayed.jsonl" "$tmp/relayed.err"
  coproc ENGINE2 { exec /usr/bin/python3 "$PEER" engine "$profile" int "$n" "$skip" -; }
  local engine_pid=$ENGINE2_PID
  pids+=("$engine_pid")
  read -r ep rep <&"${ENGINE2[0]}"
  # the relay stops after the engine's n batches (--idle-ms: only a guard)
  "$KVBM" events relay "$ep" --replay "$rep" --from 0 --zmq 'tcp://127.0.0.1:*' \
    --zmq-replay 'tcp://127.0.0.1:*' --batch 7 --delay-us 0 --count "$n" --idle-ms 30000 "$@" \
    >"$tmp/relay.out" 2>"$tmp/relay.err" &
  relay_pid=$!
  pids+=("$relay_pid")
  for _ in $(seq 100); do [ -s "$tmp/relay.out" ] && break; sleep 0.1; done
  read -r _ _ out_ep _ out_rep <"$tmp/relay.out"
  [ -n "$out_rep" ] || fail "relay did not say where it publishes: $(cat "$tmp/relay.out" "$tmp/relay.err")"
  # tail subscribes before the engine starts; once the relay has published
  # everything, tail is stopped when it has printed every relayed event (it
  # writes a batch's lines at once), not after an idle window: a loaded
  # machine can take longer than any window to deliver the first batch
  "$KVBM" events tail "$out_ep" --replay "$out_rep" --from 0 --idle-ms 120000 \
    >"$tmp/relayed.jsonl" 2>"$tmp/relayed.err" &
  local tail_pid=$!
  pids+=("$tail_pid")
  # the relay exits after its n batches, and its replay socket with it: tail
  # must have subscribed before the engine starts (a loaded ASan run took
  # longer than any fixed pause to start tail, which then saw nothing)
  wait_connected "${out_ep##*:}"
  sleep 0.5
  echo go >&"${ENGINE2[1]}"
  wait "$relay_pid" || fail "relay exited $? ($(cat "$tmp/relay.err"))"
  grep -q "$n batches" "$tmp/relay.err" || fail "relay summary: $(cat "$tmp/relay.err")"
  local events
  events=$(sed -n 's/.*published [0-9]* batches (\([0-9]*\) events).*/\1/p' "$tmp/relay.err")
  [ -n "$events" ] || fail "relay summary without its event count: $(cat "$tmp/relay.err")"
  for _ in $(seq 600); do
    [ "$(wc -l <"$tmp/relayed.jsonl")" -ge "$events" ] && break
    kill -0 "$tail_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$tail_pid" 2>/dev/null || true
  wait "$tail_pid" || fail "tail of relay: $(cat "$tmp/relayed.err")"
  echo "checkev $tmp/relayed.jsonl" >&"${ENGINE2[1]}"
  read -r verdict <&"${ENGINE2[0]}"
  [ "$verdict" = OK ] || fail "$profile: engine says the relayed events differ"
  wait "$engine_pid" || true
}
relay_check sglang-positional 30 5
relay_check vllm 30 5,6
relay_check dynamo 20 - --form positional --signed-hashes
grep -qE " [1-9][0-9]* skipped \(not decodable\)" "$tmp/relay.err" || fail "relay did not report Dynamo's bad events: $(cat "$tmp/relay.err")"
echo "events CLI: ok"
