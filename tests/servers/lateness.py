"""How late the test's event loop woke up while a block ran: what a timer-bound check must
allow on a loaded machine, measured rather than guessed (a stalled loop fires timers, and
reads what they caused, late by as much)."""

from __future__ import annotations

import asyncio

__all__ = ["LoopLateness"]


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
