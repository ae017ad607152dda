"""When the probe freezes the collector's survivors (`probes.run._gc_tuning`): not while the
start-up backlog is in flight, and never later than the settle limit."""

from __future__ import annotations

import asyncio
import gc

import pytest

from probes._spec import HttpSpec, PathSpec
from probes.run import _gc_tuning
from probes.run._gc_tuning import CollectorTuning, settled_in_flight

PATHS = [PathSpec("p", 100.0, 0.01, http=HttpSpec(path="/"))]


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gc_tuning, "GC_WARMUP_EXTRA_S", 0.0)
    monkeypatch.setattr(_gc_tuning, "_SETTLE_POLL_S", 0.001)


def freeze_after(in_flight: list[int], settled_at: int) -> tuple[int, int]:
    """Run `tune` with calls in flight as listed (then the last, repeated); how many looks
    it took and how many objects were frozen."""
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

        asyncio.run(tuning.tune(started, PATHS, now_in_flight, lambda: settled_at))
        return looks, gc.get_freeze_count()
    finally:
        restore()


def test_the_freeze_waits_for_the_backlog_to_settle(quick: None) -> None:
    looks, frozen = freeze_after([2400, 900, 10, 700, 12, 9, 3000], settled_at=16)
    assert looks == 6  # two calm looks in a row: the 5th and 6th
    assert frozen > 0
    assert gc.get_freeze_count() == 0  # put back


def test_a_backlog_that_never_settles_freezes_at_the_limit(quick: None,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(_gc_tuning, "GC_SETTLE_LIMIT_S", 0.05)
    looks, frozen = freeze_after([5000], settled_at=16)
    assert looks == 50  # the limit over the poll: every look, then the freeze
    assert frozen > 0


def test_the_steady_level_follows_the_intended_rate() -> None:
    assert settled_in_flight(0.0) == 16
    assert settled_in_flight(2400.0) == 120
