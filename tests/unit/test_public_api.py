"""The declared public surface of `probes` (as httpx checks its own exports).

A module whose dotted path has no `_`-prefixed part is public and names what other modules
may import from it in `__all__`; every name there exists. `_`-prefixed modules and names are
private to their package: a private module is imported only from inside the package that
holds it, a private name only from a module of the importer's own package, and a name
imported across packages from a public module is one its `__all__` declares. Tests and
benchmarks may reach inside (they test and time internals); the rules bind the product.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Being edited for issue 15 in a separate branch; its `__all__` is added once that merges
# (the test below fails as soon as it has one, so this list cannot go stale).
PENDING_ALL: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def public(self) -> bool:
        return not any(part.startswith("_") for part in self.name.split("."))


def modules(root: Path, package: str) -> list[Module]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found.append(Module(".".join(parts), path, is_package))
    return found


def declared_all(module: Module) -> list[str] | None:
    """`__all__` as written (a literal list or tuple), or None when there is none."""
    for node in ast.parse(module.path.read_text()).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else (
            node.targets if isinstance(node, ast.Assign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    return None


def missing_all(root: Path, package: str, pending: frozenset[str] = frozenset()) -> list[str]:
    """Public modules without `__all__` (and pending ones that have one now)."""
    problems = []
    for module in modules(root, package):
        if not module.public:
            continue
        has = declared_all(module) is not None
        if not has and module.name not in pending:
            problems.append(f"{module.name}: no __all__")
        if has and module.name in pending:
            problems.append(f"{module.name}: has __all__ now; take it off PENDING_ALL")
    return problems


def absent_exports(root: Path, package: str) -> list[str]:
    """Names listed in an `__all__` that the imported module does not have, and repeats."""
    problems = []
    for module in modules(root, package):
        names = declared_all(module)
        if names is None:
            continue
        imported = importlib.import_module(module.name)
        problems += [f"{module.name}: __all__ lists {n!r}, which it does not define"
                     for n in names if not hasattr(imported, n)]
        if len(set(names)) != len(names):
            problems.append(f"{module.name}: __all__ repeats a name")
    return problems


def _imports(module: Module, package: str) -> Iterator[tuple[str, str | None, int]]:
    """(module imported from, name or None for `import x`, line) for imports of `package`."""
    for node in ast.walk(ast.parse(module.path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
            node.module == package or node.module.startswith(package + ".")
        ):
            for alias in node.names:
                yield node.module, alias.name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    yield alias.name, None, node.lineno


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def private_reaches(root: Path, package: str) -> list[str]:
    """Imports of a private module from outside its package, of a private name from another
    package, or of a name a public module's `__all__` does not declare."""
    problems = []
    for module in modules(root, package):
        for source, name, line in _imports(module, package):
            where = f"{module.name}:{line}: {source}{'' if name is None else ' ' + name}"
            parts = source.split(".")
            target = source if name is None else f"{source}.{name}"
            private_at = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
            if private_at is not None:
                owner = ".".join(parts[:private_at])
                if not _inside(module.name, owner):
                    problems.append(f"{where}: private module of {owner}")
                continue
            if name is None:
                continue
            imported = importlib.import_module(source)
            if isinstance(getattr(imported, name, None), types.ModuleType):
                if name.startswith("_") and not _inside(module.name, source):
                    problems.append(f"{where}: private module {target}")
                continue
            if name.startswith("_") and not name.endswith("__"):  # a dunder is not private
                if source.rpartition(".")[0] != module.package and source != module.package:
                    problems.append(f"{where}: private name from another package")
                continue
            exported = getattr(imported, "__all__", None)
            if exported is not None and name not in exported and source != module.package:
                problems.append(f"{where}: not in {source}.__all__")
    return problems


def test_every_public_module_declares_all() -> None:
    assert missing_all(ROOT, "probes", PENDING_ALL) == []


def test_every_exported_name_exists() -> None:
    assert absent_exports(ROOT, "probes") == []


def test_no_module_reaches_into_another_packages_privates() -> None:
    assert private_reaches(ROOT, "probes") == []


def test_package_exports_come_from_inside_the_package() -> None:
    # As httpx checks `__module__`: what a package re-exports is its own code.
    for module in modules(ROOT, "probes"):
        if not module.is_package:
            continue
        imported = importlib.import_module(module.name)
        for name in imported.__all__:
            origin = getattr(getattr(imported, name), "__module__", None)
            if isinstance(origin, str) and origin.startswith("probes"):
                assert _inside(origin, module.name), (module.name, name, origin)


# -- the checks themselves fail on a package that breaks the rules -----------------------


@pytest.fixture
def broken(tmp_path: Path) -> Iterator[Path]:
    pkg = tmp_path / "brokenpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "1"\n__all__ = ["__version__", "gone"]\n')
    (pkg / "nothing_declared.py").write_text("def f() -> None: ...\n")
    (pkg / "_private.py").write_text("def _helper() -> None: ...\nVALUE = 1\n")
    (pkg / "sub" / "__init__.py").write_text("__all__: list[str] = []\n")
    (pkg / "sub" / "user.py").write_text(
        "from brokenpkg import __version__\n"
        "from brokenpkg._private import VALUE\n"
        "from brokenpkg.other import _hidden, undeclared\n"
        '__all__ = ["VALUE"]\n'
    )
    (pkg / "sub" / "_inner.py").write_text("X = 1\n")
    (pkg / "other.py").write_text("from brokenpkg.sub._inner import X\n"
                                  "def _hidden() -> None: ...\ndef undeclared() -> None: ...\n"
                                  '__all__ = ["X"]\n')
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if _inside(m, "brokenpkg")]:
            del sys.modules[name]


def test_the_checks_catch_what_they_forbid(broken: Path) -> None:
    assert missing_all(broken, "brokenpkg") == ["brokenpkg.nothing_declared: no __all__"]
    assert missing_all(broken, "brokenpkg", frozenset({"brokenpkg.other"})) == [
        "brokenpkg.nothing_declared: no __all__",
        "brokenpkg.other: has __all__ now; take it off PENDING_ALL",
    ]
    assert absent_exports(broken, "brokenpkg") == [
        "brokenpkg: __all__ lists 'gone', which it does not define"]
    reaches = private_reaches(broken, "brokenpkg")
    assert [r.partition(": ")[2] for r in reaches] == [
        "brokenpkg.sub._inner X: private module of brokenpkg.sub",
        "brokenpkg.other _hidden: private name from another package",
        "brokenpkg.other undeclared: not in brokenpkg.other.__all__",
    ]
