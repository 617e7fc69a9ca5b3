#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end test of `kvbm router`'s event sources against hostile or
unlucky workers (run by test_sources.sh). Each check is a finding of the
hardening issue; the fake workers are daemon_e2e.py's (vLLM's wire over ZMQ,
kvbm's NATS payload with a Kvbm-Seq header).

  restart      a worker that restarts (numbers from 0 again) is heard at
               once: its new blocks are routed to, its old ones forgotten,
               and /health counts the reset;
  stray        one batch numbered 2^63 (ZMQ frame, NATS header) does not
               blind the router to the worker: later batches still apply;
  ranks        one worker sending dp ranks 0..99 fills at most --max-ranks
               worker slots, the rest is refused and counted, and another
               worker still gets in;
  replay       a NATS source's replay server answering outside the range
               asked for is ignored; one that trickles replies holds the
               live stream back no longer than --replay-timeout-ms (5 s
               here, long enough for a loaded machine to answer a replay);
  timeout      with --worker-timeout, a worker that went silent and then
               restarted comes back with its new blocks;
  outage       a NATS outage under a relay: every batch the relay published
               is either received by the router or counted lost in
               /health, and the relay's summary counts its failed sends.
"""
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import msgpack  # noqa: E402
import zmq  # noqa: E402

from daemon_e2e import (KVBM, TIMEOUT, NatsWorker, Router, Worker,  # noqa: E402
                        dynamo_hashes, free_port, health, source, wait_for)

BS = 4
BIG = 1 << 63


def publish_at(w, seq, events, dp_rank=None):
    """Publishes one batch with an explicit number (unsigned, any size)."""
    payload = msgpack.packb([time.time(), events, w.dp_rank if dp_rank is None else dp_rank])
    if isinstance(w, NatsWorker):
        hdr = b"NATS/1.0\r\nKvbm-Seq: %d\r\n\r\n" % seq
        w.sock.sendall(b"HPUB %s %d %d\r\n" % (w.subject, len(hdr), len(hdr) + len(payload))
                       + hdr + payload + b"\r\n")
    else:
        w.pub.send_multipart([b"", struct.pack(">Q", seq), payload])


def stored(w, tokens):
    h = dynamo_hashes(tokens)
    return w.event("BlockStored", h, None, tokens), h


def overlap(router, hashes, key):
    st, r = router.request("POST", "/route", {"block_hashes": hashes})
    if st != 200:
        return None
    for x in r["workers"]:
        if (x["worker_id"], x["dp_rank"]) == key:
            return x["device"]
    return None


def warm_up(router, workers):
    t0 = time.time()
    while not all(source(health(router), w.wid)["batches"] > 0 for w in workers):
        for w in workers:
            w.publish([])
            w.serve_replay()
        assert time.time() - t0 < TIMEOUT, "router never saw the workers: " + router.logtext()
        time.sleep(0.05)


def start_nats(port=None):
    port = port or free_port()
    p = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            assert p.poll() is None, "nats-server exited (port %d taken?)" % port
            assert time.time() - t0 < TIMEOUT, "nats-server did not start"
            time.sleep(0.05)


class ReplayServer(threading.Thread):
    """A replay ROUTER on its own thread: `answer(start)` gives the replies
    (seq, payload) to send, then the end marker; with trickle=True it sends
    an empty batch for start, start+1, ... every 0.3 s and never ends."""

    def __init__(self, ctx, answer=None, trickle=False):
        super().__init__(daemon=True)
        self.sock = ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.answer, self.trickle = answer, trickle
        self.stop = threading.Event()
        self.requests = 0

    def run(self):
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            ident, _, start = self.sock.recv_multipart()
            self.requests += 1
            (first,) = struct.unpack(">Q", start)
            if self.trickle:
                k = first
                while not self.stop.wait(0.3):
                    self.sock.send_multipart([ident, b"", struct.pack(">Q", k),
                                              msgpack.packb([time.time(), [], 0])])
                    k += 1
                return
            for seq, payload in self.answer(first):
                self.sock.send_multipart([ident, b"", struct.pack(">Q", seq), payload])
            self.sock.send_multipart([ident, b"", b"\xff" * 8, b""])


class Hostile:
    """One router with four ZMQ workers (1: restart, 2: stray number, 3: a
    rank flood, 4: its victim) and, with NATS, three NATS workers (10: a
    stray Kvbm-Seq, 11: a replay server answering out of range, 12: one
    that trickles). Each check_* uses its own workers."""

    def __init__(self, use_nats):
        self.use_nats = use_nats
        ctx = zmq.Context()
        self.w = {i: Worker(ctx, i, "positional") for i in (1, 2, 3, 4)}
        args = ["--hash", "dynamo", "--block-size", str(BS), "--load-weight", "0",
                "--max-ranks", "8", "--replay-timeout-ms", "5000"]
        for w in self.w.values():
            args += ["--zmq", "%d=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (w.wid, w.pub_port, w.rep_port)]
        self.nats = None
        self.servers = []
        self.payloads = {}
        if use_nats:
            self.nats, port = start_nats()
            for i in (10, 11, 12):
                self.w[i] = NatsWorker(ctx, i, port, "kv.w%d" % i)
            payloads = self.payloads

            def answer11(first):  # 2^63, the one missing batch, one beyond the range
                return [(BIG, payloads["stray"]), (first, payloads["missing"]),
                        (first + 5, payloads["stray"])]

            for i, rs in ((11, ReplayServer(ctx, answer=answer11)), (12, ReplayServer(ctx, trickle=True))):
                self.w[i].rep.close()
                self.w[i].rep_port = rs.port
                self.w[i].serve_replay = lambda: None
                rs.start()
                self.servers.append(rs)
            for i in (10, 11, 12):
                args += ["--nats", "%d=nats://127.0.0.1:%d/kv.w%d@tcp://127.0.0.1:%d"
                         % (i, port, i, self.w[i].rep_port)]
        self.router = Router(args)
        warm_up(self.router, list(self.w.values()))

    def close(self, ok):
        if ok:
            assert self.router.stop() == 0, self.router.logtext()
        else:
            sys.stderr.write("router log:\n" + self.router.logtext())
            self.router.p.kill()
        for rs in self.servers:
            rs.stop.set()
        if self.nats:
            self.nats.kill()

    def check_restart(self):
        """worker 1 stores T1 by seq ~50, restarts, stores T2 at seq 0"""
        router, w1 = self.router, self.w[1]
        ev, h1 = stored(w1, list(range(100, 116)))
        w1.publish([ev])
        for _ in range(50):
            w1.publish([])
        wait_for(lambda: overlap(router, h1, (1, 0)) == 4, "worker 1's first blocks")
        w1.seq = 0  # the engine restarted
        w1.sent.clear()
        ev, h2 = stored(w1, list(range(200, 212)))
        w1.publish([ev])
        wait_for(lambda: overlap(router, h2, (1, 0)) == 3, "worker 1's blocks after its restart")
        assert overlap(router, h1, (1, 0)) == 0, "a restarted worker's old blocks are forgotten"
        s1 = source(health(router), 1)
        assert s1["resets"] == 1 and s1["lost"] == 0, s1

    def check_stray(self):
        """worker 2 sends one batch numbered 2^63, then goes on"""
        router, w2 = self.router, self.w[2]
        ev_a, ha = stored(w2, list(range(300, 308)))
        ev_b, hb = stored(w2, list(range(400, 408)))
        publish_at(w2, BIG, [ev_a])
        w2.publish([ev_b])
        wait_for(lambda: overlap(router, hb, (2, 0)) == 2, "worker 2's batch after a stray 2^63")
        assert overlap(router, ha, (2, 0)) == 0
        s2 = source(health(router), 2)
        assert s2["jumps"] == 1 and s2["resets"] == 0 and s2["lost"] == 0, s2

    def check_ranks(self):
        """worker 3 sends dp ranks 0..99; a rank of worker 4 that comes
        afterwards still gets a slot (the old index had none left)"""
        router, w3, w4 = self.router, self.w[3], self.w[4]
        ev_r, hr = stored(w3, list(range(500, 504)))
        for rank in range(100):
            w3.dp_rank = rank
            w3.publish([ev_r])
        wait_for(lambda: source(health(router), 3)["batches"] >= 101, "worker 3's 100 ranks")
        w4.dp_rank = 1
        ev_c, hc = stored(w4, list(range(600, 608)))
        w4.publish([ev_c])
        wait_for(lambda: overlap(router, hc, (4, 1)) == 2, "worker 4 in the index after a rank flood")
        wait_for(lambda: source(health(router), 3)["ranks_refused"] >= 92, "worker 3's 100 ranks")
        st, r = router.request("POST", "/route", {"block_hashes": hr})
        ranks = sorted(x["dp_rank"] for x in r["workers"] if x["worker_id"] == 3)
        assert ranks == list(range(8)), ranks
        s3 = source(health(router), 3)
        assert s3["ranks_refused"] == 92 and s3["errors"] == 0, s3

    def check_nats_stray(self):
        """a Kvbm-Seq header of 2^63"""
        router, n10 = self.router, self.w[10]
        ev_a, ha = stored(n10, list(range(700, 708)))
        ev_b, hb = stored(n10, list(range(800, 808)))
        publish_at(n10, BIG, [ev_a])
        n10.publish([ev_b])
        wait_for(lambda: overlap(router, hb, (10, 0)) == 2, "worker 10's batch after Kvbm-Seq 2^63")
        assert overlap(router, ha, (10, 0)) == 0
        assert source(health(router), 10)["jumps"] == 1

    def check_nats_replay_range(self):
        """a replay answered outside the range: only the missing batch is taken"""
        router, n11 = self.router, self.w[11]
        t = list(range(900, 912))
        h = dynamo_hashes(t)
        self.payloads["missing"] = msgpack.packb(
            [time.time(), [n11.event("BlockStored", h[1:2], h[0], t[4:8])], 0])
        ev_y, hy = stored(n11, list(range(950, 958)))
        self.payloads["stray"] = msgpack.packb([time.time(), [ev_y], 0])
        n11.publish([n11.event("BlockStored", h[:1], None, t[:4])])
        n11.publish([], live=False)  # missing: replayed from the server
        n11.publish([n11.event("BlockStored", h[2:3], h[1], t[8:12])])
        wait_for(lambda: overlap(router, h, (11, 0)) == 3, "worker 11's chain with the replayed batch")
        assert overlap(router, hy, (11, 0)) == 0, "a reply outside the range was applied"
        wait_for(lambda: source(health(router), 11)["replay_refused"] == 2, "refused replies counted")
        s11 = source(health(router), 11)
        assert s11["lost"] == 0 and s11["replayed"] == 1, s11

    def check_nats_trickle(self):
        """a trickling replay server: the live batch waits for the replay
        deadline (5 s), not for the 300 s the trickle would take"""
        router, n12 = self.router, self.w[12]
        n12.seq += 1000  # a gap of 1000 batches, trickled one every 0.3 s
        ev_q, hq = stored(n12, list(range(1000, 1008)))
        n12.publish([ev_q])
        wait_for(lambda: overlap(router, hq, (12, 0)) == 2, "worker 12's live batch behind a trickling replay")
        s12 = source(health(router), 12)
        assert s12["replay_failures"] == 1 and s12["replayed"] + s12["lost"] == 1000, s12

    def checks(self):
        out = [self.check_restart, self.check_stray, self.check_ranks]
        if self.use_nats:
            out += [self.check_nats_stray, self.check_nats_replay_range, self.check_nats_trickle]
        return out


def hostile(use_nats):
    h = Hostile(use_nats)
    ok = False
    try:
        for check in h.checks():
            check()
        ok = True
    finally:
        h.close(ok)


def worker_timeout():
    """--worker-timeout 1: a silent worker is dropped; it restarts and comes
    back with its new blocks (the old rule ignored it until its numbers
    passed the old ones)."""
    ctx = zmq.Context()
    w = Worker(ctx, 20, "positional")
    router = Router(["--zmq", "20=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (w.pub_port, w.rep_port),
                     "--hash", "dynamo", "--block-size", str(BS), "--worker-timeout", "1"])
    try:
        warm_up(router, [w])
        ev, h1 = stored(w, list(range(100, 116)))
        w.publish([ev])
        for _ in range(20):
            w.publish([])
        wait_for(lambda: overlap(router, h1, (20, 0)) == 4, "worker 20's blocks")
        wait_for(lambda: source(health(router), 20)["dropped"], "worker 20 dropped for silence")
        w.seq = 0
        w.sent.clear()
        ev, h2 = stored(w, list(range(200, 212)))
        w.publish([ev])
        wait_for(lambda: overlap(router, h2, (20, 0)) == 3, "worker 20 back after its restart")
        assert router.stop() == 0
    except Exception:
        sys.stderr.write("router log:\n" + router.logtext())
        router.p.kill()
        raise


def big_events(w, n, base):
    """n BlockStored events of 256 blocks each (~7 KB apiece)."""
    out = []
    for i in range(n):
        toks = [base + i * 1024 + k + 100000 for k in range(1024)]
        out.append(w.event("BlockStored", dynamo_hashes(toks), None, toks))
    return out


def outage(tmpdir):
    """A NATS outage between `kvbm events relay` and the router."""
    ctx = zmq.Context()
    eng = Worker(ctx, 30, "positional")
    eng.pub.setsockopt(zmq.SNDHWM, 0)  # nothing is lost before the relay
    nats, port = start_nats()
    router = Router(["--nats", "30=nats://127.0.0.1:%d/kv.w30" % port, "--hash", "dynamo",
                     "--block-size", str(BS)])
    relay_err = os.path.join(tmpdir, "relay.err")
    relay = subprocess.Popen([KVBM, "events", "relay", "tcp://127.0.0.1:%d" % eng.pub_port,
                              "--replay", "tcp://127.0.0.1:%d" % eng.rep_port,
                              "--nats", "nats://127.0.0.1:%d" % port, "--subject", "kv.w30",
                              "--delay-us", "0"],
                             stdout=subprocess.DEVNULL, stderr=open(relay_err, "w"))
    try:
        eng.relayed = True
        warm_up(router, [eng])
        nats.kill()
        nats.wait()
        # ~30 MB while the server is down: more than libnats' 8 MiB buffer
        ev = big_events(eng, 10, 0)
        for _ in range(400):
            eng.publish(ev)
        # a malformed batch: the relay reports it when it gets there, so by
        # then it has tried to publish everything before it
        with eng.lock:
            eng.pub.send_multipart([b"", struct.pack(">q", eng.seq), b"\xc1"])
            eng.seq += 1
        wait_for(lambda: "skipped" in open(relay_err).read(), "the relay to reach the marker", [eng])
        nats, _ = start_nats(port)
        before = source(health(router), 30)["batches"]

        def after():
            eng.publish([])
            return source(health(router), 30)["batches"] > before
        wait_for(after, "batches through NATS after the outage", [eng])
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=30) == 0
        text = open(relay_err).read()
        line = [x for x in text.splitlines() if "published" in x]
        assert line, text
        words = line[0].split()
        published = int(words[words.index("published") + 1])
        failed = int(words[words.index("failed") - 1])
        assert failed > 0, text  # the relay counts what it could not send
        s = wait_for(lambda: (lambda x: x if x["batches"] + x["lost"] >= published else None)(
            source(health(router), 30)), "every batch received or counted lost")
        assert s["batches"] + s["lost"] == published, (s, published)
        assert s["lost"] >= failed, (s, failed)
        print("outage: relay published %d batches, %d failed sends; router got %d, counted %d lost"
              % (published, failed, s["batches"], s["lost"]))
        assert router.stop() == 0
    except Exception:
        sys.stderr.write("router log:\n" + router.logtext())
        sys.stderr.write("relay:\n" + open(relay_err).read())
        router.p.kill()
        raise
    finally:
        relay.kill()
        nats.kill()


def main():
    use_nats = os.environ.get("NATS") == "1"
    hostile(use_nats)
    worker_timeout()
    if use_nats:
        import tempfile
        outage(tempfile.mkdtemp())
    print("ok")


if __name__ == "__main__":
    main()
