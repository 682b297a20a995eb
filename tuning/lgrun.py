"""Running loadgen and reading its reports, for tuning/sweep.py, tuning/ab.py and
tuning/scaling.py (and the summary of proxy/bench/ab.sh): the binary, one run to a JSON
file, the flat figures of a report, medians and spreads, and small hand-written SVG
charts (bar panels, lines, an HdrHistogram-style percentile plot) with readable axes.

Not a command; import it (the tools put tuning/ on sys.path).
"""

import json
import math
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flat figures of one result, in CSV order.
FIGURES = [
    "decisions_per_s",
    "client_cpu_us_per_decision",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "datagrams_per_decision",
    "client_cores_used",
    "responder_cores_used",
    "timeouts",
    "host_steal_ms",
]
# What the run was, read from the report (never assumed by the tools).
FACTS = ["client", "io_backend", "placement", "balanced", "commit", "dirty"]


def loadgen_binary(path, build=True):
    """`path`, or target/release/loadgen (built first unless build is False)."""
    if path:
        return path
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    if build:
        subprocess.run(["cargo", "build", "--release", "-p", "loadgen"], cwd=ROOT, check=True)
    return os.path.join(target, "release", "loadgen")


def run(cmd, json_path):
    """Runs one loadgen command line (`--json json_path` appended); returns (report or
    None, exit status, the tail of its stderr)."""
    r = subprocess.run(cmd + ["--json", json_path], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    try:
        with open(json_path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = None
    return doc, r.returncode, r.stderr[-600:]


def figures(doc, index=0):
    """The flat figures and facts of result `index` of a loadgen report."""
    res = doc["results"][index]
    lat = res["latency_us"]
    machine = doc.get("machine") or {}
    io = res.get("io") or {}
    return {
        "client": res["client"],
        "io_backend": io.get("backend") or "",
        # where the engine's core ran; the other clients have no engine core
        "placement": doc["parameters"].get("engine_core", "") if res["client"] == "engine" else "n/a",
        "balanced": res["balanced"],
        "commit": machine.get("commit", "unknown"),
        "dirty": machine.get("dirty"),
        "decisions_per_s": round(res["decisions_per_s"], 1),
        "client_cpu_us_per_decision": res["client_cpu_us_per_decision"],
        "p50_us": lat["p50"],
        "p99_us": lat["p99"],
        "p999_us": lat["p99.9"],
        "max_us": lat["max"],
        "datagrams_per_decision": res["datagrams_per_decision"],
        "client_cores_used": round(res["client_cores_used"], 3),
        "responder_cores_used": round(res.get("responder_cores_used") or 0.0, 3),
        "timeouts": res["outcomes_window"]["timeout"],
        "host_steal_ms": res.get("host_steal_ms"),
    }


def median(values):
    vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(vals) if vals else None


def spread(values):
    """(min, max) of the numbers among `values`, or (None, None)."""
    vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return (min(vals), max(vals)) if vals else (None, None)


def short_commit(rows):
    """`abc1234` (`+dirty`) of the commits the rows ran on, joined when several."""
    seen = []
    for r in rows:
        c = str(r.get("commit") or "unknown")
        tag = c[:7] + ("+dirty" if r.get("dirty") in (True, "True", "true") else "")
        if tag not in seen:
            seen.append(tag)
    return ", ".join(seen) or "unknown"


# ---- numbers on axes ----------------------------------------------------------------

def fmt(v):
    """Readable axis or bar text: 106,900 -> 107k, 1,250,000 -> 1.25M, 4.213 -> 4.21."""
    if v is None:
        return "n/a"
    a = abs(v)
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            s = f"{v / div:.3g}"
            return s + unit
    if a == 0:
        return "0"
    return f"{v:.3g}"


def ticks(vmax, n=5):
    """Round tick values from 0 to at least vmax (steps of 1, 2 or 5 x 10^k)."""
    if not vmax or vmax <= 0:
        return [0, 1]
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    out, v = [], 0.0
    while v < vmax + step * 0.5 and len(out) < 12:
        out.append(v)
        v += step
    if out[-1] < vmax:
        out.append(out[-1] + step)
    return out


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


COLORS = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb",
          "#000000"]


def svg_bars(path, title, labels, panels):
    """Bar panels stacked one above the other (one per metric: (name, values, color)) over
    the same points; the points' labels once, under the last panel, slanted, with room
    for the longest (the last one is not cut)."""
    n = max(1, len(labels))
    bw = max(22, min(60, 900 // n))
    diag = 0.7071 * 5.6 * max((len(lb) for lb in labels), default=1)  # a slanted label's reach
    left, top, ph, gap = 70, 50, 200, 46
    right = max(30, diag + 12 - bw / 2)
    width = int(left + n * bw + right)
    bottom = top + len(panels) * (ph + gap) - gap
    height = int(bottom + diag + 30)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="24" font-size="15" text-anchor="middle">{esc(title)}</text>']
    for k, (name, vals, color) in enumerate(panels):
        base = top + k * (ph + gap) + ph
        vals = [v if isinstance(v, (int, float)) else 0 for v in vals]
        tk = ticks(max(vals + [0]))
        vmax = tk[-1] or 1
        out.append(f'<text x="{left}" y="{base - ph - 6}" font-size="13">{esc(name)}</text>')
        for t in tk:
            y = base - (ph - 24) * t / vmax
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + n * bw}" y2="{y:.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
        out.append(f'<line x1="{left}" y1="{base}" x2="{left + n * bw}" y2="{base}" stroke="black"/>')
        for i, v in enumerate(vals):
            h = (ph - 24) * v / vmax
            x = left + i * bw + 3
            out.append(f'<rect x="{x}" y="{base - h:.1f}" width="{bw - 6}" height="{h:.1f}" fill="{color}"/>')
            out.append(f'<text x="{x + (bw - 6) / 2:.1f}" y="{base - h - 3:.1f}" text-anchor="middle" '
                       f'font-size="9">{fmt(v)}</text>')
    for i, lb in enumerate(labels):
        lx = left + i * bw + bw / 2
        out.append(f'<text transform="translate({lx:.1f},{bottom + 12}) rotate(45)" font-size="10">'
                   f'{esc(lb)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def svg_lines(path, title, x_label, panels, x_values):
    """Line panels side by side, each (name, [(series name, values, color)]), over the
    same numeric x values (e.g. engine cores)."""
    pw, ph = 380, 260
    width, height = len(panels) * pw + 20, ph + 130
    xmin, xmax = min(x_values), max(x_values)
    xspan = (xmax - xmin) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="22" font-size="15" text-anchor="middle">{esc(title)}</text>']
    for k, (name, series) in enumerate(panels):
        x0, top = 10 + k * pw, 50
        base, left, right = top + ph, x0 + 60, x0 + pw - 20
        allv = [v for _, vals, _ in series for v in vals if isinstance(v, (int, float))]
        tk = ticks(max(allv + [0]))
        vmax = tk[-1] or 1
        out.append(f'<text x="{x0 + pw / 2:.0f}" y="{top - 8}" font-size="13" text-anchor="middle">{esc(name)}</text>')
        for t in tk:
            y = base - (ph - 20) * t / vmax
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
        px = lambda x: left + 10 + (right - left - 20) * (x - xmin) / xspan
        for x in x_values:
            out.append(f'<text x="{px(x):.1f}" y="{base + 16}" text-anchor="middle">{fmt(x)}</text>')
        out.append(f'<text x="{(left + right) / 2:.0f}" y="{base + 34}" text-anchor="middle">{esc(x_label)}</text>')
        out.append(f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="black"/>')
        for j, (sname, vals, color) in enumerate(series):
            pts = [(px(x), base - (ph - 20) * v / vmax) for x, v in zip(x_values, vals)
                   if isinstance(v, (int, float))]
            if pts:
                out.append('<polyline fill="none" stroke-width="2" stroke="%s" points="%s"/>' % (
                    color, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
                for a, b in pts:
                    out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
            out.append(f'<text x="{left + 8}" y="{base + 54 + 14 * j}" fill="{color}">{esc(sname)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def read_hgrm(path):
    """(value ms, percentile) pairs of an .hgrm file (loadgen --hgrm: values in ms)."""
    pts = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3 or line.startswith("#"):
                continue
            try:
                pts.append((float(parts[0]), float(parts[1])))
            except ValueError:
                continue
    return pts


def svg_percentiles(path, title, curves):
    """HdrHistogram-style latency by percentile: x = 1/(1-percentile) on a log scale
    (labels 0%, 90%, 99%, ...), y = latency in µs; one line per (name, hgrm points)."""
    width, height, left, right, top, base = 900, 520, 80, 700, 50, 440
    allq = [q for _, pts in curves for _, q in pts if q < 1.0]
    decades = max(2, min(6, math.ceil(math.log10(1 / max(1e-6, 1 - max(allq + [0.99]))))))
    allv = [v * 1000 for _, pts in curves for v, _ in pts]
    tk = ticks(max(allv + [0]))
    vmax = tk[-1] or 1
    px = lambda q: left + (right - left) * min(decades, math.log10(1 / max(1e-9, 1 - q))) / decades
    py = lambda us: base - (base - top) * us / vmax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="24" font-size="15" text-anchor="middle">{esc(title)}</text>']
    for t in tk:
        out.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{right}" y2="{py(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    for d in range(decades + 1):
        q = 1 - 10 ** -d
        x = left + (right - left) * d / decades
        label = "0%" if d == 0 else f"{q * 100:.{max(0, d - 2)}f}%"
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{base + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{(left + right) / 2}" y="{base + 36}" text-anchor="middle">percentile</text>')
    out.append(f'<text transform="translate(20,{(top + base) / 2}) rotate(-90)" text-anchor="middle">latency µs</text>')
    out.append(f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="black"/>')
    for j, (name, pts) in enumerate(curves):
        color = COLORS[j % len(COLORS)]
        line = [(px(q), py(v * 1000)) for v, q in pts if q < 1.0]
        if line:
            out.append('<polyline fill="none" stroke-width="1.5" stroke="%s" points="%s"/>' % (
                color, " ".join(f"{a:.1f},{b:.1f}" for a, b in line)))
        out.append(f'<text x="{right + 12}" y="{top + 14 * j + 4}" fill="{color}" font-size="10">{esc(name)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def log(msg):
    print(msg, file=sys.stderr, flush=True)
