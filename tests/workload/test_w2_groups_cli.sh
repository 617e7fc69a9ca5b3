#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `kvbm replay` W2 (tier flags) with --groups (issue 20; workload/w2.h):
#   - --groups full gives every count of plain W2 (hits per tier, copies,
#     evictions, skips, blocks allocated), on a slice of the bundled trace
#     (G1 hits) and on a small trace whose prefixes return after G1 lost
#     them (G3 hits);
#   - a hybrid run (full,sw:128) is self-consistent: its hit never exceeds
#     the full-only run's at the same G1; the full group takes every block
#     of each hit and the window group no more; the onboards per group add
#     up to the tiers' onboards and the hit tokens per tier to the groups'
#     hit blocks; the window group's G1 peak is below the full group's; no
#     onboarded block has wrong bytes;
#   - hostile group lists are refused with W1-hybrid's messages (exit 2).
set -uo pipefail
tmp=$(mktemp -d "${KVBM_BINARY_DIR:-/tmp}/w2groups-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# run NAME ARGS...: a W2 run on a fresh G3 directory, JSON in $tmp/NAME.json
run() {
  local name=$1; shift
  rm -rf "$tmp/g3" && mkdir "$tmp/g3"
  "$KVBM_BIN" replay --json --no-progress --g3-dir "$tmp/g3" --g3-buffered --block-bytes 32 "$@" \
    > "$tmp/$name.json" || fail "run $name: $*"
}

/usr/bin/python3 - "$tmp/small.jsonl" <<'PY'
import json, sys
# 60 requests of 4 hash ids (2048 tokens): 5 prefix families of 3 ids, one
# id of its own each, so a family returns every 5th request.
with open(sys.argv[1], "w") as f:
    for i in range(60):
        fam = i % 5
        ids = [fam * 100, fam * 100 + 1, fam * 100 + 2, 1000 + i]
        f.write(json.dumps({"timestamp": i * 100, "input_length": 4 * 512 - 100,
                            "output_length": 40 + i, "hash_ids": ids}) + "\n")
PY

big="--limit 300 --block-size 64 --capacity 2200 --g2-blocks 1200 --g3-blocks 6000 --g3-policy all"
small="$tmp/small.jsonl --g2-blocks 200 --g3-blocks 3000 --g3-policy all"
run big_plain $big
run big_full $big --groups full
run small300_plain $small --capacity 300
run small300_full $small --capacity 300 --groups full
run small600_plain $small --capacity 600
run small600_full $small --capacity 600 --groups full
run small600_sw $small --capacity 600 --groups full,sw:128

/usr/bin/python3 - "$tmp" <<'PY' || fails=$((fails + 1))
import json, sys
d = sys.argv[1]
def load(n): return json.load(open(f"{d}/{n}.json"))
bad = []
TIMING = {"seconds", "prompt_tokens_per_s", "copy_seconds", "copy_gb_per_s"}
def flat(x, p=""):
    for k, v in x.items():
        if isinstance(v, dict): yield from flat(v, p + k + ".")
        elif k not in TIMING: yield p + k, v
for case in ("big", "small300", "small600"):
    a, b = dict(flat(load(case + "_plain"))), dict(flat(load(case + "_full")))
    for k, v in a.items():
        if b.get(k) != v: bad.append(f"{case}: {k}: plain {v}, --groups full {b.get(k)}")
    g = load(case + "_full")
    if g.get("groups") != "full" or len(g.get("per_group", [])) != 1:
        bad.append(f"{case}: --groups full reports {g.get('groups')} {g.get('per_group')}")
# the runs must have hit in G1 (big) and G3 (small300), else they test little
if load("big_plain")["tiers"]["g1"]["hit_tokens"] == 0: bad.append("big: no G1 hit")
if load("small300_plain")["tiers"]["g3"]["hit_tokens"] == 0: bad.append("small300: no G3 hit")

full, sw = load("small600_full"), load("small600_sw")
B = sw["block_size"]
pg = sw["per_group"]
if sw["groups"] != "full,sw:128" or len(pg) != 2: bad.append(f"hybrid groups {sw.get('groups')}")
if sw["hit_tokens"] == 0: bad.append("hybrid: no hit at all")
if sw["hit_tokens"] > full["hit_tokens"]:
    bad.append(f"hybrid hit {sw['hit_tokens']} above full-only's {full['hit_tokens']}")
if pg[0]["hit_blocks"] * B != sw["hit_tokens"]:
    bad.append(f"full group took {pg[0]['hit_blocks']} blocks for {sw['hit_tokens']} hit tokens")
if not 0 < pg[1]["hit_blocks"] < pg[0]["hit_blocks"]:
    bad.append(f"window group took {pg[1]['hit_blocks']} blocks, full {pg[0]['hit_blocks']}")
onb = sum(sw["tiers"][t]["onboarded_blocks"] for t in ("g2", "g3", "g4"))
if onb != sum(g["onboarded_blocks"] for g in pg):
    bad.append(f"tiers onboarded {onb}, groups {[g['onboarded_blocks'] for g in pg]}")
hit_t = sum(sw["tiers"][t]["hit_tokens"] for t in ("g1", "g2", "g3", "g4"))
if hit_t != B * sum(g["hit_blocks"] for g in pg):
    bad.append(f"tiers' hit tokens {hit_t} vs groups' hit blocks {[g['hit_blocks'] for g in pg]}")
if not pg[1]["peak_blocks_held"] < pg[0]["peak_blocks_held"]:
    bad.append(f"window peak {pg[1]['peak_blocks_held']} not below full's {pg[0]['peak_blocks_held']}")
if sw["verify_failures"]: bad.append(f"hybrid verify failures {sw['verify_failures']}")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY

# Hostile lists: W1-hybrid's parser and messages, exit 2.
expect() { # substring args...
  local want=$1; shift
  local out rc
  out=$("$KVBM_BIN" replay "$tmp/small.jsonl" --g2-blocks 10 --g3-blocks 0 "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" <<<"$out"; then
    fail "replay W2 $* -> exit $rc, stderr: $out (wanted exit 2 and '$want')"
  fi
}
expect "--groups:" --groups bogus
expect "--groups:" --groups sw:0
expect "--groups:" --groups full,
expect "--groups:" --groups "$(printf 'full,%.0s' $(seq 17))full"
expect "cannot share a G1 of 2 blocks" --capacity 2 --groups full,sw:8,mamba

[ "$fails" -eq 0 ] && echo "ok"
exit "$fails"
