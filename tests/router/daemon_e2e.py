#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end test of `kvbm router` (run by test_daemon.sh).

Two fake vLLM workers publish KV events over ZMQ in vLLM's wire format
(topic | 8-byte big-endian seq | msgpack [ts, [events], dp_rank]), one in
the positional event form, one in the map form, each with a replay ROUTER
socket. Their block hashes are computed here in Dynamo's scheme (xxh3,
seed 1337 chain), so a router started with --hash dynamo must find them
from token ids alone. The test then checks: routing answers and
per-worker overlaps per tier; a batch withheld from the live stream is
recovered through the replay socket; /done and load; hostile HTTP input
of many kinds (each answered with the right 4xx, the daemon staying up);
a silent worker dropped after --worker-timeout and back with its next
batch; a clean exit on SIGTERM. With NATS=1 in the environment, a third
worker's events travel ZMQ -> `kvbm events relay` -> nats-server -> router.
"""
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import xxhash
import zmq

KVBM = os.environ["KVBM_BIN"]
BS = 4
TIMEOUT = 20.0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def dynamo_hashes(tokens):
    out, prev = [], None
    for k in range(len(tokens) // BS):
        blk = xxhash.xxh3_64_intdigest(struct.pack("<%dI" % BS, *tokens[k * BS:(k + 1) * BS]), seed=0)
        prev = blk if prev is None else xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, blk), seed=1337)
        out.append(prev)
    return out


class Worker:
    """A fake engine: PUB + replay ROUTER, events kept for replay."""

    def __init__(self, ctx, wid, form, dp_rank=0):
        self.wid, self.form, self.dp_rank = wid, form, dp_rank
        self.pub = ctx.socket(zmq.PUB)
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.rep = ctx.socket(zmq.ROUTER)
        self.rep_port = self.rep.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0
        self.sent = {}
        self.lock = threading.Lock()
        self.replay_requests = 0
        self.relayed = False

    def event(self, kind, hashes=None, parent=None, tokens=None, medium="GPU"):
        if self.form == "positional":
            if kind == "BlockStored":
                return ["BlockStored", hashes, parent, tokens, BS, None, medium]
            if kind == "BlockRemoved":
                return ["BlockRemoved", hashes, medium]
            return ["AllBlocksCleared"]
        ev = {"type": kind}
        if kind == "BlockStored":
            ev.update(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                      block_size=BS, lora_id=None, medium=medium)
        elif kind == "BlockRemoved":
            ev.update(block_hashes=hashes, medium=medium)
        return ev

    def publish(self, events, live=True):
        if not events and self.relayed:
            # a relay forwards events, not batches: an empty batch would
            # never arrive; a removal of a block nobody holds changes nothing
            events = [self.event("BlockRemoved", [12345])]
        with self.lock:
            seq = self.seq
            self.seq += 1
            payload = msgpack.packb([time.time(), events, self.dp_rank])
            self.sent[seq] = payload
            if live:
                self.pub.send_multipart([b"", struct.pack(">q", seq), payload])
        return seq

    def serve_replay(self):
        while self.rep.poll(0):
            ident, empty, start = self.rep.recv_multipart()
            self.replay_requests += 1
            (first,) = struct.unpack(">q", start)
            with self.lock:
                for s in sorted(self.sent):
                    if s >= first:
                        self.rep.send_multipart([ident, b"", struct.pack(">q", s), self.sent[s]])
            self.rep.send_multipart([ident, b"", struct.pack(">q", -1), b""])


class NatsWorker(Worker):
    """A worker publishing straight to NATS (raw protocol: HPUB with a
    Kvbm-Seq header, the payload kvbm's NATS sink sends), with a ZMQ replay
    ROUTER sharing that sequence, as a kvbm publisher with both sinks has."""

    def __init__(self, ctx, wid, port, subject):
        super().__init__(ctx, wid, "positional")
        self.subject = subject.encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert self.sock.recv(4096).startswith(b"INFO ")
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\nPING\r\n')
        got = b""
        while b"PONG" not in got:
            got += self.sock.recv(4096)
            assert b"-ERR" not in got, got

    def publish(self, events, live=True):
        if not events:
            events = [self.event("BlockRemoved", [12345])]
        with self.lock:
            seq = self.seq
            self.seq += 1
            payload = msgpack.packb([time.time(), events, self.dp_rank])
            self.sent[seq] = payload
            if live:
                hdr = b"NATS/1.0\r\nKvbm-Seq: %d\r\n\r\n" % seq
                self.sock.sendall(b"HPUB %s %d %d\r\n" % (self.subject, len(hdr), len(hdr) + len(payload))
                                  + hdr + payload + b"\r\n")
        return seq


class Router:
    def __init__(self, args):
        self.dir = tempfile.mkdtemp()
        pf = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.p = subprocess.Popen([KVBM, "router", "--listen", "127.0.0.1:0", "--port-file", pf] + args,
                                  stderr=self.log)
        t0 = time.time()
        while not (os.path.exists(pf) and open(pf).read().strip()):
            assert self.p.poll() is None, "router exited: " + self.logtext()
            assert time.time() - t0 < TIMEOUT, "router did not start"
            time.sleep(0.05)
        self.port = int(open(pf).read())

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        text = r.read()
        c.close()
        return r.status, json.loads(text)

    def raw(self, data, wait=0.0):
        """Sends raw bytes; returns everything the server answered before closing."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(data)
        if wait:
            time.sleep(wait)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
        s.close()
        return out

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=10)
        return rc


