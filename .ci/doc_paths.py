#!/usr/bin/env python3
"""Lists file citations in the documents that name no file of the repository.

Scans every tracked .md file (backticked paths and relative link targets) and the doc
comments (`//!`, `///`) of every tracked .rs file (backticked paths and bare names such
as `wire.md`). A citation counts if it names a tracked file or folder relative to the
repository root, to the citing file's folder, or to its crate's root. Exit 1 if any is
missing.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    FILES = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but builds
    FILES = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
             and not {"target", ".git"} & set(p.relative_to(ROOT).parts)]
TRACKED = set(FILES)
DIRS = {str(Path(f).parents[i]) for f in FILES for i in range(len(Path(f).parents) - 1)}
EXT = r"(?:md|rs|toml|json|py|sh|csv|svg|txt|yml|yaml)"
PATHLIKE = re.compile(r"^[\w.\-]+(?:/[\w.\-{},]*)*(?:\.%s)?/?$" % EXT)
TICK = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
BARE = re.compile(r"(?<![\w/.\-])([\w\-]+\.md)\b")
TOP = {f.split("/")[0] for f in FILES if "/" in f}
PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]+(\.|/|$)")
CRATES = ["responder", "rlctl", "loadgen", "testkit", "tower", "proxy", "fuzz", "benches"]


def candidates(text):
    for m in TICK.finditer(text):
        s = m.group(1).rstrip(".,;:")
        s = re.sub(r"(:\d+)+$", "", s)
        has_ext = re.search(r"\.%s/?$" % EXT, s)
        if not (has_ext or s.endswith("/") or s.split("/")[0] in TOP):
            continue
        if s.startswith(("http", "/", ".", "-", "$")) or "::" in s or "*" in s:
            continue
        if PLACEHOLDER.search(s):
            continue
        if PATHLIKE.match(s):
            yield s


def exists(cite, src):
    base = Path(src).parent
    crate = next((c for c in CRATES if src.startswith(c + "/")), "")
    bases = ["", str(base), str(base.parent), crate, crate + "/src", "src"]
    for b in bases:
        p = os.path.normpath(os.path.join(b, cite.rstrip("/")))
        if "{" in p:
            return True  # brace lists are illustrative (e.g. parameters/{a,b})
        if p in TRACKED or p in DIRS:
            return True
        # a bare file name cited inside its own folder tree
    name = Path(cite).name
    if "/" not in cite and any(Path(f).name == name and f.startswith(str(base)) for f in FILES):
        return True
    return False


missing = []
for f in FILES:
    path = ROOT / f
    if f.endswith(".md"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            cites = set(candidates(line))
            cites |= {m.group(1) for m in LINK.finditer(line) if not m.group(1).startswith("http")}
            for c in sorted(cites):
                if not exists(c, f):
                    missing.append(f"{f}:{n}: {c}")
    elif f.endswith(".rs"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            if not (s.startswith("//!") or s.startswith("///")):
                continue
            cites = set(candidates(s)) | {m.group(1) for m in BARE.finditer(s)}
            for c in sorted(cites):
                if not exists(c, f):
                    missing.append(f"{f}:{n}: {c}")

print("\n".join(missing) if missing else "no missing citations")
sys.exit(1 if missing else 0)
