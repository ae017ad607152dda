"""The engine's schedule timer on the kernel's timerfd, against the real clock.

A timerfd is armed on CLOCK_MONOTONIC, so it cannot run on the unit tier's virtual time: these
are the checks of tests/unit/test_precise_timer.py (there on `call_at`) on every timerfd
backend this machine offers. They wait for real: each arms deadlines at most 30 ms ahead
(`QUIET_S`), and waits that long after the last one to see that none fires twice or after a
cancel. No check bounds how late a timer fired (a loaded machine may delay any wake); the
hang guard (`HANG_GUARD_S`) only ends a test that would never finish.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from probes.run._precise_timer import Backend, available_backends
from probes.run.engine import Engine
from probes.spec import PathSpec
from tests.unit.test_precise_timer import (
    ListSink,
    StampProber,
    _ep,
    check_a_cancelled_or_closed_timer_does_not_fire,
    check_engine_never_sends_before_the_intended_time,
    check_engine_rearms_only_for_an_earlier_send,
    check_fires_once_and_never_before_its_deadline,
    check_rearming_replaces_the_deadline_earlier_or_later,
    check_switching_between_precise_and_coarse_keeps_only_the_last_deadline,
)

TIMERFDS = [b for b in available_backends() if b != "call_at"]

pytestmark = pytest.mark.parametrize("backend", TIMERFDS)


@pytest.mark.parametrize("coarse", [False, True])
async def test_fires_once_and_never_before_its_deadline(backend: Backend, coarse: bool) -> None:
    await check_fires_once_and_never_before_its_deadline(backend, coarse)


async def test_rearming_replaces_the_deadline_earlier_or_later(backend: Backend) -> None:
    await check_rearming_replaces_the_deadline_earlier_or_later(backend)


async def test_switching_between_precise_and_coarse_keeps_only_the_last_deadline(
    backend: Backend,
) -> None:
    await check_switching_between_precise_and_coarse_keeps_only_the_last_deadline(backend)


async def test_a_cancelled_or_closed_timer_does_not_fire(backend: Backend) -> None:
    await check_a_cancelled_or_closed_timer_does_not_fire(backend)


# The prober stamps time.monotonic, the clock the timerfd counts on.
@pytest.mark.parametrize("rate", [10.0, 20.0])
async def test_engine_never_sends_before_the_intended_time(backend: Backend, rate: float) -> None:
    await check_engine_never_sends_before_the_intended_time(backend, rate, time.monotonic)


async def test_engine_rearms_only_for_an_earlier_send(backend: Backend) -> None:
    await check_engine_rearms_only_for_an_earlier_send(backend)


async def test_engine_closes_its_timerfd_on_stop(backend: Backend) -> None:
    loop = asyncio.get_running_loop()
    engine = Engine([PathSpec(name="p", rate_per_s=20.0, timeout_s=0.5)],
                    {"p": StampProber(time.monotonic)}, ListSink(), timer_backend=backend)
    engine.apply([_ep("a")])
    timer = engine._timetable.timer
    assert timer is not None
    fd = timer._fd
    os.fstat(fd)  # open
    await engine.stop()
    assert engine._timetable.timer is None and engine.timer_backend is None
    assert not loop.remove_reader(fd)  # no longer watched
    with pytest.raises(OSError):
        os.fstat(fd)
    # Applied again after a stop, the engine arms a new timer.
    engine.apply([_ep("b")])
    assert engine.timer_backend == backend
    await engine.stop()
