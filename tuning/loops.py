#!/usr/bin/env python3
"""Loops, waits, wake-ups, multishot re-arms and context switches per decision: the
engine on both backends and both placements beside the raw client, with GSO replies and
with one reply per datagram (`--reply-batch off`), one run each, in one sweep.

    tuning/loops.py [--loadgen BIN] [--duration S] [--out P]

Prints a Markdown table (and writes P.json with every row when --out is given). Figures
per decision, from each run's JSON: `io.loops` (passes of the I/O layer), `io.waits`
(passes that waited: `poll`, `io_uring_enter` with a wait, or a hosted core that parked),
`io.wakes` (submitters' wake-ups of a waiting core), `io.recv_rearms` (multishot receives
armed again), `client_switches` (times the client threads were switched onto a CPU,
schedstat). One run per row: compare rows of one sweep, and A/B a change with
tuning/ab.py.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lgrun  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loadgen", help="loadgen binary (default: target/release/loadgen, built)")
    p.add_argument("--duration", default="3")
    p.add_argument("--out")
    a = p.parse_args()
    lg = lgrun.loadgen_binary(a.loadgen)
    rows = []
    print("| GSO replies | backend | client | CPU µs | loops | waits | wakes | re-arms | switches |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")  # lgrun.run adds --json PATH
        for rb in ("on", "off"):
            for io in ("mmsg", "uring"):
                for client, place in (("engine", "pinned"), ("engine", "hosted"), ("raw", None)):
                    cmd = [lg, "--client", client, "--duration", a.duration, "--io", io,
                           "--reply-batch", rb]
                    if place:
                        cmd += ["--engine-core", place]
                    doc, rc, err = lgrun.run(cmd, path)
                    if doc is None or rc != 0:
                        print(f"| {rb} | {io} | {client} {place or ''}: failed ({rc}): {err.strip()[-200:]} |")
                        continue
                    r = doc["results"][0]
                    n = max(r["decisions"], 1)
                    c = r.get("io") or {}
                    row = {
                        "reply_batch": rb, "io": io, "client": client, "placement": place,
                        "cpu_us": r["client_cpu_us_per_decision"],
                        "loops": c.get("loops", 0) / n, "waits": c.get("waits", 0) / n,
                        "wakes": c.get("wakes", 0) / n, "rearms": c.get("recv_rearms", 0) / n,
                        "switches": r.get("client_switches_per_decision", 0.0),
                        "host_steal_ms": r.get("host_steal_ms"),
                    }
                    rows.append(row)
                    who = client if not place else f"{client}, {place}"
                    print(f"| {rb} | {io} | {who} | {row['cpu_us']:.2f} | {row['loops']:.3f} | "
                          f"{row['waits']:.3f} | {row['wakes']:.3f} | {row['rearms']:.4f} | "
                          f"{row['switches']:.3f} |", flush=True)
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
