#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""fake_worker.py: a stand-in for `kvbm worker`, for testing the orchestrator.

tests/cluster/test_orchestrator.sh runs `kvbm cluster --worker-bin` this file,
so that the orchestrator's own machinery (starting and stopping a dozen
servers, the open-loop load, every fault of the schedule, the recovery probes,
the convergence check against the routers' GET /index, the report) is tested
without the engine simulator and in a few seconds. It speaks the worker
contract of docs/areas/cluster.md, minimally: a G1 of --g1 blocks with LRU
eviction (no other tier, no bytes: wrong_bytes is always 0), native block
hashes from kvbm's Python package (what `kvbm router --hash native` computes
from token ids), KV events in vLLM's wire format published straight to
JetStream's subject with a Kvbm-Seq header, a clear and a full BlockStored at
start, after publishing resumes, and after NATS comes back (events that
could not be sent are counted in events_dropped, as the contract asks).
--fault-lie-blocks makes /blocks list a block it never published: a broken
worker whose run must fail the convergence invariant.

G4, minimally: with --g4 redis+cluster://HOST:PORT,..., each request's
computed blocks are "written" to G4 by opening a TCP connection to the first
node (0.2 s deadline): counted done (kvbm_offload_blocks_total{tier="G4"})
when it connects, counted failed (kvbm_offload_skipped_total{tier="G4",
cause="io"}) when it does not, as the real worker's manager counts them. So
a partition between this worker and Redis shows in its counters as in the
real worker's. Two broken workers the partition check must catch:
--fault-g4-lie counts a write that could not connect as done (a lost write
nobody counts), --fault-partition-wrong-bytes answers wrong bytes while
Redis is unreachable.
"""
import argparse
import collections
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack

p = argparse.ArgumentParser()
p.add_argument("--id", type=int, required=True)
p.add_argument("--listen", required=True)
p.add_argument("--events")
p.add_argument("--block-size", type=int, default=16)
p.add_argument("--g1", type=int, default=4096)
p.add_argument("--time-scale", type=float, default=1.0)
p.add_argument("--python-dir", default=os.environ.get("KVBM_PYTHON_DIR"))
p.add_argument("--fault-lie-blocks", action="store_true")
p.add_argument("--g4")
p.add_argument("--fault-g4-lie", action="store_true")
p.add_argument("--fault-partition-wrong-bytes", action="store_true")
a, _ = p.parse_known_args()
if a.python_dir:
    sys.path.insert(0, a.python_dir)
import kvbm  # noqa: E402

lock = threading.RLock()
held = collections.OrderedDict()  # hash -> parent (LRU order)
state = {"publish": True, "dropped": 0, "seq": 0, "sock": None, "resync": True,
         "g4_ok": 0, "g4_failed": 0, "prefill_tokens": 0, "wrong_bytes": 0}


def g4_write(blocks):
    """Counts `blocks` G4 writes done or failed: done when the first Redis
    node accepts a connection within 0.2 s. Returns whether it did."""
    if not a.g4 or blocks <= 0:
        return True
    host, port = a.g4.split("://", 1)[1].split(",")[0].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.2).close()
        ok = True
    except OSError:
        ok = False
    with lock:
        if ok or a.fault_g4_lie:
            state["g4_ok"] += blocks
        else:
            state["g4_failed"] += blocks
    return ok


def nats_connect():
    url = a.events[len("nats://"):]
    hostport, stream, subject = url.split("/", 2)
    host, port = hostport.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=2)
    s.recv(4096)
    s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n')
    return s, subject.encode()


def send(events):
    """One batch; False (and counted) when it could not go out."""
    if not a.events:
        return True
    if not state["publish"]:
        state["dropped"] += len(events)
        return False
    try:
        if state["sock"] is None:
            state["sock"] = nats_connect()
        s, subject = state["sock"]
        seq = state["seq"]
        payload = msgpack.packb([time.time(), events, 0])
        hdr = b"NATS/1.0\r\nKvbm-Seq: %d\r\n\r\n" % seq
        s.sendall(b"HPUB %s %d %d\r\n" % (subject, len(hdr), len(hdr) + len(payload)) + hdr +
                  payload + b"\r\n")
        state["seq"] += 1
        return True
    except OSError:
        state["sock"] = None
        state["dropped"] += len(events)
        state["resync"] = True
        return False


def resync():
    """AllBlocksCleared, then everything held (oldest first)."""
    evs = [["AllBlocksCleared"]]
    for h, parent in held.items():
        evs.append(["BlockStored", [h], parent, [], a.block_size, None, "GPU"])
    if send(evs):
        state["resync"] = False


def generate(body):
    ids = body["hash_ids"]
    n = min(body["input_length"], 512 * len(ids))
    toks = [ids[i // 512] * 512 + i % 512 for i in range(n)]
    hs = kvbm.block_hashes(toks, a.block_size)
    with lock:
        if state["resync"] and state["publish"]:
            resync()
        hit = 0
        for h in hs:
            if h not in held:
                break
            hit += 1
            held.move_to_end(h)
        evs = []
        for k in range(hit, len(hs)):
            while len(held) >= a.g1:
                old, _ = held.popitem(last=False)
                evs.append(["BlockRemoved", [old], "GPU"])
            held[hs[k]] = hs[k - 1] if k else None
            evs.append(["BlockStored", [hs[k]], hs[k - 1] if k else None, [], a.block_size, None, "GPU"])
        if evs:
            send(evs)
        state["prefill_tokens"] += n - hit * a.block_size
    time.sleep(0.002 * (len(hs) - hit) / a.time_scale)
    wrong = 0
    if not g4_write(len(hs) - hit) and a.fault_partition_wrong_bytes:
        wrong = 1
        with lock:
            state["wrong_bytes"] += 1
    return {"request_id": body.get("request_id"), "worker": a.id, "status": "ok",
            "prompt_tokens": n, "hit_tokens": {"g1": hit * a.block_size, "g2": 0, "g3": 0, "g4": 0},
            "prefill_tokens": n - hit * a.block_size, "onboarded_blocks": 0,
            "ttft_ms": 0.1 * (len(hs) - hit), "e2e_ms": 1.0, "wrong_bytes": wrong}


class H(BaseHTTPRequestHandler):
    def log_message(self, *x):
        pass

    def answer(self, obj, code=200, ctype="application/json"):
        data = (json.dumps(obj) if ctype == "application/json" else obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def do_GET(self):
        if self.path == "/health":
            self.answer({"status": "ok", "events_dropped": state["dropped"]})
        elif self.path == "/blocks":
            with lock:
                g1 = sorted(held)
            if a.fault_lie_blocks:
                g1.append(12345)
            self.answer({"worker": a.id, "block_size": a.block_size, "g1": g1, "g2": [], "g3": []})
        elif self.path == "/metrics":
            with lock:
                text = ("kvbm_worker_wrong_bytes_total %d\nkvbm_worker_events_dropped_total %d\n"
                        "kvbm_worker_prefill_tokens_total{worker=\"%d\"} %d\n"
                        "kvbm_offload_blocks_total{worker=\"%d\",tier=\"G4\"} %d\n"
                        "kvbm_offload_skipped_total{worker=\"%d\",tier=\"G4\",cause=\"io\"} %d\n" %
                        (state["wrong_bytes"], state["dropped"], a.id, state["prefill_tokens"],
                         a.id, state["g4_ok"], a.id, state["g4_failed"]))
            self.answer(text, ctype="text/plain")
        else:
            self.answer({"error": "unknown path"}, 404)

    def do_POST(self):
        if self.path == "/generate":
            self.answer(generate(self.body()))
        elif self.path == "/admin/fault":
            b = self.body()
            with lock:
                if "publish" in b:
                    state["publish"] = bool(b["publish"])
                    if state["publish"]:
                        resync()
                    else:
                        state["resync"] = True
            self.answer({"ok": True})
        else:
            self.answer({"error": "unknown path"}, 404)


def resync_loop():
    while True:
        time.sleep(0.2)
        with lock:
            if state["resync"] and state["publish"]:
                resync()


host, port = a.listen.rsplit(":", 1)
srv = ThreadingHTTPServer((host, int(port)), H)
with lock:
    resync()
threading.Thread(target=resync_loop, daemon=True).start()
srv.serve_forever()
