#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""cluster.py: W5, a whole kvbm cluster under faults (issue 23), from one command.

`kvbm cluster [TRACE] --workers N ...` execs this script (tools/kvbm/cmd_cluster.c
says how it is found). On loopback only, with ports it picks and a temporary
directory it creates, it starts nats-server with JetStream, a Redis Cluster of
three masters with one replica each, N `kvbm worker` engine simulators (their
G4 on that Redis Cluster, their KV and storage events in one JetStream stream),
two `kvbm router` replicas reading the stream with durables of their own, the
`kvbm advisor`, and Prometheus scraping every /metrics. It replays a Mooncake
trace open loop (each request sent at its timestamp / time-scale whether or not
earlier ones finished), alternating router replicas: router /route, worker
/generate, router /done. Meanwhile it injects the fault schedule (kill -9 and
restart of a worker, of a Redis master, of a router replica; nats-server
restarted on its store; a worker's G3 slow or full, really where root
allows it; a partition between a worker and Redis in a network namespace
(netfaults.py); a worker that stops publishing), measures how long each takes to recover, and at the end checks
the invariants (checks.py): no wrong bytes, every loss counted, every router's
index equal to every worker's /blocks, memory under budget, no unscheduled
death. It prints a JSON report (--json) or a summary, writes an SVG over time
(--svg), and exits 1 when an invariant broke, 2 on bad usage or a cluster
that could not start. Everything it started is stopped whatever happens
(procs.py).

Why Python and not C: this is an orchestrator of other processes and HTTP
calls, where the standard library has all it needs (subprocess, http.client,
threads); the work that is measured runs in the C processes it starts. The
"ideal router" needs each request's block hashes in the workers' scheme: it
uses kvbm's own Python package (kvbm.block_hashes) when it can be imported,
else the comparison is left out of the report (null), never guessed.
"""
import argparse
import http.client
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402
import netfaults  # noqa: E402
import svg  # noqa: E402
from procs import Supervisor, free_port, free_redis_port, wait_port  # noqa: E402

STREAM = "KVBM"
FAULTS = ("worker_kill", "redis_master_kill", "router_kill", "nats_restart", "nats_kill", "g3_slow",
          "g3_full", "publish_off", "partition")


class UsageError(Exception):
    pass


class StartError(Exception):
    pass


class Skipped(Exception):
    """A fault this machine cannot inject (the reason is reported; the run
    goes on)."""


# ---------------------------------------------------------------- HTTP

def control_address():
    """The source address of the orchestrator's own calls (faults, probes,
    the checks): 127.0.0.2 where it can be bound, so that they are not
    counted with the load's connections, which all come from 127.0.0.1 and
    fill the servers' per-address connection bound (a W5 run once failed
    because a worker answered the end of a g3_full fault 503 "too many
    connections from your address"). A frontend's requests and an
    operator's are not one client either. None (the default address) where
    127.0.0.2 cannot be bound."""
    try:
        s = socket.socket()
        try:
            s.bind(("127.0.0.2", 0))
        finally:
            s.close()
        return ("127.0.0.2", 0)
    except OSError:
        return None


CONTROL = control_address()


def call(port, method, path, body=None, timeout=10.0, source=CONTROL, host="127.0.0.1"):
    """(status, parsed JSON or text); raises OSError when nobody answers.
    source: the local address (the load passes None: 127.0.0.1); host:
    the server's (a partitioned worker's is its namespace's address)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout, source_address=source)
    try:
        data = None if body is None else json.dumps(body).encode()
        c.request(method, path, body=data,
                  headers={"Content-Type": "application/json"} if data is not None else {})
        r = c.getresponse()
        text = r.read()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text.decode("utf-8", "replace")
    except (http.client.HTTPException, ValueError) as e:
        raise OSError(str(e))
    finally:
        c.close()


