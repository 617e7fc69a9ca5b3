#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end test of `kvbm router`'s warm restart, JetStream sources,
DEGRADED workers and tenants' namespaces (run by test_warm.sh).

  namespaces  a block stored with a cache salt is found only by requests
              carrying that salt (escaped or not), never by others; a LoRA
              name is a namespace of its own; block_hashes take the salt too;
  degraded    a ZMQ worker whose gap cannot be filled (no replay socket, or
              one that no longer holds the batch) is DEGRADED in /health and
              in /route's answer; a request routed to it is recorded as
              approximate mode records it (the next identical request finds
              its blocks there); AllBlocksCleared or a restart ends it;
  zmq-warm    a router with --snapshot stopped mid-stream and started again
              loads its index and asks the engine's replay socket only for
              the batches after it, ending with the index the engine's
              events describe; a damaged snapshot file is refused;
  jetstream   (nats-server -js) two workers write to one stream (one straight,
              one through `kvbm events relay --jetstream`); router A
              (durable ra, snapshot every 0.5 s) and router B (durable rb)
              read it; A is stopped mid-trace, the workers go on, A starts
              again from its snapshot and reads on from the stream (no engine
              is asked to replay, and it applies fewer events than the whole
              stream holds); both routers then answer every prompt as the
              workers' events say, and their last snapshots are byte-equal.
"""
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zmq  # noqa: E402

from daemon_e2e import (KVBM, TIMEOUT, NatsWorker, Router, Worker,  # noqa: E402
                        dynamo_hashes, free_port, health, source, wait_for, warm_up)

BS = 4
BLOCKS = 6  # blocks per prompt
COMMON = ["--hash", "dynamo", "--block-size", str(BS), "--load-weight", "0"]


def page(router):
    """GET /metrics as {series: value} (series as written: name{labels})."""
    c = http.client.HTTPConnection("127.0.0.1", router.port, timeout=10)
    c.request("GET", "/metrics")
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    assert r.status == 200, (r.status, text)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def route(router, **body):
    st, r = router.request("POST", "/route", body)
    assert st == 200, (st, r)
    return r, {w["worker_id"]: w for w in r["workers"]}


def device(router, wid, **body):
    return route(router, **body)[1].get(wid, {}).get("device", 0)


class Model:
    """What the workers' events say: the hashes each worker holds."""

    def __init__(self):
        self.held = {}

    def prefix(self, wid, hashes):
        n = 0
        for h in hashes:
            if h not in self.held.get(wid, set()):
                break
            n += 1
        return n


def prompt_tokens(k):
    return [100000 + k * 1000 + i for i in range(BLOCKS * BS)]


