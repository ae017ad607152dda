"""Every third-party package the product imports is declared in pyproject.toml itself, not
only pulled in by another dependency (hpack came with h2; httpcore with httpx): a lower
bound is only a promise for what is declared."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("probes", "targets")


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = set()
    for requirement in project["dependencies"]:
        name = re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0]
        names.add(name.lower().replace("_", "-"))
    return names


def imported() -> dict[str, set[str]]:
    """Top-level modules imported by the product, and the files that import each."""
    found: dict[str, set[str]] = {}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    tops = [alias.name.split(".")[0] for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    tops = [node.module.split(".")[0]]
                else:
                    continue
                for top in tops:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_declared() -> None:
    distributions = packages_distributions()
    wanted = declared()
    missing = {}
    for top, files in imported().items():
        if top in PRODUCT or top in sys.stdlib_module_names or top == "__future__":
            continue
        dists = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
        if not dists & wanted:
            missing[top] = sorted(files)[:3]
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
