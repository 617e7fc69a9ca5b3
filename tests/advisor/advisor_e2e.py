#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end test of `kvbm advisor` (run by test_daemon.sh).

A real nats-server and Python publishers written from the wire
specifications (docs/areas/storage-events.md, docs/areas/events.md):
storage events over ZMQ (PUB + replay ROUTER) and over NATS (HPUB with a
Kvbm-Seq header), KV events of three workers (vLLM's positional form over
ZMQ, the map form over ZMQ, positional over NATS). The script plays a trace
whose right hints are known and checks them on GET /hints and on the hints
subject:

  * host (G2, from the events' metadata) learns an eviction age from 20
    blocks used once and evicted later; then A (used twice) and B (used
    once) leave G1 and go cold in host: A is demoted to disk, B dropped;
    C, still held in G1, is never hinted;
  * P sits in disk (G3, from --volume) only, its family F is used three
    times: P is promoted to host;
  * disk thins out (150 stored, 100 removed): compaction;
  * /volumes counts every store and remove, a batch withheld from the live
    ZMQ stream included (recovered through replay); /prefix answers a
    family's blocks per volume;
  * malformed payloads, a NATS sequence gap and an event-id jump are
    counted, never fatal; a flood of 30,000 distinct blocks stays within
    --max-blocks (what was forgotten is counted);
  * hostile HTTP gets the right 4xx/5xx; 64 idle sockets do not lock
    clients out, connections with a request begun do (503); SIGTERM ends
    it with status 0.
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
import zmq

KVBM = os.environ["KVBM_BIN"]
TIMEOUT = 60.0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class ZmqPub:
    """A publisher on the events' ZMQ transport: PUB + replay ROUTER."""

    def __init__(self, ctx):
        self.pub = ctx.socket(zmq.PUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.rep = ctx.socket(zmq.ROUTER)
        self.rep_port = self.rep.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0
        self.sent = {}
        self.lock = threading.Lock()
        self.replay_requests = 0

    def send(self, payload, live=True):
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.sent[seq] = payload
            if live:
                self.pub.send_multipart([b"", struct.pack(">q", seq), payload])
        return seq

    def serve_replay(self):
        while self.rep.poll(0):
            ident, _, start = self.rep.recv_multipart()
            self.replay_requests += 1
            (first,) = struct.unpack(">q", start)
            with self.lock:
                for s in sorted(self.sent):
                    if s >= first:
                        self.rep.send_multipart([ident, b"", struct.pack(">q", s), self.sent[s]])
            self.rep.send_multipart([ident, b"", struct.pack(">q", -1), b""])


class Nats:
    """The NATS client protocol, enough for HPUB and SUB/HMSG."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.msgs = []
        self.lock = threading.Lock()
        line = self._line()
        assert line.startswith(b"INFO "), line
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\nPING\r\n')
        while self._line() != b"PONG":
            pass
        self.seqs = {}

    def _fill(self):
        b = self.sock.recv(65536)
        assert b, "nats-server closed the connection"
        self.buf += b

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def publish(self, subject, payload, seq=None):
        if seq is None:
            seq = self.seqs.get(subject, 0)
            self.seqs[subject] = seq + 1
        hdr = b"NATS/1.0\r\nKvbm-Seq: %d\r\n\r\n" % seq
        self.sock.sendall(b"HPUB %s %d %d\r\n" % (subject.encode(), len(hdr), len(hdr) + len(payload))
                          + hdr + payload + b"\r\n")

    def subscribe(self, subject):
        self.sock.sendall(b"SUB %s 1\r\nPING\r\n" % subject.encode())
        while self._line() != b"PONG":
            pass
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        try:
            while True:
                line = self._line()
                if line == b"PING":
                    self.sock.sendall(b"PONG\r\n")
                elif line.startswith(b"HMSG "):
                    parts = line.split()
                    hlen, tlen = int(parts[-2]), int(parts[-1])
                    data = self._take(tlen)
                    hdr, payload = data[:hlen], data[hlen:]
                    seq = None
                    for h in hdr.split(b"\r\n"):
                        if h.lower().startswith(b"kvbm-seq:"):
                            seq = int(h.split(b":", 1)[1])
                    with self.lock:
                        self.msgs.append((seq, payload))
                elif line.startswith(b"MSG "):
                    self._take(int(line.split()[-1]))
        except (OSError, AssertionError):
            return


def storage_event(kind, eid, h, prefix, loc, tier=None):
    meta = {"tier": tier} if tier else None
    return [kind, eid, h, prefix, 4096, loc, meta]


class Storage:
    """Storage events with dense ids, on one transport."""

    def __init__(self, send, source):
        self.send = send
        self.source = source
        self.next_id = 1

    def batch(self, evs, live=True):
        out = []
        for kind, h, prefix, loc, tier in evs:
            out.append(storage_event(kind, self.next_id, h, prefix, loc, tier))
            self.next_id += 1
        return self.send(msgpack.packb([time.time(), out, self.source]), live)


def kv_payload(form, events):
    evs = []
    for kind, hashes in events:
        if form == "positional":
            evs.append(["BlockStored", hashes, None, [0] * (4 * len(hashes)), 4, None, "GPU"]
                       if kind == "S" else ["BlockRemoved", hashes, "GPU"])
        else:
            d = {"type": "BlockStored" if kind == "S" else "BlockRemoved", "block_hashes": hashes,
                 "medium": "GPU"}
            if kind == "S":
                d.update(parent_block_hash=None, token_ids=[0] * (4 * len(hashes)), block_size=4,
                         lora_id=None)
            evs.append(d)
    return msgpack.packb([time.time(), evs, 0])


class Advisor:
    def __init__(self, args):
        self.dir = tempfile.mkdtemp()
        pf = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.p = subprocess.Popen([KVBM, "advisor", "--listen", "127.0.0.1:0", "--port-file", pf] + args,
                                  stderr=self.log)
        t0 = time.time()
        while not (os.path.exists(pf) and open(pf).read().strip()):
            assert self.p.poll() is None, "advisor exited: " + self.logtext()
            assert time.time() - t0 < TIMEOUT, "advisor did not start"
            time.sleep(0.05)
        self.port = int(open(pf).read())

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, json.loads(body)

    def raw(self, data, wait=0.0):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=20)
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


def main():
    nats_port = free_port()
    nats = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(nats_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    adv = None
    try:
        t0 = time.time()
        while True:
            try:
                socket.create_connection(("127.0.0.1", nats_port), timeout=1).close()
                break
            except OSError:
                assert nats.poll() is None, "nats-server exited"
                assert time.time() - t0 < TIMEOUT, "nats-server did not start"
                time.sleep(0.05)
        ctx = zmq.Context()
        szmq = ZmqPub(ctx)
        w0, w1 = ZmqPub(ctx), ZmqPub(ctx)
        w3 = ZmqPub(ctx)  # its replay ROUTER only: w3's live batches go over NATS
        pubs = [szmq, w0, w1, w3]
        nc = Nats(nats_port)
        hints_sub = Nats(nats_port)
        hints_sub.subscribe("kvbm.hints")
        url = "nats://127.0.0.1:%d" % nats_port
        adv = Advisor([
            "--storage-zmq", "tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (szmq.port, szmq.rep_port),
            "--storage-nats", url + "/kvbm.storage",
            "--kv-zmq", "w0=tcp://127.0.0.1:%d" % w0.port,
            "--kv-zmq", "w1=tcp://127.0.0.1:%d" % w1.port,
            "--kv-nats", "w2=" + url + "/kvbm.kv.w2",
            "--kv-nats", "w3=%s/kvbm.kv.w3@tcp://127.0.0.1:%d" % (url, w3.rep_port),
            "--volume", "disk=G3", "--hints-nats", url + "/kvbm.hints",
            "--hint-period-ms", "200", "--rehint-ms", "0", "--demote-fraction", "0.7",
            "--compact-min-blocks", "100", "--max-blocks", "4096", "--max-connections", "8",
            "--io-timeout-ms", "2000"])

        def pump():
            for p in pubs:
                p.serve_replay()

        def wait_for(cond, what):
            t0 = time.time()
            while True:
                pump()
                v = cond()
                if v:
                    return v
                assert time.time() - t0 < TIMEOUT, "timed out waiting for " + what + "\n" + adv.logtext()
                time.sleep(0.05)

        def health():
            st, h = adv.get("/health")
            assert st == 200, h
            return h

        def src(h, name):
            return [s for s in h["sources"] if s["name"].startswith(name)][0]

        def w3send(payload, live=True):
            """Numbered as one publisher with a NATS and a ZMQ sink: live on NATS,
            kept for w3's replay ROUTER either way."""
            seq = w3.send(payload, live=False)
            if live:
                nc.publish("kvbm.kv.w3", payload, seq=seq)

        st = Storage(szmq.send, "manager-zmq")
        sn = Storage(lambda payload, live=True: nc.publish("kvbm.storage", payload), "manager-nats")

        # --- warm up: ZMQ subscriptions drop what is sent before they connect
        def seen_all():
            h = health()
            return all(src(h, n)["batches"] > 0 for n in ("tcp", "w0", "w1", "w2", "w3", "nats"))
        t0 = time.time()
        while not seen_all():
            st.batch([("Store", 777001, 777001, "warm", None)])
            sn.batch([("Store", 777002, 777001, "warm", None)])
            w0.send(kv_payload("positional", []))
            w1.send(kv_payload("map", []))
            nc.publish("kvbm.kv.w2", kv_payload("positional", []))
            w3send(kv_payload("map", []))
            pump()
            assert time.time() - t0 < TIMEOUT, "the advisor never saw the publishers"
            time.sleep(0.1)
        # a marker behind the warm-up batches on each storage source (each
        # source's stream is in order): once both show, no warm store is late
        st.batch([("Store", 777003, 777003, "mark", None)])
        sn.batch([("Store", 777004, 777003, "mark", None)])
        wait_for(lambda: {v["name"]: v for v in adv.get("/volumes")[1]["volumes"]}
                 .get("mark", {}).get("stores") == 2, "the warm-up's marker")
        base = {v["name"]: v for v in adv.get("/volumes")[1]["volumes"]}
        warm_stores = base["warm"]["stores"]

        # --- host learns its eviction age (blocks used once, evicted 0.5 s later)
        X = list(range(1000, 1020))
        st.batch([("Store", x, 77, "host", "G2") for x in X])
        w0.send(kv_payload("positional", [("S", X), ("R", X)]))
        wait_for(lambda: health()["advisor"]["uses"] >= 20, "the uses of X")
        time.sleep(0.5)
        st.batch([("Remove", x, 0, "host", "G2") for x in X])
        wait_for(lambda: {v["name"]: v for v in adv.get("/volumes")[1]["volumes"]}["host"]["removes"] == 20,
                 "X evicted")
        vols = {v["name"]: v for v in adv.get("/volumes")[1]["volumes"]}
        assert vols["host"]["tier"] == "G2" and vols["disk"]["tier"] == "G3", vols
        assert vols["host"]["eviction_age_ms"] >= 500, vols["host"]

        # --- A (used twice), B (used once) go cold in host; C stays in G1
        A, B, C = 1, 2, 3
        # C's G1 hold first, and seen, before C is stored in host: a hold that
        # came later than a hint derivation would let C be hinted meanwhile
        w2_events = src(health(), "w2")["events"]
        nc.publish("kvbm.kv.w2", kv_payload("positional", [("S", [C])]))
        wait_for(lambda: src(health(), "w2")["events"] >= w2_events + 1, "C held in G1")
        st.batch([("Store", h, 50, "host", "G2") for h in (A, B, C)])
        w1.send(kv_payload("map", [("S", [A]), ("R", [A]), ("S", [A, B]), ("R", [A, B])]))

        def cold_hints():
            _, h = adv.get("/hints")
            for x in h["hints"]:
                assert x["sequence_hash"] != C, ("C is held in G1 and was hinted", x)
            d = [x for x in h["hints"] if x["sequence_hash"] == A and x["kind"] == "Demote"]
            r = [x for x in h["hints"] if x["sequence_hash"] == B and x["kind"] == "Drop"]
            return (d[0], r[0]) if d and r else None
        demote, drop = wait_for(cold_hints, "Demote A and Drop B")
        assert demote["from"] == "host" and demote["to"] == "disk" and demote["uses"] == 2, demote
        assert demote["prefix_hash"] == 50 and demote["idle_ms"] > 0, demote
        assert drop["from"] == "host" and drop["to"] is None and drop["uses"] == 1, drop
        assert not [x for x in adv.get("/hints")[1]["hints"] if x["sequence_hash"] == B and x["kind"] != "Drop"]

        # --- P sits in disk only; its family F is used three times: promote
        F, P = 9000, 9001
        sn.batch([("Store", F, F, "disk", None), ("Store", P, F, "disk", None)])
        wait_for(lambda: {v["name"]: v for v in adv.get("/volumes")[1]["volumes"]}["disk"]["stores"] >= 2,
                 "F and P in disk")
        for _ in range(3):
            w0.send(kv_payload("positional", [("S", [F]), ("R", [F])]))
            time.sleep(0.05)

        def promote():
            _, h = adv.get("/hints")
            p = [x for x in h["hints"] if x["sequence_hash"] == P and x["kind"] == "Promote"]
            return p[0] if p else None
        p = wait_for(promote, "Promote P")
        assert p["from"] == "disk" and p["to"] == "host" and p["prefix_hash"] == F, p
        st_, pre = adv.get("/prefix?hash=%d" % F)
        assert st_ == 200 and pre["volumes"] == {"disk": 2} and pre["score"] > 2, pre
        st_, pre = adv.get("/prefix?hash=0x%x" % F)
        assert st_ == 200 and pre["prefix_hash"] == F, pre
        assert adv.get("/prefix?hash=123456")[0] == 404
        st_, pre = adv.get("/prefix?hash=%d&namespace=0" % F)
        assert st_ == 200 and pre["namespace"] == 0 and pre["volumes"] == {"disk": 2}, pre
        assert adv.get("/prefix?hash=%d&namespace=77" % F)[0] == 404  # another tenant's family
        for q in ("hash=abc", "hash=", "hash=-1", "x=1", "hash=18446744073709551616", "hash=1&x=2",
                  "hash=1&namespace=", "hash=1&namespace=x", "hash=1&namespace=1&x=2", "hash=1&"):
            st_, e = adv.get("/prefix?" + q)
            assert st_ == 400 and "error" in e, (q, st_, e)

        # --- disk thins out: compaction; one removal batch withheld from the
        # live stream comes back through replay
        D = list(range(50000, 50150))
        st.batch([("Store", x, 1, "disk", None) for x in D])
        st.batch([("Remove", x, 1, "disk", None) for x in D[:50]])
        before = szmq.replay_requests
        st.batch([("Remove", x, 1, "disk", None) for x in D[50:100]], live=False)
        st.batch([("Store", 4, 4, "host", "G2")])

        # (a compaction is asked once: look for it in the counters and on NATS,
        # not in the last derivation only)
        wait_for(lambda: health()["advisor"]["hints"]["compact"] >= 1, "Compact disk")
        vols = wait_for(lambda: (lambda v: v if v["disk"]["removes"] == 100 else None)(
            {v["name"]: v for v in adv.get("/volumes")[1]["volumes"]}), "the withheld removals")
        assert szmq.replay_requests > before
        assert vols["disk"]["stores"] == 152 and vols["disk"]["live_blocks"] == 52, vols["disk"]
        assert vols["host"]["stores"] == 24 and vols["host"]["removes"] == 20, vols["host"]
        assert vols["warm"]["stores"] == warm_stores, vols["warm"]
        h = health()
        assert src(h, "tcp")["lost"] == 0 and src(h, "tcp")["replayed"] >= 1, src(h, "tcp")
        assert h["advisor"]["onboard_uses"] >= 0 and h["advisor"]["lost_events"] == 0, h["advisor"]

        # --- a NATS source with a replay ROUTER: a batch that never came on
        # NATS is replayed, not lost
        w3_events = src(h, "w3")["events"]
        before = w3.replay_requests
        w3send(kv_payload("map", [("S", [880001, 880002, 880003])]), live=False)
        w3send(kv_payload("map", [("S", [880004])]))
        w3h = wait_for(lambda: (lambda s: s if s["events"] >= w3_events + 2 else None)(src(health(), "w3")),
                       "w3's gap replayed")
        assert w3.replay_requests > before
        assert w3h["replayed"] == 1 and w3h["lost"] == 0 and w3h["events"] == w3_events + 2, w3h

        # --- hints on NATS: msgpack [ts, [hint...], source], Kvbm-Seq rising
        def nats_hints():
            with hints_sub.lock:
                msgs = list(hints_sub.msgs)
            seqs = [s for s, _ in msgs]
            found = set()
            for _, payload in msgs:
                ts, hints, source = msgpack.unpackb(payload)
                assert source == "kvbm-advisor", source
                for x in hints:
                    assert len(x) == 11 and x[9] == 0 and x[10] == 0, x  # namespace, group: none here
                    found.add((x[0], x[1], x[3], x[4]))
            ok = (("Demote", A, "host", "disk") in found and ("Promote", P, "disk", "host") in found
                  and ("Compact", 0, "disk", None) in found)
            return (seqs, found) if ok else None
        seqs, found = wait_for(nats_hints, "hints on NATS")
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
        assert ("Drop", B, "host", None) in found

        # --- hostile events: counted, skipped, never fatal
        szmq.send(b"\xc1")
        szmq.send(msgpack.packb([time.time(), [["Move", 1, 2, 3, 4, "x", None]], "t"]))
        szmq.send(msgpack.packb([time.time(), [["Store", 1, 2, 3, 4, "", None]], "t"])[:-3])
        nc.publish("kvbm.storage", b"\x93\xcb" + b"\0" * 8 + b"\xdd\xff\xff\xff\xff")
        w0.send(b"not msgpack")
        # a NATS gap (one number skipped): counted lost
        nc.publish("kvbm.storage", msgpack.packb([time.time(), [], "test"]), seq=sn_next_skip(nc))
        # an event-id jump on the storage stream
        st.next_id += 10
        st.batch([("Store", 5, 5, "host", "G2")])
        h = wait_for(lambda: (lambda h: h if src(h, "tcp")["errors"] >= 3 and src(h, "nats")["errors"] >= 1
                               and src(h, "w0")["errors"] >= 1 and src(h, "nats")["lost"] >= 1
                               and h["advisor"]["lost_events"] >= 10 else None)(health()),
                     "the hostile events counted")

        # --- a flood of distinct blocks stays within --max-blocks
        n0 = health()["advisor"]["storage_events"]
        for k in range(30):
            st.batch([("Store", 10**9 + k * 1000 + i, 10**9 + k, "host", "G2") for i in range(1000)])
            pump()
        h = wait_for(lambda: (lambda h: h if h["advisor"]["storage_events"] >= n0 + 30000 else None)(health()),
                     "the flood")
        a = h["advisor"]
        assert a["entries"] <= 4096 and a["forgotten_blocks"] >= 30000 - 4096, a
        assert a["memory_bytes"] < 16 << 20, a

        # --- hostile HTTP
        def status_of(resp):
            assert resp.startswith(b"HTTP/1.1 "), resp[:100]
            return int(resp[9:12])
        bad = [
            (b"HELLO\r\n\r\n", 400),
            (b"GET /hints HTTP/1.1\nHost: x\n\n", 400),
            (b"GET /hints HTTP/2.0\r\n\r\n", 505),
            (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\n\r\n", 414),
            (b"GET /prefix?hash=" + b"1" * 300 + b" HTTP/1.1\r\n\r\n", 414),
            (b"GET /hints HTTP/1.1\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n", 431),
            (b"GET /hints HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 413),
            (b"GET /hints HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
            (b"POST /hints HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
            (b"GET /nowhere HTTP/1.1\r\n\r\n", 404),
            (b"GET /hints?x=1 HTTP/1.1\r\n\r\n", 400),
            (b"GET /hints HTTP/1.1\r\nX: \x00\r\n\r\n", 400),
        ]
        for data, want in bad:
            resp = adv.raw(data)
            assert status_of(resp) == want, (data[:80], resp[:200])
            assert b'"error"' in resp, resp
        resp = adv.raw(b"GET /volumes HTTP/1.1\r\n\r\nGET /hints HTTP/1.1\r\n\r\n"
                       b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert resp.count(b"HTTP/1.1 200 OK") == 3, resp[:300]
        assert resp.index(b'"volumes"') < resp.index(b'"hints"') < resp.index(b'"advisor"')
        resp = adv.raw(b"GET /hints HTTP/1.1\r\nX: y", wait=4.0)  # never ends: 408
        assert status_of(resp) == 408, resp
        # 64 idle sockets no longer lock clients out (issue 24: every client
        # was answered 503 until they timed out): a newcomer takes the slot of
        # an idle one (of its own address's, past the 8 one address may hold)
        idle = [socket.create_connection(("127.0.0.1", adv.port), timeout=10) for _ in range(64)]
        resp = adv.raw(b"GET /hints HTTP/1.1\r\n\r\n")
        assert status_of(resp) == 200, resp[:200]
        for s in idle:
            s.close()
        # only connections with a request begun hold their slots: 8 of them,
        # each from its own address (127.0.0.2..9, all loopback), and the
        # next client is answered 503
        busy = [socket.create_connection(("127.0.0.1", adv.port), timeout=10,
                                         source_address=("127.0.0.%d" % (2 + i), 0)) for i in range(8)]
        for s in busy:
            s.sendall(b"GET /hints HTTP/1.1\r\nX: y")
        resp = adv.raw(b"GET /hints HTTP/1.1\r\n\r\n")
        assert status_of(resp) == 503, resp
        for s in busy:
            s.close()
        wait_for(lambda: adv.raw(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200"),
                 "slots back after the busy connections closed")
        hh = health()["http"]
        assert hh["refused_busy"] >= 1 and hh["read_timeouts"] >= 1 and hh["bad_requests"] >= len(bad), hh

        check_metrics(adv)

        adv.p.send_signal(signal.SIGTERM)
        rc = adv.p.wait(timeout=20)
        assert rc == 0, (rc, adv.logtext())
        adv = None
        print("advisor e2e: ok")
    finally:
        if adv is not None and adv.p.poll() is None:
            adv.p.kill()
            adv.p.wait()
        nats.terminate()
        nats.wait()


def parse_page(text):
    """Prometheus text 0.0.4 -> ({(name, sorted labels): value}, {family: type}),
    checking that every sample's family was announced with HELP and TYPE first."""
    samples, types, helps = {}, {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helps.add(line.split(" ")[2])
            continue
        if line.startswith("# TYPE "):
            _, _, fam, typ = line.split(" ")
            assert fam in helps and fam not in types, line
            types[fam] = typ
            continue
        assert line and not line.startswith("#"), line
        if "{" in line:
            name, rest = line.split("{", 1)
            lab, value = rest.rsplit("} ", 1)
            labels = tuple(sorted((k, v.strip('"')) for k, v in
                                  (kv.split("=", 1) for kv in lab.split('",') if kv)))
            labels = tuple((k, v.rstrip('"')) for k, v in labels)
        else:
            name, value = line.split(" ")
            labels = ()
        base = name
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf) and name[: -len(suf)] in types:
                base = name[: -len(suf)]
        assert base in types, "sample before its TYPE: " + line
        key = (name, labels)
        assert key not in samples, "series twice: " + line
        samples[key] = float(value)
    return samples, types


def check_metrics(adv):
    """GET /metrics on the advisor's own port: every counter /health shows,
    each between the /health read before the scrape and the one after."""
    st, h0 = adv.get("/health")
    c = http.client.HTTPConnection("127.0.0.1", adv.port, timeout=20)
    c.request("GET", "/metrics")
    r = c.getresponse()
    text = r.read().decode()
    ctype = r.getheader("Content-Type")
    c.close()
    assert r.status == 200 and ctype.startswith("text/plain; version=0.0.4"), (r.status, ctype)
    st, h1 = adv.get("/health")
    m, types = parse_page(text)

    def between(name, labels, path):
        def at(h):
            for k in path:
                h = h[k]
            return h
        key = (name, tuple(sorted(labels.items())))
        assert key in m, ("missing", key)
        lo, hi = at(h0), at(h1)
        assert lo <= m[key] <= hi, (key, lo, m[key], hi)

    a = ["advisor"]
    between("kvbm_advisor_events_total", {"kind": "storage"}, a + ["storage_events"])
    between("kvbm_advisor_events_total", {"kind": "kv"}, a + ["kv_events"])
    between("kvbm_advisor_refused_total", {"reason": "volume"}, a + ["refused_volume"])
    between("kvbm_advisor_refused_total", {"reason": "source"}, a + ["refused_source"])
    for what, field in (("blocks", "forgotten_blocks"), ("held", "forgotten_held"),
                        ("prefixes", "forgotten_prefixes")):
        between("kvbm_advisor_forgotten_total", {"what": what}, a + [field])
    for kind in ("promote", "demote", "drop", "compact"):
        between("kvbm_advisor_hints_total", {"kind": kind}, a + ["hints", kind])
    for name, field in (("kvbm_advisor_kv_other_media_total", "kv_other_media"),
                        ("kvbm_advisor_uses_total", "uses"),
                        ("kvbm_advisor_onboard_uses_total", "onboard_uses"),
                        ("kvbm_advisor_lost_events_total", "lost_events"),
                        ("kvbm_advisor_source_restarts_total", "source_restarts"),
                        ("kvbm_advisor_unknown_removes_total", "unknown_removes")):
        between(name, {}, a + [field])
    between("kvbm_advisor_derivations_total", {}, ["derivations"])
    between("kvbm_advisor_hint_batches_published_total", {}, ["hints_published"])
    between("kvbm_advisor_hint_publish_errors_total", {}, ["hint_publish_errors"])
    assert m[("kvbm_advisor_index_max_entries", ())] == h1["advisor"]["max_blocks"] == 4096
    assert m[("kvbm_advisor_index_entries", ())] <= 4096
    assert h1["advisor"]["forgotten_blocks"] >= 30000 - 4096  # the flood's bound, seen on both
    for i, s in enumerate(h1["sources"]):
        lab = {"source": s["name"], "kind": s["kind"]}
        for f in ("batches", "events", "errors", "lost", "duplicates", "resets", "jumps",
                  "overflow") + (("replayed", "reconnects") if "replayed" in s else ()):
            between("kvbm_advisor_source_%s_total" % f, lab, ["sources", i, f])
    st, vols = adv.get("/volumes")
    for v in vols["volumes"]:
        lab = (("tier", v["tier"] or "none"), ("volume", v["name"]))
        assert m[("kvbm_advisor_volume_stores_total", lab)] <= v["stores"], v
        assert m[("kvbm_advisor_volume_high_water_blocks", lab)] <= v["high_water"], v
    # the server's own: the hostile requests above, by code, and the busy refusal
    hp = ["http"]
    codes = {k[1][0][1]: val for k, val in m.items() if k[0] == "kvbm_metrics_http_responses_total"}
    for code in ("400", "404", "405", "408", "413", "414", "431", "501", "503", "505"):
        assert codes.get(code, 0) >= 1, (code, codes)
    assert sum(val for k, val in codes.items() if int(k) >= 400) <= h1["http"]["bad_requests"]
    between("kvbm_metrics_http_connections_total", {"result": "refused"}, hp + ["refused_busy"])
    # the idle sockets above: closed for newcomers from their own address
    assert m[("kvbm_metrics_http_idle_closed_total", (("reason", "peer"),))] >= 1, m
    assert types["kvbm_advisor_volume_blocks"] == "gauge"
    doc = open(os.path.join(os.environ["KVBM_SOURCE_DIR"], "docs/areas/observability.md")).read()
    for fam in types:
        assert "| `%s` |" % fam in doc, fam + " is not in docs/areas/observability.md's table"
    assert types["kvbm_advisor_events_total"] == "counter"


def sn_next_skip(nc):
    """The storage subject's next number plus one: a gap of one batch."""
    seq = nc.seqs.get("kvbm.storage", 0) + 1
    nc.seqs["kvbm.storage"] = seq + 1
    return seq


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAIL:", e, file=sys.stderr)
        sys.exit(1)
