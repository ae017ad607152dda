"""The scheduler: every path on every matching endpoint, at an open-loop rate.

Each (path, endpoint) has its own schedule, as in Cloudprober's scheduler (`_schedule`: how
the schedules share one timer); each call runs in its own task under `asyncio.timeout`, so a
hung callee never delays the next send (open loop, as wrk2 and Fortio do). Sends follow fixed
intended times `start + k / rate`; latency is measured from the intended time, so a stalled
probe or callee cannot hide its latency (coordinated omission), and the schedule lag (actual
− intended send time) is reported on its own so the probe's own starvation is told apart
from the callee's slowness. Long-lived stream paths keep one task per (path, endpoint)
(`StreamHolder.hold`), cancelled when the endpoint leaves.

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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from asyncio_throttle import Throttler

from probes.run._precise_timer import Backend
from probes.run._schedule import (
    COARSE_ABOVE_RATE_PER_S,
    Schedule,
    Timetable,
    balance,
    intended_rates,
    phase,
)
from probes.run.seams import EndpointObserver, Prober, ResultSink, StreamHolder
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

@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_rate_per_s: float = DEFAULT_MAX_RATE_PER_S
    max_catch_up_s: float = 0.25
    # The most a small cohort's endpoints are sped up so that, per path, each cohort gets
    # about as many calls per second as the largest (1: every endpoint at the path's rate).
    cohort_balance_max: float = DEFAULT_COHORT_BALANCE_MAX


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
        self._schedules: dict[tuple[str, str], Schedule] = {}
        self._holders: dict[tuple[str, str], asyncio.Task[None]] = {}
        # The next send of every schedule and one timer armed for the earliest.
        # Backend None: the most precise this platform offers (`probes.run._precise_timer`).
        self._timetable = Timetable(self._fire, timer_backend)
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
        timer = self._timetable.timer
        return timer.backend if timer is not None else None

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
                schedule = Schedule(
                    path, endpoint, self.cohort_of(endpoint),
                    now + phase(f"{path.name}|{endpoint.key}", period),
                )
                self._schedules[(path.name, key)] = schedule
                self._timetable.add(schedule)
        for prober in self.probers.values():
            if isinstance(prober, EndpointObserver):
                prober.observe(snapshot)
        balance(self._schedules.values(), self.limits.cohort_balance_max)
        rate = sum(1.0 / s.period for s in self._schedules.values())
        self._timetable.coarse_rate = rate > COARSE_ABOVE_RATE_PER_S
        self._timetable.arm(loop)

    def intended_rates(self) -> dict[tuple[str, str], float]:
        """Calls per second the schedule intends, per (path, cohort)."""
        return intended_rates(self._schedules.values())

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
        self._timetable.close()
        for schedule in self._schedules.values():
            schedule.live = False
        self._schedules.clear()
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

    def _fire(self) -> None:
        """Send every call that is due; skip those too far behind; re-arm."""
        loop = asyncio.get_running_loop()
        timetable = self._timetable
        timetable.timer_at = float("inf")  # the timer is spent; `arm` sets it again
        heap = timetable.heap
        now = timetable.fired_at = loop.time()
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
                timetable.add(schedule)
                continue
            schedule.k += 1
            timetable.add(schedule)
            if len(self._calls) >= max_in_flight:
                self.sink.dropped(schedule.path.name, "max_in_flight")
                continue
            task = loop.create_task(self._call(schedule.path, schedule.endpoint, intended))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        timetable.arm(loop)

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
