# SPDX-License-Identifier: Apache-2.0
"""svg.py: a W5 run over time, as one SVG written by hand.

Two panels share the time axis (seconds of the scaled run): the hit rate
(hit tokens / prompt tokens of the requests sent in each bucket) and the
routing quality (blocks of overlap of the chosen worker / the ideal
router's best, per bucket; absent without the ideal). Each fault is a
vertical red line at its start with its name, and its recovery a shaded
band from its start to the moment it recovered (to the right edge when it
did not). Written directly (no plotting package: the orchestrator is
standard library only); the C side has src/workload/svg.c for its own
figures.
"""

W, H, PAD, PANEL = 900, 540, 50, 150


def _esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def buckets(records, duration, n=60):
    """[(t_mid, hit_rate or None, quality or None)] over n buckets."""
    d = max(duration, 1e-6)
    acc = [[0, 0, 0, 0] for _ in range(n)]  # hit, prompt, chosen, ideal
    for r in records:
        if r.get("status") != "ok":
            continue
        b = min(n - 1, max(0, int(r["t"] / d * n)))
        acc[b][0] += sum(int(v or 0) for v in (r.get("hit") or {}).values())
        acc[b][1] += r["prompt"]
        if "ideal_blocks" in r:
            acc[b][2] += r["chosen_blocks"]
            acc[b][3] += r["ideal_blocks"]
    out = []
    for i, (h, p, c, ib) in enumerate(acc):
        out.append(((i + 0.5) * d / n, h / p if p else None,
                    (c / ib if ib else 1.0) if p and any("ideal_blocks" in r for r in records) else None))
    return out


def _line(points, x0, y0, dur, color):
    segs, cur = [], []
    for t, v in points:
        if v is None:
            if cur:
                segs.append(cur)
            cur = []
            continue
        x = x0 + t / dur * (W - 2 * PAD)
        y = y0 + PANEL - min(1.0, max(0.0, v)) * PANEL
        cur.append("%.1f,%.1f" % (x, y))
    if cur:
        segs.append(cur)
    return "".join('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>\n' %
                   (color, " ".join(s)) for s in segs)


def write(path, records, faults, duration, time_scale):
    dur = max(duration, 1e-6)
    pts = buckets(records, dur)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">\n' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>\n',
           '<text x="%d" y="18" font-size="14">W5 cluster run (time-scale %g): hit rate and routing '
           'quality vs the ideal router, faults</text>\n' % (PAD, time_scale)]
    panels = [("hit rate", 1, PAD, "#1f77b4"), ("routing quality (chosen / ideal overlap)", 2,
                                                  PAD + PANEL + 40, "#2ca02c")]
    for title, idx, y0, color in panels:
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>\n' %
                   (PAD, y0, W - 2 * PAD, PANEL))
        out.append('<text x="%d" y="%d">%s</text>\n' % (PAD + 4, y0 + 12, _esc(title)))
        for v in (0, 0.5, 1):
            y = y0 + PANEL - v * PANEL
            out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>\n' % (PAD - 4, y + 4, v))
        out.append(_line([(q[0], q[idx]) for q in pts], PAD, y0, dur, color))
    ybot = PAD + 2 * PANEL + 40
    for f in faults:
        t = f.get("at_s", 0)
        x = PAD + min(1.0, t / dur) * (W - 2 * PAD)
        rec = f.get("outage_s")
        x1 = PAD + min(1.0, (t + rec) / dur) * (W - 2 * PAD) if rec is not None else W - PAD
        out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" opacity="0.12"/>\n' %
                   (x, PAD, max(1.0, x1 - x), ybot - PAD, "#d62728" if rec is None else "#ff7f0e"))
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d62728"/>\n' % (x, PAD, x, ybot))
        out.append('<text x="%.1f" y="%d" transform="rotate(60 %.1f %d)" fill="#d62728">%s %s</text>\n'
                   % (x, ybot + 12, x, ybot + 12, _esc(f["fault"]),
                      "(%.2fs)" % rec if rec is not None else "(no recovery)"))
    for i in range(6):
        t = dur * i / 5
        x = PAD + i / 5 * (W - 2 * PAD)
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%.0fs</text>\n' %
                   (x, PAD + PANEL + 14, t))
    out.append("</svg>\n")
    with open(path, "w") as f:
        f.write("".join(out))
