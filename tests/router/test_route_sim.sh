#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm route-sim (W3): the event-fed index agrees with the caches on every
# lookup (index_mismatches 0) and the kv-aware router then chooses exactly as
# the ideal one; with one worker every policy is W1 and equals kvbm replay;
# a router restarted warm mid-trace (its index saved to a file, dropped,
# loaded, each worker's last batch delivered again) routes exactly as one
# that never stopped and ends with a byte-equal index, in both key modes;
# bad options are refused with exit 2 and a message.
set -euo pipefail
: "${KVBM_BIN:?}"
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
N=300

check() { # check FILE: exact index, kv-aware == ideal, sane counts
  "$PY" - "$1" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
for k in ("kv_aware", "random", "round_robin", "ideal"):
    assert "hit_tokens" in r[k], k
    assert 0 <= r[k]["hit_tokens"] <= r[k]["prompt_tokens"], (k, r[k])
assert r["index_mismatches"] == 0, r
assert r["lookups"] == r["requests"] > 0, r
assert r["events"] > 0 and r["event_bytes"] > 0, r
assert r["kv_aware"]["hit_tokens"] == r["ideal"]["hit_tokens"], r
PYEOF
}

"$KVBM_BIN" route-sim --limit $N --json --no-progress --active-ms 0 > "$tmp/a.json"
check "$tmp/a.json"
# with a load term, kv-aware routing beats random and round robin here
"$KVBM_BIN" route-sim --limit $N --json --no-progress --active-ms 10000 > "$tmp/b.json"
check "$tmp/b.json"
"$PY" - "$tmp/b.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["kv_aware"]["hit_tokens"] > r["random"]["hit_tokens"], r
assert r["kv_aware"]["hit_tokens"] > r["round_robin"]["hit_tokens"], r
PYEOF
# recompute: the index keys blocks by Dynamo hashes of the events' tokens
"$KVBM_BIN" route-sim --limit $N --json --no-progress --recompute dynamo --active-ms 10000 \
  --workers 4 --capacity 8192 > "$tmp/c.json"
check "$tmp/c.json"
grep -q '"index_keys":"dynamo"' "$tmp/c.json"
# small caches: many evictions (BlockRemoved) reach the index
"$KVBM_BIN" route-sim --limit $N --json --no-progress --capacity 8000 --hash dynamo \
  --temperature 0.5 > "$tmp/d.json"
check "$tmp/d.json"

# one worker: every policy is W1, so all equal kvbm replay's hit tokens
"$KVBM_BIN" route-sim --limit $N --json --no-progress --workers 1 --capacity 9000 > "$tmp/e.json"
"$KVBM_BIN" replay --limit $N --json --no-progress --capacity 9000 > "$tmp/w1.json"
"$PY" - "$tmp/e.json" "$tmp/w1.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1])); w1 = json.load(open(sys.argv[2]))
for k in ("kv_aware", "random", "round_robin", "ideal"):
    assert r[k]["hit_tokens"] == w1["hit_tokens"], (k, r[k], w1)
assert r["index_mismatches"] == 0
PYEOF

# warm restart mid-trace: same choices, same final index as the unstopped
for mode in "" "--recompute dynamo"; do
  # shellcheck disable=SC2086
  "$KVBM_BIN" route-sim --limit $N --json --no-progress $mode > "$tmp/f0.json"
  # shellcheck disable=SC2086
  "$KVBM_BIN" route-sim --limit $N --json --no-progress $mode --restart-at $((N / 2)) \
    --snapshot "$tmp/index.snap" > "$tmp/f1.json"
  check "$tmp/f1.json"
  [ -s "$tmp/index.snap" ] || { echo "no snapshot file"; exit 1; }
  "$PY" - "$tmp/f0.json" "$tmp/f1.json" <<'PYEOF'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
rs = b["restart"]
assert rs["equal_to_unstopped"] is True, rs
assert rs["redelivered"] > 0 and rs["redelivered_skipped"] == rs["redelivered"], rs
assert rs["snapshot_bytes"] > 0, rs
assert "restart" not in a
assert a["kv_aware"]["hit_tokens"] == b["kv_aware"]["hit_tokens"], (a["kv_aware"], b["kv_aware"])
assert a["events"] == b["events"], (a["events"], b["events"])
PYEOF
done

# text output names every policy
"$KVBM_BIN" route-sim --limit 50 --no-progress > "$tmp/t.txt"
for w in kv-aware random round-robin ideal mismatches; do grep -q "$w" "$tmp/t.txt"; done

# bad input: exit 2 with a message
expect2() {
  set +e
  "$KVBM_BIN" route-sim "$@" > "$tmp/o" 2> "$tmp/e"
  rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "route-sim $*: exit $rc, expected 2"; cat "$tmp/e"; exit 1; }
  [ -s "$tmp/e" ] || { echo "route-sim $*: no message"; exit 1; }
}
expect2 --workers 0
expect2 --workers 65
expect2 --capacity
expect2 --hash sha256
expect2 --recompute nope
expect2 --load tokens
expect2 --temperature -1
expect2 --frobnicate
expect2 --restart-at 0
expect2 "$tmp/does-not-exist.jsonl"
echo '{"timestamp": 0, "input_length": 5}' > "$tmp/bad.jsonl"
expect2 "$tmp/bad.jsonl"
# a request that does not fit in a worker: runtime failure, exit 1
set +e
"$KVBM_BIN" route-sim --limit 5 --capacity 4 --no-progress > "$tmp/o" 2> "$tmp/e"
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "does not fit" "$tmp/e" || { echo "small capacity: exit $rc"; cat "$tmp/e"; exit 1; }
echo ok
