"""Where endpoints and their proxy versions come from.

A discovery source is anything with `snapshots()`: an async iterator that yields the full
current endpoint list each time it changes. The engine diffs consecutive snapshots, so a
source never reports additions and removals separately. The simplest is here
(`StaticSource`, the config's static targets); the others have a module each (`file`,
`kubernetes`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from probes.discovery.file import FileSource, parse_endpoints
from probes.types import Endpoint

__all__ = ["DiscoverySource", "FileSource", "StaticSource", "parse_endpoints"]


class DiscoverySource(Protocol):
    def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        """Yield the whole endpoint list now, then again whenever it changes."""
        ...


class StaticSource:
    """Static targets from the config: one snapshot, then nothing changes."""

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self._endpoints = tuple(endpoints)

    async def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        yield self._endpoints
        # Static targets never change; park until the engine cancels us.
        await asyncio.Event().wait()
