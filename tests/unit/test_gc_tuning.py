"""When the probe freezes the collector's survivors (`probes.run._memory`): not while the
start-up backlog is in flight, and never later than the settle limit."""

from __future__ import annotations

import gc

import pytest

from probes.run._memory import (
    _SETTLE_POLL_S,
    GC_SETTLE_LIMIT_S,
    GC_WARMUP_EXTRA_S,
    CollectorTuning,
    settled_in_flight,
)
from probes.spec import HttpSpec, PathSpec
from tests.unit.virtual_time import virtual_loop

PATHS = [PathSpec("p", 100.0, 0.01, http=HttpSpec(path="/"))]


async def freeze_after(in_flight: list[int], settled_at: int) -> tuple[int, int, float]:
    """Run `tune` (on virtual time) with calls in flight as listed (then the last, repeated);
    how many looks it took, how many objects were frozen, and how long after the start."""
    looks = 0

    def now_in_flight() -> int:
        nonlocal looks
        looks += 1
        return in_flight[min(looks, len(in_flight)) - 1]

    tuning = CollectorTuning(lambda generation, seconds: None)
    restore = tuning.save()
    try:
        async def started() -> None:
            return None

        loop = virtual_loop()
        begun = loop.time()
        await tuning.tune(started, PATHS, now_in_flight, lambda: settled_at)
        return looks, gc.get_freeze_count(), loop.time() - begun
    finally:
        restore()


# The first look: one send period and one timeout of PATHS, and the warm-up margin.
WARMUP_S = 0.01 + 0.01 + GC_WARMUP_EXTRA_S


async def test_the_freeze_waits_for_the_backlog_to_settle() -> None:
    looks, frozen, after = await freeze_after([2400, 900, 10, 700, 12, 9, 3000], settled_at=16)
    assert looks == 6  # two calm looks in a row: the 5th and 6th
    assert after == pytest.approx(WARMUP_S + 5 * _SETTLE_POLL_S)
    assert frozen > 0
    assert gc.get_freeze_count() == 0  # put back


async def test_a_backlog_that_never_settles_freezes_at_the_limit() -> None:
    looks, frozen, after = await freeze_after([5000], settled_at=16)
    assert looks == GC_SETTLE_LIMIT_S / _SETTLE_POLL_S  # every look, then the freeze
    assert after == pytest.approx(WARMUP_S + GC_SETTLE_LIMIT_S)
    assert frozen > 0


def test_the_steady_level_follows_the_intended_rate() -> None:
    assert settled_in_flight(0.0) == 16
    assert settled_in_flight(2400.0) == 120
