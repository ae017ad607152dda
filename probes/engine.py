"""The scheduler: every path on every matching endpoint, at an open-loop rate.

One task per (path, endpoint), as Cloudprober's scheduler does; each call runs in its own
task under `asyncio.timeout`, so a hung callee never delays the next send (open loop, as
wrk2 and Fortio do). Sends follow fixed intended times `start + k / rate`; latency is
measured from the intended time, so a stalled probe or callee cannot hide its latency
(coordinated omission), and the schedule lag (actual − intended send time) is reported on
its own so the probe's own starvation is told apart from the callee's slowness.

Safety bounds: `max_in_flight` calls at once across the probe (a call that would exceed it
is dropped and counted, not queued), a global rate ceiling (asyncio-throttle) that protects
targets from a misconfigured probe, and a catch-up limit: a loop that has fallen more than
`max_catch_up_s` behind skips the missed sends (counted as dropped) instead of bursting.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from asyncio_throttle import Throttler

from probes._spec import PathSpec
from probes._types import CallOutcome, CallResult, Endpoint, Outcome

log = logging.getLogger("skewprobe.engine")


class Prober(Protocol):
    """Runs one call of one path on one endpoint (see `probes.clients`)."""

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome: ...

    def forget(self, endpoint: Endpoint) -> None: ...

    async def aclose(self) -> None: ...


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


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_in_flight: int = 1000
    max_rate_per_s: float = 20000.0
    max_catch_up_s: float = 1.0


def _phase(key: str, period: float) -> float:
    # A stable spread of first sends over one period, so N endpoints don't fire together.
    return (zlib.crc32(key.encode()) / 2**32) * period


class Engine:
    """Runs the schedule for the endpoint snapshots a discovery source yields."""

    def __init__(
        self,
        paths: Sequence[PathSpec],
        probers: Mapping[str, Prober],
        sink: ResultSink,
        *,
        cohort_by: str = "proxy_version",
        limits: EngineLimits = EngineLimits(),
        streams: StreamHolder | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.paths = tuple(paths)
        self.probers = probers
        self.sink = sink
        self.cohort_by = cohort_by
        self.limits = limits
        self.streams = streams
        self._wall = wall
        self._throttler = Throttler(rate_limit=max(1, int(limits.max_rate_per_s)), period=1.0)
        self._loops: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._calls: set[asyncio.Task[None]] = set()
        self._endpoints: dict[str, Endpoint] = {}
        self._snapshot_seen = asyncio.Event()

    # -- state for progress and health ---------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(self._endpoints.values())

    @property
    def loops(self) -> int:
        return len(self._loops)

    async def wait_for_endpoints(self) -> None:
        await self._snapshot_seen.wait()

    def cohort_of(self, endpoint: Endpoint) -> str:
        return endpoint.labels.get(self.cohort_by, "unknown")

    # -- the main loop -------------------------------------------------------------------

    async def run(self, snapshots: AsyncIterator[Sequence[Endpoint]]) -> None:
        """Apply snapshots until cancelled; on cancellation stop every loop and call."""
        try:
            async for snapshot in snapshots:
                self.apply(snapshot)
                self._snapshot_seen.set()
        finally:
            await self.stop()

    def apply(self, snapshot: Sequence[Endpoint]) -> None:
        """Start loops for new (path, endpoint) pairs and cancel those of removed endpoints."""
        current = {e.key: e for e in snapshot}
        for key in self._endpoints.keys() - current.keys():
            gone = self._endpoints.pop(key)
            for path in self.paths:
                task = self._loops.pop((path.name, key), None)
                if task is not None:
                    task.cancel()
                prober = self.probers.get(path.name)
                if prober is not None:
                    prober.forget(gone)
        for key, endpoint in current.items():
            if key in self._endpoints:
                continue
            self._endpoints[key] = endpoint
            for path in self.paths:
                if not path.matches(endpoint):
                    continue
                if path.stream is not None:
                    if self.streams is None:
                        continue
                    coro = self.streams.hold(path, endpoint, self.cohort_of(endpoint))
                else:
                    coro = self._loop(path, endpoint)
                task = asyncio.create_task(coro, name=f"{path.name}@{endpoint.name}")
                self._loops[(path.name, key)] = task

    async def stop(self, grace_s: float = 0.0) -> None:
        """Cancel the schedule; give in-flight calls `grace_s` to finish, then cancel them."""
        loops = list(self._loops.values())
        self._loops.clear()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        if self._calls and grace_s > 0:
            await asyncio.wait(set(self._calls), timeout=grace_s)
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    async def _loop(self, path: PathSpec, endpoint: Endpoint) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / path.rate_per_s
        start = loop.time() + _phase(f"{path.name}|{endpoint.key}", period)
        k = 0
        while True:
            intended = start + k * period
            delay = intended - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > self.limits.max_catch_up_s:
                # Far behind (the process was starved or paused): skip, don't burst.
                skipped = int(-delay / period)
                self.sink.dropped(path.name, "behind_schedule", skipped)
                k += skipped
                continue
            k += 1
            if len(self._calls) >= self.limits.max_in_flight:
                self.sink.dropped(path.name, "max_in_flight")
                continue
            task = asyncio.create_task(self._call(path, endpoint, intended))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self, path: PathSpec, endpoint: Endpoint, intended: float) -> None:
        loop = asyncio.get_running_loop()
        wall_offset = self._wall() - loop.time()
        await self._throttler.acquire()
        sent = loop.time()
        prober = self.probers[path.name]
        try:
            async with asyncio.timeout(path.timeout_s):
                outcome = await prober.call(endpoint, uuid.uuid4().hex)
        except TimeoutError:
            outcome = CallOutcome(Outcome.TIMEOUT, detail=f"no answer within {path.timeout_s}s")
        except LookupError as exc:
            outcome = CallOutcome(Outcome.PROBE_ERROR, detail=str(exc))
        except Exception as exc:
            # A prober bug must not kill the schedule; it is counted and logged, never "ok".
            log.exception("prober %s failed on %s", path.name, endpoint.name)
            outcome = CallOutcome(Outcome.PROBE_ERROR, detail=f"{type(exc).__name__}: {exc}")
        done = loop.time()
        cohort = outcome.cohort_hint or self.cohort_of(endpoint)
        self.sink.record(
            CallResult(
                path=path.name,
                endpoint=endpoint.name,
                cohort=cohort,
                intended_at=intended + wall_offset,
                latency_s=done - intended,
                lag_s=max(0.0, sent - intended),
                outcome=outcome,
            ),
            endpoint,
        )
