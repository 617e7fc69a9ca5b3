#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_worker_coalesce.sh: `kvbm worker --events-coalesce` (issue 22). A
# worker whose G1 (32 blocks) is under pressure publishes what its pool
# link does, one block an event, evictions between registrations; with the
# flag the stream read back with `kvbm events tail` (replay from 0) has
# fewer events than blocks, some of several blocks, and applied in order it
# still equals GET /blocks (that each merged event is exactly the chain it
# replaces is tests/events/test_coalesce.c's and test_cli_coalesce.sh's).
# Without --events the flag is a usage error. Debian's Python only.
set -euo pipefail
KVBM=${KVBM_BIN:?}
set +e
"$KVBM" worker --id 1 --listen 127.0.0.1:0 --events-coalesce >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "FAIL: --events-coalesce without --events exited $rc" >&2; exit 1; }
exec /usr/bin/python3 - <<'PY'
import json, os, socket, subprocess, sys, tempfile, time, urllib.request

KVBM = os.environ["KVBM_BIN"]
tmp = tempfile.mkdtemp(prefix="kvbm-worker-coal-")


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def free_pair():
    for _ in range(200):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
        if p >= 65534:
            continue
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
        finally:
            t.close()
    fail("no free port pair")


def call(port, method, path, body=None):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read().decode())


evp = free_pair()
portfile = os.path.join(tmp, "port")
log = open(os.path.join(tmp, "log"), "w")
p = subprocess.Popen([KVBM, "worker", "--id", "3", "--listen", "127.0.0.1:0", "--port-file",
                      portfile, "--g1", "32", "--events", "tcp://127.0.0.1:%d" % evp,
                      "--events-coalesce", "--time-scale", "1000", "--memory-budget-mb", "256"],
                     stdout=log, stderr=subprocess.STDOUT)
try:
    for _ in range(300):
        if os.path.exists(portfile) and open(portfile).read().strip():
            break
        if p.poll() is not None:
            fail("worker exited: " + open(log.name).read())
        time.sleep(0.05)
    port = int(open(portfile).read())
    for i in range(4):  # 4 x 31 blocks through a G1 of 32: evict, register, ...
        a = call(port, "POST", "/generate", {"request_id": "r%d" % i, "output_length": 0,
                                             "token_ids": [i * 100000 + t for t in range(496)]})
        if a["status"] != "ok":
            fail("generate: %r" % a)
    b = call(port, "GET", "/blocks")
    blocks = {"GPU": set(b["g1"]), "CPU": set(b["g2"]), "DISK": set(b["g3"])}
    out = subprocess.run([KVBM, "events", "tail", "tcp://127.0.0.1:%d" % evp, "--replay",
                          "tcp://127.0.0.1:%d" % (evp + 1), "--from", "0", "--idle-ms", "1500"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or " 0 lost" not in out.stderr:
        fail("events tail: %s" % out.stderr)
    evs = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    held = {m: set() for m in blocks}
    nblocks = 0
    for e in evs:
        if e["type"] == "AllBlocksCleared":
            for s in held.values():
                s.clear()
        elif e["type"] == "BlockStored":
            held[e["medium"]].update(e["block_hashes"])
        elif e["type"] == "BlockRemoved":
            held[e["medium"]].difference_update(e["block_hashes"])
        nblocks += len(e.get("block_hashes", []))
    if held != blocks:
        fail("the stream applied in order differs from /blocks")
    stored = [e for e in evs if e["type"] == "BlockStored"]
    big = max(len(e["block_hashes"]) for e in stored)
    if len(evs) >= nblocks or big < 2:
        fail("not coalesced: %d events for %d blocks, largest %d" % (len(evs), nblocks, big))
    print("ok: %d block events as %d events, largest %d blocks" % (nblocks, len(evs), big))
finally:
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
    subprocess.run(["rm", "-rf", tmp])
PY
