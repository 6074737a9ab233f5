"""The project's imports run one way: no module imports, at any depth and also inside a function, one
that imports it back, and no package imports one above it (ground floor: netns_testbed, its fabric model
and errors; top: the CLI)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("netns_testbed", "workload", "agent", "analysis", "flowpulse")   # from the ground floor up


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [resolve(f"{node.module}.{a.name}") or resolve(node.module) for a in node.names]
            edges[m] |= {t for t in targets if t and t != m and not m.startswith(t + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_circles():
    assert cycles(import_graph(modules())) == []


def test_no_package_imports_one_above_it():
    rank = {p: i for i, p in enumerate(PACKAGES)}
    uphill = [(m, t) for m, ts in import_graph(modules()).items() for t in ts
              if rank[t.split(".")[0]] > rank[m.split(".")[0]]]
    assert uphill == []


def test_the_cycle_finder_finds_a_circle():
    """The check can fail: the CLI's old shape (cli imports the commands, a command imports cli)."""
    assert cycles({"flowpulse.cli": {"flowpulse.cmd_fault"}, "flowpulse.cmd_fault": {"flowpulse.cli"},
                   "flowpulse.errors": set()}) == [["flowpulse.cli", "flowpulse.cmd_fault"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
