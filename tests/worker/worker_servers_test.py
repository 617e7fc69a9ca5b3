# SPDX-License-Identifier: Apache-2.0
"""worker_servers_test.py: `kvbm worker` with the servers of a cluster (run
by test_worker_servers.sh; exits 77, a skip, without redis-server or
nats-server).

- A shared G4 on a real Redis with a cluster key: what worker 1 computed,
  worker 2 onboards from G4 with its bytes checked (wrong_bytes 0); a
  worker with another key gets no G4 hit and counts the refusal (auth).
- KV events into NATS JetStream (nats://HOST:PORT/STREAM/SUBJECT): the
  stream exists and holds the workers' batches (the server's monitoring
  page counts them), and storage events go out on NATS.
- The G3 fault knobs: g3_delay_ms makes a G3 hit slower by at least that
  much (in its TTFT); g3_full keeps new blocks out of G3 (counted) while
  what G3 held is still served; off again, G3 takes new blocks.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KVBM = os.environ["KVBM_BIN"]
tmp = tempfile.mkdtemp(prefix="kvbm-worker-srv-")
procs = []


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, what):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                fail(what + " exited at start")
            time.sleep(0.05)
    fail(what + " did not listen")


def start(cmd, log):
    p = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, log), "w"),
                         stderr=subprocess.STDOUT)
    procs.append(p)
    return p


class Worker:
    def __init__(self, args, name):
        self.portfile = os.path.join(tmp, name + ".port")
        self.logname = os.path.join(tmp, name + ".log")
        self.p = start([KVBM, "worker", "--listen", "127.0.0.1:0", "--port-file", self.portfile]
                       + args, name + ".log")
        for _ in range(300):
            if os.path.exists(self.portfile):
                break
            if self.p.poll() is not None:
                fail("worker exited at start: " + open(self.logname).read())
            time.sleep(0.05)
        else:
            fail("worker did not start")
        self.port = int(open(self.portfile).read())

    def req(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                   method=method)
        with urllib.request.urlopen(r, timeout=60) as a:
            return a.read().decode()

    def gen(self, rid, tokens):
        a = json.loads(self.req("POST", "/generate", {"request_id": rid, "token_ids": tokens}))
        if a["status"] != "ok" or a["wrong_bytes"]:
            fail("generate %s: %r" % (rid, a))
        return a

    def g3(self):
        return set(json.loads(self.req("GET", "/blocks"))["g3"])

    def metric(self, pattern):
        page = self.req("GET", "/metrics")
        total = 0
        for line in page.splitlines():
            if not line.startswith("#") and re.search(pattern, line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        if self.p.wait(timeout=30) != 0:
            fail("worker exited badly: " + open(self.logname).read()[-2000:])


def toks(seed, n):
    return [seed * 100000 + i for i in range(n)]


def key_file(name, byte):
    path = os.path.join(tmp, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, bytes([byte]) * 32)
    os.close(fd)
    return path


def main():
    if not shutil.which("redis-server") or not shutil.which("nats-server"):
        print("skip: redis-server or nats-server not installed")
        sys.exit(77)
    rp, npo, nm = free_port(), free_port(), free_port()
    redis = start(["redis-server", "--port", str(rp), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no"], "redis.log")
    nats = start(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(npo), "-m", str(nm), "-sd",
                  os.path.join(tmp, "js")], "nats.log")
    wait_port(rp, redis, "redis-server")
    wait_port(npo, nats, "nats-server")
    k1, k2 = key_file("key1", 0x5A), key_file("key2", 0x33)
    g4 = "redis://127.0.0.1:%d" % rp
    common = ["--g1", "64", "--g4", g4, "--time-scale", "1000"]
    w1 = Worker(["--id", "1", "--g4-key-file", k1, "--events",
                 "nats://127.0.0.1:%d/KVW/kv.w1" % npo, "--storage-events",
                 "nats://127.0.0.1:%d/KVW/st.w1" % npo] + common, "w1")
    w2 = Worker(["--id", "2", "--g4-key-file", k1, "--events",
                 "nats://127.0.0.1:%d/KVW/kv.w2" % npo] + common, "w2")
    w3 = Worker(["--id", "3", "--g4-key-file", k2] + common, "w3")

    r = toks(1, 100)
    w1.gen("a", r)
    # A worker's G4 puts go on behind its answer (as an engine's do:
    # worker.c's commit waits for G2/G3 only), so worker 2 asks once
    # worker 1 counts its 6 full blocks as stored in G4.
    deadline = time.time() + 20
    while w1.metric(r'kvbm_offload_blocks_total\{.*tier="G4"') < 6:
        if time.time() > deadline:
            fail("worker 1 did not store its 6 blocks in G4 within 20 s")
        time.sleep(0.05)
    a = w2.gen("b", r)
    if a["hit_tokens"]["g4"] != 96 or a["onboarded_blocks"] != 6:
        fail("worker 2 should onboard worker 1's blocks from G4: %r" % a)
    a = w3.gen("c", r)
    if a["hit_tokens"]["g4"] != 0:
        fail("a worker with another key must not use G4's values: %r" % a)
    if w3.metric(r'kvbm_verify_failures_total\{.*cause="auth"') < 1:
        fail("the other key's refusals are not counted")

    # both workers' KV events are in the JetStream stream
    deadline = time.time() + 20
    msgs, subjects = 0, []
    while time.time() < deadline:
        with urllib.request.urlopen("http://127.0.0.1:%d/jsz?streams=true&config=true" % nm, timeout=10) as x:
            jsz = json.loads(x.read())
        for acc in jsz.get("account_details", []):
            for s in acc.get("stream_detail", []):
                if s["name"] == "KVW":
                    msgs = s["state"]["messages"]
                    subjects = s.get("config", {}).get("subjects", [])
        if msgs >= 4:
            break
        time.sleep(0.2)
    if msgs < 4:
        fail("JetStream stream KVW holds %d batches" % msgs)
    if "kv.>" not in subjects:
        fail("stream subjects %r" % subjects)
    # nats-server killed (-9: it may lose what it acknowledged) and
    # restarted: the workers see their watching connection come back and
    # republish (clear + every held block) into the stream
    def stream_msgs():
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/jsz?streams=true" % nm,
                                        timeout=5) as x:
                jsz = json.loads(x.read())
        except OSError:
            return -1
        for acc in jsz.get("account_details", []):
            for s in acc.get("stream_detail", []):
                if s["name"] == "KVW":
                    return s["state"]["messages"]
        return 0
    h0 = json.loads(w1.req("GET", "/health"))
    nats.kill()
    nats.wait()
    nats = start(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(npo), "-m", str(nm), "-sd",
                  os.path.join(tmp, "js")], "nats2.log")
    wait_port(npo, nats, "nats-server (restarted)")
    after_restart = stream_msgs()
    deadline = time.time() + 30
    while time.time() < deadline:
        h = json.loads(w1.req("GET", "/health"))
        if h["nats_reconnects"] > h0["nats_reconnects"] and h["heals"] > h0["heals"]:
            break
        time.sleep(0.2)
    else:
        fail("no republish after nats-server came back: %r" % h)
    for _ in range(100):
        if stream_msgs() > after_restart:
            break
        time.sleep(0.1)
    else:
        fail("the republish did not reach the stream (%d messages)" % stream_msgs())
    for w in (w1, w2, w3):
        w.stop()

    # G3 fault knobs
    g3 = os.path.join(tmp, "g3")
    os.mkdir(g3, 0o700)
    wf = Worker(["--id", "4", "--g1", "32", "--g3", g3 + ":512", "--g3-policy", "all",
                 "--time-scale", "1000"], "wf")
    f = toks(5, 100)
    wf.gen("f1", f)
    for i in range(2):
        wf.gen("p%d" % i, toks(10 + i, 496))
    wf.req("POST", "/admin/fault", {"g3_delay_ms": 300})
    a = wf.gen("f1b", f)
    if a["hit_tokens"]["g3"] != 96 or a["ttft_ms"] < 300:
        fail("g3_delay_ms 300: %r" % a)
    wf.req("POST", "/admin/fault", {"g3_delay_ms": 0, "g3_full": True})
    before = wf.g3()
    wf.gen("new", toks(6, 100))
    if wf.g3() != before:
        fail("g3_full: G3 took new blocks")
    if wf.metric("kvbm_worker_g3_full_dropped_total") < 6:
        fail("g3_full: drops not counted")
    for i in range(2):
        wf.gen("q%d" % i, toks(20 + i, 496))
    a = wf.gen("f1c", f)  # still served from G3
    if a["hit_tokens"]["g3"] != 96:
        fail("g3_full: what G3 held is not served: %r" % a)
    wf.req("POST", "/admin/fault", {"g3_full": False})
    wf.gen("new2", toks(7, 100))
    if len(wf.g3() - before) < 6:
        fail("g3_full off: G3 takes no new blocks")
    wf.stop()
    print("ok")


try:
    main()
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(tmp, ignore_errors=True)