def wait_health(port, deadline, proc=None, host="127.0.0.1", source=CONTROL):
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            st, _ = call(port, "GET", "/health", timeout=1.0, host=host, source=source)
            if st == 200:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def nats_request(port, subject, body, timeout=10.0, host="127.0.0.1"):
    """One request over the raw NATS protocol (JetStream's API is requests)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.recv(4096)
        data = json.dumps(body).encode()
        s.sendall(b'CONNECT {"verbose":false}\r\nSUB _INBOX.w5 1\r\nPUB %s _INBOX.w5 %d\r\n%s\r\n'
                  % (subject.encode(), len(data), data))
        got = b""
        while True:
            at = got.find(b"MSG ")
            if at >= 0 and b"\r\n" in got[at:]:
                head, rest = got[at:].split(b"\r\n", 1)
                n = int(head.split()[-1])
                if len(rest) >= n:
                    return json.loads(rest[:n])
            if b"-ERR" in got:
                raise OSError("nats: " + got.decode("utf-8", "replace"))
            more = s.recv(65536)
            if not more:
                raise OSError("nats closed the connection")
            got += more
    finally:
        s.close()


def prom_metrics(text):
    """Prometheus text to {name: summed value} (labels summed away)."""
    out = {}
    if not isinstance(text, str):
        return out
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        parts = line.rsplit(" ", 1)
        if len(parts) != 2:
            continue
        name = parts[0].split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(parts[1])
        except ValueError:
            pass
    return out


def prom_sample(text, name, **labels):
    """The sum of the samples of one metric whose labels include `labels`
    (a tier's G4 counters among every tier's)."""
    total = 0.0
    if not isinstance(text, str):
        return total
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, val = line.rpartition(" ")
        n, _, lab = head.partition("{")
        if n != name:
            continue
        have = dict(kv.split("=", 1) for kv in lab.rstrip("}").split(",") if "=" in kv)
        if all(have.get(k, "").strip('"') == v for k, v in labels.items()):
            try:
                total += float(val)
            except ValueError:
                pass
    return total


def g4_counts(text):
    """A worker's G4 traffic from its /metrics (docs/areas/cluster.md,
    "Partition"): ok = writes done (offloads into G4) + blocks onboarded
    from G4; counted = every G4 write or lookup that did not happen or
    failed, each counted somewhere (skips by cause, the policy's filter,
    the backoff's skips, lookups that failed, onboards that failed or were
    abandoned); computed = prompt tokens the worker computed (prefill), the
    blocks it had something to offload for."""
    ok = prom_sample(text, "kvbm_offload_blocks_total", tier="G4") + \
        prom_sample(text, "kvbm_onboard_blocks_total", tier="G4")
    counted = (prom_sample(text, "kvbm_offload_skipped_total", tier="G4") +
               prom_sample(text, "kvbm_offload_filtered_total", tier="G4") +
               prom_sample(text, "kvbm_store_backoff_skips_total", tier="G4") +
               prom_sample(text, "kvbm_lookup_failures_total", tier="G4") +
               prom_sample(text, "kvbm_onboard_failures_total", tier="G4") +
               prom_sample(text, "kvbm_onboard_abandoned_total", tier="G4"))
    return {"ok": ok, "counted": counted,
            "computed": prom_sample(text, "kvbm_worker_prefill_tokens_total"),
            "wrong_bytes": sum(v for n, v in prom_metrics(text).items() if "wrong_bytes" in n),
            "requests": prom_sample(text, "kvbm_worker_requests_total")}


# ---------------------------------------------------------------- trace

def load_trace(path, limit, skip):
    reqs = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            if limit and len(reqs) >= limit:
                break
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            for k in ("timestamp", "input_length", "output_length", "hash_ids"):
                if k not in r:
                    raise UsageError("trace line %d has no %s" % (i + 1, k))
            reqs.append(r)
    if not reqs:
        raise UsageError("the trace slice is empty")
    t0 = reqs[0]["timestamp"]
    for r in reqs:
        r["t_s"] = (r["timestamp"] - t0) / 1000.0
    return reqs


def tokens_of(r):
    """W1's tokens (../shared/WORKLOADS.md): token i = hash_ids[i/512]*512 + i%512."""
    ids = r["hash_ids"]
    n = min(r["input_length"], 512 * len(ids))
    return [ids[i // 512] * 512 + i % 512 for i in range(n)]


# ---------------------------------------------------------------- schedule

def default_schedule(duration, workers):
    """The full default schedule over a load of `duration` seconds: every
    fault of issue 23 once, spaced so that each recovers before the next."""
    d = max(duration, 10.0)
    w = lambda k: "worker:%d" % (k % workers)  # noqa: E731
    return [
        {"at_s": 0.07 * d, "fault": "worker_kill", "target": w(1), "duration_s": 0.04 * d},
        {"at_s": 0.17 * d, "fault": "redis_master_kill", "target": "redis", "duration_s": 0.06 * d},
        {"at_s": 0.29 * d, "fault": "router_kill", "target": "router:1", "duration_s": 0.04 * d},
        {"at_s": 0.39 * d, "fault": "nats_restart", "target": "nats", "duration_s": 0.03 * d},
        {"at_s": 0.49 * d, "fault": "g3_slow", "target": w(2), "duration_s": 0.08 * d,
         "delay_ms": 20},
        # worker 1: no knob fault follows on it (a partitioned worker's
        # connections stay full for seconds after the heal)
        # at least 4 s: the counters are compared from 2.5 s after the cut
        {"at_s": 0.60 * d, "fault": "partition", "target": w(1),
         "duration_s": max(0.12 * d, 4.0)},
        {"at_s": 0.74 * d, "fault": "g3_full", "target": w(3), "duration_s": 0.08 * d},
        {"at_s": 0.85 * d, "fault": "publish_off", "target": w(0), "duration_s": 0.08 * d},
    ]


def read_schedule(spec, duration, workers):
    if spec == "none":
        return []
    if spec == "default":
        return default_schedule(duration, workers)
    out = []
    try:
        with open(spec) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    e = json.loads(line)
                except ValueError as x:
                    raise UsageError("%s:%d: not JSON (%s)" % (spec, n, x))
                if not isinstance(e, dict) or e.get("fault") not in FAULTS:
                    raise UsageError("%s:%d: fault must be one of %s" % (spec, n, ", ".join(FAULTS)))
                at = e.get("at_s")
                if not isinstance(at, (int, float)) or at < 0 or at != at:
                    raise UsageError("%s:%d: at_s must be a number >= 0" % (spec, n))
                dur = e.get("duration_s", 2.0)
                if not isinstance(dur, (int, float)) or dur < 0 or dur > 3600:
                    raise UsageError("%s:%d: duration_s must be in 0..3600" % (spec, n))
                e["duration_s"] = float(dur)
                tgt = e.get("target", "")
                kind = e["fault"]
                if kind in ("worker_kill", "g3_slow", "g3_full", "publish_off", "partition"):
                    if not (isinstance(tgt, str) and tgt.startswith("worker:") and
                            tgt[7:].isdigit() and int(tgt[7:]) < workers):
                        raise UsageError("%s:%d: target must be worker:K with K < %d" %
                                         (spec, n, workers))
                elif kind == "router_kill":
                    if tgt not in ("router:0", "router:1"):
                        raise UsageError("%s:%d: target must be router:0 or router:1" % (spec, n))
                out.append(e)
    except OSError as x:
        raise UsageError("--faults %s: %s" % (spec, x.strerror))
    if len({e["target"] for e in out if e["fault"] == "partition"}) > 1:
        raise UsageError("--faults %s: partition faults must all name the same worker "
                         "(it runs in the one network namespace)" % spec)
    return sorted(out, key=lambda e: e["at_s"])


# ---------------------------------------------------------------- the cluster

class Cluster:
    def __init__(self, a, workdir, log):
        self.a, self.dir, self.log = a, workdir, log
        self.sup = Supervisor(workdir, log)
        self.workers = {}   # k -> {"port", "g3"}
        self.routers = {}   # r -> {"port", "snap"}
        self.redis = {}     # name -> port
        self.nats_port = None
        self.advisor_port = None
        self.prom_port = None
        self.key_file = None
        # where the servers listen: loopback, or the partition's addresses
        # (netfaults.py) when a worker runs in a namespace of its own
        self.svc_host = self.redis_host = "127.0.0.1"
        self.partition_target = None   # the worker a partition fault names
        self.partition = netfaults.Partition(log)
        self.g3disk = netfaults.G3Disk(log)
        self.g3slow = netfaults.G3Slow(log)
        self.g3_slow_targets = set()
        self.sup.on_stop.append(self.teardown)

    def teardown(self):
        """The namespace and the mounts go whatever happened (called by the
        supervisor's stop, after every process it started has ended)."""
        self.partition.teardown()
        self.g3disk.teardown()
        self.g3slow.teardown()

    def setup_faults_below(self, sched):
        """The namespace for a partition fault, the tmpfs G3 for real G3
        full, before anything starts (docs/areas/cluster.md)."""
        netfaults.cleanup_stale(self.log)
        targets = sorted({e["target"] for e in sched if e["fault"] == "partition"})
        if len(targets) > 1:
            raise UsageError("partition faults must all name the same worker (one namespace)")
        if targets:
            self.partition_target = int(targets[0].split(":")[1])
            if self.a.no_g4:
                self.partition.available = "unavailable: no G4 (--no-g4): nothing to cut"
            elif self.partition.setup():
                self.svc_host, self.redis_host = self.partition.services, self.partition.redis_addr
                self.log("w5: worker %d in namespace %s (%s), Redis at %s" %
                         (self.partition_target, self.partition.ns, self.partition.worker_addr,
                          self.redis_host))
            else:
                self.log("w5: partition %s" % self.partition.available)
        self.g3disk.usable()
        self.g3_slow_targets = {int(e["target"].split(":")[1]) for e in sched
                                if e["fault"] == "g3_slow"}
        if self.g3_slow_targets:
            self.g3slow.usable()

    def whost(self, k):
        """(host the worker listens on, source of the orchestrator's calls)."""
        if k == self.partition_target and self.partition.available is True:
            return self.partition.worker_addr, (self.partition.control_addr, 0)
        return "127.0.0.1", CONTROL

    def wcall(self, k, method, path, body=None, timeout=10.0, load=False):
        host, ctl = self.whost(k)
        return call(self.workers[k]["port"], method, path, body, timeout=timeout,
                    source=None if load else ctl, host=host)

    # -- servers
    def start_nats(self, first=True):
        if first:
            self.nats_port = free_port()
        p = self.sup.start("nats", ["nats-server", "-js", "-sd", os.path.join(self.dir, "js"),
                                    "-a", self.svc_host, "-p", str(self.nats_port)], 512,
                           clean_rcs=(0, 1, -15, -9))  # nats-server exits 1 on SIGTERM
        if not wait_port(self.nats_port, time.time() + 20, p.popen, host=self.svc_host):
            raise StartError("nats-server did not start (log %s)" % p.log_path)
        if first:
            made = nats_request(self.nats_port, "$JS.API.STREAM.CREATE." + STREAM,
                                {"name": STREAM, "subjects": ["kv.>", "st.>"], "storage": "file"},
                                host=self.svc_host)
            if "error" in made:
                raise StartError("JetStream stream: %s" % made["error"])

    def redis_cli(self, port, *words, timeout=10):
        return subprocess.run(["redis-cli", "-h", self.redis_host, "-p", str(port), *words],
                              capture_output=True,
                              timeout=timeout, check=False).stdout.decode("utf-8", "replace")

    def start_redis_node(self, name, first=True):
        if first:
            self.redis[name] = free_redis_port()
        port = self.redis[name]
        d = os.path.join(self.dir, "redis", name)
        os.makedirs(d, exist_ok=True)
        p = self.sup.start(name, ["redis-server", "--port", str(port), "--bind", self.redis_host,
                                  # the address clients are sent to (MOVED, CLUSTER SLOTS)
                                  "--cluster-announce-ip", self.redis_host,
                                  "--dir", d, "--save", "", "--appendonly", "no",
                                  "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                  "--cluster-node-timeout", "1000", "--protected-mode", "no",
                                  # a cache: bounded, LRU (evicted blocks are G4 misses: volumes.md)
                                  "--maxmemory", "%dmb" % self.a.redis_maxmemory_mb,
                                  "--maxmemory-policy", "allkeys-lru"],
                           self.a.redis_maxmemory_mb + 128)
        if not wait_port(port, time.time() + 20, p.popen, host=self.redis_host):
            raise StartError("redis-server %s did not start (log %s)" % (name, p.log_path))

    def start_redis_cluster(self):
        for i in range(6):
            self.start_redis_node("redis%d" % i)
        addrs = ["%s:%d" % (self.redis_host, self.redis["redis%d" % i]) for i in range(6)]
        r = subprocess.run(["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", "1",
                            "--cluster-yes"], capture_output=True, timeout=60, check=False)
        if r.returncode:
            raise StartError("redis-cli --cluster create: %s" % r.stdout.decode()[-500:])
        if not self.wait_redis_ok(time.time() + 30, need_nodes=6):
            raise StartError("the Redis Cluster did not become ok")

    def redis_ok(self, need_nodes=None):
        live = [n for n in self.redis if self.sup.procs[n].alive()]
        if not live:
            return False
        for n in live:
            info = self.redis_cli(self.redis[n], "CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return False
            if need_nodes and "cluster_known_nodes:%d" % need_nodes not in info:
                return False
        return True

    def wait_redis_ok(self, deadline, need_nodes=None):
        while time.time() < deadline:
            if self.redis_ok(need_nodes):
                return True
            time.sleep(0.1)
        return False

    def redis_master(self):
        """A live master's node name (the one serving slot 0)."""
        for n, port in self.redis.items():
            if not self.sup.procs[n].alive():
                continue
            for line in self.redis_cli(port, "CLUSTER", "NODES").splitlines():
                f = line.split()
                if len(f) >= 9 and "master" in f[2] and "fail" not in f[2]:
                    p = int(f[1].split("@")[0].rsplit(":", 1)[1])
                    if any(s.split("-")[0] == "0" for s in f[8:]):
                        for m, mp in self.redis.items():
                            if mp == p:
                                return m
            break
        return None

    def g4_url(self):
        return "redis+cluster://" + ",".join("%s:%d" % (self.redis_host, self.redis["redis%d" % i])
                                            for i in range(3))

    def worker_cmd(self, k):
        a, w = self.a, self.workers[k]
        nats = "nats://%s:%d/%s" % (self.svc_host, self.nats_port, STREAM)
        prog = [a.worker_bin] if a.worker_bin else [a.kvbm, "worker"]
        if k == self.partition_target and self.partition.available is True:
            prog = self.partition.prefix() + prog
        prog = w.get("wrap", []) + prog  # the slow G3's cgroup, joined before anything else
        cmd = prog + ["--id", str(k), "--listen", "%s:%d" % (self.whost(k)[0], w["port"]),
               "--g1", str(a.g1), "--g2", str(a.g2), "--g3", "%s:%d" % (w["g3"], a.g3),
               "--events", "%s/kv.%d" % (nats, k), "--storage-events", "%s/st.%d" % (nats, k),
               "--block-size", str(a.block_size), "--time-scale", repr(a.time_scale),
               "--memory-budget-mb", str(a.worker_budget_mb)]
        if not a.no_g4:
            cmd += ["--g4", self.g4_url(), "--g4-key-file", self.key_file]
        return cmd + a.worker_arg

    def start_worker(self, k, first=True):
        if first:
            g3 = os.path.join(self.dir, "g3", "w%d" % k)
            os.makedirs(g3, mode=0o700, exist_ok=True)
            os.chmod(g3, 0o700)  # the worker refuses a G3 others could write (tiers.md)
            os.chmod(os.path.dirname(g3), 0o700)
            self.workers[k] = {"port": free_port(), "g3": g3}
            full = netfaults.slot_file_bytes(self.a.g3, self.block_bytes())
            if k in self.g3_slow_targets and self.g3slow.available is True:
                # ext4 on a loop device, the worker in a blkio cgroup (netfaults.G3Slow)
                wrap = self.g3slow.setup(k, g3, full + (32 << 20))
                if wrap:
                    self.workers[k]["wrap"] = wrap
                else:
                    self.log("w5: slow G3: %s" % self.g3slow.available)
            if self.g3disk.available is True and "wrap" not in self.workers[k]:
                # a tmpfs a little smaller than the slot file: its fallocate
                # fails, the file grows as slots are written, and a ballast
                # can leave no room (netfaults.py)
                size = max(full - (1 << 20), full * 3 // 4) & ~4095
                if self.g3disk.mount(g3, size):
                    self.workers[k]["tmpfs_bytes"] = size
                else:
                    self.log("w5: G3 tmpfs: %s" % self.g3disk.available)
        p = self.sup.start("worker%d" % k, self.worker_cmd(k), self.a.worker_budget_mb + 64)
        return p

    def block_bytes(self):
        """The workers' --block-bytes (1024 unless --worker-arg gives it)."""
        wa = self.a.worker_arg
        for i, x in enumerate(wa):
            if x.startswith("--block-bytes="):
                return int(x.split("=", 1)[1])
            if x == "--block-bytes" and i + 1 < len(wa):
                return int(wa[i + 1])
        return 1024

    def router_cmd(self, r):
        a, ro = self.a, self.routers[r]
        cmd = [a.kvbm, "router", "--listen", "127.0.0.1:%d" % ro["port"], "--durable", "w5-r%d" % r,
               "--snapshot", ro["snap"], "--snapshot-every", "1", "--block-size", str(a.block_size),
               "--hash", a.hash]
        for k in range(a.workers):
            cmd += ["--jetstream", "%d=nats://%s:%d/%s/kv.%d" % (k, self.svc_host, self.nats_port,
                                                                  STREAM, k)]
        return cmd

    def start_router(self, r, first=True):
        if first:
            self.routers[r] = {"port": free_port(), "snap": os.path.join(self.dir, "router%d.snap" % r)}
        return self.sup.start("router%d" % r, self.router_cmd(r), 512)

    def start_advisor(self):
        self.advisor_port = free_port()
        cmd = [self.a.kvbm, "advisor", "--listen", "127.0.0.1:%d" % self.advisor_port]
        for k in range(self.a.workers):
            url = "nats://%s:%d" % (self.svc_host, self.nats_port)
            cmd += ["--kv-nats", "w%d=%s/kv.%d" % (k, url, k), "--storage-nats", "%s/st.%d" % (url, k)]
        p = self.sup.start("advisor", cmd, 256)
        if not wait_health(self.advisor_port, time.time() + 20, p.popen):
            raise StartError("kvbm advisor did not start (log %s)" % p.log_path)

    def start_prometheus(self):
        if not shutil.which("prometheus"):
            self.log("prometheus not found: the run goes on without it")
            return
        self.prom_port = free_port()
        targets = ["%s:%d" % (self.whost(k)[0], w["port"]) for k, w in self.workers.items()]
        targets += ["127.0.0.1:%d" % r["port"] for r in self.routers.values()]
        targets.append("127.0.0.1:%d" % self.advisor_port)
        cfg = os.path.join(self.dir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                    "  - job_name: kvbm\n    static_configs:\n      - targets: %s\n" %
                    json.dumps(targets))
        self.sup.start("prometheus", ["prometheus", "--config.file", cfg,
                                      "--storage.tsdb.path", os.path.join(self.dir, "prom"),
                                      "--web.listen-address", "127.0.0.1:%d" % self.prom_port],
                       self.a.prometheus_budget_mb)

    def start_all(self):
        a = self.a
        self.key_file = os.path.join(self.dir, "g4.key")
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secrets.token_hex(32).encode())
        os.close(fd)
        self.start_nats()
        if not a.no_g4:
            self.start_redis_cluster()
        for k in range(a.workers):
            self.start_worker(k)
        for k in range(a.workers):
            p = self.sup.procs["worker%d" % k].popen
            host, ctl = self.whost(k)
            if not wait_health(self.workers[k]["port"], time.time() + 30, p, host=host, source=ctl):
                raise StartError("kvbm worker %d did not start (log %s)" %
                                 (k, self.sup.procs["worker%d" % k].log_path))
        for r in (0, 1):
            p = self.start_router(r)
            if not wait_health(self.routers[r]["port"], time.time() + 20, p.popen):
                raise StartError("kvbm router %d did not start (log %s)" %
                                 (r, self.sup.procs["router%d" % r].log_path))
        self.start_advisor()
        self.start_prometheus()

    # -- views
    def blocks(self, k, timeout=5.0):
        st, b = self.wcall(k, "GET", "/blocks", timeout=timeout)
        if st != 200 or not isinstance(b, dict):
            raise OSError("worker %d /blocks: %s" % (k, st))
        return b

    def index(self, r, k, timeout=5.0):
        st, b = call(self.routers[r]["port"], "GET", "/index?worker=%d" % k, timeout=timeout)
        if st == 404:
            return None
        if st != 200 or not isinstance(b, dict):
            raise OSError("router %d /index: %s" % (r, st))
        return b

    def stream_last(self, k):
        """The stream sequence of worker k's last KV batch (0: none yet)."""
        ans = nats_request(self.nats_port, "$JS.API.STREAM.MSG.GET." + STREAM,
                           {"last_by_subj": "kv.%d" % k}, timeout=2, host=self.svc_host)
        if "error" in ans:
            if ans["error"].get("code") == 404:
                return 0
            raise OSError("stream: %s" % ans["error"])
        return int(ans["message"]["seq"])

    def caught_up(self, workers, routers=None):
        """Every router (of `routers`) has applied every batch the stream
        held for each worker when asked: a replica that restarted, or that
        lost NATS for a while, has read back what it missed. Exact (stream
        positions, not a comparison of sets that change under load)."""
        try:
            last = {k: self.stream_last(k) for k in workers}
            for r in (self.routers if routers is None else routers):
                st, h = call(self.routers[r]["port"], "GET", "/health", timeout=2)
                if st != 200 or not isinstance(h, dict):
                    return False
                pos = {s.get("worker_id"): (s.get("stream") or {}).get("position", 0)
                       for s in h.get("sources", [])}
                if any(pos.get(k, 0) < last[k] for k in workers):
                    return False
            return True
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def converged(self):
        """(bool, views, blocks, diffs) for the exact check. A worker or
        router that is not running cannot be compared: said as a difference
        (its death is a crash of its own), the others are still checked."""
        blocks, views, down = {}, {}, []
        for k in self.workers:
            if self.sup.procs["worker%d" % k].alive():
                blocks[k] = self.blocks(k, timeout=30)
            else:
                down.append("worker %d is not running: its index was not checked" % k)
        for r in self.routers:
            if not self.sup.procs["router%d" % r].alive():
                down.append("router %d is not running: its index was not checked" % r)
                continue
            views[r] = {k: self.index(r, k, timeout=30) for k in blocks}
        bad = down + checks.check_index(views, blocks)
        return not bad, views, blocks, bad


# ---------------------------------------------------------------- load

class Load:
    """The open-loop replay: one thread per request at its time."""

    def __init__(self, cl, reqs, rng):
        self.cl, self.reqs, self.rng = cl, reqs, rng
        self.a = cl.a
        self.lock = threading.Lock()
        self.records = []
        self.sent = self.ok = self.failed = 0
        self.failures = {}
        self.wrong_bytes = {}
        self.rr = 0
        self.cache = {}      # worker -> set of hashes (any of g1..g3), refreshed by a poller
        self.hasher = None
        self.threads = []
        self.t0 = None
        self.done = threading.Event()

    def fail(self, why):
        with self.lock:
            self.failed += 1
            self.failures[why] = self.failures.get(why, 0) + 1

    def poll_blocks(self):
        while not self.done.is_set():
            for k in list(self.cl.workers):
                try:
                    b = self.cl.blocks(k, timeout=2)
                    held = set()
                    for t in checks.TIERS:
                        held.update(int(h) for h in b.get(t, []))
                    self.cache[k] = held
                except OSError:
                    self.cache[k] = set()
            self.done.wait(self.a.ideal_period)

    def choose(self, i, tokens):
        """(worker, router used or None, router's request id)."""
        a = self.a
        if a.routing == "random":
            return self.rng.randrange(a.workers), None, None
        if a.routing == "round-robin":
            with self.lock:
                self.rr += 1
                return self.rr % a.workers, None, None
        for r in (i % 2, 1 - i % 2):
            try:
                st, ans = call(self.cl.routers[r]["port"], "POST", "/route", {"token_ids": tokens},
                               timeout=10, source=None)
                if st == 200 and isinstance(ans, dict) and ans.get("worker_id") in self.cl.workers:
                    return ans["worker_id"], r, ans.get("request_id")
            except OSError:
                pass
        return None, None, None

    def one(self, i, r):
        tokens = tokens_of(r)
        rec = {"i": i, "t": time.time() - self.t0, "prompt": len(tokens)}
        w, router, rid = self.choose(i, tokens)
        rec["router"] = router
        if w is None:
            self.fail("no router answered /route")
            rec["status"] = "route_failed"
            with self.lock:
                self.records.append(rec)
            return
        rec["worker"] = w
        if self.hasher is not None:
            hs = self.hasher(tokens)
            over = {k: checks.prefix_overlap(hs, self.cache.get(k, set())) for k in self.cl.workers}
            rec["ideal_blocks"] = max(over.values()) if over else 0
            rec["chosen_blocks"] = over.get(w, 0)
        body = {"request_id": "w5-%d" % i, "hash_ids": r["hash_ids"],
                "input_length": r["input_length"], "output_length": r["output_length"]}
        try:
            st, ans = self.cl.wcall(w, "POST", "/generate", body, timeout=self.a.request_timeout,
                                    load=True)
            if st == 200 and isinstance(ans, dict) and ans.get("status") == "ok":
                with self.lock:
                    self.ok += 1
                    wb = int(ans.get("wrong_bytes", 0) or 0)
                    self.wrong_bytes[w] = self.wrong_bytes.get(w, 0) + wb
                rec.update(status="ok", hit=ans.get("hit_tokens", {}), ttft=ans.get("ttft_ms"),
                           prefill=ans.get("prefill_tokens"))
            else:
                err = ans.get("error") if isinstance(ans, dict) else None
                self.fail("worker answered %s: %s" % (st, (err or "")[:60]))
                rec["status"] = "error"
                if isinstance(ans, dict) and ans.get("wrong_bytes"):
                    with self.lock:
                        self.wrong_bytes[w] = self.wrong_bytes.get(w, 0) + int(ans["wrong_bytes"])
        except OSError as e:
            self.fail("worker unreachable or timed out (%s)" % type(e).__name__)
            rec["status"] = "unreachable"
        rec["t_done"] = time.time() - self.t0  # when its answer (or failure) came
        if router is not None and rid is not None:
            try:
                call(self.cl.routers[router]["port"], "POST", "/done", {"request_id": rid}, timeout=5,
                     source=None)
            except OSError:
                pass  # the router's --request-ttl ends it; not a loss of the request
        with self.lock:
            self.records.append(rec)

    def run(self):
        poller = threading.Thread(target=self.poll_blocks, daemon=True)
        if self.hasher is not None:
            poller.start()
        self.t0 = time.time()
        for i, r in enumerate(self.reqs):
            at = self.t0 + r["t_s"] / self.a.time_scale
            now = time.time()
            if at > now:
                time.sleep(at - now)
            t = threading.Thread(target=self.one, args=(i, r), daemon=True)
            with self.lock:
                self.sent += 1
            t.start()
            self.threads.append(t)
        end = time.time() + self.a.request_timeout + 15
        for t in self.threads:
            t.join(timeout=max(0.0, end - time.time()))
        self.done.set()


# ---------------------------------------------------------------- faults

class Faults:
    """Runs the schedule on the main thread (children must be started by a
    thread that lives as long as they do: PR_SET_PDEATHSIG follows the
    forking thread) and measures each fault's recovery."""

    def __init__(self, cl, schedule, load):
        self.cl, self.sched, self.load = cl, schedule, load
        self.state = []  # per fault: dict with times
        for e in schedule:
            self.state.append({"fault": e["fault"], "target": e.get("target", ""),
                               "at_s": e["at_s"], "duration_s": e["duration_s"], "phase": "wait",
                               "e": e})

    def worker_of(self, tgt):
        return int(tgt.split(":")[1])

    def patient_call(self, k, method, path, body=None, timeout=5.0, patience=10.0):
        """worker k's answer to one call, tried again every 0.2 s for
        `patience` seconds until it answers 200 (a worker whose connection
        table is full of waiting requests answers 503 or drops the
        connection); the last error is raised after that."""
        end = time.time() + patience
        while True:
            try:
                st, ans = self.cl.wcall(k, method, path, body, timeout=timeout)
                if st == 200:
                    return ans
                what = path if body is None else "%s %s" % (path, json.dumps(body))
                err = OSError("worker %d %s: %s %s" % (k, what, st, ans))
            except OSError as e:
                err = e
            if time.time() > end:
                raise err
            time.sleep(0.2)

    def knob(self, k, body, patience=10.0):
        """Sets a worker's fault knob, patiently: a knob left on (e.g.
        publishing off) would break the run for good."""
        self.patient_call(k, "POST", "/admin/fault", body, patience=patience)

    def metrics_text(self, k, timeout=5.0, patience=10.0):
        """A worker's /metrics page, patiently: a fault that cannot read
        its target's counters is not injected, or not timed, for a reason
        that says nothing about the fault."""
        return self.patient_call(k, "GET", "/metrics", timeout=timeout, patience=patience)

    def g4_snapshot(self, k, timeout=5.0, patience=10.0):
        return g4_counts(self.metrics_text(k, timeout, patience))

    def sample_partition(self, f, timeout=0.5):
        """One more reading of the target's counters while the fault holds
        (kept when it answers): G4's for a partition, G3's for g3_slow."""
        try:
            k = self.worker_of(f["target"])
            snap = self.g4_snapshot(k, timeout=timeout, patience=0) if f["fault"] == "partition" \
                else self.g3_counts(k, timeout=timeout, patience=0)
        except OSError:
            return
        f["last"], f["t_last"] = snap, time.time()

    def g3_counts(self, k, timeout=5.0, patience=10.0):
        """G3 writes the worker counted failed, and done, blocks it read
        back from G3 (its /metrics)."""
        text = self.metrics_text(k, timeout, patience)
        return {"write_failures": prom_sample(text, "kvbm_offload_skipped_total", tier="G3"),
                "writes": prom_sample(text, "kvbm_offload_blocks_total", tier="G3"),
                "reads": prom_sample(text, "kvbm_onboard_blocks_total", tier="G3"),
                "requests": prom_sample(text, "kvbm_worker_requests_ok_total")}

    def begin(self, f):
        cl, kind, tgt = self.cl, f["fault"], f["target"]
        if kind == "worker_kill":
            cl.sup.kill9("worker%d" % self.worker_of(tgt))
        elif kind == "router_kill":
            cl.sup.kill9("router%d" % int(tgt.split(":")[1]))
        elif kind == "redis_master_kill":
            if cl.a.no_g4:
                raise OSError("no Redis Cluster (--no-g4)")
            m = cl.redis_master()
            if m is None:
                raise OSError("no live master found")
            f["target"] = m
            cl.sup.kill9(m)
        elif kind == "nats_restart":  # a restart: SIGTERM, so the store is flushed
            cl.sup.stop("nats")
        elif kind == "nats_kill":  # kill -9: JetStream loses what it had not flushed
            cl.sup.kill9("nats")
        elif kind == "g3_slow":
            k, delay = self.worker_of(tgt), int(f["e"].get("delay_ms", 20))
            f["before"] = f["last"] = self.g3_counts(k)
            f["t_before"] = f["t_last"] = time.time()
            if "wrap" in cl.workers[k]:  # the block layer itself: 1000/delay I/Os a second
                f["mode"] = "real: %d read and %d write I/Os a second on its G3 device" % \
                    (max(1, 1000 // max(1, delay)), max(1, 1000 // max(1, delay)))
                cl.g3slow.throttle(k, max(1, 1000 // max(1, delay)))
            else:
                f["mode"] = cl.g3slow.available if cl.g3slow.available is not True else \
                    "emulated: the slow G3 device could not be made"
                self.knob(k, {"g3_delay_ms": delay})
        elif kind == "g3_full":
            k = self.worker_of(tgt)
            if "tmpfs_bytes" in cl.workers[k]:  # the filesystem's own ENOSPC
                f["before"] = self.g3_counts(k)
                f["mode"] = "real"
                f["ballast_bytes"] = cl.g3disk.fill(cl.workers[k]["g3"])
                f["free_bytes_after_fill"] = cl.g3disk.free_bytes(cl.workers[k]["g3"])
            else:
                f["mode"] = cl.g3disk.available if cl.g3disk.available is not True else \
                    "emulated: the G3 mount failed"
                self.knob(k, {"g3_full": True})
        elif kind == "publish_off":
            self.knob(self.worker_of(tgt), {"publish": False})
        elif kind == "partition":
            k = self.worker_of(tgt)
            if cl.partition.available is not True:
                raise Skipped(cl.partition.available)
            cl.partition.cut()
            f["mode"] = "real"
            # every G4 operation issued before the cut has ended by then,
            # done or failed (g4_timeout_ms is 2 s), even on two busy cores:
            # from here no G4 write or onboard can succeed
            settle = min(2.5, f["duration_s"] / 2)
            time.sleep(settle)
            f["settle_s"] = settle
            f["before"] = self.g4_snapshot(k)
            f["last"] = f["before"]
            f["t_last"] = f["t_cut_settled"] = time.time()

    def end(self, f):
        cl, kind, tgt = self.cl, f["fault"], f["target"]
        if kind == "worker_kill":
            cl.start_worker(self.worker_of(tgt), first=False)
        elif kind == "router_kill":
            cl.start_router(int(tgt.split(":")[1]), first=False)
        elif kind == "redis_master_kill":
            cl.start_redis_node(f["target"], first=False)  # back as a replica
        elif kind in ("nats_restart", "nats_kill"):
            cl.start_nats(first=False)
        elif kind == "g3_slow":
            k = self.worker_of(tgt)
            # what the worker's G3 did meanwhile (the real throttle bounds its
            # rate); the last reading under the fault when it stops answering
            self.sample_partition(f, timeout=2.0)
            f["window"] = {n: f["last"][n] - f["before"][n] for n in f["last"]}
            f["window"]["seconds"] = round(f["t_last"] - f["t_before"], 3)
            if "wrap" in cl.workers[k]:
                cl.g3slow.throttle(k, 0)
            else:
                self.knob(k, {"g3_delay_ms": 0})
        elif kind == "g3_full":
            k = self.worker_of(tgt)
            if f.get("mode") == "real":
                cl.g3disk.unfill(cl.workers[k]["g3"])
                after = self.g3_counts(k)
                f["window"] = {n: after[n] - f["before"][n] for n in after}
            else:
                self.knob(k, {"g3_full": False})
        elif kind == "publish_off":
            self.knob(self.worker_of(tgt), {"publish": True})
        elif kind == "partition":
            k = self.worker_of(tgt)
            try:
                self.sample_partition(f, timeout=2.0)
                after = f["last"]
                f["window"] = {n: after[n] - f["before"][n] for n in after}
                # how much of the window the counters cover (a worker whose
                # connections all wait may refuse /metrics: the last
                # reading taken while the cut held is used)
                f["window"]["until_s"] = round(f["t_last"] - f["t_cut_settled"], 3)
            finally:
                cl.partition.heal()
            f["healed"] = after

    def recovered(self, f):
        """The fault's own notion of recovered (docs/areas/cluster.md): the
        process answers again and every router replica has applied all
        that the stream holds for the workers concerned."""
        cl, kind, tgt = self.cl, f["fault"], f["target"]
        if kind == "redis_master_kill":
            return cl.redis_ok()
        if kind == "partition":  # G4 works again for it: a G4 write or onboard succeeded
            k = self.worker_of(tgt)
            try:
                now = self.g4_snapshot(k, timeout=1.0, patience=0)
            except OSError:
                return False
            if now["ok"] <= f["healed"]["ok"]:
                # no load left to write with: recovered once it answers and
                # its G4 failures stopped growing for longer than a put's
                # deadline (g4_timeout_ms, 2 s) (said: recovered_idle)
                if not self.load.done.is_set():
                    return False
                if f.get("idle_counted") != now["counted"]:
                    f["idle_counted"], f["idle_since"] = now["counted"], time.time()
                    return False
                if time.time() - f["idle_since"] < 2.5:
                    return False
                f["recovered_idle"] = True
            # the writes cut off fail at their deadline (g4_timeout_ms),
            # often after the heal: counted is taken up to here
            f["window"]["counted_by_recovery"] = now["counted"] - f["before"]["counted"]
            return True
        if kind in ("worker_kill", "g3_slow", "g3_full", "publish_off"):
            k = self.worker_of(tgt)
            try:
                st, _ = cl.wcall(k, "GET", "/health", timeout=1)
            except OSError:
                return False
            return st == 200 and cl.caught_up([k])
        if kind == "router_kill":
            r = int(tgt.split(":")[1])
            return cl.caught_up(list(cl.workers), [r])
        if kind in ("nats_restart", "nats_kill"):
            return cl.caught_up(list(cl.workers))
        return True

    def step(self, now):
        """Advances every fault; True while some fault is not finished."""
        busy = False
        for f in self.state:
            ph = f["phase"]
            if ph == "wait" and now >= f["at_s"]:
                f["t_begin"] = now
                try:
                    self.begin(f)
                    f["phase"], f["injected"] = "active", True
                except Skipped as e:
                    f["phase"], f["skipped"] = "done", str(e)
                except OSError as e:
                    f["phase"], f["error"] = "done", str(e)
            elif ph == "active" and f["fault"] in ("partition", "g3_slow") and \
                    now < f["t_begin"] + f["duration_s"] and time.time() - f.get("t_last", 0) > 0.25:
                self.sample_partition(f)
            if ph == "active" and now >= f["t_begin"] + f["duration_s"]:
                f["t_end"] = now
                try:
                    self.end(f)
                    f["phase"] = "recovering"
                except (OSError, StartError) as e:
                    f["phase"], f["error"] = "done", "ending it: %s" % e
            elif ph == "recovering":
                if self.recovered(f):
                    f["t_recovered"] = now
                    f["phase"] = "done"
                elif now - f["t_end"] > self.cl.a.recovery_timeout:
                    f["phase"], f["error"] = "done", "not recovered within %gs" % \
                        self.cl.a.recovery_timeout
            busy = busy or f["phase"] != "done"
        return busy

    def report(self):
        out = []
        for f in self.state:
            d = {"fault": f["fault"], "target": f["target"], "at_s": round(f.get("t_begin", f["at_s"]), 3),
                 "duration_s": f["duration_s"], "injected": bool(f.get("injected"))}
            if "t_recovered" in f:
                d["recovery_s"] = round(f["t_recovered"] - f["t_end"], 3)
                d["outage_s"] = round(f["t_recovered"] - f["t_begin"], 3)
            else:
                d["recovery_s"] = None
            if "error" in f:
                d["error"] = f["error"]
            for key in ("skipped", "mode", "window", "ballast_bytes", "free_bytes_after_fill",
                        "settle_s", "recovered_idle"):
                if key in f:
                    d[key] = f[key]
            if f["fault"] in ("partition", "g3_full", "g3_slow") and "t_end" in f and \
                    f["target"].startswith("worker:"):
                # the target kept serving: its requests answered ok while the fault lasted
                k = self.worker_of(f["target"])
                with self.load.lock:
                    d["served_ok_during"] = sum(
                        1 for r in self.load.records if r.get("worker") == k and
                        r.get("status") == "ok" and f["t_begin"] <= r.get("t_done", -1) <= f["t_end"])
            out.append(d)
        return out


# ---------------------------------------------------------------- run

def summarize(load, workers):
    recs = load.records
    hit = {"g1": 0, "g2": 0, "g3": 0, "g4": 0}
    per = {k: {"requests": 0, "hit_tokens": dict(hit), "prompt_tokens": 0} for k in workers}
    ttft, prompt = [], 0
    ideal_sum = chosen_sum = agree = nideal = 0
    for r in recs:
        if r.get("status") != "ok":
            continue
        prompt += r["prompt"]
        w = per[r["worker"]]
        w["requests"] += 1
        w["prompt_tokens"] += r["prompt"]
        for t in hit:
            v = int((r.get("hit") or {}).get(t, 0) or 0)
            hit[t] += v
            w["hit_tokens"][t] += v
        if r.get("ttft") is not None:
            ttft.append(float(r["ttft"]))
        if "ideal_blocks" in r:
            nideal += 1
            ideal_sum += r["ideal_blocks"]
            chosen_sum += r["chosen_blocks"]
            agree += r["chosen_blocks"] >= r["ideal_blocks"]
    routing = None
    if nideal:
        routing = {"requests": nideal, "ideal_blocks": ideal_sum, "chosen_blocks": chosen_sum,
                   "quality": round(chosen_sum / ideal_sum, 4) if ideal_sum else 1.0,
                   "agreement": round(agree / nideal, 4)}
    return hit, per, prompt, ttft, routing


def g3_full_mode(cl, sched):
    """The report's `g3_full`: real when every g3_full target's G3 is a
    tmpfs of its own, else emulated and why."""
    targets = {int(e["target"].split(":")[1]) for e in sched if e["fault"] == "g3_full"}
    if not targets:
        return "not scheduled"
    if cl.g3disk.available is not True:
        return cl.g3disk.available
    if any(k in cl.g3_slow_targets and "wrap" in cl.workers.get(k, {}) for k in targets):
        return "emulated: a g3_full target is also a g3_slow target (its G3 is the slow device)"
    if all("tmpfs_bytes" in cl.workers.get(k, {}) for k in targets):
        sizes = sorted({cl.workers[k]["tmpfs_bytes"] for k in targets})
        return "real: tmpfs of %s bytes as the G3 of worker %s, filled by a ballast" % (
            "/".join(str(x) for x in sizes), ", ".join(str(k) for k in sorted(targets)))
    return "emulated: the G3 mount failed"


def run(a):
    log = (lambda *x: print(*x, file=sys.stderr)) if not a.quiet else (lambda *x: None)
    reqs = load_trace(a.trace, a.limit, a.skip)
    duration = reqs[-1]["t_s"] / a.time_scale
    sched = read_schedule(a.faults, duration, a.workers)
    workdir = a.out or tempfile.mkdtemp(prefix="kvbm-w5-")
    os.makedirs(workdir, exist_ok=True)
    cl = Cluster(a, workdir, log)
    wall0 = time.time()
    watchdog = threading.Timer(a.max_wall, lambda: (log("watchdog: --max-wall %gs passed, stopping"
                                                        % a.max_wall), cl.sup.stop_all(),
                                                    os._exit(3)))
    watchdog.daemon = True
    watchdog.start()
    try:
        log("w5: starting the cluster in %s" % workdir)
        cl.setup_faults_below(sched)
        cl.start_all()
        load = Load(cl, reqs, random.Random(a.seed))
        if a.python_dir:
            sys.path.insert(0, a.python_dir)
        try:
            import kvbm  # noqa: F401
            load.hasher = lambda toks: kvbm.block_hashes(toks, a.block_size, scheme=a.hash)
        except ImportError:
            log("w5: the kvbm Python package is not importable: no ideal-router comparison")
        faults = Faults(cl, sched, load)
        lt = threading.Thread(target=load.run, daemon=True)
        log("w5: replaying %d requests over %.1fs, %d faults" % (len(reqs), duration, len(sched)))
        lt.start()
        while True:
            busy = True if load.t0 is None else faults.step(time.time() - load.t0)
            cl.sup.poll_deaths()
            if not busy and not lt.is_alive():
                break
            time.sleep(0.05)
        lt.join()
        # quiesced: the exact convergence check, for a bounded time
        conv, bad, t_conv = False, [], time.time()
        while True:
            try:
                conv, views, blocks, bad = cl.converged()
            except OSError as e:
                bad = ["convergence check: %s" % e]
            if conv or time.time() - t_conv > a.converge_timeout or \
                    any("not running" in b for b in bad):  # a dead process will not come back
                break
            time.sleep(0.5)
        if not conv and bad and "views" in dir():
            # what disagreed, for the post-mortem (kept with --out / --keep)
            with open(os.path.join(workdir, "index_diff.json"), "w") as f:
                json.dump({"views": {str(r): {str(k): v for k, v in vs.items()}
                                     for r, vs in views.items()},
                           "blocks": {str(k): v for k, v in blocks.items()}}, f)
        # counters from the processes
        metrics_wrong, counted = {}, {}
        for k in cl.workers:
            try:
                st, text = cl.wcall(k, "GET", "/metrics", timeout=10)
                m = prom_metrics(text)
                metrics_wrong[k] = int(sum(v for n, v in m.items() if "wrong_bytes" in n))
                counted["worker%d" % k] = {n: v for n, v in m.items()
                                           if any(s in n for s in ("dropped", "lost", "fail", "error", "skipped"))
                                           and v and not n.endswith(("_bucket", "_sum", "_count"))}
                st, h = cl.wcall(k, "GET", "/health", timeout=5)
                for key in ("events_dropped", "republishes"):  # republishes: clear + re-store rounds
                    if isinstance(h, dict) and key in h:
                        counted["worker%d" % k][key] = h[key]
            except OSError as e:
                counted["worker%d" % k] = {"error": str(e)}
        for r in cl.routers:
            try:
                st, h = call(cl.routers[r]["port"], "GET", "/health", timeout=5)
                counted["router%d" % r] = {"lost_batches": sum(s.get("lost", 0) for s in h.get("sources", [])),
                                           "overflow": sum(s.get("overflow", 0) for s in h.get("sources", []))}
            except (OSError, AttributeError) as e:
                counted["router%d" % r] = {"error": str(e)}
        prom_up = None
        if cl.prom_port:
            try:
                st, ans = call(cl.prom_port, "GET", "/api/v1/query?query=up", timeout=5)
                res = ans["data"]["result"]
                prom_up = {"targets": len(res), "up": sum(1 for x in res if x["value"][1] == "1")}
            except (OSError, KeyError, TypeError):
                prom_up = {"error": "query failed"}
    except StartError as e:
        cl.sup.stop_all()
        print("kvbm cluster: %s" % e, file=sys.stderr)
        return 2
    finally:
        cl.sup.stop_all()
        watchdog.cancel()
    # invariants
    wrong, v_wrong = checks.check_wrong_bytes(load.wrong_bytes, metrics_wrong)
    v_req = checks.check_requests(load.sent, load.ok, load.failed)
    v_mem = checks.check_memory(cl.sup.peaks, cl.sup.budgets())
    v_crash = checks.check_crashes(cl.sup.deaths)
    hit, per, prompt, ttft, routing = summarize(load, cl.workers)
    frep = faults.report()
    v_part = checks.check_partitions(frep)
    violations = v_wrong + v_req + bad + v_mem + v_crash + v_part
    rep = {
        "workload": "W5", "trace": a.trace, "workers": a.workers, "routing": a.routing,
        "g4": not a.no_g4, "time_scale": a.time_scale, "load_s": round(duration, 3),
        "wall_s": round(time.time() - wall0, 3),
        "requests": load.sent, "requests_ok": load.ok, "requests_failed": load.failed,
        "failures": load.failures, "prompt_tokens": prompt, "hit_tokens": hit,
        "hit_rate": round(sum(hit.values()) / prompt, 4) if prompt else None,
        "per_worker": {str(k): v for k, v in per.items()},
        "routing_vs_ideal": routing,
        "ttft_ms": {"p50": checks.percentile(ttft, 50), "p99": checks.percentile(ttft, 99)},
        "wrong_bytes": wrong, "uncounted_losses": checks.uncounted_losses(load.sent, load.ok, load.failed),
        "counted_losses": counted, "index_converged": conv, "index_diffs": bad[:20],
        "crashed": sorted(set(d["process"] for d in checks.crashes(cl.sup.deaths))),
        "deaths": cl.sup.deaths,
        "memory_peak_mb": {p: round(v / 1024.0, 1) for p, v in sorted(cl.sup.peaks.items())},
        "memory_budget_mb": cl.sup.budgets(),
        "faults_injected": sum(1 for f in frep if f["injected"]),
        "faults": frep, "recovery_s": [f["recovery_s"] for f in frep],
        "partition": (cl.partition.describe() if cl.partition_target is not None
                      else "not scheduled"),
        "g3_slow": ("not scheduled" if not cl.g3_slow_targets else
                    "real: ext4 on a loop device, the worker in a blkio cgroup throttled by the fault"
                    if cl.g3slow.available is True and
                    all("wrap" in cl.workers[k] for k in cl.g3_slow_targets if k in cl.workers)
                    else cl.g3slow.available or "emulated: the slow G3 device could not be made"),
        "g3_full": g3_full_mode(cl, sched),
        "prometheus": prom_up, "violations": violations, "workdir": workdir,
    }
    if a.svg:
        svg.write(a.svg, load.records, frep, duration, a.time_scale)
    if a.json:
        print(json.dumps(rep, indent=1, sort_keys=True))
    else:
        print("W5: %d requests (%d ok, %d failed, %d uncounted), hit rate %s, wrong bytes %d, "
              "index converged %s, crashed %s, faults %d, routing quality %s" %
              (load.sent, load.ok, load.failed, rep["uncounted_losses"], rep["hit_rate"], wrong,
               conv, rep["crashed"], rep["faults_injected"],
               routing and routing["quality"]))
        for f in frep:
            print("  %-18s %-10s at %7.2fs recovery %s%s" % (f["fault"], f["target"], f["at_s"],
                  f["recovery_s"], "  (%s)" % f["error"] if "error" in f else ""))
        for v in violations:
            print("  BROKEN: " + v)
    if not a.keep and not a.out:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if violations else 0


def parse(argv):
    p = argparse.ArgumentParser(prog="kvbm cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", default=None, help="Mooncake trace (JSON lines)")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--limit", type=int, default=0, help="requests of the trace (0: all)")
    p.add_argument("--skip", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--faults", default="default", help="default | none | FILE (JSON lines)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--svg")
    p.add_argument("--routing", choices=("kv", "random", "round-robin"), default="kv")
    p.add_argument("--no-g4", action="store_true")
    p.add_argument("--out", help="keep the run's directory here (logs, stores)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--kvbm", default=os.environ.get("KVBM_BIN"))
    p.add_argument("--python-dir", default=os.environ.get("KVBM_PYTHON_DIR"))
    p.add_argument("--hash", choices=("native", "dynamo"), default="native")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--g1", type=int, default=8192)
    p.add_argument("--g2", type=int, default=16384)
    p.add_argument("--g3", type=int, default=32768)
    p.add_argument("--worker-budget-mb", type=int, default=512)
    p.add_argument("--redis-maxmemory-mb", type=int, default=128,
                   help="each Redis node's maxmemory (allkeys-lru); its budget is this + 128")
    p.add_argument("--prometheus-budget-mb", type=int, default=1024)
    p.add_argument("--worker-bin", help="a program run instead of `kvbm worker`, with its flags "
                   "(tests/cluster/fake_worker.py tests the orchestrator)")
    p.add_argument("--worker-arg", action="append", default=[], help="passed to every worker")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--recovery-timeout", type=float, default=30.0)
    p.add_argument("--converge-timeout", type=float, default=30.0)
    p.add_argument("--ideal-period", type=float, default=0.5)
    p.add_argument("--max-wall", type=float, default=1800.0)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if a.trace is None:  # the bundled trace: $KVBM_SHARED_DIR, beside the source tree, or ../shared
        here = os.path.dirname(os.path.abspath(__file__))
        for shared in (os.environ.get("KVBM_SHARED_DIR"), os.path.join(here, "..", "..", "..", "shared"),
                       os.path.join(os.getcwd(), "..", "shared"), os.path.join(os.getcwd(), "shared")):
            t = shared and os.path.join(shared, "data", "mooncake_conversation_trace.jsonl")
            if t and os.path.exists(t):
                a.trace = t
                break
        else:
            raise UsageError("no TRACE given and the bundled trace not found (set KVBM_SHARED_DIR)")
    if not os.path.exists(a.trace):
        raise UsageError("%s: no such trace" % a.trace)
    if not 1 <= a.workers <= 64:
        raise UsageError("--workers must be in 1..64 (the router's limit)")
    if not (a.time_scale > 0 and a.time_scale < 1e6):
        raise UsageError("--time-scale must be > 0")
    if a.limit < 0 or a.skip < 0 or a.block_size < 1:
        raise UsageError("--limit, --skip must be >= 0 and --block-size >= 1")
    if not a.kvbm or not os.access(a.kvbm, os.X_OK):
        raise UsageError("the kvbm binary is not known: run as `kvbm cluster` or give --kvbm")
    for tool in ["nats-server"] + ([] if a.no_g4 else ["redis-server", "redis-cli"]):
        if not shutil.which(tool):
            raise UsageError("%s is not installed (scripts/setup.sh installs it)" % tool)
    return a


def main(argv):
    try:
        a = parse(argv)
        return run(a)
    except UsageError as e:
        print("kvbm cluster: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
