#!/usr/bin/env python3
"""Sweep runner over loadgen parameters.

Runs loadgen once per point of the grid (cartesian product of the lists given),
collects the JSON figures into a CSV and draws an SVG (matplotlib when present,
otherwise a small hand-written SVG).

Example (a short sweep, ~3 s per point):

    tuning/sweep.py --client engine,raw --in-flight 16,64,256 --duration 2 \
        --out /tmp/sweep

Lists are comma separated; core lists use ';' between alternatives
(--client-cores '0;0,1'). In --rate, "closed" stands for a closed-loop point.

The I/O axes: --io (auto, uring, mmsg), --gso (on, off), --reply-batch (on, off).
Core placement: --engine-core (pinned, hosted, auto).
--preset io sweeps backend x GSO x reply batching x {closed loop, 1k, 10k, 50k/s}:

    tuning/sweep.py --preset io --client engine,official,raw --duration 3 --out /tmp/io
"""

import argparse
import csv
import itertools
import json
import os
import subprocess
import sys
import tempfile

FIELDS = [
    "decisions_per_s",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "client_cpu_us_per_decision",
    "datagrams_per_decision",
    "client_cores_used",
    "io_backend",
    "datagrams_per_send",
    "datagrams_per_recv",
    "gso_fallbacks",
    "gro_fallbacks",
    "queue_wait_p99_us",
    "wire_p99_us",
    "decision_p99_us",
    "completion_wake_p99_us",
    "timeouts",
    "balanced",
]


def split(s, sep=","):
    return [x for x in s.split(sep) if x != ""]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loadgen", default=None, help="loadgen binary (default: build & use target/release/loadgen)")
    ap.add_argument("--client", default="engine", help="engine,official,raw")
    ap.add_argument("--client-cores", default="0", help="alternatives separated by ';'")
    ap.add_argument("--in-flight", default="64")
    ap.add_argument("--rate", default="", help="open-loop rates; 'closed' or empty: closed loop")
    ap.add_argument("--io", default="auto", help="I/O backends: auto,uring,mmsg")
    ap.add_argument("--gso", default="on", help="on,off")
    ap.add_argument("--reply-batch", default="on", help="on,off (embedded responders)")
    ap.add_argument("--engine-core", default="pinned",
                    help="pinned,hosted,auto: the engine core on a thread of its own or as a "
                         "task on loadgen's Tokio runtime; auto is loadgen's default (hosted with "
                         "mmsg, pinned with uring). Pinned here, so the recorded grids stay "
                         "comparable")
    ap.add_argument("--preset", choices=["io"], default=None,
                    help="io: --io uring,mmsg --gso on,off --reply-batch on,off "
                         "--rate closed,1000,10000,50000")
    ap.add_argument("--batch", default="32", help="raw client receive batch sizes")
    ap.add_argument("--unit-ms", default="20")
    ap.add_argument("--socket-buffer", default="4194304")
    ap.add_argument("--servers", default="2")
    ap.add_argument("--auth", default="aes")
    ap.add_argument("--duration", default="3")
    ap.add_argument("--warmup", default="0.5")
    ap.add_argument("--extra", default="", help="extra loadgen arguments, space separated")
    ap.add_argument("--out", default="sweep", help="output prefix: PREFIX.csv and PREFIX.svg")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = ap.parse_args()
    if a.preset == "io":
        a.io, a.gso, a.reply_batch = "uring,mmsg", "on,off", "on,off"
        a.rate = "closed,1000,10000,50000"

    loadgen = a.loadgen
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if loadgen is None and not a.dry_run:
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
        subprocess.run(["cargo", "build", "--release", "-p", "loadgen"], cwd=root, check=True)
        loadgen = os.path.join(target, "release", "loadgen")
    loadgen = loadgen or "loadgen"

    axes = {
        "client": split(a.client),
        "client_cores": split(a.client_cores, ";"),
        "in_flight": split(a.in_flight),
        "rate": [("" if r == "closed" else r) for r in split(a.rate)] or [""],
        "io": split(a.io),
        "gso": split(a.gso),
        "reply_batch": split(a.reply_batch),
        "engine_core": split(a.engine_core),
        "batch": split(a.batch),
        "unit_ms": split(a.unit_ms),
        "socket_buffer": split(a.socket_buffer),
        "servers": split(a.servers),
        "auth": split(a.auth),
    }
    names = list(axes)
    points = list(itertools.product(*[axes[n] for n in names]))
    varying = [n for n in names if len(axes[n]) > 1]
    rows = []
    for i, p in enumerate(points):
        pt = dict(zip(names, p))
        if a.dry_run:
            jpath = "RESULT.json"
        else:
            fd, jpath = tempfile.mkstemp(suffix=".json")
            os.close(fd)
        cmd = [
            loadgen, "--quiet", "--client", pt["client"], "--client-cores", pt["client_cores"],
            "--in-flight", pt["in_flight"], "--batch", pt["batch"], "--unit-ms", pt["unit_ms"],
            "--socket-buffer", pt["socket_buffer"], "--servers", pt["servers"], "--auth", pt["auth"],
            "--io", pt["io"], "--gso", pt["gso"], "--reply-batch", pt["reply_batch"],
            "--engine-core", pt["engine_core"],
            "--duration", a.duration, "--warmup", a.warmup, "--json", jpath,
        ]
        if pt["rate"]:
            cmd += ["--rate", pt["rate"]]
        cmd += split(a.extra, " ")
        print(f"[{i + 1}/{len(points)}] {' '.join(cmd)}", file=sys.stderr)
        if a.dry_run:
            continue
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        row = dict(pt)
        row["exit"] = r.returncode
        try:
            with open(jpath) as f:
                doc = json.load(f)
            res = doc["results"][0]
            lat = res["latency_us"]
            row.update({
                "decisions_per_s": round(res["decisions_per_s"], 1),
                "p50_us": lat["p50"],
                "p99_us": lat["p99"],
                "p999_us": lat["p99.9"],
                "max_us": lat["max"],
                "client_cpu_us_per_decision": res["client_cpu_us_per_decision"],
                "datagrams_per_decision": res["datagrams_per_decision"],
                "client_cores_used": round(res["client_cores_used"], 3),
                "timeouts": res["outcomes_window"]["timeout"],
                "balanced": res["balanced"],
            })
            io = res.get("io") or {}
            row.update({
                "io_backend": io.get("backend"),
                "datagrams_per_send": io.get("datagrams_per_send"),
                "datagrams_per_recv": io.get("datagrams_per_recv"),
                "gso_fallbacks": io.get("gso_fallbacks"),
                "gro_fallbacks": io.get("gro_fallbacks"),
            })
            for stage, v in (res.get("breakdown_us") or {}).items():
                row[f"{stage}_p99_us"] = v.get("p99")
        except (OSError, ValueError, KeyError, IndexError) as e:
            print(f"  no result ({e}); stderr tail: {r.stderr[-400:]}", file=sys.stderr)
        finally:
            try:
                os.unlink(jpath)
            except OSError:
                pass
        print("  " + ", ".join(f"{k}={row.get(k)}" for k in FIELDS[:6]), file=sys.stderr)
        rows.append(row)
    if a.dry_run:
        return
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names + ["exit"] + FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow(row)
    labels = [" ".join(f"{n}={row[n]}" for n in (varying or ["client"])) for row in rows]
    plot(a.out + ".svg", labels, rows)
    print(f"wrote {a.out}.csv and {a.out}.svg", file=sys.stderr)


