#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `kvbm policy-sim`: its "today" configuration reproduces the manager's W2
# (`kvbm replay --g2-blocks ... --g3-blocks ...`, real copies through G2
# and the G3 file) exactly: hit tokens per tier, blocks written per tier,
# G1 allocations, for several capacities and policies that force evictions
# in every tier; with no G2 and G3 it equals W1 and the oracle
# ../shared/tools/ref_replay.py. The bound is never below any preset;
# --sweep writes an SVG with one curve per policy; bad options are named.
set -uo pipefail
tmp=$(mktemp -d "${KVBM_BINARY_DIR:-/tmp}/psimcli-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# compare NAME TRACE LIMIT "replay flags" "policy-sim flags" [lower-tier hits expected: 1]
compare() {
  local name=$1 trace=$2 limit=$3 rflags=$4 sflags=$5 lower=${6:-1}
  # shellcheck disable=SC2086
  "$KVBM_BIN" replay "$trace" --limit "$limit" --json --no-progress --g3-dir "$tmp" \
    --block-bytes 16 $rflags > "$tmp/$name.replay.json" || { fail "$name: replay"; return; }
  # shellcheck disable=SC2086
  "$KVBM_BIN" policy-sim "$trace" --limit "$limit" --json $sflags > "$tmp/$name.sim.json" \
    || { fail "$name: policy-sim"; return; }
  /usr/bin/python3 - "$tmp/$name.replay.json" "$tmp/$name.sim.json" "$name" "$lower" <<'PY' || fails=$((fails + 1))
import json, sys
rep, sim, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
lower = sys.argv[4] == "1"
p = sim["policies"][0]["points"][0]
bad = []
def eq(what, a, b):
    if a != b: bad.append(f"{what}: replay {a} vs policy-sim {b}")
for k in ("requests", "prompt_tokens", "hit_tokens"):
    eq(k, rep[k], p[k])
eq("blocks_allocated", rep["blocks_allocated"], p["g1_allocated"])
for t in ("g1", "g2", "g3"):
    eq(t + " hit_tokens", rep["tiers"][t]["hit_tokens"], p["tiers"][t]["hit_tokens"])
    if t != "g1":
        eq(t + " written", rep["tiers"][t]["offloaded_blocks"], p["tiers"][t]["written_blocks"])
        eq(t + " evictions", rep["tiers"][t]["evictions"], p["tiers"][t]["evictions"])
if rep["verify_failures"]: bad.append("replay verify failures")
if lower and p["tiers"]["g2"]["hit_tokens"] + p["tiers"]["g3"]["hit_tokens"] == 0:
    bad.append("no lower-tier hits: the case checks nothing below G1")
for b in bad: print(f"FAIL {name}:", b)
if not bad:
    print(f"ok {name}: hits", p["hit_tokens"], {t: p["tiers"][t]["hit_tokens"] for t in ("g1", "g2", "g3")},
          "written", {t: p["tiers"][t]["written_blocks"] for t in ("g2", "g3")},
          "evicted", {t: p["tiers"][t]["evictions"] for t in ("g2", "g3")})
sys.exit(1 if bad else 0)
PY
}

# A generated chat trace whose reuse lands in every tier at small sizes.
small="$tmp/small.jsonl"
"$KVBM_BIN" trace-gen --requests 800 --session-rate 4 --think-s 20 --user-tokens 600 \
  --max-context 8192 --out "$small" --quiet || fail "trace-gen"
# The manager's defaults (G2 write-through, G3 behind the frequency filter).
compare default "$small" 800 "--capacity 2048 --g2-blocks 4096 --g3-blocks 8192" \
  "--policy today --g1-blocks 2048 --g2-blocks 4096 --g3-blocks 8192"
# G3 write-through: G2 and G3 both evict.
compare g3all "$small" 800 "--capacity 2048 --g2-blocks 3000 --g3-blocks 6000 --g3-policy all" \
  "--g2 lru:all --g3 lru:all --g1-blocks 2048 --g2-blocks 3000 --g3-blocks 6000"
# G2 behind the filter, G3 write-through, a smaller G1. The manager's G2
# filter has the settings of G3's; policy-sim's G2 filter its own (g2-freq's
# 3/2^26/2^22), so they are given the manager's here.
compare g2freq "$small" 800 "--capacity 1500 --g2-blocks 3000 --g3-blocks 5000 --g2-policy frequency --g3-policy all" \
  "--g2 lru:frequency --g3 lru:all --g1-blocks 1500 --g2-blocks 3000 --g3-blocks 5000 --g2-freq-threshold 2 --g2-freq-decay-uses 65536 --g2-freq-max-entries 1048576"
# G3 without G2 (copies from G1), block size 32, Dynamo's hashes.
compare g3only "$small" 800 "--block-size 32 --hash dynamo --capacity 1024 --g2-blocks 0 --g3-blocks 3000 --g3-policy all" \
  "--block-size 32 --hash dynamo --g2 lru:all --g3 lru:all --g1-blocks 1024 --g2-blocks 0 --g3-blocks 3000"
# A G2 smaller than some requests: commits skip for space (pins).
compare tiny "$small" 400 "--capacity 2048 --g2-blocks 600 --g3-blocks 0" \
  "--policy today --g1-blocks 2048 --g2-blocks 600 --g3-blocks 0" 0
# The bundled trace with the manager's defaults.
compare bundled "$KVBM_SOURCE_DIR/data/mooncake_conversation_trace.jsonl.gz" 1500 \
  "--g2-blocks 8192 --g3-blocks 16384" "--policy today --g2-blocks 8192 --g3-blocks 16384"

# No lower tiers: W1, and the oracle.
TRACE="$KVBM_SHARED_DIR/data/mooncake_conversation_trace.jsonl"
"$KVBM_BIN" policy-sim "$TRACE" --limit 300 --json --policy today --g2-blocks 0 --g3-blocks 0 \
  > "$tmp/zero.json" || fail "policy-sim without lower tiers"
"$KVBM_BIN" replay "$TRACE" --limit 300 --json --no-progress > "$tmp/w1.json" || fail "W1"
/usr/bin/python3 "$KVBM_SHARED_DIR/tools/ref_replay.py" "$TRACE" --limit 300 --block-size 16 \
  --capacity 16384 > "$tmp/oracle.json" || fail "oracle"
/usr/bin/python3 - "$tmp" <<'PY' || fails=$((fails + 1))
import json, sys
d = sys.argv[1]
p = json.load(open(d + "/zero.json"))["policies"][0]["points"][0]
bad = []
for src in ("w1", "oracle"):
    w = json.load(open(f"{d}/{src}.json"))
    for k, q in (("requests", "requests"), ("prompt_tokens", "prompt_tokens"),
                 ("hit_tokens", "hit_tokens"), ("blocks_allocated", "g1_allocated")):
        if w[k] != p[q]: bad.append(f"{src} {k} {w[k]} vs policy-sim {p[q]}")
if p["hit_tokens"] <= 0: bad.append("no hits at all")
for b in bad: print("FAIL W1:", b)
sys.exit(1 if bad else 0)
PY

# Every preset, one sweep of three factors, an SVG; the bound is the top.
"$KVBM_BIN" policy-sim "$small" --json --g1-blocks 2048 --g2-blocks 2048 --g3-blocks 4096 \
  --sweep 0.5,1,2 --svg "$tmp/curves.svg" --title "test <curves> & co" > "$tmp/all.json" \
  || fail "policy-sim presets with a sweep"
/usr/bin/python3 - "$tmp" <<'PY' || fails=$((fails + 1))
import json, sys, xml.etree.ElementTree as ET
d = sys.argv[1]
doc = json.load(open(d + "/all.json"))
bad = []
names = [p["name"] for p in doc["policies"]]
if names != ["today", "lru-tail", "arc", "s3fifo", "wtinylfu", "victim", "g2-freq", "advisor", "belady"]:
    bad.append(f"presets {names}")
if doc["factors"] != [0.5, 1, 2]: bad.append(f"factors {doc['factors']}")
bound = next(p for p in doc["policies"] if p["name"] == "belady")
for p in doc["policies"]:
    if len(p["points"]) != 3: bad.append(f"{p['name']}: {len(p['points'])} points")
    for k, pt in enumerate(p["points"]):
        if pt["hit_tokens"] > bound["points"][k]["hit_tokens"]:
            bad.append(f"{p['name']} beats the bound at factor {pt['factor']}")
        if sum(pt["tiers"][t]["hit_tokens"] for t in ("g1", "g2", "g3")) != pt["hit_tokens"]:
            bad.append(f"{p['name']}: tier hits do not add up")
svg = ET.parse(d + "/curves.svg").getroot()
ns = "{http://www.w3.org/2000/svg}"
lines = svg.findall(f".//{ns}polyline")
if len(lines) != 9: bad.append(f"{len(lines)} curves in the SVG")
for l in lines:
    if len(l.get("points").split()) != 3: bad.append("a curve without 3 points")
texts = "".join(t.text or "" for t in svg.iter(f"{ns}text"))
if "test <curves> & co" not in texts: bad.append("title not escaped and kept")
for b in bad: print("FAIL presets:", b)
sys.exit(1 if bad else 0)
PY

expect() { # expected-exit expected-substring args...
  local code=$1 want=$2; shift 2
  local out rc
  out=$("$KVBM_BIN" policy-sim "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$want" <<<"$out"; then
    fail "policy-sim $* -> exit $rc, stderr: $out (wanted exit $code and '$want')"
  fi
}
expect 2 "unknown policy 'nope'" --policy nope
expect 2 "--g2: 'lru' is not EVICT:ADMIT" --g2 lru
expect 2 "--g1: 'arc:all' is not lru or belady" --g1 arc:all
expect 2 "G1 evicts by lru or belady" --limit 10 --g1 s3fifo
expect 2 "--sweep" --sweep 0
expect 2 "--g2-blocks" --g2-blocks x
expect 2 "unknown option" --bogus
expect 2 "victim admission is for G3 only" --limit 10 --g2 lru:victim
expect 1 "does not fit in G1" --limit 50 --g1-blocks 100
expect 2 "--eta-noise: 65 is out of range" --eta-noise 65
expect 2 "--eta-noise: -0.5 is out of range" --eta-noise -0.5
expect 2 "--eta-noise: 'nan' is not a number" --eta-noise nan
expect 2 "--eta-noise: 'inf' is not a number" --eta-noise inf
expect 2 "--ttl-s: 0 is out of range" --ttl-s 0
expect 2 "--ttl-sigma: 17 is out of range" --ttl-sigma 17
expect 2 "--ttl-rank: 'oldest' is not none, random or turn" --ttl-rank oldest
expect 2 "G2: sticky admission needs ttl eviction" --limit 10 --g2 lru:sticky
expect 2 "G2: turn admission needs ttl eviction" --limit 10 --g2 belady:turn
expect 2 "more than one trace" a b
expect 1 "cannot create" --limit 10 --policy today --svg /nonexistent/dir/x.svg

[ "$fails" -eq 0 ] && echo "all ok"
exit $((fails > 0))
