"""The engine's seams as typed Protocols: the prober that runs one call, the sink that takes
its result, the holder of long-lived streams, and a prober shown every discovery snapshot.
`probes.clients` implements the probers and the stream holder; the runner's `Recorder` is the
sink."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from probes.spec import PathSpec
from probes.types import CallOutcome, CallResult, Endpoint

__all__ = ["EndpointObserver", "Prober", "ResultSink", "StreamHolder"]


class Prober(Protocol):
    """Runs one call of one path on one endpoint (see `probes.clients`)."""

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome: ...

    def forget(self, endpoint: Endpoint) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class EndpointObserver(Protocol):
    """A prober that is shown every discovery snapshot (the relay prober judges stale
    routing against it)."""

    def observe(self, endpoints: Sequence[Endpoint]) -> None: ...


class ResultSink(Protocol):
    """Takes finished calls (the aggregator and the metrics surface)."""

    def record(self, result: CallResult, endpoint: Endpoint) -> None: ...

    def dropped(self, path: str, reason: str, count: int = 1) -> None: ...


class StreamHolder(Protocol):
    """Holds a path's long-lived streams on one endpoint until cancelled
    (`probes.clients.StreamProber`).

    Cancelling `hold()` (the endpoint left discovery, or the engine stops) only stops
    re-opening: a restarting pod leaves the endpoint list before it drains, so the holder
    keeps the open streams until they end on their own (bounded by its linger time) and the
    drain's resets are still counted. The holder's own `aclose()` ends them at shutdown.
    """

    async def hold(self, path: PathSpec, endpoint: Endpoint, cohort: str) -> None: ...
