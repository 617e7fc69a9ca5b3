#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/trace_sessions.py: sessions, turns and gaps on a trace whose
# answer is known by hand; hostile traces and arguments refused by name.
set -euo pipefail
: "${KVBM_SOURCE_DIR:?}"
S="$KVBM_SOURCE_DIR/scripts/trace_sessions.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# r0 and r1 start sessions (sharing only id 0, the system prompt); r2
# continues r0 after 10 s, r3 continues r2 after 30 s, r4 continues r1
# after 49 s.
cat >"$tmp/t.jsonl" <<'T'
{"timestamp": 0, "input_length": 1500, "output_length": 100, "hash_ids": [0, 1, 2]}
{"timestamp": 1000, "input_length": 900, "output_length": 10, "hash_ids": [0, 5]}
{"timestamp": 10000, "input_length": 2000, "output_length": 300, "hash_ids": [0, 1, 2, 3]}

{"timestamp": 40000, "input_length": 2500, "output_length": 50, "hash_ids": [0, 1, 2, 3, 4]}
{"timestamp": 50000, "input_length": 1400, "output_length": 20, "hash_ids": [0, 5, 6]}
T
/usr/bin/python3 "$S" "$tmp/t.jsonl" --json >"$tmp/out.json"
/usr/bin/python3 - "$tmp/out.json" <<'PY' || fail "wrong analysis: $(cat "$tmp/out.json")"
import json, sys
a = json.load(open(sys.argv[1]))
assert a["requests"] == 5 and a["continuations"] == 3, a
t = {x["turn"]: (x["requests"], x["next_turn_share"]) for x in a["turns"]}
assert t == {0: (2, 1.0), 1: (2, 0.5), 2: (1, 0.0)}, t
assert a["gap_s"] == {"p10": 10.0, "p50": 30.0, "p90": 30.0, "n": 3}, a["gap_s"]
assert a["previous_gap_n"] == 1, a
PY
# --min-shared 4: only r3 continues (r2 shares 4 ids with it); r2 shares 3 with r0
/usr/bin/python3 "$S" "$tmp/t.jsonl" --json --min-shared 4 | /usr/bin/python3 -c '
import json, sys; a = json.load(sys.stdin); assert a["continuations"] == 1, a' ||
  fail "--min-shared 4"
gzip -c "$tmp/t.jsonl" >"$tmp/t.jsonl.gz"
/usr/bin/python3 "$S" "$tmp/t.jsonl.gz" >"$tmp/gz.out" # not into grep -q: it may close the pipe early
grep -q "5 requests, 3 continue" "$tmp/gz.out" || fail "gzip trace: $(cat "$tmp/gz.out")"

refused() { # refused EXIT MESSAGE ARGS...
  local want=$1 msg=$2 rc=0
  shift 2
  timeout 20 /usr/bin/python3 "$S" "$@" >/dev/null 2>"$tmp/err" || rc=$?
  [ "$rc" = "$want" ] && grep -qF -- "$msg" "$tmp/err" ||
    fail "trace_sessions $* -> exit $rc (want $want, '$msg'): $(cat "$tmp/err")"
}
printf '{"timestamp": 0, "hash_ids": [0]}\n{"timestamp": 1, "hash_ids": [0,\n' >"$tmp/bad1"
refused 1 "bad1:2: not JSON" "$tmp/bad1"
printf '{"timestamp": 0, "hash_ids": "0 1 2"}\n' >"$tmp/bad2"
refused 1 "hash_ids is not a list of integers" "$tmp/bad2"
printf '{"timestamp": -5, "hash_ids": [0]}\n' >"$tmp/bad3"
refused 1 "timestamp is not a non-negative integer" "$tmp/bad3"
printf '[1, 2]\n' >"$tmp/bad4"
refused 1 "not a JSON object" "$tmp/bad4"
printf '{"timestamp": 0, "input_length": true, "hash_ids": [0]}\n' >"$tmp/bad5"
refused 1 "input_length is not a non-negative integer" "$tmp/bad5"
head -c 40 "$tmp/t.jsonl.gz" >"$tmp/cut.gz"
refused 1 "cut.gz" "$tmp/cut.gz"
printf '\xff\xfe{\n' >"$tmp/bad6"
refused 1 "bad6" "$tmp/bad6"
refused 1 "No such file" "$tmp/nonexistent"
refused 2 "unknown option" --bogus
refused 2 "--min-shared needs" "$tmp/t.jsonl" --min-shared 0
refused 2 "--min-shared needs" "$tmp/t.jsonl" --min-shared
echo ok
