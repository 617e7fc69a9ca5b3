#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm replay's metrics endpoint and picture: W1 serves its own endpoint
# (the replay's counters and the pool's), switched on by --metrics-port or
# by Dynamo's DYN_KVBM_METRICS; --plot draws hit rate and occupancy whose
# last points are the summary's numbers; bad settings are refused.
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
exec /usr/bin/python3 - "$KVBM_BIN" <<'PY'
import json, os, re, signal, socket, subprocess, sys, tempfile, time, urllib.request
import xml.etree.ElementTree as ET

KVBM = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="kvbm-replay-cli-")
SVG = "{http://www.w3.org/2000/svg}"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def held(args, env=None, port_file=None):
    """Runs a replay with --hold; returns (process, summary, port)."""
    out = os.path.join(tmp, "out%d" % time.monotonic_ns())
    p = subprocess.Popen([KVBM, "replay"] + args + ["--json", "--no-progress", "--hold"],
                         stdout=open(out, "w"), stderr=subprocess.PIPE,
                         env=dict(os.environ, **(env or {})))
    t0 = time.time()
    while not (os.path.exists(out) and open(out).read().strip()):
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() - t0 < 120, "no summary"
        time.sleep(0.05)
    summary = json.loads(open(out).read())
    port = int(open(port_file).read()) if port_file else None
    return p, summary, port


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return r.read().decode()


def value(page, series):
    m = re.search(r"^%s (\S+)$" % re.escape(series), page, re.M)
    assert m, series + " missing"
    return float(m.group(1))


def stop(p):
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0


def plot_check(path, summary, tiers):
    root = ET.parse(path).getroot()
    lines = root.findall(SVG + "polyline")
    assert len(lines) == 2 + len(tiers), len(lines)
    # the first panel: y = 60 + 220 - 220 * rate; the cumulative rate is
    # the second line drawn, its last point the summary's hit rate
    pts = [tuple(map(float, q.split(","))) for q in lines[1].get("points").split()]
    assert 2 <= len(pts) <= 1002, len(pts)
    assert abs(pts[-1][0] - 830.0) < 0.06, pts[-1]
    rate = (280.0 - pts[-1][1]) / 220.0
    assert abs(rate - summary["hit_rate"]) < 0.001, (rate, summary["hit_rate"])
    xs = [x for x, _ in pts]
    assert xs == sorted(xs)
    for line in lines[2:]:  # occupancy in [0, 1] inside the second panel
        for q in line.get("points").split():
            x, y = map(float, q.split(","))
            assert 360.0 - 0.06 <= y <= 580.0 + 0.06, y
    text = ET.tostring(root).decode()
    for t in tiers:
        assert ">%s<" % t in text, t


# W1 with its own endpoint and a picture
pf = os.path.join(tmp, "w1.port")
p, s, port = held(["--limit", "300", "--metrics-port", "0", "--metrics-host", "127.0.0.1",
                   "--metrics-port-file", pf, "--plot", os.path.join(tmp, "w1.svg")], port_file=pf)
page = scrape(port)
assert value(page, "kvbm_replay_finished") == 1
assert value(page, "kvbm_replay_requests_done_total") == s["requests"]
assert value(page, "kvbm_replay_prompt_tokens_total") == s["prompt_tokens"]
assert value(page, "kvbm_replay_hit_tokens_total") == s["hit_tokens"]
assert value(page, 'kvbm_pool_allocated_blocks_total{tier="G1"}') == s["blocks_allocated"]
assert value(page, 'kvbm_pool_capacity_blocks{tier="G1"}') == s["capacity"]
doc = open(os.path.join(os.environ["KVBM_SOURCE_DIR"], "docs/areas/observability.md")).read()
for fam in re.findall(r"^# TYPE (\S+) ", page, re.M):
    assert "| `%s` |" % fam in doc, fam + " is not in docs/areas/observability.md"
stop(p)
plot_check(os.path.join(tmp, "w1.svg"), s, ["G1"])

# W2: the picture has every tier
out = subprocess.run([KVBM, "replay", "--limit", "200", "--capacity", "8192", "--g2-blocks", "16384",
                      "--g3-blocks", "16384", "--g3-dir", tmp, "--json", "--no-progress", "--plot",
                      os.path.join(tmp, "w2.svg")], capture_output=True, check=True)
plot_check(os.path.join(tmp, "w2.svg"), json.loads(out.stdout), ["G1", "G2", "G3"])

# switched on the way Dynamo does it
port = free_port()
p, s, _ = held(["--limit", "50"], env={"DYN_KVBM_METRICS": "true", "DYN_KVBM_METRICS_PORT": str(port),
                                       "KVBM_METRICS_HOST": "127.0.0.1"})
assert value(scrape(port), "kvbm_replay_prompt_tokens_total") == s["prompt_tokens"]
stop(p)

# refusals
def refused(args, env, rc, msg):
    r = subprocess.run([KVBM, "replay", "--limit", "5", "--no-progress"] + args, capture_output=True,
                       env=dict(os.environ, **env))
    assert r.returncode == rc and msg in r.stderr.decode(), (args, env, r.returncode, r.stderr)

refused(["--metrics-port", "70000"], {}, 2, "--metrics-port")
refused([], {"DYN_KVBM_METRICS": "maybe"}, 2, "DYN_KVBM_METRICS")
refused([], {"DYN_KVBM_METRICS_PORT": "-1"}, 2, "DYN_KVBM_METRICS_PORT")
refused(["--metrics-port", "0", "--metrics-host", "localhost"], {}, 1, "IPv4")
refused(["--plot", os.path.join(tmp, "no", "such", "dir.svg")], {}, 1, "--plot")
refused(["--g2-blocks", "64", "--metrics-port", "0", "--metrics-host", "nowhere"], {}, 2, "IPv4")
subprocess.run(["rm", "-rf", tmp])
print("kvbm replay: metrics and plot ok")
PY
