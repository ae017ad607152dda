"""Static targets from the config: one snapshot, then nothing changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from probes.types import Endpoint

__all__ = [
    "StaticSource",
]


class StaticSource:
    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self._endpoints = tuple(endpoints)

    async def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        yield self._endpoints
        # Static targets never change; park until the engine cancels us.
        await asyncio.Event().wait()
