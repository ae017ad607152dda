"""The engine's schedule timer (`probes.run._precise_timer`): never early, re-armable, closable.

Here on the loop's `call_at` (the fallback), on virtual time: a loop whose clock is not
time.monotonic takes it by itself. The kernel timer (timerfd) counts on the real clock, so
tests/integration/test_precise_timer.py runs the same checks (the `check_` functions below) on
every timerfd backend this machine offers. Only order, "not before the deadline" and counts
are asserted, never how late a timer fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator

import pytest

from probes.run._precise_timer import Backend, PreciseTimer, available_backends
from probes.run._schedule import COARSE_ABOVE_RATE_PER_S
from probes.run.engine import Engine
from probes.spec import PathSpec
from probes.types import CallOutcome, CallResult, Endpoint, Outcome
from tests.unit.virtual_time import virtual_loop

BACKENDS = available_backends()
# A guard against a hung test, not a bound on lateness.
HANG_GUARD_S = 30.0
# Long enough after the last deadline armed for a stray (replaced or cancelled) one to fire:
# every deadline these checks arm is at most this far ahead.
QUIET_S = 0.03


class Fired:
    """The loop times a timer's callback ran at."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.at: list[float] = []
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.at.append(self.loop.time())
        self.event.set()

    async def wait(self) -> None:
        await asyncio.wait_for(self.event.wait(), HANG_GUARD_S)
        self.event.clear()


@contextlib.contextmanager
def a_timer(backend: Backend) -> Iterator[tuple[asyncio.AbstractEventLoop, Fired, PreciseTimer]]:
    """A timer on the running loop that records when it fires; closed afterwards."""
    loop = asyncio.get_running_loop()
    fired = Fired(loop)
    timer = PreciseTimer(loop, fired, backend=backend)
    try:
        yield loop, fired, timer
    finally:
        timer.close()


def test_linux_offers_a_timerfd_and_every_platform_the_fallback() -> None:
    assert BACKENDS[-1] == "call_at"
    if sys.platform.startswith("linux"):
        assert "timerfd-ctypes" in BACKENDS


async def check_fires_once_and_never_before_its_deadline(backend: Backend, coarse: bool) -> None:
    with a_timer(backend) as (loop, fired, timer):
        assert timer.backend == backend
        for delay in (0.0031, 0.0007, 0.0123, 0.0):
            deadline = loop.time() + delay
            timer.arm(deadline, coarse=coarse)
            await fired.wait()
            assert fired.at[-1] >= deadline
            assert timer.deadline is None
        await asyncio.sleep(QUIET_S)
        assert len(fired.at) == 4  # one call per arm, none spurious


@pytest.mark.parametrize("coarse", [False, True])
async def test_fires_once_and_never_before_its_deadline(coarse: bool) -> None:
    await check_fires_once_and_never_before_its_deadline("call_at", coarse)


async def check_rearming_replaces_the_deadline_earlier_or_later(backend: Backend) -> None:
    with a_timer(backend) as (loop, fired, timer):
        # Earlier: a deadline far off, replaced by a near one, fires at the near one.
        timer.arm(loop.time() + 3600.0)
        near = loop.time() + 0.005
        timer.arm(near)
        await fired.wait()
        assert len(fired.at) == 1 and fired.at[0] >= near
        # Later: the first deadline no longer counts.
        first = loop.time() + 0.002
        timer.arm(first)
        later = first + 0.03
        timer.arm(later)
        await fired.wait()
        assert len(fired.at) == 2 and fired.at[1] >= later


async def test_rearming_replaces_the_deadline_earlier_or_later() -> None:
    await check_rearming_replaces_the_deadline_earlier_or_later("call_at")


async def check_switching_between_precise_and_coarse_keeps_only_the_last_deadline(
    backend: Backend,
) -> None:
    with a_timer(backend) as (loop, fired, timer):
        for first_coarse in (False, True):
            timer.arm(loop.time() + 0.002, coarse=first_coarse)
            last = loop.time() + 0.03
            timer.arm(last, coarse=not first_coarse)
            await fired.wait()
            assert fired.at[-1] >= last
        await asyncio.sleep(QUIET_S)
        assert len(fired.at) == 2


async def test_switching_between_precise_and_coarse_keeps_only_the_last_deadline() -> None:
    await check_switching_between_precise_and_coarse_keeps_only_the_last_deadline("call_at")


