#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `kvbm cluster` itself, with tests/cluster/fake_worker.py standing in for
# `kvbm worker`: the whole machinery (a dozen servers started and stopped,
# the open-loop load, all eight faults of the default schedule with their
# recovery probes, the convergence check against the routers' /index, the
# report and SVG) in about a minute; then a run whose workers list a block
# they never published must fail (exit 1, index_converged false), and bad
# usage must be refused (exit 2). The partition and the real G3 full
# (scripts/cluster/netfaults.py) need root: where they work, a run killed
# with -9 must leave its namespace and mounts to the next run, which removes
# them, and a worker that counts G4 writes done through the partition, or
# serves wrong bytes during it, must fail the run; everywhere, with the
# fallbacks forced (KVBM_W5_NO_NETNS, KVBM_W5_NO_MOUNT) the run says why and
# passes. Skips (77) without nats-server, redis-server or kvbm's Python
# package.
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}" "${KVBM_BINARY_DIR:?}"
for t in nats-server redis-server redis-cli; do
  command -v "$t" >/dev/null || { echo "skip: no $t"; exit 77; }
done
PYDIR="$KVBM_BINARY_DIR/python"
KVBM_PYTHON_DIR="$PYDIR" /usr/bin/python3 -c 'import kvbm' 2>/dev/null || { echo "skip: kvbm Python package"; exit 77; }
FAKE="$KVBM_SOURCE_DIR/tests/cluster/fake_worker.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. a clean run under the full default schedule
"$KVBM_BIN" cluster --worker-bin "$FAKE" --workers 4 --limit 400 --time-scale 10 \
  --faults default --json --svg "$tmp/w5.svg" --quiet > "$tmp/clean.json"
/usr/bin/python3 - "$tmp/clean.json" "$tmp/w5.svg" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["violations"] == [], r["violations"]
for k in ("requests", "hit_tokens", "wrong_bytes", "uncounted_losses", "index_converged", "crashed",
          "faults_injected", "recovery_s"):
    assert k in r, k
assert r["requests"] == 400 and r["requests_ok"] + r["requests_failed"] == 400, r["requests"]
assert r["requests_ok"] >= 300, r["failures"]
assert r["index_converged"] is True and r["wrong_bytes"] == 0 and r["uncounted_losses"] == 0
assert r["crashed"] == [], r["crashed"]
kinds = [f["fault"] for f in r["faults"]]
assert sorted(kinds) == sorted(["worker_kill", "redis_master_kill", "router_kill", "nats_restart",
                                "g3_slow", "g3_full", "publish_off", "partition"]), kinds
part = [f for f in r["faults"] if f["fault"] == "partition"][0]
if isinstance(r["partition"], dict):  # root: a real partition happened and was measured
    assert part["injected"] and part["mode"] == "real", part
    w = part["window"]
    assert w["ok"] == 0 and w["counted_by_recovery"] > 0, part  # every write failed, counted
    assert part["served_ok_during"] > 0, part        # and it kept serving
else:
    assert r["partition"].startswith("unavailable: ") and part["skipped"], (r["partition"], part)
done = [f for f in r["faults"] if not f.get("skipped")]
assert r["faults_injected"] == len(done) >= 7, r["faults"]
assert all(f["recovery_s"] is not None for f in done), r["faults"]
full = [f for f in r["faults"] if f["fault"] == "g3_full"][0]
if r["g3_full"].startswith("real"):
    assert full["mode"] == "real" and full["ballast_bytes"] > 0 and full["free_bytes_after_fill"] == 0, full
else:
    assert r["g3_full"].startswith("emulated: ") and full["mode"].startswith("emulated"), full
assert r["hit_tokens"]["g1"] > 0 and r["routing_vs_ideal"]["requests"] > 0
assert 0 < r["routing_vs_ideal"]["quality"] <= 1.0
assert set(r["per_worker"]) == {"0", "1", "2", "3"}
assert r["prometheus"]["up"] >= 1, r["prometheus"]
assert all(d["scheduled"] or d["at_stop"] for d in r["deaths"]), r["deaths"]
svg = open(sys.argv[2]).read()
assert svg.startswith("<svg") and "worker_kill" in svg and "polyline" in svg
print("clean run: ok (%d requests, hit rate %s, quality %s, recoveries %s)" %
      (r["requests"], r["hit_rate"], r["routing_vs_ideal"]["quality"], r["recovery_s"]))
PY

# 2. a worker that lists a block it never published: the index cannot converge
set +e
"$KVBM_BIN" cluster --worker-bin "$FAKE" --worker-arg=--fault-lie-blocks --workers 2 --limit 30 \
  --time-scale 50 --faults none --no-g4 --converge-timeout 2 --json --quiet > "$tmp/lie.json"
rc=$?
set -e
[ "$rc" = 1 ] || { echo "a lying worker's run exited $rc, not 1"; exit 1; }
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["index_converged"] is False, r
assert any("g1: 1 blocks missing, 0 extra" in v for v in r["violations"]), r["violations"]
print("lying worker: caught (%s)" % r["violations"][0])' "$tmp/lie.json"

