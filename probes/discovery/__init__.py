"""Where endpoints and their proxy versions come from.

A discovery source is anything with `snapshots()`: an async iterator that yields the full
current endpoint list each time it changes. The engine diffs consecutive snapshots, so a
source never reports additions and removals separately.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from probes.discovery.file import FileSource, parse_endpoints
from probes.discovery.static import StaticSource
from probes.types import Endpoint

__all__ = ["DiscoverySource", "FileSource", "StaticSource", "parse_endpoints"]


class DiscoverySource(Protocol):
    def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        """Yield the whole endpoint list now, then again whenever it changes."""
        ...
