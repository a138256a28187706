#!/usr/bin/env python3
"""The house rules CI holds (docs/architecture.md), checked from the tree alone:

1. the repository root tracks only the project's layout (a file committed by accident fails);
2. no crate under crates/ depends on a crate under tools/ (dev-dependencies aside: the test kit
   lives in tools/ and ships in nothing);
3. no `crate::` import circle between the top-level modules of any library crate;
4. no library source file (crates/*/src) over 700 lines: a new record or concept gets a module.

Prints each breach and exits 1; prints the facade's module order and exits 0 otherwise.
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUT = {".ci", ".gitignore", "Cargo.toml", "Cargo.lock", "README.md", "rustfmt.toml",
          "conformance", "crates", "docs", "fuzz", "spec", "tools"}
MAX_LINES = 700


def root_entries():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line.split("/")[0] for line in out.splitlines() if line}


def upward_dependencies():
    meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
                                     cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    crates, tools = os.path.join(ROOT, "crates") + os.sep, os.path.join(ROOT, "tools") + os.sep
    for pkg in meta["packages"]:
        if not pkg["manifest_path"].startswith(crates):
            continue
        for dep in pkg["dependencies"]:
            if dep.get("path", "").startswith(tools) and dep["kind"] != "dev":
                yield f'{pkg["name"]} depends on {dep["name"]} ({os.path.relpath(dep["path"], ROOT)})'


def module_graph(src):
    """Each top-level module of a crate's `src` and the top-level modules its code names through
    `crate::` (comments and test modules aside)."""
    graph = {}
    for folder, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(folder, f)
            top = os.path.relpath(path, src)[:-3].split(os.sep)[0]
            if top in ("lib", "main", "bin"):
                continue
            text = open(path, encoding="utf-8").read().split("#[cfg(test)]\nmod tests")[0]
            text = re.sub(r"//.*", "", text)
            names = set(re.findall(r"crate::([a-z_][a-z0-9_]*)", text))
            for group in re.findall(r"crate::\{([^}]*)\}", text):
                names.update(re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)::", group))
            graph.setdefault(top, set()).update(names - {top})
    return {m: {d for d in deps if d in graph} for m, deps in graph.items()}


def circles(graph):
    """Import circles, and the modules in an order where each comes after what it uses."""
    state, order, found = {}, [], []

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = "done"
        order.append(m)

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found, order


def main():
    breaches = []
    odd = sorted(root_entries() - LAYOUT)
    if odd:
        breaches.append(f"the repository root tracks entries outside its layout: {odd}")
    breaches += list(upward_dependencies())
    facade_order = []
    for crate in sorted(os.listdir(os.path.join(ROOT, "crates"))):
        src = os.path.join(ROOT, "crates", crate, "src")
        found, order = circles(module_graph(src))
        breaches += [f"{crate}: import circle {' -> '.join(c)}" for c in found]
        if crate == "tpde":
            facade_order = order
        for folder, _, files in os.walk(src):
            for f in files:
                path = os.path.join(folder, f)
                if f.endswith(".rs") and (n := sum(1 for _ in open(path, encoding="utf-8"))) > MAX_LINES:
                    breaches.append(f"{os.path.relpath(path, ROOT)} has {n} lines (at most {MAX_LINES})")
    for b in breaches:
        print(f"house: {b}", file=sys.stderr)
    if breaches:
        return 1
    print("house: layout, dependencies, imports and file sizes hold; the facade's modules in order:",
          " < ".join(facade_order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