# 3. the partition and the real G3 full, where this machine allows them
cat > "$tmp/part.jsonl" <<'EOF'
{"at_s": 1.0, "fault": "partition", "target": "worker:1", "duration_s": 2.0}
{"at_s": 1.5, "fault": "g3_full", "target": "worker:0", "duration_s": 1.0}
{"at_s": 1.2, "fault": "g3_slow", "target": "worker:1", "duration_s": 1.0}
EOF
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1; then
  # 3a. kill -9 of the orchestrator leaves its namespace and mounts; the next run removes them
  "$KVBM_BIN" cluster --worker-bin "$FAKE" --workers 2 --limit 2000 --time-scale 5 \
    --faults "$tmp/part.jsonl" --out "$tmp/killed" --quiet > /dev/null 2>&1 &
  victim=$!
  for _ in $(seq 1 300); do
    ip netns list | grep -q "^kvbmw5-$victim\b" && grep -q "^kvbmw5-$victim " /proc/mounts && break
    sleep 0.1
  done
  ip netns list | grep -q "^kvbmw5-$victim\b" || { echo "no namespace kvbmw5-$victim appeared"; exit 1; }
  kill -9 "$victim"
  wait "$victim" 2>/dev/null || true
  sleep 0.5
  ip netns list | grep -q "^kvbmw5-$victim\b" || { echo "the killed run's namespace is gone already?"; exit 1; }
  # 3b. a worker that counts G4 writes done through the partition and serves wrong
  # bytes during it: both caught (and this run removes the killed run's leftovers)
  set +e
  "$KVBM_BIN" cluster --worker-bin "$FAKE" --worker-arg=--fault-g4-lie \
    --worker-arg=--fault-partition-wrong-bytes --workers 2 --limit 300 --time-scale 20 \
    --faults "$tmp/part.jsonl" --json --quiet > "$tmp/liar.json"
  rc=$?
  set -e
  [ "$rc" = 1 ] || { echo "a partition liar's run exited $rc, not 1"; exit 1; }
  if ip netns list | grep -q "^kvbmw5-$victim\b" || grep -q "^kvbmw5-$victim " /proc/mounts ||
     ip link show "kw5${victim}r" >/dev/null 2>&1 ||
     { command -v losetup >/dev/null && losetup -l -n -O BACK-FILE | grep -q "kvbmw5-$victim-"; } ||
     ls -d /sys/fs/cgroup/blkio/kvbmw5-"$victim"-* >/dev/null 2>&1; then
    echo "the killed run's namespace, veth, mounts, loop device or cgroup outlived the next run"; exit 1
  fi
  rm -rf "$tmp/killed"
  /usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
v = r["violations"]
assert any("reported done while Redis was unreachable" in x for x in v), v
assert any("wrong bytes served during it" in x for x in v), v
assert isinstance(r["partition"], dict) and r["g3_full"].startswith("real"), (r["partition"], r["g3_full"])
print("partition liar: caught (%d violations)" % len(v))' "$tmp/liar.json"
  # what a finished run left: names whose pid is gone (another W5 run on
  # this machine, a benchmark say, holds its own while it lives)
  dead_left() {
    local n pid
    for n in $(ip netns list | awk '{print $1}'; awk '{print $1}' /proc/mounts); do
      case "$n" in kvbmw5-*) ;; *) continue ;; esac
      pid=${n#kvbmw5-}; pid=${pid%%-*}
      kill -0 "$pid" 2>/dev/null || echo "$n"
    done
  }
  left=$(dead_left)
  if [ -n "$left" ]; then echo "a namespace or G3 tmpfs outlived its run: $left"; exit 1; fi
else
  echo "skip 3a, 3b: no root or no ip netns (the fallback below still runs)"
fi
# 3c. the fallbacks: said in the report, the run passes
KVBM_W5_NO_NETNS=1 KVBM_W5_NO_MOUNT=1 "$KVBM_BIN" cluster --worker-bin "$FAKE" --workers 2 \
  --limit 300 --time-scale 20 --faults "$tmp/part.jsonl" --json --quiet > "$tmp/fallback.json"
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["violations"] == [], r["violations"]
assert r["partition"] == "unavailable: KVBM_W5_NO_NETNS is set", r["partition"]
assert r["g3_full"] == "emulated: KVBM_W5_NO_MOUNT is set", r["g3_full"]
assert r["g3_slow"] == "emulated: KVBM_W5_NO_MOUNT is set", r["g3_slow"]
f = {x["fault"]: x for x in r["faults"]}
assert f["partition"]["injected"] is False and f["partition"]["skipped"].startswith("unavailable"), f
assert f["g3_full"]["injected"] and f["g3_full"]["mode"].startswith("emulated"), f
print("fallbacks: said and passed")' "$tmp/fallback.json"

# 4. bad usage is refused before anything starts
for args in "--workers 0" "--workers 2 --time-scale 0" "--workers 2 --faults /nonexistent" \
            "--workers 2 /nonexistent/trace"; do
  set +e
  # shellcheck disable=SC2086
  "$KVBM_BIN" cluster $args > "$tmp/out" 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] || { echo "'$args' exited $rc, not 2"; cat "$tmp/out"; exit 1; }
done
echo "test_orchestrator: ok"