def plot(path, labels, rows):
    thr = [float(r.get("decisions_per_s") or 0) for r in rows]
    p99 = [float(r.get("p99_us") or 0) for r in rows]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
        a1.bar(range(len(rows)), thr)
        a1.set_ylabel("decisions/s")
        a2.bar(range(len(rows)), p99, color="tab:red")
        a2.set_ylabel("p99 µs")
        a2.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
        fig.tight_layout()
        fig.savefig(path)
        return
    except ImportError:
        pass
    svg_bars(path, labels, [("decisions/s", thr, "#4477aa"), ("p99 latency (µs)", p99, "#cc3311")])


def svg_bars(path, labels, panels):
    """Minimal SVG: one bar panel per metric, point labels underneath."""
    n = max(1, len(labels))
    bw = max(24, min(80, 900 // n))
    width = 120 + n * bw + 40
    ph = 220
    height = len(panels) * (ph + 40) + 140
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for k, (title, vals, color) in enumerate(panels):
        top = 20 + k * (ph + 40)
        vmax = max(vals + [1e-9])
        out.append(f'<text x="10" y="{top + 12}" font-size="13">{title}</text>')
        base = top + ph
        out.append(f'<line x1="110" y1="{base}" x2="{width - 20}" y2="{base}" stroke="black"/>')
        for t in range(5):
            v = vmax * t / 4
            y = base - (ph - 30) * t / 4
            out.append(f'<text x="105" y="{y + 4:.0f}" text-anchor="end">{v:.4g}</text>')
            out.append(f'<line x1="110" y1="{y:.0f}" x2="{width - 20}" y2="{y:.0f}" stroke="#ddd"/>')
        for i, v in enumerate(vals):
            h = (ph - 30) * v / vmax
            x = 120 + i * bw
            out.append(f'<rect x="{x}" y="{base - h:.1f}" width="{bw - 6}" height="{h:.1f}" fill="{color}"/>')
            out.append(f'<text x="{x + (bw - 6) / 2:.0f}" y="{base - h - 3:.0f}" text-anchor="middle" font-size="9">{v:.3g}</text>')
    ly = len(panels) * (ph + 40) + 10
    for i, lab in enumerate(labels):
        x = 120 + i * bw + (bw - 6) / 2
        out.append(f'<text transform="translate({x:.0f},{ly}) rotate(40)" font-size="9">{escape(lab)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


if __name__ == "__main__":
    main()
