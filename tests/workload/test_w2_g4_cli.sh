#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# W2 with G4, across processes: two `kvbm replay` runs against one Redis
# (a redis-server this test starts on a free loopback port) and against one
# shared directory (file://). The second run serves from G4 the blocks the
# first stored and counts them as G4 hits; no run reports fewer hits than
# W2 without G4, and none a verify failure. The environment configures the
# same runs (KVBM_G4_URL, DYN_KVBM_* names) and flags override it; a bad
# value is named (exit 2).
set -uo pipefail
tmp=$(mktemp -d "${KVBM_BINARY_DIR:-/tmp}/w2g4-XXXXXX")
redis_pid=""
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --dir "$tmp" >/dev/null 2>&1 &
redis_pid=$!
for _ in $(seq 1 200); do
  redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break
  sleep 0.05
done
redis-cli -p "$port" PING | grep -q PONG || { echo "FAIL: redis-server did not start"; exit 1; }

# A file:// store costs a file per block (create, rename): fewer requests.
limit_redis=120 limit_file=30
args=(--json --no-progress --capacity 8192 --block-bytes 64)
run() { "$KVBM_BIN" replay "${args[@]}" "$@"; }

run --limit $limit_redis --g2-blocks 0 > "$tmp/nog4.redis.json" || fail "run without G4"
run --limit $limit_file --g2-blocks 0 > "$tmp/nog4.file.json" || fail "run without G4"
mkdir "$tmp/shared"
for url in "redis://127.0.0.1:$port" "file://$tmp/shared"; do
  tag=$(echo "$url" | cut -d: -f1)
  limit=$limit_redis
  [ "$tag" = file ] && limit=$limit_file
  run --limit $limit --g4 "$url" > "$tmp/$tag.1.json" || fail "first run against $url"
  run --limit $limit --g4 "$url" > "$tmp/$tag.2.json" || fail "second run against $url"
done
# The environment instead of flags (Redis), and a flag over it.
KVBM_G4_URL="redis://127.0.0.1:$port" DYN_KVBM_OBJECT_NUM_BLOCKS=50000 \
  run --limit 40 > "$tmp/env.json" || fail "run configured by the environment"
DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS=1000 run --limit 20 --g2-blocks 2000 > "$tmp/envflag.json" \
  || fail "flag over the environment"

/usr/bin/python3 - "$tmp" <<'PY' || fails=$((fails + 1))
import json, sys
d = sys.argv[1]
load = lambda n: json.load(open(f"{d}/{n}.json"))
bad = []
for tag in ("redis", "file"):
    no = load(f"nog4.{tag}")
    a, b = load(f"{tag}.1"), load(f"{tag}.2")
    for name, doc in ((f"{tag} first", a), (f"{tag} second", b)):
        if doc["verify_failures"] != 0: bad.append(f"{name}: verify failures")
        if doc["hit_tokens"] < no["hit_tokens"]: bad.append(f"{name}: fewer hits than without G4")
        if sum(doc["tiers"][t]["hit_tokens"] for t in ("g1", "g2", "g3", "g4")) != doc["hit_tokens"]:
            bad.append(f"{name}: hit_tokens is not the sum over tiers")
        for k in ("onboard_failures", "checksum_failures", "foreign", "lookup_errors"):
            if doc["tiers"]["g4"][k] != 0: bad.append(f"{name}: g4 {k} {doc['tiers']['g4'][k]}")
        if doc["skipped_offloads"] != 0: bad.append(f"{name}: skipped copies")
    if a["tiers"]["g4"]["offloaded_blocks"] <= 0: bad.append(f"{tag}: the first run stored nothing")
    # The second process finds what the first stored: G4 hits it had no way
    # to produce itself (its own G4 index starts empty).
    g4 = b["tiers"]["g4"]
    if g4["hit_tokens"] <= 0 or g4["lookup_found"] <= 0: bad.append(f"{tag}: no G4 hits in the second run")
    if b["hit_tokens"] <= a["hit_tokens"]: bad.append(f"{tag}: the second run did not gain hits")
    if g4["onboarded_blocks"] * b["block_size"] != g4["hit_tokens"]:
        bad.append(f"{tag}: onboarded G4 blocks x block size != G4 hit tokens")
    if not b["g4_url"].startswith(tag): bad.append(f"{tag}: g4_url {b['g4_url']}")
e = load("env")
if not e["g4_url"].startswith("redis://") or e["g4_blocks"] != 50000: bad.append(f"env: {e['g4_url']} {e['g4_blocks']}")
if e["tiers"]["g4"]["hit_tokens"] <= 0: bad.append("env: no G4 hits from the store the runs above filled")
f = load("envflag")
if f["g2_blocks"] != 2000: bad.append(f"flag over env: g2_blocks {f['g2_blocks']}")
for b_ in bad: print("FAIL:", b_)
sys.exit(1 if bad else 0)
PY

# The environment alone selects W2, and a bad value is named.
out=$(DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS=512 "$KVBM_BIN" replay --limit 20 --json --no-progress) \
  || fail "W2 from the environment alone"
grep -q '"workload":"W2"' <<<"$out" && grep -q '"g2_blocks":512' <<<"$out" || fail "env W2: $out"
expect() { # expected-exit expected-substring env-assignment args...
  local code=$1 want=$2 env=$3; shift 3
  local out rc
  out=$(env "$env" "$KVBM_BIN" replay --limit 5 --no-progress "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$want" <<<"$out"; then
    fail "$env replay $* -> exit $rc: $out (wanted $code, '$want')"
  fi
}
expect 2 "DYN_KVBM_CPU_CACHE_GB" DYN_KVBM_CPU_CACHE_GB=lots
expect 2 "KVBM_G4_POLICY" KVBM_G4_POLICY=sometimes
expect 2 "DYN_KVBM_OBJECT_ENABLED" DYN_KVBM_OBJECT_ENABLED=1
expect 2 "g4_url" KVBM_G4_URL=nosuch://x
expect 2 "--g4-blocks" KVBM_MODEL_ID=m --g4 "file://$tmp/shared" --g4-blocks 0

[ "$fails" -eq 0 ] && echo "ok" || exit 1
