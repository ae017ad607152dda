"""skewprobe: a caller-side canary and regression probe for service-mesh upgrades."""

from __future__ import annotations

import importlib.metadata

__all__ = ["__version__"]

try:
    __version__ = importlib.metadata.version("skewprobe")
except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
    __version__ = "0+unknown"
