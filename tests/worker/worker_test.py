# SPDX-License-Identifier: Apache-2.0
"""worker_test.py: `kvbm worker` end to end on loopback (run by
test_worker.sh with /usr/bin/python3).

A real worker process (G1 32 blocks, G2 128, G3 a persistent slot file,
KV events on ZMQ with replay) is driven over HTTP, and its KV events are
read back with kvbm's own subscriber (`kvbm events tail`, replay from 0):
- a request sent twice gets G1 hits the second time;
- after G1 pressure the same prompt is served from G2, and after G2
  pressure from G3, with every onboarded block's bytes checked
  (wrong_bytes 0);
- the event stream, applied in order per medium, equals GET /blocks;
- with publishing off, events are counted as dropped; on resume the
  worker republishes (clear + stores) and the stream equals /blocks again;
- kill -9 and a restart on the same G3 directory: G3 is warm (hits), and
  the new stream starts with AllBlocksCleared followed by a store of
  every block, equal to /blocks;
- the batch limit makes a request wait (its TTFT includes the wait);
- hostile bodies get 4xx with a message naming what is wrong, and the
  worker keeps serving; a configuration over the memory budget is refused.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

KVBM = os.environ["KVBM_BIN"]
tmp = tempfile.mkdtemp(prefix="kvbm-worker-test-")
procs = []


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def free_pair():
    """A port P with P+1 also free (the ZMQ PUB and its replay ROUTER)."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
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


