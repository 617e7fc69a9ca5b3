#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What one answer of `kvbm router` costs, measured so that the machine's
other load moves it little: N requests sent one at a time over 50 keep-alive
connections (8 declared workers, block size 16), and either

  --cpu        the router's CPU time (user + system, /proc) per answer, or
  --callgrind  the instructions it executes per answer in user space
               (valgrind --tool=callgrind; a run with no requests is
               subtracted, so start-up does not count).

/route bodies carry 1,024 token ids (64 prompts sharing their first half),
/health is the plain GET. Compare two builds by running this on each.

usage: router_daemon_cost.py KVBM_BINARY [--cpu | --callgrind] [--path /route] [-n 2000]
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import time


def bodies(path):
    if path != "/route":
        return [b"GET %s HTTP/1.1\r\n\r\n" % path.encode()]
    r, out = random.Random(1), []
    for _ in range(64):
        toks = [t * 7 + 1 if t < 512 else r.randrange(32000) for t in range(1024)]
        b = json.dumps({"token_ids": toks}, separators=(",", ":")).encode()
        out.append(b"POST /route HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    return out


def start(kvbm, wrap):
    d = tempfile.mkdtemp()
    pf = os.path.join(d, "port")
    args = wrap(d) + [kvbm, "router", "--listen", "127.0.0.1:0", "--port-file", pf, "--block-size", "16"]
    for w in range(1, 9):
        args += ["--worker", str(w)]
    p = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not (os.path.exists(pf) and open(pf).read().strip()):
        assert p.poll() is None and time.time() - t0 < 120, "router did not start"
        time.sleep(0.05)
    return p, int(open(pf).read()), d


def drive(port, reqs, n, conns=50):
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
    for i in range(n):
        s = socks[i % conns]
        s.sendall(reqs[i % len(reqs)])
        buf = b""
        while True:
            got = s.recv(65536)
            assert got, "connection closed"
            buf += got
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep and len(rest) >= int(re.search(rb"Content-Length: (\d+)", head).group(1)):
                break
        assert buf.startswith(b"HTTP/1.1 200"), buf[:80]
    for s in socks:
        s.close()


def cpu_seconds(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvbm")
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--path", default="/route")
    ap.add_argument("-n", type=int, default=2000)
    a = ap.parse_args()
    reqs = bodies(a.path)
    if a.callgrind:
        def run(n):
            p, port, d = start(a.kvbm, lambda d: ["valgrind", "--tool=callgrind",
                                                  "--callgrind-out-file=/dev/null",
                                                  "--log-file=" + os.path.join(d, "vg")])
            drive(port, reqs, n)
            time.sleep(0.3)
            p.send_signal(signal.SIGTERM)
            p.wait()
            return int(re.search(r"Collected : (\d+)", open(os.path.join(d, "vg")).read()).group(1))
        base = run(0)
        print("%s %s: %.0f instructions per answer (user space)" % (a.kvbm, a.path, (run(a.n) - base) / a.n))
    else:
        p, port, _ = start(a.kvbm, lambda d: [])
        c0 = cpu_seconds(p.pid)
        drive(port, reqs, a.n)
        c1 = cpu_seconds(p.pid)
        p.send_signal(signal.SIGTERM)
        p.wait()
        print("%s %s: %.1f us of router CPU per answer" % (a.kvbm, a.path, (c1 - c0) * 1e6 / a.n))


if __name__ == "__main__":
    main()
