#!/usr/bin/env python3
"""Regenerates the results tables of README.md and docs/benchmarks.md from the loadgen
JSON reports committed in tuning/results/.

Each generated table sits between `<!-- table:NAME -->` and `<!-- /table -->`; NAME is a
JSON file in tuning/results/ without `.json`. `--check` fails (exit 1) when a document's
table differs from what its JSON gives, without writing.

    tuning/gen_tables.py            # rewrite the tables
    tuning/gen_tables.py --check    # verify them
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tuning" / "results"
DOCS = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md"]
BLOCK = re.compile(r"(<!-- table:([\w.-]+) -->\n)(.*?)(<!-- /table -->)", re.S)

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


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for path in DOCS:
        text = path.read_text()
        new = BLOCK.sub(lambda m: m.group(1) + table(m.group(2)) + m.group(4), text)
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
