#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `kvbm trace-gen`: deterministic per seed; every line is a request the
# trace reader takes (kvbm replay runs it); the model's properties hold in
# the output: sessions whose prompts extend the previous turn's prompt and
# answer, a shared system prompt per session picked with Zipf popularity
# (rank 1 about 2^zipf times rank 2), the documented means of turns and
# lengths within a tolerance, time order; bad parameters are named.
set -uo pipefail
tmp=$(mktemp -d "${KVBM_BINARY_DIR:-/tmp}/tracegen-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$KVBM_BIN" trace-gen --out "$tmp/a.jsonl" --quiet || fail "chat"
"$KVBM_BIN" trace-gen --quiet > "$tmp/a2.jsonl" || fail "chat to stdout"
"$KVBM_BIN" trace-gen --seed 2 --out "$tmp/b.jsonl" --quiet || fail "chat seed 2"
"$KVBM_BIN" trace-gen --profile agent --requests 6000 --out "$tmp/g.jsonl" 2> "$tmp/g.err" || fail "agent"
cmp -s "$tmp/a.jsonl" "$tmp/a2.jsonl" || fail "same seed, different bytes"
cmp -s "$tmp/a.jsonl" "$tmp/b.jsonl" && fail "another seed, same bytes"
grep -q "6000 requests" "$tmp/g.err" || fail "summary: $(cat "$tmp/g.err")"

"$KVBM_BIN" replay "$tmp/g.jsonl" --limit 2000 --json --no-progress > "$tmp/g.replay.json" \
  || fail "the reader refuses the generated trace"

check() { # file zipf turns user_tokens output_tokens system_prompts system_tokens
  /usr/bin/python3 - "$@" <<'PY'
import json, sys, collections
path, zipf, turns, user, out, nsys, systok = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), \
    float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
reqs = [json.loads(l) for l in open(path)]
bad = []
sys_blocks = -(-systok // 512)
shared = sys_blocks - (1 if systok % 512 else 0)   # whole system blocks, shared by sessions
last_ts = 0
sessions = {}          # first session-owned id -> list of requests
first_turn_prompt = collections.Counter()
for i, r in enumerate(reqs):
    ids, L = r["hash_ids"], r["input_length"]
    if set(r) != {"timestamp", "input_length", "output_length", "hash_ids"}: bad.append(f"{i}: keys {set(r)}")
    if r["timestamp"] < last_ts: bad.append(f"{i}: time goes back")
    last_ts = r["timestamp"]
    if not (512 * (len(ids) - 1) < L <= 512 * len(ids)): bad.append(f"{i}: {L} tokens in {len(ids)} ids")
    if not (1 <= r["output_length"] <= 65535): bad.append(f"{i}: output {r['output_length']}")
    sysp = ids[0] // sys_blocks if shared else None
    if shared and ids[:shared] != [sysp * sys_blocks + b for b in range(shared)]:
        bad.append(f"{i}: does not start with a whole system prompt")
    key = ids[shared]
    sessions.setdefault(key, []).append(r)
    if len(sessions[key]) == 1 and shared: first_turn_prompt[sysp] += 1
# Turn by turn: each prompt extends the previous turn's (its last block
# keeps its id as it fills), by at least the previous answer.
for key, rs in sessions.items():
    for a, b in zip(rs, rs[1:]):
        pa, pb = a["hash_ids"], b["hash_ids"]
        if pb[:len(pa)] != pa: bad.append(f"session {key}: a turn does not extend the previous one")
        if b["input_length"] < a["input_length"] + a["output_length"] + 1:
            bad.append(f"session {key}: a turn is shorter than the last one plus its answer")
        if b["timestamp"] < a["timestamp"]: bad.append(f"session {key}: turns out of order")
mean_turns = len(reqs) / len(sessions)
# Sessions still open at the end of the trace are cut short: allow for it.
if not (0.6 * turns <= mean_turns <= 1.2 * turns): bad.append(f"mean turns {mean_turns:.2f} vs {turns}")
mean_out = sum(r["output_length"] for r in reqs) / len(reqs)
if not (0.85 * out <= mean_out <= 1.15 * out): bad.append(f"mean output {mean_out:.1f} vs {out}")
growth = [b["input_length"] - a["input_length"] - a["output_length"]
          for rs in sessions.values() for a, b in zip(rs, rs[1:])]
mean_user = sum(growth) / len(growth)
if not (0.85 * user <= mean_user <= 1.15 * user): bad.append(f"mean user tokens {mean_user:.1f} vs {user}")
if shared:
    ranks = [first_turn_prompt[p] for p in range(nsys)]
    if ranks != sorted(ranks, reverse=True) and ranks[0] < max(ranks): bad.append(f"rank 1 is not the most used: {ranks}")
    ratio = ranks[0] / max(ranks[1], 1)
    if not (0.75 * 2 ** zipf <= ratio <= 1.33 * 2 ** zipf): bad.append(f"rank1/rank2 {ratio:.2f} vs 2^{zipf}")
for b in bad[:20]: print("FAIL", path, b)
print("ok" if not bad else "", path, f"{len(reqs)} requests, {len(sessions)} sessions, "
      f"{mean_turns:.2f} turns, user {mean_user:.0f}, out {mean_out:.0f}")
sys.exit(1 if bad else 0)
PY
}
check "$tmp/a.jsonl" 1.0 4 1500 400 16 1500 || fails=$((fails + 1))
check "$tmp/g.jsonl" 1.2 20 700 120 8 6000 || fails=$((fails + 1))

expect() { # expected-exit expected-substring args...
  local code=$1 want=$2; shift 2
  local out rc
  out=$("$KVBM_BIN" trace-gen --quiet "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$want" <<<"$out"; then
    fail "trace-gen $* -> exit $rc, stderr: $out (wanted exit $code and '$want')"
  fi
}
expect 2 "'robot' is not chat or agent" --profile robot
expect 2 "--turns" --turns 0.5
expect 2 "--zipf" --zipf -1
expect 2 "system tokens (must be below max context)" --system-tokens 5000 --max-context 4000
expect 2 "too many hash ids" --system-prompts 1000000 --system-tokens 4096 --max-context 8192
expect 2 "unknown option" --bogus
expect 1 "cannot create" --out /nonexistent/dir/t.jsonl

[ "$fails" -eq 0 ] && echo "all ok"
exit $((fails > 0))
