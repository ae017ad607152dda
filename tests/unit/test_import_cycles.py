"""No import circles among the modules of `probes` and `targets`.

Read statically with `ast`: every import counts, the ones inside functions and under
`TYPE_CHECKING` too, since an import moved into a function hides a circle without removing
it. `from a.b import c` is an arrow to the module `a.b.c` when there is one, else to `a.b`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Circles left for later, none now. The test fails once one is gone, so this list cannot
# go stale.
ALLOWED: frozenset[frozenset[str]] = frozenset()


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


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
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


def cycles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

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
            component = set()
            while (w := stack.pop()) != v:
                component.add(w)
            if component:
                found.add(frozenset({v, *component}))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_but_the_allowed_one() -> None:
    found = cycles(import_graph(ROOT, ("probes", "targets")))
    assert sorted(map(sorted, found - ALLOWED)) == [], "import circles"
    assert sorted(map(sorted, ALLOWED - found)) == [], "gone: take them off ALLOWED"


def test_the_check_sees_circles_hidden_in_functions(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "a.py": "from loopy import b\n",
        "b.py": "def f():\n    from loopy.a import X\n",
        "sub/__init__.py": "from .c import Y\n",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..d import Z\n",
        "d.py": "import loopy.sub.c\n",
        "e.py": "from loopy.sub import Y\nfrom loopy import a\n",
    }
    for name, text in files.items():
        path = tmp_path / "loopy" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    graph = import_graph(tmp_path, ("loopy",))
    assert graph["loopy.e"] == {"loopy.sub", "loopy.a"}
    assert cycles(graph) == {frozenset({"loopy.a", "loopy.b"}),
                             frozenset({"loopy.sub.c", "loopy.d"})}
