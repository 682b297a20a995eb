#!/usr/bin/env python3
"""Sweep runner over loadgen parameters.

Runs loadgen once per point of the grid (the cartesian product of the lists given),
--repeat times (in rounds: every point once, then again), and keeps everything as it
goes: with --out P it creates P's folder and writes

  P.csv          one row per point (medians of its runs so far, their spread, the backend
                 and placement each point ran with), rewritten after every run
  P/runs.csv     one row per run, appended as each run ends
  P/NNN-rK.json  loadgen's report of point NNN, round K (and its .hgrm)
  P.svg          decisions/s, client CPU µs per decision and p99 per point, titled
                 with the commit the runs were built from
  P-latency.svg  latency by percentile (HdrHistogram style) of each point's last run

(--out naming an existing folder, or ending in '/', means P = that folder/sweep.)

so a crash or Ctrl-C loses nothing finished.

Defaults are loadgen's: an option not given here is not passed, and the CSV records what
the runs used (the I/O backend from the report's results[0].io.backend, the engine core
placement from its parameters). Only --duration (3 s) and --warmup (0.5 s) are the
sweep's own, for shorter points.

Example (a short sweep, ~4 s per point):

    tuning/sweep.py --client engine,raw --in-flight 16,64,256 --out /tmp/sweep/inflight

Lists are comma separated; core lists use ';' between alternatives
(--client-cores '0;0,1'). In --rate, "closed" stands for a closed-loop point. Arguments
after -- go to every loadgen run as they are (--unit-ms 5,20 -- --dead-oldest).
--preset io sweeps backend x GSO x reply batching x {closed loop, 1k, 10k, 50k/s}:

    tuning/sweep.py --preset io --client engine,official,raw --duration 3 --out /tmp/io

Thread-per-core scaling (engine cores 1..N on CPUs of their own) is tuning/scaling.py.
"""

import argparse
import csv
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lgrun  # noqa: E402

# axis name -> (loadgen option, separator of alternatives)
AXES = {
    "client": ("--client", ","),
    "client_cores": ("--client-cores", ";"),
    "in_flight": ("--in-flight", ","),
    "rate": ("--rate", ","),
    "io": ("--io", ","),
    "gso": ("--gso", ","),
    "reply_batch": ("--reply-batch", ","),
    "engine_core": ("--engine-core", ","),
    "batch": ("--batch", ","),
    "unit_ms": ("--unit-ms", ","),
    "socket_buffer": ("--socket-buffer", ","),
    "servers": ("--servers", ","),
    "auth": ("--auth", ","),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loadgen", default=None, help="loadgen binary (default: build and use target/release/loadgen)")
    for axis, (opt, sep) in AXES.items():
        alt = "alternatives separated by ';'" if sep == ";" else "comma-separated list"
        ap.add_argument(opt, dest=axis, default=None, help=f"{alt} (default: loadgen's)")
    ap.add_argument("--preset", choices=["io"], default=None,
                    help="io: --io uring,mmsg --gso on,off --reply-batch on,off --rate closed,1000,10000,50000")
    ap.add_argument("--repeat", type=int, default=1, help="runs per point, in rounds; the CSV has their medians")
    ap.add_argument("--duration", default="3", help="loadgen --duration of each run (s)")
    ap.add_argument("--warmup", default="0.5", help="loadgen --warmup of each run (s)")
    ap.add_argument("--extra", default="", help="more loadgen arguments, space separated "
                    "(write --extra=--dead-oldest, or put them after --)")
    ap.add_argument("--out", default="sweep", help="output prefix P: P.csv, P.svg, P-latency.svg, P/ (created)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw P.svg and P-latency.svg from P.csv and the .hgrm files in P/")
    argv = sys.argv[1:] if argv is None else list(argv)
    tail = []
    if "--" in argv:
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1:]
    a = ap.parse_args(argv)
    a.extra = " ".join([a.extra] + tail).strip()
    if a.preset == "io":
        a.io, a.gso, a.reply_batch = "uring,mmsg", "on,off", "on,off"
        a.rate = "closed,1000,10000,50000"
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    return a


def grid(a):
    """The points: a list of {axis: value} with only the axes given (a value None means
    'not passed': loadgen's default)."""
    given = {}
    for axis, (_, sep) in AXES.items():
        text = getattr(a, axis)
        if text is None:
            continue
        vals = [x for x in text.split(sep) if x != ""]
        if axis == "rate":
            vals = [None if v == "closed" else v for v in vals]
        given[axis] = vals or [None]
    names = list(given)
    return names, [dict(zip(names, p)) for p in itertools.product(*[given[n] for n in names])]


def command(loadgen, a, point):
    cmd = [loadgen, "--quiet", "--duration", a.duration, "--warmup", a.warmup]
    for axis, value in point.items():
        if value is not None:
            cmd += [AXES[axis][0], value]
    return cmd + [x for x in a.extra.split(" ") if x]


def label(point, varying):
    keys = varying or ["client"]
    text = " ".join(f"{k}={point.get(k) or 'default'}" for k in keys)
    return text or "loadgen defaults"


def r3(v):
    return round(v, 3) if isinstance(v, float) else v


