"""A benchmark script under `benchmarks/` loaded as a module, for the tests that check what
it puts beside the verdict (the optima a goal is measured against)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_benchmark"]


def load_benchmark(name: str) -> ModuleType:
    """`benchmarks/<name>.py` as module `name` (registered, so the scripts it imports by
    name find it)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
