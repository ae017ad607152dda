"""The engine's schedules: when each (path, endpoint) sends, how the schedules share one
timer, and how a smaller cohort's endpoints are sped up (cohort balancing).

The schedules share one timer: a heap of (next send, schedule) and one timer armed for the
earliest. On Linux it is a timerfd (`probes.run._precise_timer`), as `call_at` wakes up to 1 ms
late (asyncio rounds its waits up to whole ms) and that lateness would be in every latency;
sends close together (or many per second) still share `call_at`'s coarser wakes, which cost
less CPU, and elsewhere it is `call_at` throughout. A task per schedule sleeping between
sends would cost, per send, a Future, a timer handle and a task step, and keep thousands of
such objects alive for a period each: at 2,400 endpoints that was both CPU and the bulk of
what every garbage collection had to walk (pauses of tens of milliseconds in the schedule
lag). A removed endpoint's schedule is marked dead and dropped when it comes up.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import zlib
from collections.abc import Callable, Iterable

from probes.run._precise_timer import Backend, PreciseTimer
from probes.spec import PathSpec
from probes.types import Endpoint

__all__ = [
    "COARSE_ABOVE_RATE_PER_S",
    "COARSE_WITHIN_S",
    "Schedule",
    "Timetable",
    "balance",
    "intended_rates",
    "phase",
]

# Sends close together wait on `call_at`, not the timerfd: a send due within COARSE_WITHIN_S
# of the timer's last firing, and every send while the schedules add up to more than
# COARSE_ABOVE_RATE_PER_S. A precise wake for each such send costs a wake of the process
# (CPU per call +30 % at 2,400 sends/s, about +5 % at 250/s; BENCHMARKS.md D9), while
# `call_at`'s millisecond rounding lets one wake, or a wake the loop makes for answers
# anyway, send several. Their lateness (up to 1 ms) stays in their latency, as any send's.
COARSE_WITHIN_S = 0.001
COARSE_ABOVE_RATE_PER_S = 250.0


def phase(key: str, period: float) -> float:
    # A stable spread of first sends over one period, so N endpoints don't fire together.
    return (zlib.crc32(key.encode()) / 2**32) * period


class Schedule:
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


def balance(schedules: Iterable[Schedule], cohort_balance_max: float) -> None:
    """Per path, speed up the endpoints of the smaller cohorts so that each cohort gets
    about as many calls per second as the largest, up to `cohort_balance_max` × the
    path's rate per endpoint: early in a rollout the canary is one pod of many, and the
    smaller cohort limits every two-sample test."""
    schedules = list(schedules)
    counts: dict[tuple[str, str], int] = {}
    largest: dict[str, int] = {}
    for s in schedules:
        key = (s.path.name, s.cohort)
        counts[key] = counts.get(key, 0) + 1
        largest[s.path.name] = max(largest.get(s.path.name, 0), counts[key])
    ceiling = max(1.0, cohort_balance_max)
    for s in schedules:
        factor = min(ceiling, largest[s.path.name] / counts[(s.path.name, s.cohort)])
        if factor != s.factor:
            s.speed(factor)


def intended_rates(schedules: Iterable[Schedule]) -> dict[tuple[str, str], float]:
    """Calls per second the schedules intend, per (path, cohort)."""
    rates: dict[tuple[str, str], float] = {}
    for s in schedules:
        key = (s.path.name, s.cohort)
        rates[key] = rates.get(key, 0.0) + 1.0 / s.period
    return rates


class Timetable:
    """The next send of every schedule on one heap, and one timer armed for the earliest.
    The engine's `fire` pops what is due from `heap`, `add`s each schedule back at its next
    send and calls `arm` again."""

    def __init__(self, fire: Callable[[], None], backend: Backend | None) -> None:
        # (due, tie-breaker, schedule): every live schedule's next send (and dead ones'
        # until they come up).
        self.heap: list[tuple[float, int, Schedule]] = []
        self._seq = itertools.count()
        self._fire = fire
        self._backend = backend
        self.timer: PreciseTimer | None = None
        self.timer_at = float("inf")
        self.fired_at = float("-inf")
        # True while the schedules add up to more than COARSE_ABOVE_RATE_PER_S.
        self.coarse_rate = False

    def add(self, schedule: Schedule) -> None:
        heapq.heappush(self.heap, (schedule.due, next(self._seq), schedule))

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make the timer fire at the earliest due send (re-armed only if that moved)."""
        if not self.heap:
            return
        due = self.heap[0][0]
        if due >= self.timer_at:
            return
        timer = self.timer
        if timer is None or timer.loop is not loop:
            if timer is not None:
                timer.close()
            timer = self.timer = PreciseTimer(loop, self._fire, backend=self._backend)
        timer.arm(due, coarse=self.coarse_rate or due - self.fired_at < COARSE_WITHIN_S)
        self.timer_at = due

    def close(self) -> None:
        """Close the timer and forget every pending send."""
        if self.timer is not None:
            self.timer.close()
            self.timer, self.timer_at = None, float("inf")
        self.heap.clear()
