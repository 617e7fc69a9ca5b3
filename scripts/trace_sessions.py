#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""trace_sessions.py: how a Mooncake-format trace's conversations return.

    /usr/bin/python3 scripts/trace_sessions.py [TRACE] [--json]

The policy simulator (docs/areas/policies.md) asks two questions of a
trace that no cache policy can answer by itself: *which* requests will be
continued by a next turn, and *when*. This script measures both, so the
limits of an online policy can be argued from the trace rather than
guessed.

Sessions are not named in Mooncake's format, so they are inferred: a
request's parent is the latest earlier request that shares its longest
prefix of hash ids, if that prefix has at least --min-shared ids (2 by
default: hash id 0 alone is the system prompt every request shares). A
request's turn is its parent's turn + 1 (0 without a parent); the gap is
the time from a parent to its first child.

It reports, per turn number, how many requests there are and the share
that get a next turn; the gap's percentiles; and the correlation of the
log gap with what is known online when the parent runs (its input and
output lengths, its turn, and its own gap from its parent).

Input is treated as hostile: a line that is not a JSON object with an
integer timestamp and a list of integer hash_ids stops the script with
the line number and what is wrong (exit 1); bad arguments exit 2.
"""
import gzip
import json
import math
import sys

USAGE = "usage: trace_sessions.py [TRACE] [--json] [--min-shared N]"
DEFAULT_TRACE = "data/mooncake_conversation_trace.jsonl.gz"


class TraceError(Exception):
    pass


def read_trace(path):
    """The requests as (timestamp_ms, input_length, output_length, hash_ids)."""
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except ValueError as e:
                    raise TraceError("%s:%d: not JSON (%s)" % (path, n, e))
                if not isinstance(r, dict):
                    raise TraceError("%s:%d: not a JSON object" % (path, n))
                ts, h = r.get("timestamp"), r.get("hash_ids")
                if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                    raise TraceError("%s:%d: timestamp is not a non-negative integer" % (path, n))
                if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                      for x in h):
                    raise TraceError("%s:%d: hash_ids is not a list of integers" % (path, n))
                lens = []
                for k in ("input_length", "output_length"):
                    v = r.get(k, 0)
                    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                        raise TraceError("%s:%d: %s is not a non-negative integer" % (path, n, k))
                    lens.append(v)
                out.append((ts, lens[0], lens[1], h))
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceError("%s: %s" % (path, e))
    return out


def parents(reqs, min_shared):
    """Per request: the index of its parent or None. A dict keyed by every
    prefix (as a tuple) of at least min_shared ids: the cost is the sum of
    the squares of the requests' lengths in ids, fine for traces in 512-token
    ids (the bundled one: 288500 ids)."""
    last = {}
    out = []
    for j, (_, _, _, h) in enumerate(reqs):
        p = None
        for k in range(len(h), min_shared - 1, -1):
            p = last.get(tuple(h[:k]))
            if p is not None:
                break
        out.append(p)
        for k in range(min_shared, len(h) + 1):
            last[tuple(h[:k])] = j
    return out


def quantile(sorted_xs, q):
    return sorted_xs[int(q * (len(sorted_xs) - 1))] if sorted_xs else None


def corr(xs, ys):
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs) / n)
    sy = math.sqrt(sum((y - my) ** 2 for y in ys) / n)
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / n / sx / sy


def analyse(reqs, min_shared=2):
    par = parents(reqs, min_shared)
    turn = []
    for p in par:
        turn.append(0 if p is None else turn[p] + 1)
    first_child = {}
    for j, p in enumerate(par):
        if p is not None and p not in first_child:
            first_child[p] = j
    by_turn = {}
    for j, t in enumerate(turn):
        c = by_turn.setdefault(min(t, 7), [0, 0])
        c[0] += 1
        c[1] += j in first_child
    rows = []  # (gap s, input, output, turn, previous gap s or None)
    for p, c in sorted(first_child.items()):
        g = (reqs[c][0] - reqs[p][0]) / 1000.0
        pp = par[p]
        prev = (reqs[p][0] - reqs[pp][0]) / 1000.0 if pp is not None else None
        rows.append((g, reqs[p][1], reqs[p][2], turn[p], prev))
    gaps = sorted(r[0] for r in rows)
    lg = [math.log1p(max(r[0], 0)) for r in rows]
    feats = {}
    for i, name in ((1, "input_length"), (2, "output_length"), (3, "turn")):
        feats[name] = corr(lg, [math.log1p(r[i]) for r in rows])
    withprev = [(math.log1p(max(r[0], 0)), math.log1p(max(r[4], 0))) for r in rows if r[4] is not None]
    feats["previous_gap"] = corr([a for a, _ in withprev], [b for _, b in withprev])
    return {
        "requests": len(reqs),
        "continuations": sum(p is not None for p in par),
        "turns": [{"turn": t if t < 7 else "7+", "requests": n, "next_turn_share": k / n}
                  for t, (n, k) in sorted(by_turn.items())],
        "gap_s": {"p10": quantile(gaps, 0.1), "p50": quantile(gaps, 0.5), "p90": quantile(gaps, 0.9),
                  "n": len(gaps)},
        "log_gap_correlation": feats,
        "previous_gap_n": len(withprev),
    }


def show(a):
    print("%d requests, %d continue an earlier one" % (a["requests"], a["continuations"]))
    print("turn  requests  share with a next turn")
    for t in a["turns"]:
        print("%4s  %8d  %.2f" % (t["turn"], t["requests"], t["next_turn_share"]))
    g = a["gap_s"]
    if g["n"]:
        print("gap to the next turn (s): p10 %.0f, median %.0f, p90 %.0f (n %d)" %
              (g["p10"], g["p50"], g["p90"], g["n"]))
    print("correlation of log gap with log:")
    for k, v in a["log_gap_correlation"].items():
        print("  %-14s %s" % (k, "n/a" if v is None else "%.2f" % v))


def main(argv):
    path, as_json, min_shared = DEFAULT_TRACE, False, 2
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--json":
            as_json = True
        elif a == "--min-shared":
            if i + 1 >= len(argv) or not argv[i + 1].isdigit() or not 1 <= int(argv[i + 1]) <= 1 << 20:
                print("trace_sessions: --min-shared needs an integer in 1..1048576\n" + USAGE,
                      file=sys.stderr)
                return 2
            min_shared = int(argv[i + 1])
            i += 1
        elif a in ("-h", "--help"):
            print(USAGE)
            return 0
        elif a.startswith("-"):
            print("trace_sessions: unknown option %s\n%s" % (a, USAGE), file=sys.stderr)
            return 2
        else:
            path = a
        i += 1
    try:
        a = analyse(read_trace(path), min_shared)
    except TraceError as e:
        print("trace_sessions: %s" % e, file=sys.stderr)
        return 1
    try:
        if as_json:
            json.dump(a, sys.stdout, indent=1)
            print()
        else:
            show(a)
        sys.stdout.flush()
    except BrokenPipeError:  # a reader that stopped early (| head) is not an error
        sys.stdout = None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