def play(rng, workers, model, prompts, removes=True):
    """Each prompt's blocks stored on a random worker (one batch), and now
    and then an earlier prompt's tail removed from a worker holding it."""
    for k in prompts:
        w = rng.choice(workers)
        toks = prompt_tokens(k)
        h = dynamo_hashes(toks)
        w.publish([w.event("BlockStored", h, None, toks)])
        model.held.setdefault(w.wid, set()).update(h)
        if removes and k % 3 == 2:
            v = rng.choice(workers)
            old = dynamo_hashes(prompt_tokens(rng.choice(list(prompts)[: list(prompts).index(k) + 1])))
            tail = old[BLOCKS // 2:]
            if tail[0] in model.held.get(v.wid, set()):
                v.publish([v.event("BlockRemoved", tail)])
                model.held[v.wid] -= set(tail)


def matches(router, model, wids, prompts):
    for k in prompts:
        h = dynamo_hashes(prompt_tokens(k))
        _, ws = route(router, block_hashes=h)
        for wid in wids:
            got = ws.get(wid, {}).get("device", 0)
            if got != model.prefix(wid, h):
                return False
    return True


def test_namespaces(ctx):
    a = Worker(ctx, 5, "map")
    b = Worker(ctx, 6, "map")
    r = Router(["--zmq", "5=tcp://127.0.0.1:%d" % a.pub_port,
                "--zmq", "6=tcp://127.0.0.1:%d" % b.pub_port] + COMMON)
    try:
        warm_up(r, [a, b])
        toks = prompt_tokens(1)
        h = dynamo_hashes(toks)
        ev = a.event("BlockStored", h, None, toks)
        ev["cache_salt"] = "tenantA"  # SGLang's map form carries it
        a.publish([ev])
        b.publish([b.event("BlockStored", h, None, toks)])
        wait_for(lambda: health(r)["events"] >= 2, "both stores")
        assert device(r, 5, token_ids=toks, cache_salt="tenantA") == BLOCKS
        assert device(r, 6, token_ids=toks, cache_salt="tenantA") == 0
        assert device(r, 5, token_ids=toks) == 0
        assert device(r, 6, token_ids=toks) == BLOCKS
        assert device(r, 5, token_ids=toks, cache_salt="tenantB") == 0
        assert device(r, 5, token_ids=toks, lora_name="tenantA") == 0
        # the same salt, written with an escape, and null as no salt
        st, x = r.request("POST", "/route", b'{"token_ids": %s, "cache_salt": "\\u0074enantA"}'
                          % json.dumps(toks).encode())
        assert st == 200 and {w["worker_id"]: w["device"] for w in x["workers"]}[5] == BLOCKS, x
        assert device(r, 6, token_ids=toks, cache_salt=None) == BLOCKS
        # by engine hashes (Python's signed form for one of them)
        signed = [v - (1 << 64) if v >= 1 << 63 else v for v in h]
        assert device(r, 5, block_hashes=signed, cache_salt="tenantA") == BLOCKS
        assert device(r, 5, block_hashes=h) == 0
        # a removal without the salt (vLLM and SGLang send none) finds the block
        a.publish([a.event("BlockRemoved", h[3:])])
        wait_for(lambda: device(r, 5, token_ids=toks, cache_salt="tenantA") == 3, "the removal")
        st, x = r.request("POST", "/route", {"token_ids": toks, "cache_salt": 7})
        assert st == 400, x
        st, x = r.request("POST", "/route", b'{"token_ids": [1], "cache_salt": "\\ud800"}')
        assert st == 400, x
        assert r.stop() == 0
    finally:
        if r.p.poll() is None:
            r.p.kill()
    print("namespaces: ok")


def test_degraded(ctx):
    a = Worker(ctx, 3, "map")  # no replay socket given to the router
    b = Worker(ctx, 4, "map")  # a replay socket that lost what it is asked
    r = Router(["--zmq", "3=tcp://127.0.0.1:%d" % a.pub_port,
                "--zmq", "4=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (b.pub_port, b.rep_port),
                "--replay-timeout-ms", "3000"] + COMMON)
    try:
        warm_up(r, [a, b])
        assert health(r)["status"] == "ok"
        m = page(r)
        assert m['kvbm_router_source_degraded{worker_id="3"}'] == 0, m
        assert m["kvbm_router_degraded_workers"] == 0, m
        # an event the decoder does not know is skipped, the rest applied
        toks = prompt_tokens(2)
        h = dynamo_hashes(toks)
        b.publish([b.event("Ignored"), b.event("BlockRemoved", [12345]), b.event("Ignored")])
        wait_for(lambda: source(health(r), 4)["skipped_events"] == 2, "worker 4's skipped events",
                 [b])
        m = page(r)
        assert m['kvbm_router_source_skipped_events_total{worker_id="4"}'] == 2, m
        assert m['kvbm_router_source_skipped_events_total{worker_id="3"}'] == 0, m
        a.publish([a.event("BlockStored", h[:3], None, toks[:3 * BS])])
        a.publish([a.event("BlockRemoved", h[:1])], live=False)  # never arrives
        a.publish([])
        wait_for(lambda: 3 in health(r)["degraded_workers"], "worker 3 degraded")
        hl = health(r)
        assert hl["status"] == "degraded" and source(hl, 3)["degraded"] is True, hl
        assert source(hl, 4)["degraded"] is False and source(hl, 3)["lost"] >= 1, hl
        m = page(r)
        assert m['kvbm_router_source_degraded{worker_id="3"}'] == 1, m
        assert m['kvbm_router_source_degraded{worker_id="4"}'] == 0, m
        assert m["kvbm_router_degraded_workers"] == 1, m
        assert m['kvbm_router_source_lost_batches_total{worker_id="3"}'] == source(hl, 3)["lost"]
        # the index's size for worker 3: its three blocks, on the device
        g = 'kvbm_index_worker_blocks{dp_rank="0",tier="%s",worker_id="3"}'  # labels sorted
        assert m[g % "G1"] == 3 and m[g % "G2"] == 0, m
        # routed to it: marked, and recorded as approximate mode does
        x, ws = route(r, token_ids=toks)
        assert x["worker_id"] == 3 and x["approximate"] is True and ws[3].get("degraded"), x
        assert "degraded" not in ws[4], x
        assert ws[3]["device"] == 3, x
        x, ws = route(r, token_ids=toks)
        assert ws[3]["device"] == BLOCKS, ("the decision was not recorded", x)
        assert health(r)["degraded_routes"] == 2
        m = page(r)
        assert m["kvbm_router_degraded_routes_total"] == 2, m
        assert m["kvbm_router_approx_recorded_total"] == 2, m
        assert m["kvbm_router_approximate"] == 0, m
        # worker 4: the replay socket no longer holds the missing batch
        b.publish([b.event("BlockStored", h[:2], None, toks[:2 * BS])])
        s = b.publish([b.event("BlockStored", h[2:4], h[1], toks[2 * BS:4 * BS])], live=False)
        del b.sent[s]
        b.publish([])
        wait_for(lambda: 4 in health(r)["degraded_workers"], "worker 4 degraded", [b])
        assert b.replay_requests >= 1
        # a cleared cache makes worker 3 whole; a restart (numbers from 0) worker 4
        a.publish([a.event("AllBlocksCleared")])
        b.seq = 0
        b.sent.clear()
        b.publish([b.event("BlockStored", h[:1], None, toks[:BS])])
        wait_for(lambda: health(r)["degraded_workers"] == [], "both whole again", [b])
        hl = health(r)
        assert hl["status"] == "ok", hl
        m = page(r)
        assert m["kvbm_router_degraded_workers"] == 0, m
        assert m['kvbm_router_source_degraded{worker_id="4"}'] == 0, m
        x, ws = route(r, token_ids=prompt_tokens(9))
        assert x["approximate"] is False and "degraded" not in ws[3], x
        # The clear took the records' copies with the worker's blocks; the
        # worker now stores the routed prompt itself (as W5's republish
        # after a NATS restart did). Its index must list exactly that, and
        # keep it when the records go: a record that outlived the clear
        # once took the worker's own copy out of /index and of snapshots
        # (W5: a replica 32 blocks short, cluster.md).
        a.publish([a.event("BlockStored", h[:BLOCKS], None, toks)])
        wait_for(lambda: device(r, 3, token_ids=toks) == BLOCKS, "worker 3's own store")
        st, ix = r.request("GET", "/index?worker=3")
        assert st == 200 and sorted(ix["g1"]) == sorted(h[:BLOCKS]), (st, ix, h[:BLOCKS])
        m = page(r)
        assert m["kvbm_router_approx_records"] == 0 and m["kvbm_router_approx_blocks"] == 0, m
        assert r.stop() == 0
    finally:
        if r.p.poll() is None:
            r.p.kill()
    print("degraded: ok")


def test_zmq_warm(ctx, tmp):
    w = Worker(ctx, 7, "map")
    snap = os.path.join(tmp, "zmq.snap")
    args = ["--zmq", "7=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (w.pub_port, w.rep_port),
            "--snapshot", snap, "--snapshot-every", "0"] + COMMON
    rng = random.Random(7)
    model = Model()
    r = Router(args)
    try:
        warm_up(r, [w])
        play(rng, [w], model, range(0, 20))
        wait_for(lambda: matches(r, model, [7], range(0, 20)), "phase 1", [w])
        assert r.stop() == 0
        assert os.path.getsize(snap) > 0 and "last snapshot written" in r.logtext()
        play(rng, [w], model, range(20, 40))  # while the router is away: kept for replay
        before = w.replay_requests
        r = Router(args)
        wait_for(lambda: matches(r, model, [7], range(0, 40)), "phase 2 after the restart", [w])
        assert "blocks loaded" in r.logtext(), r.logtext()
        assert w.replay_requests > before
        hl = health(r)
        assert source(hl, 7)["lost"] == 0 and hl["degraded_workers"] == [], hl
        assert source(hl, 7)["replayed"] >= 1, hl
        assert r.stop() == 0
        # a damaged snapshot is refused (the router does not start on half an index)
        good = open(snap, "rb").read()
        for bad in (good[:-1], good[:40], good[:30] + bytes([good[30] ^ 1]) + good[31:], b"x" * 64):
            open(snap, "wb").write(bad)
            p = subprocess.run([KVBM, "router", "--listen", "127.0.0.1:0"] + args,
                               capture_output=True, timeout=TIMEOUT)
            assert p.returncode != 0 and b"snapshot" in p.stderr, p
        open(snap, "wb").write(good)
    finally:
        if r.p.poll() is None:
            r.p.kill()
    print("zmq-warm: ok")


def nats_request(port, subject, body):
    """One request over the raw NATS protocol (JetStream's API is requests):
    the reply's JSON."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.recv(4096)
    data = json.dumps(body).encode()
    s.sendall(b'CONNECT {"verbose":false}\r\nSUB _INBOX.t 1\r\nPUB %s _INBOX.t %d\r\n%s\r\n'
              % (subject.encode(), len(data), data))
    got = b""
    while True:
        at = got.find(b"MSG ")
        if at >= 0 and b"\r\n" in got[at:]:
            head, rest = got[at:].split(b"\r\n", 1)
            n = int(head.split()[-1])
            if len(rest) >= n:
                s.close()
                return json.loads(rest[:n])
        assert b"-ERR" not in got, got
        more = s.recv(65536)
        assert more, got
        got += more


def start_js(tmp):
    port = free_port()
    p = subprocess.Popen(["nats-server", "-js", "-sd", os.path.join(tmp, "js"), "-a", "127.0.0.1",
                          "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            assert p.poll() is None, "nats-server exited"
            assert time.time() - t0 < TIMEOUT, "nats-server did not start"
            time.sleep(0.05)


def test_jetstream(ctx, tmp):
    nats, port = start_js(tmp)
    relay = ra = rb = None
    try:
        made = nats_request(port, "$JS.API.STREAM.CREATE.KV",
                            {"name": "KV", "subjects": ["kv.>"], "storage": "file"})
        assert "error" not in made, made
        w1 = NatsWorker(ctx, 1, port, "kv.1")  # straight into the stream
        w2 = Worker(ctx, 2, "map")             # through kvbm's relay
        w2.relayed = True
        relay = subprocess.Popen([KVBM, "events", "relay", "tcp://127.0.0.1:%d" % w2.pub_port,
                                  "--jetstream", "nats://127.0.0.1:%d" % port, "--stream", "KV",
                                  "--subject", "kv.2", "--delay-us", "0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = "nats://127.0.0.1:%d/KV" % port
        srcs = ["--jetstream", "1=%s/kv.1" % url, "--jetstream", "2=%s/kv.2" % url] + COMMON
        snap_a, snap_b = os.path.join(tmp, "a.snap"), os.path.join(tmp, "b.snap")
        args_a = srcs + ["--durable", "ra", "--snapshot", snap_a, "--snapshot-every", "0.5"]
        args_b = srcs + ["--durable", "rb", "--snapshot", snap_b, "--snapshot-every", "0"]
        ra, rb = Router(args_a), Router(args_b)
        warm_up(ra, [w1, w2])  # the relay's subscription takes a moment
        rng = random.Random(11)
        model = Model()
        wids = [1, 2]
        play(rng, [w1, w2], model, range(0, 30))
        for r in (ra, rb):
            wait_for(lambda: matches(r, model, wids, range(0, 30)), "phase 1")
        time.sleep(1.2)  # a snapshot or two, acked
        events_a1 = health(ra)["events"]
        pos_a1 = {wid: source(health(ra), wid)["stream"]["position"] for wid in wids}
        assert ra.stop() == 0
        # started again with nothing new in the stream: /health gives the
        # position its snapshot holds at once, not 0 until a batch comes (a
        # restored router of a worker that sends nothing more looked as if
        # it had read nothing: the W5 cluster run's recovery probe waited)
        ra = Router(args_a)
        ha = health(ra)
        for wid in wids:
            assert source(ha, wid)["stream"]["position"] == pos_a1[wid] > 0, (ha, pos_a1)
        assert ra.stop() == 0
        # the workers go on while A is away
        play(rng, [w1, w2], model, range(30, 60))
        wait_for(lambda: matches(rb, model, wids, range(0, 60)), "B, phase 2")
        ra = Router(args_a)
        wait_for(lambda: matches(ra, model, wids, range(0, 60)), "A after its restart")
        log = ra.logtext()
        assert "blocks loaded" in log and "the snapshot's position" in log, log
        ha, hb = health(ra), health(rb)
        # A applied what came after its snapshot, not the whole stream again
        assert ha["events"] < hb["events"], (ha["events"], hb["events"], events_a1)
        for wid in wids:
            assert source(ha, wid)["replayed"] == 0 and source(ha, wid)["lost"] == 0, ha
            assert source(ha, wid)["stream"]["position"] == source(hb, wid)["stream"]["position"]
        assert w1.replay_requests == 0 and w2.replay_requests == 0
        # more after the restart: both follow
        play(rng, [w1, w2], model, range(60, 70))
        for r in (ra, rb):
            wait_for(lambda: matches(r, model, wids, range(0, 70)), "phase 3")
        time.sleep(0.3)
        # the stream's counters and the snapshots on A's page, as /health says
        # (A started again moments ago: its first snapshot and acks come)
        wait_for(lambda: page(ra)['kvbm_router_snapshots_total{result="ok"}'] >= 1 and all(
            page(ra)['kvbm_router_source_stream_acks_total{worker_id="%d"}' % w] >= 1
            for w in wids), "A's snapshot and acks on its page")
        ha, m = health(ra), page(ra)
        assert m['kvbm_router_snapshots_total{result="ok"}'] >= ha["snapshots"] >= 1, ha
        assert m['kvbm_router_snapshots_total{result="failed"}'] == ha["snapshot_failures"] == 0
        for wid in wids:
            st = source(ha, wid)["stream"]
            j = '{worker_id="%d"}' % wid
            pos = m["kvbm_router_source_stream_position" + j]
            assert pos == st["position"] > 0, (pos, st)
            for k in ("redelivered", "acks", "rebinds", "malformed"):
                v = m["kvbm_router_source_stream_%s_total%s" % (k, j)]
                assert v >= st[k], (k, v, st)
            assert m["kvbm_router_source_stream_rebinds_total" + j] == 1  # at its restart
            assert m["kvbm_router_source_messages_total" + j] >= 1, m  # since its restart
        hb, mb = health(rb), page(rb)
        assert mb['kvbm_router_snapshots_total{result="ok"}'] == hb["snapshots"] == 0, hb
        assert ra.stop() == 0 and rb.stop() == 0
        a, b = open(snap_a, "rb").read(), open(snap_b, "rb").read()
        print("jetstream: A applied %d events after its restart, B %d; positions %s; "
              "snapshots of %d bytes; A's log:\n%s" % (
                  ha["events"], hb["events"],
                  [source(ha, wid)["stream"] for wid in wids], len(a),
                  "\n".join(l for l in ra.logtext().splitlines() if "snapshot" in l or "JetStream" in l)))
        assert a == b, "the two routers' snapshots differ (%d, %d bytes)" % (len(a), len(b))
        # the durable consumers stay on the server, acked up to a snapshot
        info = nats_request(port, "$JS.API.CONSUMER.INFO.KV.ra-1", {})
        assert info["ack_floor"]["stream_seq"] > 0, info
    finally:
        for p in (relay, ra and ra.p, rb and rb.p, nats):
            if p and p.poll() is None:
                p.kill()
    print("jetstream: ok")


def main():
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        test_namespaces(ctx)
        test_degraded(ctx)
        test_zmq_warm(ctx, tmp)
        if os.environ.get("NATS") == "1":
            test_jetstream(ctx, tmp)
        else:
            print("jetstream: skipped (no nats-server)")


if __name__ == "__main__":
    main()
