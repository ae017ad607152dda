"""The unit tier's clock (`tests/unit/virtual_time.py`): async tests run on virtual time that
skips what they would wait, threads' work takes none of it, and a real sleep fails the test."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.unit.virtual_time import RealSleep, SleepGuard, VirtualTimeLoop, virtual_loop


async def test_every_async_unit_test_runs_on_virtual_time() -> None:
    assert isinstance(asyncio.get_running_loop(), VirtualTimeLoop)


async def test_sleeps_and_timeouts_end_at_their_time_in_order() -> None:
    loop = virtual_loop()
    start = loop.time()
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append((name, loop.time() - start))

    await asyncio.gather(nap("hour", 3600.0), nap("second", 1.0), nap("minute", 60.0))
    assert woke == [("second", 1.0), ("minute", 60.0), ("hour", 3600.0)]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.Event().wait(), 2.5)
    assert loop.time() - start == 3602.5


async def test_a_timer_fires_at_its_time_far_from_zero_too() -> None:
    # A timer woken a float's width early would be re-armed by PreciseTimer, again and again.
    loop = virtual_loop()
    loop.advance(1e6 + 0.1)
    for delay in (0.1, 0.3, 1e-7, 0.7, 0.2):
        when = loop.time() + delay
        woke = loop.create_future()
        loop.call_at(when, woke.set_result, None)
        await woke
        assert loop.time() >= when, delay


async def test_advance_stands_for_a_blocked_loop() -> None:
    loop = virtual_loop()
    start = loop.time()
    late = asyncio.get_running_loop().create_future()
    loop.call_at(start + 0.1, lambda: late.set_result(loop.time()))
    loop.advance(0.5)  # blocked past the timer: it runs late, at the time the block ended
    assert await late == start + 0.5
    assert loop.wall() - loop.time() == VirtualTimeLoop.EPOCH
    with pytest.raises(ValueError):
        loop.advance(-1.0)


async def test_work_in_a_thread_takes_no_virtual_time() -> None:
    # The thread counts for tens of milliseconds of real time; a clock that skipped while it
    # ran would end the (virtual) millisecond's guard first.
    loop = virtual_loop()
    start = loop.time()
    total = await asyncio.wait_for(asyncio.to_thread(sum, range(3_000_000)), 0.001)
    assert total == 3_000_000 * 2_999_999 // 2
    assert loop.time() == start


def test_time_sleep_fails_the_test(no_real_sleeps: SleepGuard) -> None:
    with pytest.raises(RealSleep):
        time.sleep(0.01)
    # Kept even when product code swallows the exception: the fixture fails the test on it.
    assert no_real_sleeps.refused == ["time.sleep(0.01)"]
    no_real_sleeps.refused.clear()


def test_asyncio_sleep_on_a_real_loop_fails_the_test(no_real_sleeps: SleepGuard) -> None:
    async def nap(seconds: float) -> None:
        await asyncio.sleep(seconds)

    asyncio.run(nap(0.0))  # a yield to the loop waits for nothing
    with pytest.raises(RealSleep):
        asyncio.run(nap(0.01))
    assert no_real_sleeps.refused == ["asyncio.sleep(0.01) on a real loop"]
    no_real_sleeps.refused.clear()
