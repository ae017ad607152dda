"""The overload rule: skipped calls or a schedule lag p99 over 10 ms in recent windows."""

from __future__ import annotations

import pytest

from probes.measure.overload import OverloadWatch


def test_a_clean_probe_is_not_overloaded() -> None:
    watch = OverloadWatch()
    assert watch.update(0, 0, 0) is None
    # 24,000 calls a window, 1 % of them late: p99 is at the budget, not over it.
    assert watch.update(24_000, 240, 0) is None
    assert not watch.overloaded


def test_any_skipped_call_is_overload() -> None:
    watch = OverloadWatch()
    watch.update(0, 0, 0)
    reason = watch.update(24_000, 0, 3)
    assert reason is not None and "3 calls skipped" in reason
    assert watch.overloaded


def test_lag_p99_over_budget_is_overload() -> None:
    watch = OverloadWatch()
    watch.update(0, 0, 0)
    reason = watch.update(10_000, 101, 0)  # 1.01 % sent more than 10 ms late
    assert reason is not None and "10 ms late" in reason and "1.0%" in reason


def test_it_clears_only_after_the_recent_windows_are_clean() -> None:
    watch = OverloadWatch(windows=3)
    totals = [(0, 0, 0), (1000, 0, 5)]  # one window with skipped calls
    for t in totals:
        watch.update(*t)
    assert watch.overloaded
    calls, lagged, skipped = totals[-1]
    for clean in range(3):
        calls += 1000
        watch.update(calls, lagged, skipped)
        # The skipped window is still among the last three until three clean ones followed.
        assert watch.overloaded == (clean < 2)


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        OverloadWatch(windows=0)
    with pytest.raises(ValueError):
        OverloadWatch(budget_share=1.0)
