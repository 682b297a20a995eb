#!/usr/bin/env python3
"""Thread-per-core scaling of the engine: loadgen with 1..N pinned engine cores, each on a
CPU of its own, while the application's threads (loadgen's Tokio workers, which submit
and await the requests) and the embedded responders run on other CPUs.

For every engine core count k of --cores it runs

    loadgen --engine-core pinned --client-cores E[:k] --app-cores A --responder-cores R
            --responder-threads T --in-flight k*F ...

(--repeat times, in rounds) and writes, with --out P (its folder created):

  P.json   the layout, the commit, the machine, and per k the medians of decisions/s,
           client CPU µs per decision (engine cores and application together), p50/p99
           and the runs' reports (P/k-rN.json)
  P.csv    the same, one row per k
  P.svg    decisions/s and CPU µs per decision (and p99) against engine cores

CPUs: --engine-cpus E (default 0..N-1), --app-cpus A (default the next CPU),
--responder-cpus R (default the rest). On a machine with fewer than N + 2 CPUs the roles
share CPUs: each point then takes the first k CPUs for the engine, the next free one for
the application and the last free one for the responders (or CPU n-1), and the JSON says
what was pinned where. The responders get T = max(1, |R| / servers) threads each, so
every responder CPU is used.

Example (a machine with 16 CPUs):

    tuning/scaling.py --cores 1,2,4,8 --engine-cpus 0-7 --app-cpus 8-9 \\
        --responder-cpus 10-15 --repeat 3 --out /tmp/scaling/tpc
"""

import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lgrun  # noqa: E402


def cpus(text):
    out = []
    for part in [p for p in (text or "").split(",") if p]:
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def cpu_text(cs):
    return ",".join(str(c) for c in cs)