async def check_a_cancelled_or_closed_timer_does_not_fire(backend: Backend) -> None:
    loop = asyncio.get_running_loop()
    fired = Fired(loop)
    timer = PreciseTimer(loop, fired, backend=backend)
    timer.arm(loop.time() + 0.005)
    timer.cancel()
    assert timer.deadline is None
    await asyncio.sleep(QUIET_S)
    assert fired.at == []
    timer.arm(loop.time() + 0.005)
    timer.close()
    timer.close()  # idempotent
    await asyncio.sleep(QUIET_S)
    assert fired.at == [] and timer.closed
    with pytest.raises(RuntimeError):
        timer.arm(loop.time())


async def test_a_cancelled_or_closed_timer_does_not_fire() -> None:
    await check_a_cancelled_or_closed_timer_does_not_fire("call_at")


async def test_a_loop_on_another_clock_falls_back_to_call_at() -> None:
    # The virtual loop's clock is not time.monotonic: a kernel deadline would be wrong for it.
    loop = virtual_loop()
    fired = Fired(loop)
    timer = PreciseTimer(loop, fired)
    try:
        deadline = loop.time() + 0.002
        timer.arm(deadline)
        await fired.wait()
    finally:
        timer.close()
    assert timer.backend == "call_at"
    assert fired.at == [deadline]


# -- the engine on each backend ------------------------------------------------------------


class StampProber:
    """Answers ok at once, with the time the call began on `clock` in `detail`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        return CallOutcome(Outcome.OK, status=200, detail=repr(self.clock()))

    def forget(self, endpoint: Endpoint) -> None:
        pass

    async def aclose(self) -> None:
        pass


class ListSink:
    def __init__(self, enough: int = 0) -> None:
        self.results: list[CallResult] = []
        self.drops = 0
        self.enough = enough
        self.has_enough = asyncio.Event()

    def record(self, result: CallResult, endpoint: Endpoint) -> None:
        self.results.append(result)
        if len(self.results) >= self.enough:
            self.has_enough.set()

    def dropped(self, path: str, reason: str, count: int = 1) -> None:
        self.drops += count


def _ep(name: str) -> Endpoint:
    return Endpoint(name=name, host="127.0.0.1", port=1, labels={"proxy_version": "1"})


async def check_engine_never_sends_before_the_intended_time(
    backend: Backend, rate: float, clock: Callable[[], float],
) -> None:
    # `wall=clock` puts intended times on the prober's clock: the engine reads the wall
    # clock just before the loop's, so a reported intended time is never later than the
    # true one, and a call that began before it would show as an early send.
    assert 20 * 10.0 < COARSE_ABOVE_RATE_PER_S < 20 * 20.0
    sink = ListSink(enough=200)
    engine = Engine([PathSpec(name="p", rate_per_s=rate, timeout_s=0.5)],
                    {"p": StampProber(clock)}, sink, wall=clock, timer_backend=backend)
    engine.apply([_ep(f"e{i}") for i in range(20)])
    assert engine.timer_backend == backend
    await asyncio.wait_for(sink.has_enough.wait(), HANG_GUARD_S)
    await engine.stop()
    assert all(float(r.outcome.detail) >= r.intended_at for r in sink.results)
    assert all(r.latency_s >= r.lag_s >= 0.0 for r in sink.results)


# 20 endpoints at 10/s: 200 sends/s, each on the timerfd unless close behind another; at
# 20/s: 400 sends/s, above COARSE_ABOVE_RATE_PER_S, all on call_at.
@pytest.mark.parametrize("rate", [10.0, 20.0])
async def test_engine_never_sends_before_the_intended_time(rate: float) -> None:
    await check_engine_never_sends_before_the_intended_time("call_at", rate, virtual_loop().time)


async def check_engine_rearms_only_for_an_earlier_send(backend: Backend) -> None:
    loop = asyncio.get_running_loop()
    engine = Engine([PathSpec(name="p", rate_per_s=0.01, timeout_s=0.5)],
                    {"p": StampProber(loop.time)}, ListSink(), timer_backend=backend)
    endpoints: list[Endpoint] = []
    armed: list[float] = []
    # First sends are spread over the 100 s period: each new endpoint whose first send is
    # earlier than every one before moves the timer to it; a later one leaves it.
    for i in range(12):
        endpoints.append(_ep(f"e{i}"))
        engine.apply(endpoints)
        timer = engine._timetable.timer
        assert timer is not None and timer.deadline is not None
        assert timer.deadline == min(due for due, _, _ in engine._timetable.heap)
        armed.append(timer.deadline)
    assert armed == sorted(armed, reverse=True)
    assert len(set(armed)) > 1, "some endpoint must have come first"
    assert all(deadline > loop.time() for deadline in armed)
    await engine.stop()


async def test_engine_rearms_only_for_an_earlier_send() -> None:
    await check_engine_rearms_only_for_an_earlier_send("call_at")
