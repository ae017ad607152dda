"""The scheduler: every path on every matching endpoint, at an open-loop rate.

Each (path, endpoint) has its own schedule, as in Cloudprober's scheduler; each call runs in
its own task under `asyncio.timeout`, so a hung callee never delays the next send (open
loop, as wrk2 and Fortio do). Sends follow fixed intended times `start + k / rate`; latency
is measured from the intended time, so a stalled probe or callee cannot hide its latency
(coordinated omission), and the schedule lag (actual − intended send time) is reported on
its own so the probe's own starvation is told apart from the callee's slowness.

The schedules share one timer: a heap of (next send, schedule) and one timer armed for the
earliest. On Linux it is a timerfd (`probes.run._precise_timer`), as `call_at` wakes up to 1 ms
late (asyncio rounds its waits up to whole ms) and that lateness would be in every latency;
sends close together (or many per second) still share `call_at`'s coarser wakes, which cost
less CPU, and elsewhere it is `call_at` throughout. A task per schedule sleeping between
sends would cost, per send, a Future, a timer handle and a task step, and keep thousands of
such objects alive for a period each: at 2,400 endpoints that was both CPU and the bulk of
what every garbage collection had to walk (pauses of tens of milliseconds in the schedule
lag). A removed endpoint's schedule is marked dead and dropped when it comes up. Long-lived
stream paths keep one task per (path, endpoint) (`StreamHolder.hold`), cancelled when the
endpoint leaves.

Safety bounds: `max_in_flight` calls at once across the probe (a call that would exceed it
is dropped and counted, not queued), a global rate ceiling (asyncio-throttle) that protects
targets from a misconfigured probe, and a catch-up limit: a send more than `max_catch_up_s`
behind its intended time is skipped (counted as dropped) instead of sent late in a burst,
so a starved probe sheds load and recovers instead of piling up late calls that time out.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from asyncio_throttle import Throttler

from probes.run._precise_timer import Backend, PreciseTimer
from probes.spec import (
    DEFAULT_COHORT_BALANCE_MAX,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_RATE_PER_S,
    PathSpec,
)
from probes.types import CallOutcome, CallResult, Endpoint, Outcome, pair_cohort

__all__ = [
    "EndpointObserver",
    "Engine",
    "EngineLimits",
    "Prober",
    "ResultSink",
    "StreamHolder",
]

log = logging.getLogger("skewprobe.engine")

# Sends close together wait on `call_at`, not the timerfd: a send due within COARSE_WITHIN_S
# of the timer's last firing, and every send while the schedules add up to more than
# COARSE_ABOVE_RATE_PER_S. A precise wake for each such send costs a wake of the process
# (CPU per call +30 % at 2,400 sends/s, about +5 % at 250/s; BENCHMARKS.md D9), while
# `call_at`'s millisecond rounding lets one wake, or a wake the loop makes for answers
# anyway, send several. Their lateness (up to 1 ms) stays in their latency, as any send's.
COARSE_WITHIN_S = 0.001
COARSE_ABOVE_RATE_PER_S = 250.0


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


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_rate_per_s: float = DEFAULT_MAX_RATE_PER_S
    max_catch_up_s: float = 0.25
    # The most a small cohort's endpoints are sped up so that, per path, each cohort gets
    # about as many calls per second as the largest (1: every endpoint at the path's rate).
    cohort_balance_max: float = DEFAULT_COHORT_BALANCE_MAX


def _phase(key: str, period: float) -> float:
    # A stable spread of first sends over one period, so N endpoints don't fire together.
    return (zlib.crc32(key.encode()) / 2**32) * period


class _Schedule:
    """One (path, endpoint): send k is due at `start + k * period` (loop time)."""

    __slots__ = ("cohort", "endpoint", "factor", "k", "live", "path", "period", "start")

    def __init__(self, path: PathSpec, endpoint: Endpoint, cohort: str, start: float) -> None:
        self.path = path
        self.endpoint = endpoint
        self.cohort = cohort
        self.factor = 1.0
        self.period = 1.0 / path.rate_per_s
        self.start = start
        self.k = 0
        self.live = True

    @property
    def due(self) -> float:
        return self.start + self.k * self.period

    def speed(self, factor: float) -> None:
        """Send at `factor` × the path's rate from the pending send on (it keeps its time)."""
        self.start, self.k = self.due, 0
        self.factor = factor
        self.period = 1.0 / (self.path.rate_per_s * factor)


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
        timer_backend: Backend | None = None,
    ) -> None:
        self.paths = tuple(paths)
        self.probers = probers
        self.sink = sink
        self.cohort_by = cohort_by
        self.limits = limits
        self.streams = streams
        self._wall = wall
        self._throttler = Throttler(rate_limit=max(1, int(limits.max_rate_per_s)), period=1.0)
        self._schedules: dict[tuple[str, str], _Schedule] = {}
        self._holders: dict[tuple[str, str], asyncio.Task[None]] = {}
        # (due, tie-breaker, schedule): the next send of every live schedule (and of dead
        # ones until they come up); one timer armed for the earliest.
        self._heap: list[tuple[float, int, _Schedule]] = []
        self._seq = itertools.count()
        # None: the most precise this platform offers (`probes.run._precise_timer`).
        self._timer_backend = timer_backend
        self._timer: PreciseTimer | None = None
        self._timer_at = float("inf")
        self._fired_at = float("-inf")
        self._coarse_rate = False
        self._calls: set[asyncio.Task[None]] = set()
        self._endpoints: dict[str, Endpoint] = {}
        self._snapshot_seen = asyncio.Event()
        # Request ids: a random 64-bit prefix per engine and a counter, 32 hex digits like a
        # UUID, unique across probes and restarts, at a fraction of uuid4's cost per call.
        self._id_prefix = os.urandom(8).hex()
        self._id_seq = itertools.count()

    def request_id(self) -> str:
        """The `x-request-id` of the next call."""
        return f"{self._id_prefix}{next(self._id_seq):016x}"

    # -- state for progress and health ---------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(self._endpoints.values())

    @property
    def timer_backend(self) -> Backend | None:
        """The schedule timer's backend (None until the first schedule is armed)."""
        return self._timer.backend if self._timer is not None else None

    @property
    def loops(self) -> int:
        """Schedules and stream holders running."""
        return len(self._schedules) + len(self._holders)

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
        """Start schedules for new (path, endpoint) pairs and stop those of removed endpoints.

        Call from the event loop (it arms the schedule's timer)."""
        loop = asyncio.get_running_loop()
        current = {e.key: e for e in snapshot}
        for key in self._endpoints.keys() - current.keys():
            gone = self._endpoints.pop(key)
            for path in self.paths:
                schedule = self._schedules.pop((path.name, key), None)
                if schedule is not None:
                    schedule.live = False
                task = self._holders.pop((path.name, key), None)
                if task is not None:
                    task.cancel()
                prober = self.probers.get(path.name)
                if prober is not None:
                    prober.forget(gone)
        now = loop.time()
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
                    task = asyncio.create_task(coro, name=f"{path.name}@{endpoint.name}")
                    self._holders[(path.name, key)] = task
                    continue
                period = 1.0 / path.rate_per_s
                schedule = _Schedule(
                    path, endpoint, self.cohort_of(endpoint),
                    now + _phase(f"{path.name}|{endpoint.key}", period),
                )
                self._schedules[(path.name, key)] = schedule
                heapq.heappush(self._heap, (schedule.start, next(self._seq), schedule))
        for prober in self.probers.values():
            if isinstance(prober, EndpointObserver):
                prober.observe(snapshot)
        self._balance()
        rate = sum(1.0 / s.period for s in self._schedules.values())
        self._coarse_rate = rate > COARSE_ABOVE_RATE_PER_S
        self._arm(loop)

    def _balance(self) -> None:
        """Per path, speed up the endpoints of the smaller cohorts so that each cohort gets
        about as many calls per second as the largest, up to `cohort_balance_max` × the
        path's rate per endpoint: early in a rollout the canary is one pod of many, and the
        smaller cohort limits every two-sample test."""
        counts: dict[tuple[str, str], int] = {}
        largest: dict[str, int] = {}
        for s in self._schedules.values():
            key = (s.path.name, s.cohort)
            counts[key] = counts.get(key, 0) + 1
            largest[s.path.name] = max(largest.get(s.path.name, 0), counts[key])
        ceiling = max(1.0, self.limits.cohort_balance_max)
        for s in self._schedules.values():
            factor = min(ceiling, largest[s.path.name] / counts[(s.path.name, s.cohort)])
            if factor != s.factor:
                s.speed(factor)

    def intended_rates(self) -> dict[tuple[str, str], float]:
        """Calls per second the schedule intends, per (path, cohort)."""
        rates: dict[tuple[str, str], float] = {}
        for s in self._schedules.values():
            key = (s.path.name, s.cohort)
            rates[key] = rates.get(key, 0.0) + 1.0 / s.period
        return rates

    def held_streams(self) -> dict[str, int]:
        """Streams the holders keep open, per path (`per_endpoint` on each endpoint)."""
        held: dict[str, int] = {}
        by_name = {p.name: p for p in self.paths}
        for name, _ in self._holders:
            stream = by_name[name].stream
            held[name] = held.get(name, 0) + (stream.per_endpoint if stream else 0)
        return held

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop the schedule; give in-flight calls `grace_s` to finish, then cancel them."""
        if self._timer is not None:
            self._timer.close()
            self._timer, self._timer_at = None, float("inf")
        for schedule in self._schedules.values():
            schedule.live = False
        self._schedules.clear()
        self._heap.clear()
        holders = list(self._holders.values())
        self._holders.clear()
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        if self._calls and grace_s > 0:
            await asyncio.wait(set(self._calls), timeout=grace_s)
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    # -- the schedule ----------------------------------------------------------------------

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make the timer fire at the earliest due send (re-armed only if that moved)."""
        if not self._heap:
            return
        due = self._heap[0][0]
        if due >= self._timer_at:
            return
        timer = self._timer
        if timer is None or timer.loop is not loop:
            if timer is not None:
                timer.close()
            timer = self._timer = PreciseTimer(loop, self._fire, backend=self._timer_backend)
        timer.arm(due, coarse=self._coarse_rate or due - self._fired_at < COARSE_WITHIN_S)
        self._timer_at = due

    def _fire(self) -> None:
        """Send every call that is due; skip those too far behind; re-arm."""
        loop = asyncio.get_running_loop()
        self._timer_at = float("inf")  # the timer is spent; `_arm` sets it again
        heap = self._heap
        now = self._fired_at = loop.time()
        catch_up = self.limits.max_catch_up_s
        max_in_flight = self.limits.max_in_flight
        while heap and heap[0][0] <= now:
            intended, _, schedule = heapq.heappop(heap)
            if not schedule.live:
                continue
            behind = now - intended
            if behind > catch_up:
                # Far behind (the process was starved or paused): skip every send more than
                # `catch_up` late, don't burst them, and take up the schedule from there.
                skipped = int((behind - catch_up) / schedule.period) + 1
                self.sink.dropped(schedule.path.name, "behind_schedule", skipped)
                schedule.k += skipped
                heapq.heappush(heap, (schedule.due, next(self._seq), schedule))
                continue
            schedule.k += 1
            heapq.heappush(heap, (schedule.due, next(self._seq), schedule))
            if len(self._calls) >= max_in_flight:
                self.sink.dropped(schedule.path.name, "max_in_flight")
                continue
            task = loop.create_task(self._call(schedule.path, schedule.endpoint, intended))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        self._arm(loop)

    async def _call(self, path: PathSpec, endpoint: Endpoint, intended: float) -> None:
        loop = asyncio.get_running_loop()
        wall_offset = self._wall() - loop.time()
        await self._throttler.acquire()
        sent = loop.time()
        prober = self.probers[path.name]
        try:
            async with asyncio.timeout(path.timeout_s):
                outcome = await prober.call(endpoint, self.request_id())
        except TimeoutError:
            outcome = CallOutcome(Outcome.TIMEOUT, detail=f"no answer within {path.timeout_s}s")
        except LookupError as exc:
            outcome = CallOutcome(Outcome.PROBE_ERROR, detail=str(exc))
        except Exception as exc:
            # A prober bug must not kill the schedule; it is counted and logged, never "ok".
            log.exception("prober %s failed on %s", path.name, endpoint.name)
            outcome = CallOutcome(Outcome.PROBE_ERROR, detail=f"{type(exc).__name__}: {exc}")
        done = loop.time()
        if path.relay is not None:
            # Through a relay: the caller is the relay pod, the callee the pod that answered.
            cohort = pair_cohort(self.cohort_of(endpoint), outcome.cohort_hint or "unknown")
        else:
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
