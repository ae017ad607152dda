"""Stores written through the Store API, for tests that judge what a probe recorded."""

from __future__ import annotations

from pathlib import Path

from probes.measure.window import WindowAggregator
from probes.store import Store
from probes.types import CallOutcome, CallResult, Outcome


def store_with_a_failing_canary(path: Path, now: float, *, failing: bool = True) -> None:
    """Ten minutes of windows on three pods per cohort: the canary fails one call in five
    (none with `failing` False), the baseline none."""
    agg = WindowAggregator(length_s=10.0, grace_s=0.0)
    start = (now // 10) * 10 - 600
    for i in range(6000):
        t = start + i * 0.1
        for cohort, bad in (("1.20.3", False), ("1.21.0", failing and i % 5 == 0)):
            outcome = CallOutcome(Outcome.HTTP_5XX if bad else Outcome.OK, 200)
            agg.add(CallResult("checkout", f"pod-{cohort}-{i % 3}", cohort, t, 0.01, 0.0,
                               outcome))
    with Store.open(path) as store:
        store.write(*agg.flush(now=now, force=True))


def newest_window_end(store_path: str) -> float:
    """The end of the newest window a probe wrote to the store (it has written one)."""
    with Store.open(store_path, readonly=True) as store:
        newest = store.newest_window_end()
    assert newest is not None
    return newest
