#!/usr/bin/env python3
"""Attribute `perf script` samples to stages and print each stage's share.

Usage:
    perf record -e cpu-clock -C 0 --call-graph dwarf,16384 -o perf.data -- sleep 2
    perf script -i perf.data > samples.txt
    tuning/perf_stages.py samples.txt --preset loadgen [--us-per-op 1.58] [--comm REGEX]

A sample goes to the first stage of the preset whose pattern matches a frame of its stack
(`leaf:` patterns match the innermost frame only), so the order of a preset is its
precedence: the kernel and AES-GCM come before the code that called them, and the engine's
own stages before the harness and Tokio that run them. Samples of other processes (idle,
perf itself) are left out: `--comm` keeps the threads whose name matches. With
`--us-per-op`, each share is also given in µs of that figure (the run's client CPU per
decision or the proxy's CPU per request), which assumes the profiled threads are the ones
that CPU time counts.

Presets:
- `loadgen`: the client core of `loadgen --client engine|raw` (kernel, AES, the engine
  core's turn, submission and completion on the caller's side, loadgen's recording, raw's
  own code, the rest of loadgen's client task, Tokio's scheduler).
- `proxy`: `rl-proxy` with engine admission (the engine core's turn with the kernel work it
  calls, the caller side of the engine, the upstream client, the layer's own work, hyper's
  server and the rest).
"""

import argparse
import re
import sys
from collections import Counter

PRESETS = {
    "loadgen": [
        ("kernel", r"leaf:\[kernel\.kallsyms\]"),
        ("AES-GCM (aws-lc)", r"aws_lc"),
        ("engine core turn", r"ratelimitly_engine::engine::runtime::turn::Core::turn"),
        ("submission (caller side)", r"ratelimitly_engine::engine::runtime::(handle|submit|request)"),
        ("completion (caller side)", r"ratelimitly_engine::engine::runtime::completion"),
        ("loadgen's recording", r"loadgen::(stats|phase)::|hdrhistogram::"),
        ("raw client's own code", r"loadgen::clients::raw"),
        ("loadgen's client task (building requests)", r"loadgen::"),
        ("Tokio scheduler", r"tokio::"),
    ],
    "proxy": [
        ("engine core turn", r"ratelimitly_engine::engine::runtime::turn::Core::turn"),
        ("engine, caller side", r"ratelimitly_engine::"),
        ("upstream client", r"rl_proxy::upstream|hyper_util::client|hyper::client"),
        ("layer's own work", r"ratelimitly_tower::"),
        ("hyper server", r"hyper::"),
        ("Tokio scheduler", r"tokio::"),
    ],
}

# Leaf symbols worth a line of their own, whatever stage they fall in.
LEAVES = [
    ("memmove/memcpy", r"mem(move|cpy)"),
    ("clock_gettime", r"clock_gettime|read_tsc"),
]


def samples(lines, comm):
    """Yields (thread name, frames innermost first) per sample of `perf script` text."""
    head, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            if head is not None:
                yield head, frames
            head, frames = None, []
        elif line[0] in " \t":
            parts = line.split(None, 1)
            if head is not None and len(parts) == 2:
                frames.append(parts[1])
        else:
            # The thread name may hold spaces; the pid follows it.
            m = re.match(r"(.*?)\s+\d+(/\d+)?\s", line)
            name = m.group(1) if m else line.split()[0]
            head, frames = (name if comm.search(name) else None), []
    if head is not None:
        yield head, frames


def compile_stages(stages):
    out = []
    for name, pat in stages:
        leaf = pat.startswith("leaf:")
        out.append((name, leaf, re.compile(pat[5:] if leaf else pat)))
    return out


def stage_of(frames, stages):
    for name, leaf, rx in stages:
        if leaf:
            if frames and rx.search(frames[0]):
                return name
        elif any(rx.search(f) for f in frames):
            return name
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", help="`perf script` output (- for stdin)")
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--comm", default=r"^(loadgen|tokio-rt-worker|rl-proxy)",
                    help="regex of the thread names to keep")
    ap.add_argument("--us-per-op", type=float, help="CPU µs per operation to split")
    ap.add_argument("--frame", action="append", default=[],
                    help="also count the samples with a frame matching this regex, by stage")
    args = ap.parse_args()
    stages = compile_stages(PRESETS[args.preset])
    leaves = [(n, re.compile(p)) for n, p in LEAVES]
    src = sys.stdin if args.file == "-" else open(args.file, errors="replace")
    frames_rx = [re.compile(p) for p in args.frame]
    by_stage, by_leaf, by_frame, total = Counter(), Counter(), Counter(), 0
    for _, frames in samples(src, re.compile(args.comm)):
        total += 1
        stage = stage_of(frames, stages)
        by_stage[stage] += 1
        for i, rx in enumerate(frames_rx):
            if any(rx.search(f) for f in frames):
                by_frame[i, stage] += 1
        for name, rx in leaves:
            if frames and rx.search(frames[0]):
                by_leaf[name] += 1
    if not total:
        sys.exit("no samples of the threads named by --comm")
    per = args.us_per_op
    print(f"{total} samples" + (f", {per} µs per operation" if per else ""))
    print("| stage | share | µs |" if per else "| stage | share |")
    print("|---|---|---|" if per else "|---|---|")
    names = [n for n, _ in PRESETS[args.preset]] + ["other"]
    rows = [(n, by_stage[n]) for n in names] + [(f"(leaf) {n}", by_leaf[n]) for n, _ in LEAVES]
    for name, n in rows:
        share = n / total
        print(f"| {name} | {100 * share:.1f}% |" + (f" {share * per:.2f} |" if per else ""))
    for i, pat in enumerate(args.frame):
        parts = [(n, by_frame[i, n]) for n in names if by_frame[i, n]]
        whole = sum(c for _, c in parts)
        split = ", ".join(f"{n} {100 * c / total:.1f}%" for n, c in parts)
        print(f"frame /{pat}/: {100 * whole / total:.1f}% of samples ({split or 'none'})")


if __name__ == "__main__":
    main()