class Worker:
    def __init__(self, args, name):
        self.portfile = os.path.join(tmp, name + ".port")
        if os.path.exists(self.portfile):
            os.unlink(self.portfile)
        self.log = open(os.path.join(tmp, name + ".log"), "w")
        self.p = subprocess.Popen([KVBM, "worker", "--listen", "127.0.0.1:0",
                                   "--port-file", self.portfile] + args,
                                  stdout=self.log, stderr=subprocess.STDOUT)
        procs.append(self.p)
        for _ in range(300):
            if os.path.exists(self.portfile):
                break
            if self.p.poll() is not None:
                fail("worker exited at start: " + open(self.log.name).read())
            time.sleep(0.05)
        else:
            fail("worker did not start")
        self.port = int(open(self.portfile).read())

    def call(self, method, path, body=None, raw=None, timeout=30):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def json(self, method, path, body=None, raw=None):
        st, text = self.call(method, path, body, raw)
        try:
            return st, json.loads(text)
        except ValueError:
            fail("%s %s: not JSON (%d): %r" % (method, path, st, text[:200]))

    def gen(self, rid, tokens, output=0):
        st, a = self.json("POST", "/generate",
                          {"request_id": rid, "token_ids": tokens, "output_length": output})
        if st != 200 or a["status"] != "ok":
            fail("generate %s: %d %r" % (rid, st, a))
        if a["wrong_bytes"] != 0:
            fail("generate %s: wrong bytes %r" % (rid, a))
        return a

    def blocks(self):
        st, b = self.json("GET", "/blocks")
        if st != 200:
            fail("/blocks %d" % st)
        return {"GPU": set(b["g1"]), "CPU": set(b["g2"]), "DISK": set(b["g3"])}

    def kill9(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            fail("worker did not stop on SIGTERM")
        if rc != 0:
            fail("worker exited %d: %s" % (rc, open(self.log.name).read()[-2000:]))


def events(port):
    """Every event the worker's publisher still has, decoded by kvbm's own
    subscriber (replay from batch 0), applied in order per medium."""
    out = subprocess.run([KVBM, "events", "tail", "tcp://127.0.0.1:%d" % port, "--replay",
                          "tcp://127.0.0.1:%d" % (port + 1), "--from", "0", "--idle-ms", "1500"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail("events tail: %s" % out.stderr)
    evs = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    if "0 lost" not in out.stderr:
        fail("events lost: " + out.stderr)
    held = {"GPU": set(), "CPU": set(), "DISK": set()}
    for e in evs:
        if e["type"] == "AllBlocksCleared":
            for s in held.values():
                s.clear()
        elif e["type"] == "BlockStored":
            held[e["medium"]].update(e["block_hashes"])
        elif e["type"] == "BlockRemoved":
            held[e["medium"]].difference_update(e["block_hashes"])
    return evs, held


def same(held, blocks, what):
    for m in ("GPU", "CPU", "DISK"):
        if held[m] != blocks[m]:
            fail("%s: %s events give %d blocks, /blocks %d (only in events %d, only in /blocks %d)"
                 % (what, m, len(held[m]), len(blocks[m]), len(held[m] - blocks[m]),
                    len(blocks[m] - held[m])))


def toks(seed, n):
    return [seed * 100000 + i for i in range(n)]


def main():
    g3 = os.path.join(tmp, "g3")
    os.mkdir(g3, 0o700)
    evp = free_pair()
    args = ["--id", "7", "--g1", "32", "--g2", "128", "--g3", g3 + ":512", "--g3-policy", "all",
            "--events", "tcp://127.0.0.1:%d" % evp, "--time-scale", "1000",
            "--memory-budget-mb", "512"]
    w = Worker(args, "w1")

    # twice: G1 hits the second time (floor(99/16) = 6 blocks matchable)
    r = toks(1, 100)
    a = w.gen("r1", r)
    if a["hit_tokens"] != {"g1": 0, "g2": 0, "g3": 0, "g4": 0} or a["prefill_tokens"] != 100:
        fail("first request: %r" % a)
    a = w.gen("r1b", r)
    if a["hit_tokens"]["g1"] != 96 or a["prefill_tokens"] != 4 or a["worker"] != 7:
        fail("second request, G1 hits expected: %r" % a)

    # G1 pressure (2 x 31 distinct blocks): the prompt comes from G2
    for i in range(2):
        w.gen("p%d" % i, toks(10 + i, 496))
    a = w.gen("r1c", r)
    if a["hit_tokens"]["g1"] != 0 or a["hit_tokens"]["g2"] != 96 or a["onboarded_blocks"] != 6:
        fail("after G1 pressure, G2 hits expected: %r" % a)

    # G2 pressure too (5 x 31 > 128 blocks): a fresh prompt comes from G3
    q = toks(2, 100)
    w.gen("q1", q)
    for i in range(5):
        w.gen("pp%d" % i, toks(20 + i, 496))
    a = w.gen("q2", q)
    if a["hit_tokens"]["g3"] != 96 or a["onboarded_blocks"] != 6:
        fail("after G2 pressure, G3 hits expected: %r" % a)

    # the stream applied in order equals /blocks
    evs, held = events(evp)
    if evs[0]["type"] != "AllBlocksCleared":
        fail("the stream does not start with a clear: %r" % evs[0])
    same(held, w.blocks(), "live stream")

    # publishing off: dropped events counted; on resume a clear + stores
    st, f = w.json("POST", "/admin/fault", {"publish": False})
    if st != 200 or f["publish"] is not False:
        fail("fault publish false: %d %r" % (st, f))
    w.gen("off", toks(3, 200))
    st, h = w.json("GET", "/health")
    if h["events_dropped"] == 0 or h["publishing"]:
        fail("events not counted as dropped: %r" % h)
    n_before = len(evs)
    _, held_off = events(evp)
    if held_off == {k: v for k, v in w.blocks().items()}:
        fail("the stream followed /blocks while publishing was off")
    st, f = w.json("POST", "/admin/fault", {"publish": True})
    st, h2 = w.json("GET", "/health")
    if h2["republishes"] != h["republishes"] + 1:
        fail("no republish on resume: %r" % h2)
    evs, held = events(evp)
    tail = evs[n_before:]
    if not any(e["type"] == "AllBlocksCleared" for e in tail):
        fail("no clear after resuming")
    same(held, w.blocks(), "after resume")

    # kill -9, restart on the same G3 directory: warm G3, clear + re-store
    before = w.blocks()
    w.kill9()
    w = Worker(args, "w1b")
    after = w.blocks()
    if not after["DISK"] or after["DISK"] != before["DISK"]:
        fail("G3 not warm after restart: %d blocks, %d before" % (len(after["DISK"]),
                                                                   len(before["DISK"])))
    if after["GPU"] or after["CPU"]:
        fail("G1/G2 not empty after a restart")
    evs, held = events(evp)
    if evs[0]["type"] != "AllBlocksCleared":
        fail("restart: the stream does not start with a clear")
    stored = set()
    for e in evs[1:]:
        if e["type"] == "BlockStored" and e["medium"] == "DISK":
            stored.update(e["block_hashes"])
    if stored != after["DISK"]:
        fail("restart: %d DISK stores for %d G3 blocks" % (len(stored), len(after["DISK"])))
    same(held, w.blocks(), "after restart")
    a = w.gen("q3", q)
    if a["hit_tokens"]["g3"] != 96:
        fail("restart: G3 hit expected: %r" % a)
    evs, held = events(evp)
    same(held, w.blocks(), "after restart and a request")

    # hostile bodies: 4xx naming what is wrong; the worker serves on
    bad = [
        (b"not json", 400, "JSON object"),
        (b'{"request_id":"x","tokens":[1]}', 400, "unknown key 'tokens'"),
        (b'{"token_ids":[1,2]}', 400, "request_id"),
        (b'{"request_id":"","token_ids":[1]}', 400, "request_id"),
        (b'{"request_id":"x","token_ids":[1,-2]}', 400, "token_ids"),
        (b'{"request_id":"x","token_ids":[1.5]}', 400, "token_ids"),
        (b'{"request_id":"x","token_ids":[99999999999]}', 400, "token_ids above"),
        (b'{"request_id":"x","token_ids":[1],"token_ids":[2]}', 400, "twice"),
        (b'{"request_id":"x","token_ids":[1]} x', 400, "after the object"),
        (b'{"request_id":"x","token_ids":[1', 400, "token_ids"),
        (b'{"request_id":"' + b"a" * 200 + b'","token_ids":[1]}', 400, "request_id"),
        (b'{"request_id":"a\\"b","token_ids":[1]}', 400, "escapes"),
        (b'{"request_id":"x","hash_ids":[1],"input_length":513,"output_length":1}', 400,
         "beyond 512"),
        (b'{"request_id":"x","hash_ids":[1],"input_length":10}', 400, "output_length"),
        (b'{"request_id":"x","token_ids":[1],"hash_ids":[1],"input_length":1,'
         b'"output_length":1}', 400, "not both"),
        (b'{"request_id":"x","token_ids":[' + b",".join([b"1"] * 2000) + b"]}", 413,
         "more than"),
        (b"[1,2]", 400, "JSON object"),
        (b"", 400, "JSON object"),
    ]
    wt = Worker(["--id", "8", "--g1", "64", "--max-tokens", "1024", "--time-scale", "1000"],
                "w2")
    for raw, code, words in bad:
        st, a = wt.json("POST", "/generate", raw=raw)
        if st != code or words not in a.get("error", "") or a.get("status") != code:
            fail("body %r: %d %r (want %d naming %r)" % (raw[:60], st, a, code, words))
    for raw, words in [(b'{"publish":1}', "true or false"), (b'{"g3_delay_ms":-1}', "g3_delay"),
                       (b'{"g3_delay_ms":700000}', "above"), (b"{}", "none of"),
                       (b'{"boom":true}', "unknown key")]:
        st, a = wt.json("POST", "/admin/fault", raw=raw)
        if st != 400 or words not in a.get("error", ""):
            fail("fault body %r: %d %r" % (raw, st, a))
    st, _ = wt.call("GET", "/generate")
    if st != 405:
        fail("GET /generate: %d" % st)
    st, _ = wt.call("GET", "/nope")
    if st != 404:
        fail("GET /nope: %d" % st)
    s = socket.create_connection(("127.0.0.1", wt.port), timeout=10)
    s.sendall(b"\x00\x01garbage\r\n\r\n")
    if b" 400 " not in s.recv(4096):
        fail("a garbage head is not answered 400")
    s.close()
    wt.gen("fine", toks(4, 50))  # still serving

    # the batch limit: with --batch 1 the second of two requests waits
    wb = Worker(["--id", "9", "--g1", "64", "--batch", "1", "--decode-tps", "50",
                 "--time-scale", "10"], "w3")
    res = []

    def one(i):
        res.append(wb.gen("b%d" % i, toks(30 + i, 40), output=50))
    th = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    ttfts = sorted(a["ttft_ms"] for a in res)
    # each decode is 1 s simulated (0.1 s slept at scale 10): the waiter's
    # TTFT includes about 1 s of queue (measured, scaled back)
    if len(res) != 2 or ttfts[1] < 800 or res[0]["e2e_ms"] < 1000:
        fail("batch limit not applied: %r" % res)

    # many clients at once on a small G1 (requests wait for room, none
    # fails), and clients that hang up while their request is parked
    # (freed, counted)
    g3s = os.path.join(tmp, "g3s")
    os.mkdir(g3s, 0o700)
    ws = Worker(["--id", "10", "--g1", "128", "--g2", "256", "--g3", g3s + ":1024",
                 "--g3-policy", "all", "--batch", "8", "--time-scale", "200"], "w4")
    out = []

    def client(c):
        for i in range(10):
            t = [((c * 7 + i) % 10) * 100000 + j for j in range(200 + (i % 4) * 100)]
            out.append(ws.gen("s%d-%d" % (c, i), t, output=30))  # fails on any error
    th = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for t in th:
        t.start()
    for k in range(5):
        s = socket.create_connection(("127.0.0.1", ws.port), timeout=10)
        b = json.dumps({"request_id": "gone%d" % k, "token_ids": list(range(300)),
                        "output_length": 400}).encode()
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
        time.sleep(0.02)
        s.close()
    for t in th:
        t.join()
    if len(out) != 160:
        fail("stress: %d of 160 answered ok" % len(out))
    for _ in range(100):
        st, m = ws.call("GET", "/metrics")
        gone = [l for l in m.splitlines() if l.startswith("kvbm_worker_clients_gone_total")]
        if gone and float(gone[0].split()[-1]) == 5:
            break
        time.sleep(0.1)
    else:
        fail("stress: clients gone not counted: %r" % gone)
    st, h = ws.json("GET", "/health")
    if h["running"] or h["queued"] or h["wrong_bytes"]:
        fail("stress: %r" % h)
    ws.stop()

    # over the memory budget: refused at start, each part named
    out = subprocess.run([KVBM, "worker", "--id", "1", "--listen", "127.0.0.1:0", "--g1",
                          "1000000", "--memory-budget-mb", "64"], capture_output=True, text=True,
                         timeout=30)
    if out.returncode != 2 or "memory-budget-mb" not in out.stderr or "G1" not in out.stderr:
        fail("over budget: rc %d %r" % (out.returncode, out.stderr))

    for x in (w, wt, wb):
        x.stop()
    print("ok")


try:
    main()
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    subprocess.run(["rm", "-rf", tmp])
