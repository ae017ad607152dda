"""The unit tier's clock: an event loop on virtual time, and the guard that keeps real sleeps out.

`VirtualTimeLoop` starts its clock at zero and, whenever nothing is ready to run, jumps it to
the next timer instead of waiting: `await asyncio.sleep(600)` returns at once with
`loop.time()` 600 s later, and every schedule, timeout and poll runs in the order real time
would run it, with no wait and no jitter. Every async test under tests/unit runs on one
(`conftest.py`). Code that reads the loop's clock sees virtual time; code that takes a clock
(`wall=`, `clock=`) is given `loop.time` or `loop.wall`; `loop.advance(s)` stands for the loop
being blocked for `s` (a GC pause, a starved process). Sync code that takes a clock is given
a `FakeClock`, which the test moves by hand. Code that reads time.monotonic or time.time
itself still sees the real clock, so it must be given the loop's (as test_engine.py does for
asyncio-throttle).

Work handed to threads (`run_in_executor`, `asyncio.to_thread`) takes no virtual time: while
any is running the loop waits for it for real and the clock stands still, so a hang guard
(`asyncio.wait_for(..., 30)`) never fires because a loaded machine was slow.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

__all__ = ["FakeClock", "RealSleep", "SleepGuard", "VirtualTimeLoop", "virtual_loop"]

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector loop whose clock is virtual and skips idle time (see the module doc)."""

    # What `wall()` reads at virtual time zero: an epoch second, as time.time would give.
    EPOCH = 1_700_000_000.0

    def __init__(self) -> None:
        self._now = 0.0
        self._in_threads = 0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._now

    def wall(self) -> float:
        """A wall clock (seconds since the epoch) that moves with the loop's."""
        return self.EPOCH + self._now

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass at once, as they would while a callback blocks the loop."""
        if seconds < 0:
            raise ValueError(f"time runs forward, not by {seconds}")
        self._now += seconds

    def run_in_executor(self, executor: Executor | None, func: Callable[..., T],
                        *args: Any) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._in_threads += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any]) -> None:
        self._in_threads -= 1


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Returns what is ready now; where the loop would wait `timeout` for nothing, skips it."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        if timeout is not None and timeout <= 0:
            return super().select(0)  # type: ignore[no-any-return]
        if self._loop._in_threads or timeout is None:
            # A thread's result (or, with no timer at all, any wake-up) comes through the
            # loop's self-pipe: wait for it for real, the clock standing still.
            return super().select(None)  # type: ignore[no-any-return]
        ready: list[tuple[Any, int]] = super().select(0)
        if not ready:
            self._loop.advance(timeout)
        return ready


class FakeClock:
    """A clock for code that takes one (`clock=`) and runs outside a loop: it reads `now`,
    which the test moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def virtual_loop() -> VirtualTimeLoop:
    """The running loop, which under tests/unit is always a `VirtualTimeLoop`."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), f"not on virtual time: {loop!r}"
    return loop


class RealSleep(AssertionError):
    """A unit test waited on the real clock."""


class SleepGuard:
    """Stand-ins for `time.sleep` and `asyncio.sleep` that refuse to wait on the real clock.

    `asyncio.sleep` is still allowed on a `VirtualTimeLoop` (it waits for nothing) and with a
    delay of zero (a yield to the loop). Each refusal raises `RealSleep` and is also kept in
    `refused`, as product code may catch the exception (the engine counts a prober's)."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self._asyncio_sleep = asyncio.sleep

    def _refuse(self, what: str) -> RealSleep:
        self.refused.append(what)
        return RealSleep(f"{what}: tests/unit runs on virtual time (tests/unit/virtual_time.py); "
                         "a test that needs real time belongs in tests/integration")

    def time_sleep(self, seconds: float) -> None:
        raise self._refuse(f"time.sleep({seconds})")

    def asyncio_sleep(self, delay: float, result: Any = None) -> Coroutine[Any, Any, Any]:
        if delay > 0 and not isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
            raise self._refuse(f"asyncio.sleep({delay}) on a real loop")
        return self._asyncio_sleep(delay, result)
