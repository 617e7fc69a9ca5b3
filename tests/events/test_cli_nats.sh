#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_cli_nats.sh: a Python SGLang engine -> `kvbm events relay --nats` -> a
# real nats-server (free loopback port, stopped at the end) -> `kvbm events
# tail nats://... --subject`: tail shows exactly the engine's events (the
# engine checks them field by field), including batches the engine did not
# send live (the relay got them by replay).
set -euo pipefail
KVBM=${KVBM_BIN:?}
PEER="$KVBM_SOURCE_DIR/tests/events/engine_peer.py"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
/usr/sbin/nats-server -a 127.0.0.1 -p "$port" -m "$mport" >/dev/null 2>&1 &
pids+=($!)
url="nats://127.0.0.1:$port"
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

coproc ENGINE { exec /usr/bin/python3 "$PEER" engine sglang-positional int 20 4 -; }
pids+=("$ENGINE_PID")
read -r ep rep <&"${ENGINE[0]}"
"$KVBM" events tail "$url" --subject kvbm.events.w0 --idle-ms 120000 \
  >"$tmp/tail.jsonl" 2>"$tmp/tail.err" &
tail_pid=$!
pids+=("$tail_pid")
"$KVBM" events relay "$ep" --replay "$rep" --from 0 --nats "$url" --subject kvbm.events.w0 \
  --form map --batch 5 --delay-us 0 --count 20 --idle-ms 30000 >"$tmp/relay.out" 2>"$tmp/relay.err" &
relay_pid=$!
pids+=("$relay_pid")
# tail has no replay: the engine starts once nats-server holds tail's
# subscription (its monitor lists it)
/usr/bin/python3 - "$mport" <<'PY' || fail "tail never subscribed to kvbm.events.w0"
import json, sys, time, urllib.request
url = "http://127.0.0.1:%s/subsz?subs=1" % sys.argv[1]
t0 = time.time()
while time.time() - t0 < 30:
    try:
        subs = json.load(urllib.request.urlopen(url, timeout=2)).get("subscriptions_list") or []
        if any(x.get("subject") == "kvbm.events.w0" for x in subs):
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.05)
sys.exit(1)
PY
sleep 0.3 # the relay's ZMQ subscription (it replays from 0 besides)
echo go >&"${ENGINE[1]}"
wait "$relay_pid" || fail "relay exited $? ($(cat "$tmp/relay.err"))"
grep -q "20 batches" "$tmp/relay.err" || fail "relay summary: $(cat "$tmp/relay.err")"
# tail stops once it printed every relayed event (not after an idle window,
# which a loaded machine can outlast before the first batch)
events=$(sed -n 's/.*published [0-9]* batches (\([0-9]*\) events).*/\1/p' "$tmp/relay.err")
[ -n "$events" ] || fail "relay summary without its event count: $(cat "$tmp/relay.err")"
for _ in $(seq 600); do
  [ "$(wc -l <"$tmp/tail.jsonl")" -ge "$events" ] && break
  kill -0 "$tail_pid" 2>/dev/null || break
  sleep 0.1
done
kill -TERM "$tail_pid" 2>/dev/null || true
wait "$tail_pid" || fail "tail exited $? ($(cat "$tmp/tail.err"))"
grep -q " 0 lost," "$tmp/tail.err" && grep -q " 0 malformed" "$tmp/tail.err" ||
  fail "tail summary: $(cat "$tmp/tail.err")"
grep -q " 0 failed sends" "$tmp/relay.err" || fail "relay publisher summary: $(cat "$tmp/relay.err")"
echo "checkev $tmp/tail.jsonl" >&"${ENGINE[1]}"
read -r verdict <&"${ENGINE[0]}"
[ "$verdict" = OK ] || fail "engine says the events on NATS differ"
echo "events CLI over NATS: ok"
