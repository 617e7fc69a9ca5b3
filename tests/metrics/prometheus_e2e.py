#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Proof with the real thing (run by test_prometheus.sh).

Starts two kvbm processes and Debian's `prometheus` server on loopback,
with a scrape config pointing at both:

  * `kvbm replay` with tiers (G1, G2, G3 on a disk:// slot file in the
    test's directory), `--metrics-port 0 --hold`: the endpoint is the
    library's own (the manager serves it, kvbm_manager_config.metrics),
    and the replay prints its JSON summary and keeps serving;
  * `kvbm router` fed by a fake vLLM engine over ZMQ (vLLM's wire format)
    that holds one batch back from the live stream and serves it on its
    replay socket, so the router sees a gap and a replay; the test routes
    requests and sends a few bad ones.

It waits until Prometheus has scraped each target at least twice, then
asks Prometheus' HTTP API (/api/v1/query) for the expected series and
checks that their values agree with what each process reports in its own
JSON (the replay's summary; the router's GET /health). Each page is also
run through `promtool check metrics` (no parse error; lint remarks only
for Dynamo's names, kept for compatibility).
"""
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import msgpack
import zmq

KVBM = os.environ["KVBM_BIN"]
SRC = os.environ["KVBM_SOURCE_DIR"]
DOC = os.path.join(SRC, "docs", "areas", "observability.md")
DASH = os.path.join(SRC, "docs", "grafana", "kvbm.json")
TIMEOUT = 60.0
BS = 4
DYNAMO_NAMES = ("dynamo_", "kvbm_offload_blocks_", "kvbm_onboard_blocks_", "kvbm_matched_tokens",
                "kvbm_host_cache_hit_rate", "kvbm_disk_cache_hit_rate", "kvbm_object_cache_hit_rate",
                "kvbm_offload_bytes_object", "kvbm_onboard_bytes_object")

procs = []
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_file(path, proc, what):
    t0 = time.time()
    while not (os.path.exists(path) and open(path).read().strip()):
        if proc.poll() is not None:
            raise SystemExit("%s exited early (rc %s)" % (what, proc.returncode))
        if time.time() - t0 > TIMEOUT:
            raise SystemExit("%s did not start" % what)
        time.sleep(0.05)
    return open(path).read().strip()


def get(url, data=None):
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Engine:
    """A fake vLLM engine: PUB + replay ROUTER (vLLM's wire format)."""

    def __init__(self, ctx):
        self.pub = ctx.socket(zmq.PUB)
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.rep = ctx.socket(zmq.ROUTER)
        self.rep_port = self.rep.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0
        self.sent = {}
        self.events = 0

    def publish(self, events, live=True):
        payload = msgpack.packb([time.time(), events, 0])
        self.sent[self.seq] = payload
        if live:
            self.pub.send_multipart([b"", struct.pack(">q", self.seq), payload])
        self.seq += 1
        self.events += len(events)

    def serve_replay(self):
        while self.rep.poll(0):
            frames = self.rep.recv_multipart()
            ident, start = frames[0], frames[-1]
            (first,) = struct.unpack(">q", start)
            for s in sorted(self.sent):
                if s >= first:
                    self.rep.send_multipart([ident, b"", struct.pack(">q", s), self.sent[s]])
            self.rep.send_multipart([ident, b"", struct.pack(">q", -1), b""])


def stored(hashes, parent, first_token):
    toks = list(range(first_token, first_token + BS * len(hashes)))
    return ["BlockStored", hashes, parent, toks, BS, None, "GPU"]


def start_router(tmp, engine):
    pf = os.path.join(tmp, "router.port")
    log = open(os.path.join(tmp, "router.log"), "w")
    p = subprocess.Popen([KVBM, "router", "--listen", "127.0.0.1:0", "--port-file", pf,
                          "--block-size", str(BS), "--zmq",
                          "7=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (engine.pub_port, engine.rep_port)],
                         stderr=log)
    procs.append(p)
    return p, int(wait_file(pf, p, "router"))


def start_relay(tmp, engine):
    """kvbm events relay from the engine to a ZMQ endpoint of its own,
    serving its counters."""
    pf = os.path.join(tmp, "relay.port")
    err = open(os.path.join(tmp, "relay.err"), "w+")
    p = subprocess.Popen([KVBM, "events", "relay", "tcp://127.0.0.1:%d" % engine.pub_port,
                          "--replay", "tcp://127.0.0.1:%d" % engine.rep_port,
                          "--zmq", "tcp://127.0.0.1:*", "--metrics-port", "0",
                          "--metrics-host", "127.0.0.1", "--metrics-port-file", pf],
                         stdout=subprocess.DEVNULL, stderr=err)
    procs.append(p)
    return p, int(wait_file(pf, p, "relay")), err


def page_value(port, series):
    page = get("http://127.0.0.1:%d/metrics" % port)[1].decode()
    m = re.search(r"^%s (\S+)$" % re.escape(series), page, re.M)
    return float(m.group(1)) if m else None


def drive_router(engine, port, relay_port):
    """Events with a gap filled by replay, routes, bad requests. Returns
    the number of routes answered 200 and of bad requests sent."""
    base = "http://127.0.0.1:%d" % port
    # the subscriptions need a moment: publish until the router and the
    # relay have a batch
    t0 = time.time()
    while True:
        engine.publish([stored([1000 + engine.seq], None, 1)])
        time.sleep(0.1)
        h = json.loads(get(base + "/health")[1])
        if h["events"] > 0 and (page_value(relay_port, "kvbm_subscriber_batches_total") or 0) > 0:
            base_batches = h["sources"][0]["batches"]
            break
        if time.time() - t0 > TIMEOUT:
            raise SystemExit("router or relay never took an event")
    chain = [11, 12, 13, 14, 15, 16]
    engine.publish([stored(chain[:2], None, 100)])
    engine.publish([stored(chain[2:4], chain[1], 108)], live=False)  # held back: a gap
    engine.publish([stored(chain[4:], chain[3], 116), ["BlockRemoved", [999999], "GPU"]])
    # Dynamo's "Ignored": skipped by the decoder and counted, the rest applied
    engine.publish([["BlockRemoved", chain[5:], "GPU"], ["Ignored"]])
    t0 = time.time()
    while True:
        engine.serve_replay()
        h = json.loads(get(base + "/health")[1])
        src = h["sources"][0]
        # the four batches above, the held-back one through replay (earlier
        # ones may have gone before the subscription took: ZMQ's slow joiner)
        if (src["batches"] >= base_batches + 4 and src["replayed"] >= 1 and
                (page_value(relay_port, "kvbm_subscriber_replayed_batches_total") or 0) >= 1):
            break
        if time.time() - t0 > TIMEOUT:
            raise SystemExit("router did not catch up: %r" % h)
        time.sleep(0.05)
    routes = 0
    for k in range(12):
        st, body = get(base + "/route", json.dumps({"block_hashes": chain[: 1 + k % 6]}).encode())
        check(st == 200, "route %d answered %d %r" % (k, st, body))
        routes += st == 200
    bad = 0
    for path, data in (("/route", b"{not json"), ("/route", b'{"token_ids": "x"}'), ("/nope", None)):
        st, _ = get(base + path, data)
        check(st >= 400, "bad request %s answered %d" % (path, st))
        bad += 1
    return routes, bad


def start_replay(tmp, name, args):
    pf = os.path.join(tmp, name + ".port")
    out = open(os.path.join(tmp, name + ".json"), "w")
    err = open(os.path.join(tmp, name + ".err"), "w")
    p = subprocess.Popen([KVBM, "replay"] + args +
                         ["--json", "--no-progress", "--metrics-port", "0", "--metrics-host",
                          "127.0.0.1", "--metrics-port-file", pf, "--hold"],
                         stdout=out, stderr=err)
    procs.append(p)
    port = int(wait_file(pf, p, name))
    summary = wait_file(os.path.join(tmp, name + ".json"), p, name + "'s summary")
    return p, port, json.loads(summary)


def start_prometheus(tmp, targets):
    port = free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n")
        for job, tport in targets.items():
            f.write("  - job_name: %s\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n"
                    % (job, tport))
    log = open(os.path.join(tmp, "prometheus.log"), "w")
    p = subprocess.Popen(["prometheus", "--config.file=" + cfg,
                          "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                          "--web.listen-address=127.0.0.1:%d" % port],
                         stdout=log, stderr=log)
    procs.append(p)
    t0 = time.time()
    while True:
        try:
            if get("http://127.0.0.1:%d/-/ready" % port)[0] == 200:
                return p, port
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if p.poll() is not None or time.time() - t0 > TIMEOUT:
            raise SystemExit("prometheus did not start (see %s)" % log.name)
        time.sleep(0.2)


class Prom:
    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def query(self, q):
        st, body = get(self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        r = json.loads(body)
        if st != 200 or r.get("status") != "success":
            raise SystemExit("query %s: %s" % (q, body))
        return r["data"]["result"]

    def value(self, q):
        """The single value of an instant query, or None when it has none."""
        res = self.query(q)
        if len(res) != 1:
            return None
        return float(res[0]["value"][1])

    def wait_scrapes(self, job, n):
        t0 = time.time()
        while True:
            v = self.value('sum(count_over_time(up{job="%s"}[10m]))' % job)
            up = self.value('up{job="%s"}' % job)
            if v is not None and v >= n and up == 1:
                return
            if time.time() - t0 > TIMEOUT:
                raise SystemExit("prometheus did not scrape %s %d times (up=%r, count=%r)"
                                 % (job, n, up, v))
            time.sleep(0.25)


def agree(prom, q, want, what, tol=0.0):
    got = prom.value(q)
    ok = got is not None and abs(got - float(want)) <= tol
    check(ok, "%s: prometheus %s = %r, the process says %r" % (what, q, got, want))


def promtool(page, what):
    r = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True)
    text = (r.stdout + r.stderr).decode()
    check(r.returncode in (0, 3), "promtool on %s: rc %d: %s" % (what, r.returncode, text))
    for line in text.splitlines():
        name = line.split(" ", 1)[0]
        check(name.startswith(DYNAMO_NAMES),
              "promtool on %s: a remark about one of ours: %s" % (what, line))


def main():
    tmp = tempfile.mkdtemp(prefix="kvbm-prom-")
    ctx = zmq.Context()
    done = False
    try:
        engine = Engine(ctx)
        router, rport = start_router(tmp, engine)
        relay, lport, relay_err = start_relay(tmp, engine)
        routes, bad = drive_router(engine, rport, lport)
        # G1, G2 and the disk; then G1, G2 and a file:// G4 with bigger blocks
        # (fewer files)
        replay, mport, summary = start_replay(tmp, "replay", [
            "--limit", "1500", "--capacity", "8192", "--g2-blocks", "65536", "--g3-blocks",
            "16384", "--g3-dir", tmp, "--g3-policy", "frequency"])
        os.mkdir(os.path.join(tmp, "g4"))
        replay4, m4port, summary4 = start_replay(tmp, "replay4", [
            "--limit", "300", "--block-size", "256", "--capacity", "1024", "--g2-blocks", "512",
            "--g4", "file://" + os.path.join(tmp, "g4")])
        prom_p, pport = start_prometheus(tmp, {"kvbm_replay": mport, "kvbm_replay_g4": m4port,
                                               "kvbm_router": rport, "kvbm_relay": lport})
        prom = Prom(pport)
        for job in ("kvbm_replay", "kvbm_replay_g4", "kvbm_router", "kvbm_relay"):
            prom.wait_scrapes(job, 2)

        # ---- the replay: the library's counters against the replay's summary
        s, t = summary, summary["tiers"]
        j = '{job="kvbm_replay"}'
        agree(prom, "kvbm_replay_finished" + j, 1, "replay finished")
        agree(prom, "kvbm_prefill_requests_total" + j, s["requests"], "requests")
        agree(prom, "kvbm_requested_tokens_total" + j, s["prompt_tokens"], "requested tokens")
        agree(prom, "kvbm_replay_prompt_tokens_total" + j, s["prompt_tokens"], "replay prompt tokens")
        agree(prom, "kvbm_matched_tokens" + j, s["hit_tokens"], "matched tokens (no verify failures)")
        agree(prom, 'sum(kvbm_hit_tokens_total{job="kvbm_replay"})', s["hit_tokens"], "hit tokens")
        agree(prom, 'sum(kvbm_hit_tokens_total{job="kvbm_replay"}) / '
                    'sum(kvbm_requested_tokens_total{job="kvbm_replay"})', s["hit_rate"], "hit rate",
              tol=5e-7)
        for k, tier in (("g1", "G1"), ("g2", "G2"), ("g3", "G3")):
            jt = '{job="kvbm_replay",tier="%s"}' % tier
            agree(prom, "kvbm_hit_tokens_total" + jt, t[k]["hit_tokens"], tier + " hit tokens")
            agree(prom, "kvbm_replay_tier_hit_tokens_total" + jt, t[k]["hit_tokens"],
                  tier + " replay hit tokens")
            agree(prom, "kvbm_tier_evictions_total" + jt, t[k]["evictions"], tier + " evictions")
            if tier == "G1":
                continue
            agree(prom, "kvbm_offload_blocks_total" + jt, t[k]["offloaded_blocks"], tier + " offloads")
            agree(prom, "kvbm_offload_bytes_total" + jt, t[k]["offloaded_bytes"], tier + " offload bytes")
            agree(prom, "kvbm_onboard_blocks_total" + jt, t[k]["onboarded_blocks"], tier + " onboards")
            agree(prom, "kvbm_onboard_bytes_total" + jt, t[k]["onboarded_bytes"], tier + " onboard bytes")
            agree(prom, 'sum(kvbm_offload_skipped_total{job="kvbm_replay",tier="%s"})' % tier,
                  t[k]["skipped_offloads"], tier + " skipped offloads")
            agree(prom, 'kvbm_verify_failures_total{job="kvbm_replay",tier="%s",cause="checksum"}' % tier,
                  t[k]["checksum_failures"], tier + " checksum failures")
            agree(prom, "kvbm_copy_busy_seconds_total" + jt, t[k]["copy_seconds"], tier + " copy time",
                  tol=1e-6)
        agree(prom, "kvbm_offload_blocks_d2h" + j, t["g2"]["offloaded_blocks"], "Dynamo's d2h")
        agree(prom, "kvbm_onboard_blocks_h2d" + j, t["g2"]["onboarded_blocks"], "Dynamo's onboard h2d")
        agree(prom, "kvbm_onboard_blocks_d2d" + j, t["g3"]["onboarded_blocks"], "Dynamo's onboard d2d")
        agree(prom, 'kvbm_offload_blocks_h2d{job="kvbm_replay"} + kvbm_offload_blocks_d2d{job="kvbm_replay"}',
              t["g3"]["offloaded_blocks"], "Dynamo's h2d + d2d")
        # every G3 read is in one transfer (a store batch) of the histograms
        agree(prom, 'kvbm_copy_transfer_bytes_sum{job="kvbm_replay",src="G3",dst="G1"}',
              t["g3"]["onboarded_bytes"], "G3 -> G1 bytes in the histogram")
        agree(prom, 'kvbm_copy_transfer_bytes_sum{job="kvbm_replay",src="G1",dst="G2"}',
              t["g2"]["offloaded_bytes"], "G1 -> G2 bytes in the histogram")
        n = prom.value('kvbm_copy_seconds_count{job="kvbm_replay",src="G3",dst="G1"}')
        check(n is not None and 1 <= n <= t["g3"]["onboarded_blocks"], "G3 -> G1 transfers: %r" % n)
        agree(prom, 'kvbm_volume_bytes_total{job="kvbm_replay",tier="G3",op="get"}',
              t["g3"]["onboarded_bytes"], "G3's volume returned the onboarded bytes")
        agree(prom, 'kvbm_tier_info{job="kvbm_replay",tier="G3",mode="%s"}' % s["g3_mode"], 1,
              "G3's mode")
        agree(prom, 'kvbm_tier_allocated_blocks_total{job="kvbm_replay",tier="G1"}',
              s["blocks_allocated"], "G1 blocks allocated")
        agree(prom, "kvbm_replay_verify_failures_total" + j, s["verify_failures"], "verify failures")
        agree(prom, 'kvbm_tier_capacity_blocks{job="kvbm_replay",tier="G3"}', s["g3_blocks"], "G3 size")
        check(t["g2"]["hit_tokens"] > 0 and t["g3"]["hit_tokens"] > 0,
              "the replay's hits came from every tier: %r" % t)
        for name in ("host", "disk"):
            rate = prom.value('kvbm_%s_cache_hit_rate{job="kvbm_replay"}' % name)
            check(rate is not None and 0 < rate <= 1, "%s cache hit rate %r" % (name, rate))

        # ---- G4: Dynamo's object-store names and the lookups
        g4 = summary4["tiers"]["g4"]
        j = '{job="kvbm_replay_g4"}'
        jt = '{job="kvbm_replay_g4",tier="G4"}'
        check(g4["hit_tokens"] > 0 and g4["onboarded_blocks"] > 0 and g4["lookups"] > 0,
              "the G4 replay exercised G4: %r" % g4)
        agree(prom, "kvbm_hit_tokens_total" + jt, g4["hit_tokens"], "G4 hit tokens")
        agree(prom, "kvbm_offload_blocks_d2o" + j, g4["offloaded_blocks"], "Dynamo's d2o")
        agree(prom, "kvbm_onboard_blocks_o2d" + j, g4["onboarded_blocks"], "Dynamo's o2d")
        agree(prom, "kvbm_offload_bytes_object" + j, g4["offloaded_bytes"], "Dynamo's object bytes out")
        agree(prom, "kvbm_onboard_bytes_object" + j, g4["onboarded_bytes"], "Dynamo's object bytes in")
        agree(prom, "kvbm_lookups_total" + jt, g4["lookups"], "G4 lookups")
        agree(prom, 'kvbm_lookup_blocks_total{job="kvbm_replay_g4",tier="G4",result="found"}',
              g4["lookup_found"], "G4 lookup blocks found")
        agree(prom, 'sum(kvbm_lookup_failures_total{job="kvbm_replay_g4"})',
              g4["lookup_timeouts"] + g4["lookup_errors"], "G4 lookup failures")
        agree(prom, "kvbm_onboard_missing_total" + jt, g4["missing"], "G4 missing")
        agree(prom, 'kvbm_volume_ops_total{job="kvbm_replay_g4",tier="G4",op="put"}',
              g4["offloaded_blocks"] + g4["skipped_offloads"] - prom.value(
                  'sum(kvbm_offload_skipped_total{job="kvbm_replay_g4",tier="G4",'
                  'cause=~"queue|space|unavailable"})'), "G4's volume puts")
        agree(prom, "kvbm_requested_tokens_total" + j, summary4["prompt_tokens"], "G4 replay tokens")
        rate = prom.value("kvbm_object_cache_hit_rate" + j)
        check(rate is not None and 0 < rate <= 1, "object cache hit rate %r" % rate)

        # ---- the router: its counters against its own /health
        st, body = get("http://127.0.0.1:%d/health" % rport)
        h = json.loads(body)
        src = h["sources"][0]
        j = '{job="kvbm_router"}'
        jw = '{job="kvbm_router",worker_id="7"}'
        agree(prom, "dynamo_kvindexer_workers" + j, h["workers"], "workers")
        agree(prom, "kvbm_index_events_applied_total" + j, h["events"], "events applied")
        agree(prom, "kvbm_index_entries" + j, h["entries"], "index entries")
        agree(prom, 'sum(dynamo_component_kv_cache_events_applied{job="kvbm_router",status="ok"})',
              h["events"], "Dynamo's events applied")
        agree(prom, 'dynamo_component_kv_cache_events_applied{job="kvbm_router",event_type="removed",'
                    'status="ok"}', 2, "remove events applied")
        agree(prom, "kvbm_index_unknown_removed_total" + j, h["unknown_removed"], "unknown removes")
        agree(prom, "kvbm_router_routes_total" + j, h["routes"], "routes")
        agree(prom, "kvbm_router_routes_total" + j, routes, "routes sent")
        agree(prom, "kvbm_router_bad_requests_total" + j, h["bad_requests"], "bad requests")
        agree(prom, "kvbm_router_bad_requests_total" + j, bad, "bad requests sent")
        agree(prom, "kvbm_router_active_requests" + j, h["active_requests"], "active requests")
        agree(prom, 'dynamo_kvindexer_requests_total{job="kvbm_router",endpoint="/route",method="POST"}',
              routes + 2, "POST /route requests")
        agree(prom, 'sum(dynamo_kvindexer_errors_total{job="kvbm_router"})', bad, "error answers")
        agree(prom, "dynamo_router_overhead_total_ms_count" + j, routes, "routing overhead samples")
        agree(prom, "dynamo_component_router_kv_hit_rate_count" + j, routes, "hit rate samples")
        for key, metric in (("batches", "batches"), ("replayed", "replayed_batches"),
                            ("lost", "lost_batches"), ("duplicates", "duplicates"),
                            ("resets", "resets"), ("errors", "errors")):
            agree(prom, "kvbm_router_source_%s_total%s" % (metric, jw), src[key], "worker 7 " + key)
        agree(prom, "kvbm_router_source_gaps_total" + jw, 1, "worker 7 gaps")
        agree(prom, "kvbm_router_source_replayed_batches_total" + jw, 1, "worker 7 replayed")
        agree(prom, 'dynamo_kvindexer_listeners{job="kvbm_router",status="active"}', 1, "active sources")
        agree(prom, "kvbm_router_source_skipped_events_total" + jw, src["skipped_events"],
              "worker 7 skipped events")
        agree(prom, "kvbm_router_source_skipped_events_total" + jw, 1, "the Ignored event skipped")
        agree(prom, "kvbm_router_degraded_workers" + j, len(h["degraded_workers"]), "degraded workers")
        agree(prom, "kvbm_router_source_degraded" + jw, 0, "worker 7 whole")
        agree(prom, 'sum(kvbm_index_worker_blocks{job="kvbm_router"})', h["entries"],
              "the index's size per worker and tier, summed (device only: the entries)")

        relay_page = get("http://127.0.0.1:%d/metrics" % lport)[1]
        # ---- the relay: its counters against what it prints when it stops
        # (the engine is quiet: a scrape after this moment has the final
        # values). Once the relay is gone Prometheus marks its series stale
        # and an instant query of them is empty: the queries below read the
        # last sample scraped (last_over_time ignores staleness markers).
        t_page = time.time()
        t0 = time.time()
        while (prom.value('timestamp(up{job="kvbm_relay"})') or 0) <= t_page:
            if time.time() - t0 > TIMEOUT:
                raise SystemExit("prometheus did not scrape the relay after its last batch")
            time.sleep(0.25)
        relay.send_signal(signal.SIGTERM)
        check(relay.wait(timeout=20) == 0, "relay exited %r" % relay.returncode)
        relay_err.seek(0)
        text = relay_err.read()
        m = re.search(r"(\d+) batches, (\d+) events, (\d+) gaps, (\d+) replayed, (\d+) lost, "
                      r"(\d+) duplicates", text)
        check(m is not None, "relay's counters: %r" % text)
        if m:
            jr = '{job="kvbm_relay"}'
            for i, metric in enumerate(("batches", "events", "gaps", "replayed_batches",
                                        "lost_batches", "duplicate_batches")):
                agree(prom, "last_over_time(kvbm_subscriber_%s_total%s[10m])" % (metric, jr),
                      int(m.group(i + 1)), "relay " + metric)
            check(int(m.group(3)) >= 1 and int(m.group(4)) >= 1, "the relay saw the gap: " + text)
        m = re.search(r"(\d+) events relayed, (\d+) skipped \(not decodable\), (\d+) refused", text)
        check(m is not None, "relay's own counters: %r" % text)
        if m:
            for i, metric in enumerate(("events", "skipped_events", "refused_events")):
                agree(prom, 'last_over_time(kvbm_relay_%s_total{job="kvbm_relay"}[10m])' % metric,
                      int(m.group(i + 1)), "relay " + metric)
            check(int(m.group(2)) == 1, "the relay skipped the Ignored event: " + text)
        agree(prom, 'last_over_time(kvbm_events_accepted_total{job="kvbm_relay"}[10m])', prom.value(
            'last_over_time(kvbm_subscriber_events_total{job="kvbm_relay"}[10m])'),
              "relay: every event received was queued")

        # ---- every page parses as Prometheus reads it, and every family on
        # it is in docs/areas/observability.md's table
        documented = set(re.findall(r"^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \|", open(DOC).read(), re.M))
        pages = [(get("http://127.0.0.1:%d/metrics" % mport)[1], "the replay's page"),
                 (get("http://127.0.0.1:%d/metrics" % m4port)[1], "the G4 replay's page"),
                 (get("http://127.0.0.1:%d/metrics" % rport)[1], "the router's page"),
                 (relay_page, "the relay's page")]
        for page, what in pages:
            promtool(page, what)
            for fam in re.findall(r"^# TYPE (\S+) ", page.decode(), re.M):
                check(fam in documented, "%s: %s is not in %s" % (what, fam, DOC))
        # ---- the Grafana dashboard's queries are PromQL Prometheus accepts,
        # over documented metrics
        dash = json.load(open(DASH))
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        check(len(exprs) >= 20, "the dashboard has %d queries" % len(exprs))
        for e in exprs:
            q = e.replace("$__rate_interval", "1m").replace("$job", ".*").replace("$instance", ".*")
            st, body = get(prom.base + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
            check(st == 200 and json.loads(body)["status"] == "success", "dashboard query %s: %s" % (q, body))
            for name in re.findall(r"\b((?:kvbm|dynamo)_[a-z0-9_]+)", q):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                check(name in documented or base in documented,
                      "the dashboard uses %s, not in the table" % name)
        agree(prom, 'sum(kvbm_metrics_errors_total)', 0, "no sample refused by the renderer")

        # ---- clean exits
        for p in (replay, replay4, router):
            p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=20)
            check(rc == 0, "%s exited %d" % (p.args[1], rc))
        done = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        ctx.destroy(linger=0)
        if failures or not done:
            print("kept the test's files in", tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        raise SystemExit("%d check(s) failed" % len(failures))
    print("prometheus agrees with the replay's summary and the router's /health")


if __name__ == "__main__":
    main()
