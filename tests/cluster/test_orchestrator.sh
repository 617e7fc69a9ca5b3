#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `kvbm cluster` itself, with tests/cluster/fake_worker.py standing in for
# `kvbm worker`: the whole machinery (a dozen servers started and stopped,
# the open-loop load, all seven faults of the default schedule with their
# recovery probes, the convergence check against the routers' /index, the
# report and SVG) in about a minute; then a run whose workers list a block
# they never published must fail (exit 1, index_converged false), and bad
# usage must be refused (exit 2). Skips (77) without nats-server,
# redis-server or kvbm's Python package.
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
                                "g3_slow", "g3_full", "publish_off"]), kinds
assert r["faults_injected"] == 7 and all(f["recovery_s"] is not None for f in r["faults"]), r["faults"]
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

# 3. bad usage is refused before anything starts
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
