#!/usr/bin/env python3
"""Regenerates the results tables of README.md, docs/benchmarks.md and tuning/README.md
from the loadgen JSON reports and sweep CSVs committed in tuning/results/.

Each generated table sits between `<!-- table:NAME -->` (a loadgen JSON report,
tuning/results/NAME.json), `<!-- sweep:NAME -->` (a tuning/sweep.py CSV,
tuning/results/NAME.csv) or `<!-- scaling:NAME -->` (a tuning/scaling.py JSON,
tuning/results/NAME.json) and `<!-- /table -->`. `--check` fails (exit 1) when a
document's table differs from what its data gives, without writing.

    tuning/gen_tables.py            # rewrite the tables
    tuning/gen_tables.py --check    # verify them
"""
import csv
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tuning" / "results"
DOCS = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "tuning" / "README.md"]
BLOCK = re.compile(r"(<!-- (table|sweep|scaling):([\w.-]+) -->\n)(.*?)(<!-- /table -->)", re.S)

NAMES = {
    "engine": "engine",
    "official": "official `ratelimitly` 0.1.0 (Tokio)",
    "raw": "raw-UDP ceiling",
}


def num(x, digits=0):
    return f"{x:,.{digits}f}"


def client_name(result, params):
    """The row's client; the raw ceiling says how it waited when the report records it
    (`raw_wait`, from loadgen's --raw-busy-poll change on; older reports polled)."""
    name = NAMES.get(result["client"], result["client"])
    wait = result.get("raw_wait") or params.get("raw_wait")
    if result["client"] == "raw" and wait:
        name += " (waits)" if wait == "sleep" else " (busy-polls)"
    return name


def table(name):
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    lines = [
        "| client | decisions/s | p50 / p99 / p99.9 µs | datagrams per decision "
        "| client CPU µs per decision | client cores used |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        lat = r["latency_us"]
        lines.append(
            f"| {client_name(r, doc['parameters'])} | {num(r['decisions_per_s'])} "
            f"| {num(lat['p50'])} / {num(lat['p99'])} / {num(lat['p99.9'])} "
            f"| {r['datagrams_per_decision']:.2f} | {r['client_cpu_us_per_decision']:.2f} "
            f"| {r['client_cores_used']:.2f} |"
        )
    ratios = doc.get("ratios") or {}
    if "engine_vs_official" in ratios:
        lines.append("")
        lines.append(
            "Decisions/s per fully used client core: engine/official "
            f"**{ratios['engine_vs_official']:.2f}**, engine/raw "
            f"**{ratios['engine_vs_raw']:.2f}** (plain decisions/s: "
            f"{ratios['engine_vs_official_throughput']:.2f} and "
            f"{ratios['engine_vs_raw_throughput']:.2f}). "
            f"Source: `tuning/results/{name}.json`."
        )
    else:
        lines.append("")
        lines.append(f"Source: `tuning/results/{name}.json`.")
    return "\n".join(lines) + "\n"


def cell(row, key, digits):
    v = row.get(key)
    if v in (None, ""):
        return "n/a"
    return num(float(v), digits)


def spread_cell(row, key, digits):
    lo, hi = row.get(key + "_min"), row.get(key + "_max")
    text = cell(row, key, digits)
    if lo not in (None, "") and hi not in (None, "") and int(row.get("runs") or 0) > 1:
        text += f" ({num(float(lo), digits)}–{num(float(hi), digits)})"
    return text


def sweep(name):
    """A tuning/sweep.py CSV as a table: one row per point, medians (min–max over the
    runs), the backend and placement each point ran with."""
    path = RESULTS / f"{name}.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    lines = [
        "| point | client | backend | placement | decisions/s | client CPU µs per decision "
        "| p50 / p99 µs | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['client']} | {r['io_backend'] or 'n/a'} | {r['placement']} "
            f"| {spread_cell(r, 'decisions_per_s', 0)} "
            f"| {spread_cell(r, 'client_cpu_us_per_decision', 2)} "
            f"| {cell(r, 'p50_us', 0)} / {cell(r, 'p99_us', 0)} | {r['runs']} |"
        )
    commits = sorted({(r.get("commit") or "unknown")[:7] for r in rows})
    lines.append("")
    lines.append(
        f"Medians of the runs per point (min–max). Source: `tuning/results/{name}.csv`, "
        f"built from commit {', '.join(f'`{c}`' for c in commits)}."
    )
    return "\n".join(lines) + "\n"


def cpus(cs):
    return ",".join(str(c) for c in cs)


def scaling(name):
    """A tuning/scaling.py run as a table: per engine core count, the CPUs of each role
    and the medians."""
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    lines = [
        "| engine cores | engine CPUs | application CPUs | responder CPUs (threads each) "
        "| in flight | decisions/s | client CPU µs per decision | p50 / p99 µs | runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in doc["points"]:
        dps = num(p["decisions_per_s"]) if p["decisions_per_s"] is not None else "n/a"
        if p["runs"] > 1 and p.get("decisions_per_s_min") is not None:
            dps += f" ({num(p['decisions_per_s_min'])}–{num(p['decisions_per_s_max'])})"
        cpu = p["client_cpu_us_per_decision"]
        lines.append(
            f"| {p['engine_cores']} | {cpus(p['engine_cpus'])} | {cpus(p['app_cpus'])} "
            f"| {cpus(p['responder_cpus'])} ({p['responder_threads']}) | {p['in_flight']} "
            f"| {dps} | {'n/a' if cpu is None else f'{cpu:.2f}'} "
            f"| {num(p['p50_us'] or 0)} / {num(p['p99_us'] or 0)} | {p['runs']} |"
        )
    machine = doc.get("machine") or {}
    lines.append("")
    lines.append(
        f"Medians (min–max of decisions/s). Commit `{doc['commit']}`, "
        f"{machine.get('cores', '?')} CPUs ({machine.get('cpu_model', 'unknown')}), "
        f"{doc['servers']} responders, {doc['duration_s']:g} s after {doc['warmup_s']:g} s."
        + (" The roles shared CPUs (fewer CPUs than engine cores + 2)." if doc.get("roles_share_cpus") else "")
        + f" Source: `tuning/results/{name}.json`."
    )
    return "\n".join(lines) + "\n"


def render(kind, name):
    return {"table": table, "sweep": sweep, "scaling": scaling}[kind](name)


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for path in DOCS:
        text = path.read_text()
        new = BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(5), text)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not check:
                path.write_text(new)
    if check and stale:
        print("stale tables in: " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
