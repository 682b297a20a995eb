#!/usr/bin/env python3
"""Import levels of src/engine/runtime/ (docs/ARCHITECTURE.md, "Import levels"): a file's
level is 1 + the highest level among the runtime files it names in code (`use super::x`,
`crate::engine::runtime::x`, `super::x::` paths; comments, mod.rs and test modules left
out), 1 for a file naming none.

    python3 tuning/runtime_levels.py [REPO_ROOT]
"""
import re
import sys
from pathlib import Path
root = Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "src/engine/runtime"
mods = {p.stem for p in root.glob("*.rs") if p.stem != "mod"}
deps = {}
for m in mods:
    text = (root / f"{m}.rs").read_text()
    # strip test modules
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    text = re.split(r"#\[cfg\(all\(test, feature = \"loom\"\)\)\]\s*mod loom_tests", text)[0]
    text = "\n".join(l.split("//")[0] for l in text.splitlines())
    d = set()
    for x in re.findall(r"\bsuper::(\w+)", text): d.add(x)
    for x in re.findall(r"crate::engine::runtime::(\w+)", text): d.add(x)
    for grp in re.findall(r"use super::\{([^}]*)\}", text):
        for x in re.findall(r"(\w+)", grp): d.add(x)
    deps[m] = {x for x in d if x in mods and x != m}
lvl = {}
def L(m, stack=()):
    if m in stack: raise SystemExit(f"cycle {stack+(m,)}")
    if m not in lvl:
        lvl[m] = 1 + max((L(x, stack+(m,)) for x in deps[m]), default=0)
    return lvl[m]
for m in sorted(mods, key=lambda m: (L(m), m)):
    print(L(m), m, sorted(deps[m]))
print("levels:", max(lvl.values()))
