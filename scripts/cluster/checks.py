# SPDX-License-Identifier: Apache-2.0
"""checks.py: the invariants of a W5 cluster run (issue 23), as pure functions.

Each checker takes what the run measured (plain dicts and lists, no
sockets) and returns a list of violations, each a short sentence; an empty
list means the invariant holds. They are pure so that
tests/cluster/test_checks.py can feed them synthetic broken runs (a
mismatched index, wrong bytes, an unscheduled death, a process over its
budget, a request nobody counted) and see each one caught: a checker that
silently passes would make every green W5 run worthless.

Definitions (docs/areas/cluster.md says the same):
- wrong bytes: the sum over workers of `wrong_bytes` as their /generate
  answers report it and as their /metrics report it (the larger of the
  two per worker: a worker killed before its last scrape still has its
  answers counted); must be 0.
- uncounted losses: requests sent minus requests answered "ok" minus
  requests counted failed (an error answer, a refused connection, a
  timeout: each is recorded with its reason); a request whose outcome was
  never recorded is an uncounted loss. Event and G4 losses are counted by
  the processes themselves (workers' events_dropped, routers' lost
  batches, G4 write failures in the workers' metrics): they appear in the
  report's `counted_losses`; an uncounted loss of those shows as a
  mismatched index, which the convergence check catches.
- index converged: for every router replica and every worker, the
  replica's GET /index?worker=ID equals the worker's GET /blocks, tier by
  tier, as sets of hashes (a 404 from the router is an empty index).
- bounded memory: every process's peak resident set (VmHWM, sampled from
  /proc while it ran) is at most its budget.
- crashed: a process that exited without the schedule killing it (any
  exit before the run's stop, or a death by signal other than the stop's
  SIGTERM/SIGKILL at the stop).
"""

TIERS = ("g1", "g2", "g3")


def check_wrong_bytes(from_answers, from_metrics):
    """from_answers / from_metrics: {worker: int}. Returns (total, violations)."""
    total = 0
    bad = []
    for w in sorted(set(from_answers) | set(from_metrics), key=str):
        n = max(int(from_answers.get(w, 0) or 0), int(from_metrics.get(w, 0) or 0))
        total += n
        if n:
            bad.append("worker %s served %d wrong bytes" % (w, n))
    return total, bad


def uncounted_losses(sent, ok, failed_counted):
    """Requests whose outcome nobody recorded (never negative: a request
    counted twice is a bug of the run, reported by check_requests)."""
    return sent - ok - failed_counted


def check_requests(sent, ok, failed_counted):
    n = uncounted_losses(sent, ok, failed_counted)
    if n > 0:
        return ["%d requests sent but neither answered nor counted failed" % n]
    if n < 0:
        return ["%d more outcomes recorded than requests sent" % -n]
    return []


def _as_sets(d):
    return {t: set(int(h) for h in (d or {}).get(t, []) or []) for t in TIERS}


def index_diff(index, blocks):
    """index: a router's /index answer (None: 404), blocks: a worker's
    /blocks. Returns {tier: (missing_in_index, extra_in_index)} for tiers
    that differ."""
    a, b = _as_sets(index), _as_sets(blocks)
    out = {}
    for t in TIERS:
        if a[t] != b[t]:
            out[t] = (len(b[t] - a[t]), len(a[t] - b[t]))
    return out


def check_index(views, blocks):
    """views: {router: {worker: /index answer or None}}, blocks: {worker:
    /blocks answer}. Every router must hold exactly every worker's blocks."""
    bad = []
    for r in sorted(views):
        for w in sorted(blocks, key=str):
            if w not in views[r]:
                bad.append("router %s: worker %s not queried" % (r, w))
                continue
            d = index_diff(views[r][w], blocks[w])
            for t, (miss, extra) in sorted(d.items()):
                bad.append("router %s, worker %s, %s: %d blocks missing, %d extra" %
                           (r, w, t, miss, extra))
    return bad


def check_memory(peaks_kb, budgets_mb):
    """peaks_kb: {process: VmHWM kB}, budgets_mb: {process: MB}."""
    bad = []
    for p in sorted(peaks_kb):
        b = budgets_mb.get(p)
        if b is None:
            bad.append("process %s has no memory budget" % p)
        elif peaks_kb[p] > b * 1024:
            bad.append("process %s peaked at %.1f MB, budget %d MB" % (p, peaks_kb[p] / 1024.0, b))
    return bad


def check_crashes(deaths):
    """deaths: [{"process", "scheduled": bool, "at_stop": bool, "rc",
    "clean_rcs" (optional)}]. A death is a crash unless the schedule killed
    it, or the stop ended it with one of its clean exits (by default 0 or
    the stop's own -15/-9; nats-server also exits 1 on SIGTERM)."""
    bad = []
    for d in crashes(deaths):
        bad.append("process %s died unscheduled (rc %s%s)" %
                   (d["process"], d.get("rc"), ", at stop" if d.get("at_stop") else ""))
    return bad


def crashes(deaths):
    """The deaths check_crashes counts as crashes."""
    out = []
    for d in deaths:
        if d.get("scheduled"):
            continue
        if d.get("at_stop") and d.get("rc") in d.get("clean_rcs", (0, -15, -9)):
            continue
        out.append(d)
    return out


def percentile(xs, p):
    """Nearest-rank percentile of a list (None when empty)."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


def prefix_overlap(hashes, held):
    """Blocks of the request's chain, from its start, that a set holds."""
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


def check_partitions(faults):
    """faults: the report's fault list. For each partition that was
    injected, `window` holds how the worker's own counters moved while it
    was cut off from Redis (netfaults.py; cluster.py g4_counts): ok (G4
    writes done and blocks onboarded from G4), counted (G4 writes and
    lookups that failed or were skipped, each counted), computed (prompt
    tokens it computed), wrong_bytes; counted_by_recovery: counted again,
    up to when G4 worked for it again (the writes cut off fail at their
    deadline, often after the heal). Through a partition no G4 write can
    succeed, so ok > 0 is a write the worker believes done and Redis never
    got: a loss nobody counts. A worker that computed blocks (so had G4
    writes to make) without counting a single one failed or skipped lost
    them silently. Wrong bytes are wrong bytes."""
    bad = []
    for f in faults:
        if f.get("fault") != "partition" or not f.get("injected"):
            continue
        w = f.get("window")
        if not isinstance(w, dict):
            bad.append("partition of %s: no counters read from the worker" % f.get("target"))
            continue
        if w.get("ok", 0) > 0:
            bad.append("partition of %s: %d G4 writes or onboards reported done while Redis "
                       "was unreachable (uncounted losses)" % (f.get("target"), w["ok"]))
        if w.get("computed", 0) > 0 and max(w.get("counted", 0),
                                             w.get("counted_by_recovery", 0)) <= 0:
            bad.append("partition of %s: %d tokens computed, no G4 write counted failed or "
                       "skipped (lost uncounted)" % (f.get("target"), w["computed"]))
        if w.get("wrong_bytes", 0) > 0:
            bad.append("partition of %s: %d wrong bytes served during it" %
                       (f.get("target"), w["wrong_bytes"]))
    return bad
