"""Per-endpoint clients (an HTTP transport, a gRPC channel) with an orderly end.

A client is created on an endpoint's first call and reused (keep-alive per endpoint). When
discovery drops the endpoint (`forget`), or a prober decides a client must not be reused
(`retire`), the client is closed as soon as its last in-flight call has finished, so no
call is cut short by someone else's clean-up. Closing runs in tasks kept in a set and
awaited by `aclose`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from probes.types import Endpoint

C = TypeVar("C")


@dataclass(eq=False)
class Lease(Generic[C]):
    """One endpoint's client and the calls currently using it."""

    key: str
    client: C
    in_flight: int = 0
    retired: bool = False
    closing: bool = False


class EndpointPool(Generic[C]):
    def __init__(
        self, create: Callable[[Endpoint], C], close: Callable[[C], Awaitable[None]]
    ) -> None:
        self._create = create
        self._close = close
        self._leases: dict[str, Lease[C]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._leases)

    @contextlib.asynccontextmanager
    async def use(self, endpoint: Endpoint) -> AsyncIterator[Lease[C]]:
        lease = self.acquire(endpoint)
        try:
            yield lease
        finally:
            self.release(lease)

    def acquire(self, endpoint: Endpoint) -> Lease[C]:
        """The endpoint's client, counted as in use until `release`: `use` without the
        context manager, for a holder that keeps a lease for hours (a held stream), where
        the manager's generator and frame would be kept alive per stream."""
        if self._closed:
            raise RuntimeError("prober is closed")
        lease = self._leases.get(endpoint.key)
        if lease is None:
            lease = Lease(endpoint.key, self._create(endpoint))
            self._leases[endpoint.key] = lease
        lease.in_flight += 1
        return lease

    def release(self, lease: Lease[C]) -> None:
        lease.in_flight -= 1
        if lease.retired and lease.in_flight == 0:
            self._close_soon(lease)

    def retire(self, lease: Lease[C]) -> None:
        """Stop handing this client out; close it once its calls are done."""
        if self._leases.get(lease.key) is lease:
            del self._leases[lease.key]
        if not lease.retired:
            lease.retired = True
            if lease.in_flight == 0:
                self._close_soon(lease)

    def forget(self, endpoint: Endpoint) -> None:
        lease = self._leases.get(endpoint.key)
        if lease is not None:
            self.retire(lease)

    async def aclose(self) -> None:
        """Close every client now, in-flight or not, and wait for the closing to finish."""
        self._closed = True
        leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            lease.retired = True
            self._close_soon(lease)
        while self._closing:
            await asyncio.gather(*self._closing)

    def _close_soon(self, lease: Lease[C]) -> None:
        if lease.closing:
            return
        lease.closing = True
        task = asyncio.get_running_loop().create_task(self._close_quietly(lease.client))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, client: C) -> None:
        # A client being thrown away has nothing left to report; an error while closing
        # its sockets must not surface as an unretrieved task exception.
        with contextlib.suppress(Exception):
            await self._close(client)
