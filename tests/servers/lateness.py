"""How late the test's event loop woke up while a block ran: what a timer-bound check must
allow on a loaded machine, measured rather than guessed (a stalled loop fires timers, and
reads what they caused, late by as much)."""

from __future__ import annotations

import asyncio
import time

__all__ = ["LoopLateness", "RunQueueWait"]


class LoopLateness:
    """`async with LoopLateness() as late:`; then `late.max_s`, the most one tick woke late."""

    TICK_S = 0.01

    def __init__(self) -> None:
        self.max_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.TICK_S
            await asyncio.sleep(self.TICK_S)
            self.max_s = max(self.max_s, loop.time() - due)

    async def __aenter__(self) -> LoopLateness:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class RunQueueWait:
    """`async with RunQueueWait() as rq:`; then `rq.waited(t0, t1)`: how long this thread (the
    event loop's) sat runnable but unscheduled around the wall-clock span [t0, t1], from the
    kernel's own count (`/proc/thread-self/schedstat`). A loop late by that much was late
    because the machine gave its core to others, not because of its own work. Sampled every
    `EVERY_S`; the span is widened to the samples around it, so the figure can only be
    generous. Without schedstat (a kernel built without it) every span waited 0 s."""

    EVERY_S = 0.05
    SOURCE = "/proc/thread-self/schedstat"

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (time.time(), seconds waited so far)
        self._task: asyncio.Task[None] | None = None

    def _read(self) -> float | None:
        try:
            with open(self.SOURCE) as f:
                return int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    async def _sample(self) -> None:
        while True:
            waited = self._read()
            if waited is None:
                return
            self.samples.append((time.time(), waited))
            await asyncio.sleep(self.EVERY_S)

    def waited(self, t0: float, t1: float) -> float:
        """Seconds spent waiting for a core between the last sample at or before `t0` and
        the first at or after `t1` (the ends of the samples where the span runs past them)."""
        if not self.samples:
            return 0.0
        before = [w for t, w in self.samples if t <= t0]
        after = [w for t, w in self.samples if t >= t1]
        return (after[0] if after else self.samples[-1][1]) - (
            before[-1] if before else self.samples[0][1])

    def starved(self, at: float, reach_s: float, budget_s: float) -> bool:
        """Did this thread wait for a core at least `budget_s` in the `reach_s` before `at`
        (an overload rule's look back when it fired at `at`)?"""
        return self.waited(at - reach_s, at) >= budget_s

    async def __aenter__(self) -> RunQueueWait:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if (last := self._read()) is not None:
            self.samples.append((time.time(), last))