def wait_for(cond, what, workers=()):
    t0 = time.time()
    while True:
        for w in workers:
            w.serve_replay()
        v = cond()
        if v:
            return v
        assert time.time() - t0 < TIMEOUT, "timed out waiting for " + what
        time.sleep(0.02)


def health(router):
    st, h = router.request("GET", "/health")
    assert st == 200, h
    return h


def source(h, wid):
    return [s for s in h["sources"] if s["worker_id"] == wid][0]


def warm_up(router, workers):
    """PUB drops messages until the subscription reaches it: send empty
    batches until the router has seen one from each worker."""
    def seen():
        h = health(router)
        return all(source(h, w.wid)["batches"] > 0 for w in workers)
    t0 = time.time()
    while not seen():
        for w in workers:
            w.publish([])
            w.serve_replay()
        assert time.time() - t0 < TIMEOUT, "router never saw the workers: " + router.logtext()
        time.sleep(0.05)


def route(router, **body):
    st, r = router.request("POST", "/route", body)
    assert st == 200, (st, r)
    return r, {(w["worker_id"], w["dp_rank"]): w for w in r["workers"]}


def main():
    ctx = zmq.Context()
    a = Worker(ctx, 7, "positional")
    b = Worker(ctx, 8, "map", dp_rank=1)
    args = ["--zmq", "7=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (a.pub_port, a.rep_port),
            "--zmq", "8=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (b.pub_port, b.rep_port),
            "--hash", "dynamo", "--block-size", str(BS), "--worker-timeout", "2",
            "--io-timeout", "1", "--load-weight", "0"]
    use_nats = os.environ.get("NATS") == "1"
    if use_nats:
        nats_port = free_port()
        nats = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(nats_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while True:  # until the server accepts connections (slow on a loaded machine)
            try:
                socket.create_connection(("127.0.0.1", nats_port), timeout=1).close()
                break
            except OSError:
                assert nats.poll() is None, "nats-server exited (port %d taken?)" % nats_port
                assert time.time() - t0 < TIMEOUT, "nats-server did not start"
                time.sleep(0.05)
        c = Worker(ctx, 9, "positional")
        c.relayed = True
        args += ["--nats", "9=nats://127.0.0.1:%d/kv.w9" % nats_port]
        d10 = NatsWorker(ctx, 10, nats_port, "kv.w10")
        args += ["--nats", "10=nats://127.0.0.1:%d/kv.w10@tcp://127.0.0.1:%d" % (nats_port, d10.rep_port)]
        relay = subprocess.Popen([KVBM, "events", "relay", "tcp://127.0.0.1:%d" % c.pub_port,
                                  "--nats", "nats://127.0.0.1:%d" % nats_port, "--subject", "kv.w9",
                                  "--delay-us", "0"], stderr=subprocess.DEVNULL)
    router = Router(args)
    workers = [a, b] + ([c, d10] if use_nats else [])
    beat = threading.Event()

    def heartbeat():  # keeps --worker-timeout from dropping the workers until the test wants it
        while not beat.wait(0.3):
            for w in workers:
                w.publish([])

    hb = threading.Thread(target=heartbeat)
    try:
        warm_up(router, workers)
        hb.start()

        # --- stores, both event forms, two tiers
        tokens = list(range(1000, 1032))
        h = dynamo_hashes(tokens)
        assert len(h) == 8
        a.publish([a.event("BlockStored", h[:5], None, tokens[:20]),
                   a.event("BlockStored", h[5:], h[4], tokens[20:])])
        b.publish([b.event("BlockStored", h[:2], None, tokens[:8], "GPU"),
                   b.event("BlockStored", h[2:3], h[1], tokens[8:12], "CPU"),
                   b.event("BlockStored", h[3:4], h[2], tokens[12:16], "DISK")])
        # (not a count of events: the heartbeat's placeholder removals count too)
        def both_stored():
            ws = route(router, token_ids=tokens)[1]
            return ws.get((7, 0), {}).get("device") == 8 and ws.get((8, 1), {}).get("disk") == 4
        wait_for(both_stored, "both workers' stores", workers)
        r, ws = route(router, token_ids=tokens + [1, 2, 3])  # 3 extra tokens: no full block
        assert r["worker_id"] == 7 and r["dp_rank"] == 0 and r["blocks"] == 8, r
        assert (ws[(7, 0)]["device"], ws[(7, 0)]["host"], ws[(7, 0)]["disk"]) == (8, 8, 8), ws
        assert (ws[(8, 1)]["device"], ws[(8, 1)]["host"], ws[(8, 1)]["disk"]) == (2, 3, 4), ws
        assert abs(ws[(8, 1)]["score"] - (2 + 0.75 + 0.25)) < 1e-9, ws
        # the same by hashes, Python's signed form for one of them
        signed = [x - (1 << 64) if x >= 1 << 63 else x for x in h]
        r2, ws2 = route(router, block_hashes=signed)
        assert r2["worker_id"] == 7 and ws2[(8, 1)]["disk"] == 4, r2
        # a prefix only worker 8 has more of: a request of the first 2 blocks ties
        r3, ws3 = route(router, token_ids=tokens[:8])
        assert ws3[(7, 0)]["device"] == 2 and ws3[(8, 1)]["device"] == 2 and r3["ties"] == 2, r3

        # --- a gap: batch withheld from the live stream, recovered by replay
        before = a.replay_requests
        a.publish([a.event("BlockRemoved", h[4:])], live=False)
        a.publish([])
        wait_for(lambda: route(router, block_hashes=h)[1][(7, 0)]["device"] == 4,
                 "the withheld BlockRemoved to arrive through replay", workers)
        assert a.replay_requests > before

        # --- /done
        st, d = router.request("POST", "/done", {"request_id": r["request_id"]})
        assert st == 200 and d["ok"], d
        st, d = router.request("POST", "/done", {"request_id": r["request_id"]})
        assert st == 404, d

        # --- NATS: a third worker through the relay
        if use_nats:
            c.publish([c.event("BlockStored", h[:6], None, tokens[:24])])
            wait_for(lambda: route(router, block_hashes=h)[1].get((9, 0), {}).get("device") == 6,
                     "worker 9's blocks through NATS", workers)
            # worker 10: a batch missing on NATS is asked for at its replay socket
            before = d10.replay_requests
            d10.publish([d10.event("BlockStored", h[:2], None, tokens[:8])])
            d10.publish([d10.event("BlockStored", h[2:4], h[1], tokens[8:16])], live=False)
            d10.publish([])
            wait_for(lambda: route(router, block_hashes=h)[1].get((10, 0), {}).get("device") == 4,
                     "worker 10's withheld batch through replay", workers)
            assert d10.replay_requests > before
            # the count is updated once replay() returns, just after the
            # replayed batch reached the index: wait for it as well
            wait_for(lambda: source(health(router), 10)["replayed"] >= 1,
                     "worker 10's replay count", workers)

        # --- hostile HTTP input: the right status, the daemon stays up
        def status_of(resp):
            assert resp.startswith(b"HTTP/1.1 "), resp[:100]
            return int(resp[9:12])

        bad = [
            (b"HELLO\r\n\r\n", 400),
            (b"GET /health HTTP/1.1\nHost: x\n\n", 400),
            (b"GET /health HTTP/1.1\r\nX: \x00\r\n\r\n", 400),
            (b"GET /health HTTP/2.0\r\n\r\n", 505),
            (b"GET health HTTP/1.1\r\n\r\n", 400),
            (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\n\r\n", 414),
            (b"GET /health HTTP/1.1\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n", 431),
            (b"GET /health HTTP/1.1\r\n" + b"".join(b"X%d: y\r\n" % i for i in range(100)) + b"\r\n", 431),
            (b"GET /health HTTP/1.1\r\n folded\r\n\r\n", 400),
            (b"POST /route HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413),
            (b"POST /route HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
            (b"POST /route HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
            (b"POST /route HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
            (b"POST /route HTTP/1.1\r\n\r\n", 411),
            (b"GET /route HTTP/1.1\r\n\r\n", 405),
            (b"DELETE /health HTTP/1.1\r\n\r\n", 405),
            (b"GET /nowhere HTTP/1.1\r\n\r\n", 404),
        ]

        def post(body):
            return b"POST /route HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body

        bodies = [
            (b"", 400), (b"[]", 400), (b"{", 400), (b'{"token_ids": [1, 2,', 400),
            (b'{"token_ids": [1.5]}', 400), (b'{"token_ids": [-1]}', 400),
            (b'{"token_ids": [4294967296]}', 400), (b'{"token_ids": "abc"}', 400),
            (b'{"token_ids": [1], "block_hashes": [2]}', 400), (b'{}', 400),
            (b'{"token_ids": [1]} x', 400), (b'{"token_ids": [1], "token_ids": [2]}', 400),
            (b'{"block_hashes": [18446744073709551616]}', 400),
            (b'{"x": ' + b"[" * 100 + b"]" * 100 + b', "token_ids": [1]}', 400),
            (b'{"x": "\\q", "token_ids": [1]}', 400), (b'{"x": "\x01"}', 400),
            (b'{"token_ids": [01]}', 400), (b"\xff\xfe", 400),
        ]
        for data, want in bad + [(post(b), w) for b, w in bodies]:
            resp = router.raw(data)
            assert status_of(resp) == want, (data[:80], resp[:200])
            assert b'"error"' in resp, resp
        # unknown keys are skipped, nested ones too
        st, r = router.request("POST", "/route", {"x": {"y": [1, {"z": None}]}, "token_ids": tokens})
        assert st == 200 and r["worker_id"] == (9 if use_nats else 7), r
        # too many tokens: a 413 (limit 1 << 20)
        st, r = router.request("POST", "/route", b'{"token_ids": [' + b"1," * (1 << 20) + b'1]}')
        assert st == 413, (st, r)
        # pipelining: two requests in one write, two answers in order
        two = b"GET /health HTTP/1.1\r\n\r\n" + post(b'{"token_ids": [1,2,3,4]}')
        resp = router.raw(two + b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert resp.count(b"HTTP/1.1 200 OK") == 3, resp
        # a head that never ends: 408 after --io-timeout (1 s)
        resp = router.raw(b"GET /health HTTP/1.1\r\nX: y", wait=2.5)
        assert status_of(resp) == 408, resp
        # Expect: 100-continue: the interim answer comes before the body is sent
        sk = socket.create_connection(("127.0.0.1", router.port), timeout=10)
        sk.sendall(b"POST /route HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 19\r\n"
                   b"Connection: close\r\n\r\n")
        got = sk.recv(100)
        assert got == b"HTTP/1.1 100 Continue\r\n\r\n", got
        sk.sendall(b'{"token_ids": [1]}\n')
        got = b""
        while True:
            x = sk.recv(65536)
            if not x:
                break
            got += x
        sk.close()
        assert got.startswith(b"HTTP/1.1 200"), got
        # a burst of connections that close at once
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", router.port))
            s.close()
        hh = health(router)
        assert hh["status"] == "ok" and hh["bad_requests"] >= len(bad) + len(bodies), hh

        # --- silence: workers dropped after --worker-timeout 2 s, back with events
        beat.set()
        hb.join()
        wait_for(lambda: all(s["dropped"] for s in health(router)["sources"]), "workers dropped")
        assert health(router)["workers"] == 0
        st, r = router.request("POST", "/route", {"token_ids": tokens})
        assert st == 503, r
        a.publish([a.event("BlockStored", h[:1], None, tokens[:4])])
        wait_for(lambda: health(router)["workers"] == 1, "worker 7 back", workers)
        r, ws = route(router, token_ids=tokens)
        assert r["worker_id"] == 7 and ws[(7, 0)]["device"] == 1, r  # forgotten, then 1 new block

        rc = router.stop()
        assert rc == 0, (rc, router.logtext())
    except Exception:
        beat.set()
        if hb.is_alive():
            hb.join()
        sys.stderr.write("router log:\n" + router.logtext())
        router.p.kill()
        raise
    finally:
        if use_nats:
            relay.kill()
            nats.kill()
    approximate()
    print("ok")


def approximate():
    """--approx-ttl: no events; each decision counts as stored, then expires."""
    router = Router(["--worker", "1", "--worker", "2:3", "--approx-ttl", "3", "--block-size", "4",
                     "--load-weight", "0"])
    try:
        tokens = list(range(50, 70))
        r1, ws = route(router, token_ids=tokens)
        assert all(w["device"] == 0 for w in ws.values()) and r1["ties"] == 2, r1
        r2, ws = route(router, token_ids=tokens)
        chosen = (r1["worker_id"], r1["dp_rank"])
        assert (r2["worker_id"], r2["dp_rank"]) == chosen and ws[chosen]["device"] == 5, r2
        time.sleep(3.3)
        r3, ws = route(router, token_ids=tokens[:8])
        assert all(w["device"] == 0 for w in ws.values()), r3
        assert router.stop() == 0
    except Exception:
        sys.stderr.write("router log:\n" + router.logtext())
        router.p.kill()
        raise


if __name__ == "__main__":
    main()
