#!/usr/bin/env python3
"""A/B of two loadgen builds or two sets of loadgen options, in alternated rounds: the way
to tell whether a change helped on a noisy machine, where one run swings by more than
most changes.

    tuning/ab.py A B [--rounds N] [--out P] [-- COMMON LOADGEN ARGUMENTS]

A and B are each a loadgen binary (a path to an executable) or a set of loadgen options
in one argument (run by the default binary, target/release/loadgen, built first), e.g.

    tuning/ab.py /tmp/before/loadgen target/release/loadgen -- --duration 3
    tuning/ab.py "--io mmsg" "--io uring --engine-core pinned" --rounds 7

Every round runs the same command with A and with B, one right after the other, the
order alternating (A B, B A, A B, ...) so that neither side always runs second. Printed
and written (with --out P: P.json, P.md, and each run's report in P/):

- per side, the median and the spread (min-max) of decisions/s, client CPU µs per
  decision, p50 and p99 over the rounds;
- per round, the ratio B/A of each figure, and their median and spread: the figure to
  quote ("B/A CPU per decision 0.93, rounds 0.90-0.97").

A run that fails (loadgen exit status other than 0) is reported and left out of the
figures. `--summarize-proxy FILE` prints proxy/bench/ab.sh's summary of its runs with
the same statistics.
"""

import argparse
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lgrun  # noqa: E402

METRICS = [
    ("decisions_per_s", "decisions/s"),
    ("client_cpu_us_per_decision", "client CPU µs/decision"),
    ("p50_us", "p50 µs"),
    ("p99_us", "p99 µs"),
]


def side(spec, default_binary):
    """(binary, extra options, label) of one side."""
    if os.path.isfile(spec) and os.access(spec, os.X_OK):
        return spec, [], spec
    return default_binary, shlex.split(spec), spec or "(loadgen defaults)"


def ratio(b, a):
    return b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None


def stats(values):
    lo, hi = lgrun.spread(values)
    return {"median": lgrun.median(values), "min": lo, "max": hi}


def summarize(rounds, metrics):
    """rounds: [{"A": figures or None, "B": figures or None}]. Medians and spreads per
    side, and the per-round B/A ratios with their median and spread (rounds where both
    sides ran)."""
    out = {"A": {}, "B": {}, "ratio_b_over_a": {}}
    for key, _ in metrics:
        for s in ("A", "B"):
            out[s][key] = stats([r[s].get(key) for r in rounds if r.get(s)])
        per_round = [ratio(r["B"].get(key), r["A"].get(key)) for r in rounds if r.get("A") and r.get("B")]
        out["ratio_b_over_a"][key] = dict(stats(per_round), rounds=per_round)
    return out


def fmt(v, digits=3):
    return "n/a" if v is None else (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}g}")


def table(summary, metrics, labels):
    lines = [f"A = `{labels['A']}`, B = `{labels['B']}`", "",
             "| figure | A median (min-max) | B median (min-max) | B/A median (min-max) | B/A per round |",
             "|---|---|---|---|---|"]
    for key, name in metrics:
        a, b, r = summary["A"][key], summary["B"][key], summary["ratio_b_over_a"][key]
        rounds = " ".join("n/a" if x is None else f"{x:.3f}" for x in r["rounds"])
        lines.append(f"| {name} | {fmt(a['median'])} ({fmt(a['min'])}-{fmt(a['max'])}) "
                     f"| {fmt(b['median'])} ({fmt(b['min'])}-{fmt(b['max'])}) "
                     f"| {fmt(r['median'])} ({fmt(r['min'])}-{fmt(r['max'])}) | {rounds} |")
    return "\n".join(lines) + "\n"


def summarize_proxy(path):
    """proxy/bench/ab.sh's runs ("round build mode req/s µs/req" lines): per build, the
    medians of both modes and the per-round engine/`--limit off` req/s ratios."""
    runs = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 5:
                continue
            rnd, build, mode, rps, cpu = parts
            runs.setdefault(build, {}).setdefault(rnd, {})[mode] = {"rps": float(rps), "cpu": float(cpu)}
    for build, by_round in runs.items():
        both = [{"A": r["off"], "B": r["engine"]} for r in by_round.values() if len(r) == 2]
        s = summarize(both, [("rps", "req/s"), ("cpu", "µs/req")])
        rr = s["ratio_b_over_a"]["rps"]
        print(f"{build}: off {s['A']['rps']['median']:.0f} req/s {s['A']['cpu']['median']:.2f} µs/req, "
              f"engine {s['B']['rps']['median']:.0f} req/s {s['B']['cpu']['median']:.2f} µs/req, "
              f"engine/off median {rr['median']:.3f} (rounds {' '.join(f'{x:.2f}' for x in rr['rounds'])})")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    common = []
    if "--" in argv:
        i = argv.index("--")
        argv, common = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", nargs="?", help="side A: a loadgen binary or a set of loadgen options")
    ap.add_argument("b", nargs="?", help="side B: the same")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loadgen", default=None, help="the binary for option sets (default: build target/release/loadgen)")
    ap.add_argument("--out", default=None, help="prefix P: P.json, P.md and the runs' reports in P/")
    ap.add_argument("--summarize-proxy", metavar="FILE", help="summarize proxy/bench/ab.sh's runs and exit")
    a = ap.parse_args(argv)
    if a.summarize_proxy:
        summarize_proxy(a.summarize_proxy)
        return 0
    if a.a is None or a.b is None:
        ap.error("give A and B")
    needs_default = not all(os.path.isfile(s) and os.access(s, os.X_OK) for s in (a.a, a.b))
    default = lgrun.loadgen_binary(a.loadgen, build=needs_default) if needs_default else None
    sides = {"A": side(a.a, default), "B": side(a.b, default)}
    folder = a.out or os.path.join("/tmp", f"ab-{os.getpid()}")
    os.makedirs(folder, exist_ok=True)
    rounds = []
    for k in range(1, a.rounds + 1):
        rnd = {}
        for s in (("A", "B") if k % 2 else ("B", "A")):
            binary, opts, _ = sides[s]
            cmd = [binary, "--quiet"] + opts + common
            path = os.path.join(folder, f"r{k}-{s}.json")
            lgrun.log(f"[round {k} {s}] {' '.join(shlex.quote(c) for c in cmd)}")
            doc, code, err = lgrun.run(cmd, path)
            if doc is None or code != 0:
                lgrun.log(f"  failed (exit {code}): {err.strip()}")
                rnd[s] = None
                continue
            rnd[s] = lgrun.figures(doc)
            lgrun.log("  " + ", ".join(f"{n} {fmt(rnd[s].get(key))}" for key, n in METRICS))
        rounds.append(rnd)
    labels = {s: sides[s][2] for s in sides}
    summary = summarize(rounds, METRICS)
    ran = [r[s] for r in rounds for s in ("A", "B") if r.get(s)]
    text = f"loadgen A/B, {a.rounds} alternated rounds, commit(s) {lgrun.short_commit(ran)}, " \
           f"common arguments `{' '.join(common) or '(none)'}`\n\n" + table(summary, METRICS, labels)
    print(text)
    if a.out:
        doc = {"sides": labels, "common": common, "rounds": rounds, "summary": summary}
        with open(a.out + ".json", "w") as f:
            json.dump(doc, f, indent=2)
        with open(a.out + ".md", "w") as f:
            f.write(text)
        lgrun.log(f"wrote {a.out}.json, {a.out}.md and {folder}/")
    return 0 if all(r.get("A") and r.get("B") for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
