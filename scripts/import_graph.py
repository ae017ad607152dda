"""The import graph of `probes` and `targets`: modules, arrows, layers and circles.

    python scripts/import_graph.py [REPO_ROOT]

Read statically with `ast`: every import counts, the ones inside functions and under
`TYPE_CHECKING` too, since an import moved into a function hides a circle without removing
it. `from a.b import c` is an arrow to the module `a.b.c` when there is one, else to `a.b`.
Layers are the longest chain of imports once each circle counts as one node: how many
modules a change at the bottom can ripple through. `tests/unit/test_import_cycles.py` runs
it on the repository and allows no circle but its list.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path

__all__ = ["PACKAGES", "cycles", "import_graph", "longest_chain", "module_files", "report"]

PACKAGES = ("probes", "targets")


def module_files(root: Path, packages: Iterable[str]) -> dict[str, tuple[Path, bool]]:
    """Dotted name → (file, is a package's `__init__`)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Each module's arrows to the other modules of `packages` it imports."""
    files = module_files(root, packages)

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in files.items():
        here = name if is_package else name.rpartition(".")[0]
        imported: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                imported += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                             for a in node.names]
        graph[name] = {m for m in map(known, imported) if m is not None and m != name}
    return graph


def components(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """Every strongly connected component (Tarjan's algorithm), dependencies first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {v}
            while (w := stack.pop()) != v:
                component.add(w)
            found.append(frozenset(component))

    # A module imports at most every other one: the recursion is that deep at worst.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The circles: components of more than one module."""
    return {c for c in components(graph) if len(c) > 1}


def longest_chain(graph: Mapping[str, set[str]]) -> list[str]:
    """The longest chain of imports, a circle counted as one node (named by its first
    module in sorted order); its length is the graph's number of layers."""
    comps = components(graph)
    comp_of = {v: i for i, c in enumerate(comps) for v in c}

    @cache
    def chain(i: int) -> tuple[str, ...]:
        below = [chain(comp_of[w]) for v in comps[i] for w in graph[v] if comp_of[w] != i]
        deepest: tuple[str, ...] = max(below, key=len) if below else ()
        return (min(comps[i]), *deepest)

    return max((list(chain(i)) for i in range(len(comps))), key=len, default=[])


def report(root: Path) -> list[str]:
    """The figures, one per line, as `main` prints them."""
    graph = import_graph(root)
    chain = longest_chain(graph)
    top = sorted(p.name for p in (root / "probes").glob("*.py") if p.name != "__init__.py")
    lines = [
        f"modules {len(graph)}, arrows {sum(map(len, graph.values()))}, layers {len(chain)}",
        f"top-level modules in probes/: {len(top)} (+ __init__.py)",
        "longest chain: " + " -> ".join(chain),
    ]
    lines += [f"circle: {c}" for c in sorted(map(sorted, cycles(graph)))]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    root = Path(args[0] if args else ".")
    if not (root / "probes").is_dir():
        print(f"import_graph: {root}: no probes/ package here", file=sys.stderr)
        return 2
    try:
        print("\n".join(report(root)), flush=True)
    except BrokenPipeError:  # `| head`: the rest goes nowhere, and so does the final flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