def layouts(a, ncpu):
    """The CPUs of each role per engine core count: {k: (engine, app, responders)}."""
    ks = [int(k) for k in a.cores.split(",") if k]
    kmax = max(ks)
    if a.engine_cpus or a.app_cpus or a.responder_cpus or ncpu >= kmax + 2:
        eng = cpus(a.engine_cpus) or list(range(kmax))
        app = cpus(a.app_cpus) or [max(eng) + 1]
        resp = cpus(a.responder_cpus) or [c for c in range(ncpu) if c not in eng + app] or [ncpu - 1]
        if len(eng) < kmax:
            sys.exit(f"--engine-cpus has {len(eng)} CPUs, --cores asks for {kmax}")
        return {k: (eng[:k], app, resp) for k in ks}, False
    out = {}
    for k in ks:
        eng = [c % ncpu for c in range(k)]
        free = [c for c in range(ncpu) if c not in eng]
        out[k] = (eng, [free[0] if free else ncpu - 1], [free[-1] if free else ncpu - 1])
    return out, True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loadgen", default=None, help="loadgen binary (default: build and use target/release/loadgen)")
    ap.add_argument("--cores", default="1,2,4,8", help="engine core counts")
    ap.add_argument("--engine-cpus", default=None, help="CPUs of the engine cores, e.g. 0-7")
    ap.add_argument("--app-cpus", default=None, help="CPUs of the application's threads")
    ap.add_argument("--responder-cpus", default=None, help="CPUs of the embedded responders")
    ap.add_argument("--servers", type=int, default=2, help="embedded responders (loadgen --servers)")
    ap.add_argument("--in-flight-per-core", type=int, default=64, help="requests in flight per engine core")
    ap.add_argument("--repeat", type=int, default=1, help="runs per core count, in rounds")
    ap.add_argument("--duration", default="3")
    ap.add_argument("--warmup", default="0.5")
    ap.add_argument("--extra", default="", help="more loadgen arguments, space separated")
    ap.add_argument("--out", default="scaling", help="output prefix P: P.json, P.csv, P.svg, P/ (created)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    ncpu = os.cpu_count() or 1
    plan, shared = layouts(a, ncpu)
    if shared:
        lgrun.log(f"this machine has {ncpu} CPUs, fewer than --cores' largest + 2: "
                  "engine, application and responders share CPUs (see the JSON's layout)")
    loadgen = lgrun.loadgen_binary(a.loadgen, build=not a.dry_run)
    if not a.dry_run:
        os.makedirs(a.out, exist_ok=True)
    runs = {k: [] for k in plan}
    for rnd in range(1, a.repeat + 1):
        for k, (eng, app, resp) in plan.items():
            threads = max(1, len(resp) // max(1, a.servers))
            cmd = [loadgen, "--quiet", "--engine-core", "pinned", "--client-cores", cpu_text(eng),
                   "--app-cores", cpu_text(app), "--responder-cores", cpu_text(resp),
                   "--responder-threads", str(threads), "--servers", str(a.servers),
                   "--in-flight", str(k * a.in_flight_per_core),
                   "--duration", a.duration, "--warmup", a.warmup] + [x for x in a.extra.split(" ") if x]
            lgrun.log(f"[k={k} round {rnd}] {' '.join(cmd)}")
            if a.dry_run:
                continue
            path = os.path.join(a.out, f"{k}-r{rnd}.json")
            doc, code, err = lgrun.run(cmd, path)
            if doc is None:
                lgrun.log(f"  no report (exit {code}): {err}")
                continue
            fig = lgrun.figures(doc)
            fig.update({"exit": code, "report": path, "machine": doc.get("machine")})
            runs[k].append(fig)
            write(a, plan, runs, shared)
            lgrun.log(f"  {fig['decisions_per_s']:.0f} decisions/s, {fig['client_cpu_us_per_decision']:.2f} µs/decision")
    if not a.dry_run:
        lgrun.log(f"wrote {a.out}.json, {a.out}.csv, {a.out}.svg")


def write(a, plan, runs, shared):
    points = []
    for k, (eng, app, resp) in plan.items():
        mine = runs[k]
        p = {"engine_cores": k, "engine_cpus": eng, "app_cpus": app, "responder_cpus": resp,
             "responder_threads": max(1, len(resp) // max(1, a.servers)),
             "in_flight": k * a.in_flight_per_core, "runs": len(mine),
             "reports": [r["report"] for r in mine], "exits": [r["exit"] for r in mine]}
        for f in ("decisions_per_s", "client_cpu_us_per_decision", "p50_us", "p99_us",
                  "client_cores_used", "responder_cores_used", "host_steal_ms"):
            p[f] = lgrun.median([r.get(f) for r in mine])
        lo, hi = lgrun.spread([r.get("decisions_per_s") for r in mine])
        p["decisions_per_s_min"], p["decisions_per_s_max"] = lo, hi
        points.append(p)
    all_runs = [r for rs in runs.values() for r in rs]
    doc = {
        "commit": lgrun.short_commit(all_runs),
        "machine": next((r["machine"] for r in all_runs if r.get("machine")), None),
        "roles_share_cpus": shared,
        "placement": "pinned engine cores (--engine-core pinned)",
        "servers": a.servers,
        "duration_s": float(a.duration),
        "warmup_s": float(a.warmup),
        "points": points,
    }
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=2)
    fields = [k for k in points[0] if k not in ("reports", "exits")]
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for p in points:
            w.writerow({k: (cpu_text(v) if isinstance(v, list) else v) for k, v in p.items()})
    done = [p for p in points if p["runs"]]
    if done:
        xs = [p["engine_cores"] for p in done]
        lgrun.svg_lines(a.out + ".svg", f"engine thread-per-core scaling, commit {doc['commit']}"
                        + (" (roles share CPUs)" if shared else ""), "engine cores", [
            ("decisions/s", [("decisions/s", [p["decisions_per_s"] for p in done], lgrun.COLORS[0])]),
            ("client CPU µs per decision", [("engine + application", [p["client_cpu_us_per_decision"] for p in done], lgrun.COLORS[2])]),
            ("p99 latency µs", [("p99", [p["p99_us"] for p in done], lgrun.COLORS[1])]),
        ], xs)


if __name__ == "__main__":
    main()
