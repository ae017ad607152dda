"""`skewprobe verdict --at T` is the verdict as it stood at T.

Judged at T on the whole store, a verdict must equal the one judged at T on a copy of the
store holding only what a probe had written by then: the windows that had ended, the events
made before T. Later windows (the canary's first, still open at T; a probe that started
again on the same store) must change nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probes.measure.overload import OVERLOAD_EVENT
from probes.measure.window import WindowAggregator
from probes.spec import JudgingSettings
from probes.store import Event, Store
from probes.types import CallOutcome, CallResult, EndpointWindow, Outcome, PathWindow
from probes.verdict.service import compute_verdict

T0 = 1_790_000_000.0
WINDOW_S = 10.0
OLD, NEW = "1.20.3", "1.21.0"
CANARY_FROM = T0 + 300  # the canary's first calls
STOPPED = (T0 + 600, T0 + 1200)  # the probe was down, and had stopped overloaded
END = T0 + 1800
OVERLOADED_AT = T0 + 595

Windows = tuple[list[PathWindow], list[EndpointWindow]]


@pytest.fixture(scope="module")
def windows() -> Windows:
    """Three pods per cohort; the canary fails one call in five, the baseline none."""
    agg = WindowAggregator(length_s=WINDOW_S, grace_s=0.0)
    for i in range(int((END - T0) * 10)):
        t = T0 + i * 0.1
        if STOPPED[0] <= t < STOPPED[1]:
            continue
        for cohort, bad in ((OLD, False), (NEW, i % 5 == 0)):
            if cohort == NEW and t < CANARY_FROM:
                continue
            outcome = CallOutcome(Outcome.HTTP_5XX if bad else Outcome.OK, 200)
            agg.add(CallResult("checkout", f"pod-{cohort}-{i % 3}", cohort, t, 0.01, 0.0,
                               outcome))
    return agg.flush(now=END, force=True)


def _store(path: Path, windows: Windows, by: float = float("inf")) -> str:
    """The store as it stood at `by`: windows ended by then, events made before then."""
    paths, endpoints = windows
    overload = Event(OVERLOAD_EVENT, OVERLOADED_AT, detail={"reason": "probe overloaded: x"})
    with Store.open(str(path)) as store:
        store.write([w for w in paths if w.start + w.length <= by],
                    [w for w in endpoints if w.start + WINDOW_S <= by])
        store.write_events([overload] if overload.at < by else [])
    return str(path)


@pytest.mark.parametrize("at", [
    CANARY_FROM + 5,  # the canary's first window is still open: only the baseline was in
    CANARY_FROM + 10,  # ... and just ended
    CANARY_FROM + 200,
    STOPPED[0] - 1,  # overloaded, still writing
    STOPPED[0] + 300,  # stopped overloaded: judged on its sound windows
    END + 3600,  # stale
])
def test_the_verdict_at_a_time_is_the_one_the_store_gave_then(
    tmp_path: Path, windows: Windows, at: float,
) -> None:
    whole = _store(tmp_path / "whole.db", windows)
    then = _store(tmp_path / "then.db", windows, by=at)
    settings = JudgingSettings(window_s=WINDOW_S, warmup_s=0.0, min_samples=50)
    asked = compute_verdict(whole, settings, now=at)
    assert json.dumps(asked, sort_keys=True) == json.dumps(
        compute_verdict(then, settings, now=at), sort_keys=True)


def test_a_since_inside_the_step_a_source_answers_before_is_not_yet_judged(
        tmp_path: Path, windows: Windows) -> None:
    # A Prometheus source answers a step before it was asked (the newest scrapes may still be
    # in flight): a `since` in that step is a rollout that has just begun, not bad input.
    from probes.errors import BadInput
    from probes.verdict.service import verdict_from_source

    db = _store(tmp_path / "p.db", windows)
    asked = CANARY_FROM + 200.0
    now = asked - WINDOW_S
    since = f"{asked - 4.0:.3f}"
    with Store.open(db, readonly=True) as store:
        result = verdict_from_source(store, JudgingSettings(), since=since, now=now,
                                     asked=asked)
        assert result["verdict"] == "inconclusive"
        assert all(p["verdict"] == "inconclusive" for p in result["paths"])
        with pytest.raises(BadInput, match="in the future"):
            verdict_from_source(store, JudgingSettings(), since=since, now=now)
        with pytest.raises(BadInput, match="in the future"):
            verdict_from_source(store, JudgingSettings(), since=f"{asked + 1.0:.3f}", now=now,
                                asked=asked)
