#!/usr/bin/env python3
"""Fails when the top-level modules of a crate import each other in a cycle (`use crate::a` in b and `use
crate::b` in a, or longer rings). A cycle means two modules cannot be understood, tested or moved apart; shared
pieces belong in a leaf module both use. A submodule (a file under `src/<module>/`) counts as part of its
top-level module, which is how one type's impl is split over files. Counted: `crate::x` anywhere, `super::x` in a
file directly under `src/` (there it means the crate root), and bare names in grouped uses (`use crate::{x, y}`).
Comments and `#[cfg(test)] mod tests` (inline, or a `tests.rs` file) are ignored.

Usage: scripts/check-module-cycles.py [CRATE_DIR ...]   (default: every workspace member with a src/)
"""
import os
import re
import sys


def top_level_modules(src):
    modules = {}
    for root, _, files in os.walk(src):
        for name in files:
            # A `tests.rs` file is a module's `#[cfg(test)] mod tests;`: test code, ignored like an inline one.
            if not name.endswith(".rs") or name == "tests.rs":
                continue
            path = os.path.join(root, name)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            modules.setdefault(parts[0] if parts else "lib", []).append(path)
    return modules


def imports(paths, names, src):
    found = set()
    for path in paths:
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)
        text = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
        # In a file directly under src/ (a top-level module), `super::` is the crate root: `crate::`.
        roots = ["crate"]
        if os.path.dirname(path) == src and os.path.basename(path) not in ("lib.rs", "main.rs"):
            roots.append("super")
        for root in roots:
            found.update(m.group(1) for m in re.finditer(rf"\b{root}::([a-z_0-9]+)", text))
            for group in re.finditer(rf"use {root}::\{{([^}}]*)\}}", text, re.S):
                inner = group.group(1)
                found.update(re.findall(r"\b([a-z_0-9]+)::", inner))
                # Bare names in a grouped use (`use crate::{a, b}`): a module imported whole.
                found.update(re.findall(r"(?:^|[{,\s])([a-z_0-9]+)\s*(?=,|$)", inner.strip()))
    return {name for name in found if name in names}


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def main(crates):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not crates:
        crates = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, "src")))
    failed = False
    for crate in crates:
        modules = top_level_modules(os.path.join(root, crate, "src"))
        names = set(modules)
        src = os.path.join(root, crate, "src")
        graph = {m: imports(paths, names, src) - {m, "lib"} for m, paths in modules.items() if m != "lib"}
        for ring in cycles(graph):
            failed = True
            edges = ", ".join(f"{a} -> {sorted(graph[a] & set(ring))}" for a in ring)
            print(f"{crate}: modules import each other in a cycle: {edges}")
    if not failed:
        print(f"no module import cycles in {len(crates)} crates")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
