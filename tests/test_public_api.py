"""The declared public surface, as httpx checks its own: every public module names what it
exports in `__all__`, every name there exists, and a private module (`_x`) is imported only
from inside its own package."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import probes

ROOT = Path(probes.__file__).resolve().parent


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(ROOT)], prefix="probes."))


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split(".")[1:])


PUBLIC = [m for m in _modules() if _public(m)]


def test_the_walk_finds_the_package() -> None:
    assert {"probes.verdict", "probes.engine", "probes.stats.pods"} <= set(PUBLIC)
    assert "probes.clients._h1" in _modules() and "probes.clients._h1" not in PUBLIC


@pytest.mark.parametrize("name", ["probes", *PUBLIC])
def test_every_public_module_declares_all_and_every_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__ list"
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def test_private_modules_are_imported_only_inside_their_own_package() -> None:
    offences = []
    for info in pkgutil.walk_packages([str(ROOT)], prefix="probes."):
        spec = importlib.util.find_spec(info.name)
        assert spec is not None and spec.origin is not None
        path = Path(spec.origin)
        here = _package_of(info.name, path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("probes.")):
                continue
            parts = node.module.split(".")
            for i, part in enumerate(parts[1:], start=1):
                owner = ".".join(parts[:i])
                if part.startswith("_") and not (here == owner or here.startswith(owner + ".")):
                    offences.append(f"{info.name} imports {node.module}")
                    break
    assert not offences, offences