def summary_rows(points, runs, varying):
    """One row per point: the point's axes, its runs' medians and spreads, the facts of
    its last run."""
    rows = []
    for i, pt in enumerate(points):
        mine = [r for r in runs if r["point"] == i and r.get("decisions_per_s") is not None]
        row = {"point": i, "label": label(pt, varying), "runs": len(mine)}
        row.update({k: (v if v is not None else "default") for k, v in pt.items()})
        if mine:
            row.update({k: mine[-1].get(k) for k in lgrun.FACTS})
            for k in lgrun.FIGURES:
                row[k] = r3(lgrun.median([r.get(k) for r in mine]))
            for k in ("decisions_per_s", "client_cpu_us_per_decision"):
                lo, hi = lgrun.spread([r.get(k) for r in mine])
                row[k + "_min"], row[k + "_max"] = r3(lo), r3(hi)
            row["exit"] = max(r["exit"] for r in mine)
        rows.append(row)
    return rows


def write_csv(path, rows, names):
    spread = ["decisions_per_s_min", "decisions_per_s_max",
              "client_cpu_us_per_decision_min", "client_cpu_us_per_decision_max"]
    facts = [f for f in lgrun.FACTS if f not in names]
    fields = ["point", "label"] + names + ["runs", "exit"] + facts + lgrun.FIGURES + spread
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    os.replace(tmp, path)


def append_run(path, run, names):
    facts = [f for f in lgrun.FACTS if f not in names]
    fields = ["point", "round", "exit"] + names + facts + lgrun.FIGURES + ["json"]
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(run)


def plots(out, rows, runs_dir):
    done = [r for r in rows if r.get("runs")]
    if not done:
        return
    title = f"loadgen sweep, commit {lgrun.short_commit(done)} (medians of {max(r['runs'] for r in done)} run(s) per point)"
    labels = [r["label"] for r in done]
    lgrun.svg_bars(out + ".svg", title, labels, [
        ("decisions/s", [r.get("decisions_per_s") for r in done], lgrun.COLORS[0]),
        ("client CPU µs per decision", [r.get("client_cpu_us_per_decision") for r in done], lgrun.COLORS[2]),
        ("p99 latency µs", [r.get("p99_us") for r in done], lgrun.COLORS[1]),
    ])
    curves = []
    for r in done:
        hgrms = sorted(f for f in os.listdir(runs_dir) if f.startswith(f"{r['point']:03d}-") and f.endswith(".hgrm"))
        if hgrms:
            curves.append((r["label"], lgrun.read_hgrm(os.path.join(runs_dir, hgrms[-1]))))
    if curves:
        lgrun.svg_percentiles(out + "-latency.svg", f"latency by percentile, commit {lgrun.short_commit(done)}", curves)


def replot(out):
    """Redraws a finished sweep's charts from its CSV (numbers as the CSV has them)."""
    with open(out + ".csv") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["point"], r["runs"] = int(r["point"]), int(r["runs"] or 0)
        for k in lgrun.FIGURES:
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
        r["dirty"] = r.get("dirty") == "True"
    plots(out, rows, out)


def main(argv=None):
    a = parse_args(argv)
    if a.replot:
        replot(a.out)
        return
    names, points = grid(a)
    varying = [n for n in names if len({str(p[n]) for p in points}) > 1]
    loadgen = lgrun.loadgen_binary(a.loadgen, build=not a.dry_run)
    out = a.out
    if out.endswith(os.sep) or os.path.isdir(out):
        out = os.path.join(out, "sweep")  # a folder: P = FOLDER/sweep
    runs_dir = out
    if not a.dry_run:
        os.makedirs(runs_dir, exist_ok=True)
    runs = []
    total = len(points) * a.repeat
    for k in range(a.repeat):
        for i, pt in enumerate(points):
            base = os.path.join(runs_dir, f"{i:03d}-r{k + 1}")
            cmd = command(loadgen, a, pt) + ["--hgrm", base + ".hgrm"]
            lgrun.log(f"[{k * len(points) + i + 1}/{total}] {' '.join(cmd)}")
            if a.dry_run:
                continue
            doc, code, err = lgrun.run(cmd, base + ".json")
            run = {"point": i, "round": k + 1, "exit": code, "json": base + ".json"}
            run.update({n: pt[n] if pt[n] is not None else "default" for n in names})
            if doc is not None:
                run.update(lgrun.figures(doc))
            else:
                lgrun.log(f"  no report (exit {code}); stderr: {err}")
            if code != 0:
                lgrun.log(f"  loadgen exited {code}: {err.strip().splitlines()[-1] if err.strip() else ''}")
            runs.append(run)
            append_run(os.path.join(runs_dir, "runs.csv"), run, names)
            rows = summary_rows(points, runs, varying)
            write_csv(out + ".csv", rows, names)
            plots(out, rows, runs_dir)
            lgrun.log("  " + ", ".join(f"{f}={run.get(f)}" for f in
                                        ["decisions_per_s", "client_cpu_us_per_decision", "p99_us", "io_backend", "placement"]))
    if not a.dry_run:
        lgrun.log(f"wrote {out}.csv, {out}.svg, {out}-latency.svg and {runs_dir}/")


if __name__ == "__main__":
    main()
