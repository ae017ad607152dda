"""What `run` logs (`probes.run._status`), driven by hand: the clock and the recorder's
counts are the test's, so every check is at a time it chose."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from probes.run._status import ProgressReporter, verdict_words


@dataclass
class Tally:
    calls_by_cohort: dict[str, int] = field(default_factory=dict)
    errors_by_cohort: dict[str, int] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)


@dataclass
class State:
    recorder: Tally = field(default_factory=Tally)
    endpoint_count: int = 3
    windows_written: int = 0
    windows_unwritten: int = 0
    last_verdict: Mapping[str, Any] | None = None


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_all_down_is_said_once_after_the_threshold_and_its_end_once(
        caplog: pytest.LogCaptureFixture) -> None:
    reporter = ProgressReporter(State(), every_s=60.0, down_after_s=30.0)
    t0 = reporter.started
    for k in (1, 2):  # 10 and 20 s of silence: not yet
        reporter._check_down(set(), t0 + 10 * k)
    assert not _warnings(caplog)
    for k in (3, 4, 5):  # from 30 s: said once, not again
        reporter._check_down(set(), t0 + 10 * k)
    assert _warnings(caplog) == [
        "all 3 endpoints are down: none answered a call in 30s (refused, timed out or "
        "unreachable); probing goes on"]
    reporter._check_down({"pod-0"}, t0 + 60)
    reporter._check_down({"pod-0"}, t0 + 70)
    assert _warnings(caplog)[1:] == ["endpoints answer again: 1 of 3 answered in the last 10s"]


def test_silence_after_answers_counts_from_the_last_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    reporter = ProgressReporter(State(endpoint_count=0), every_s=60.0, down_after_s=30.0)
    t0 = reporter.started
    reporter._check_down({"pod-0"}, t0 + 10)
    reporter._check_down(set(), t0 + 20)  # silent since about t0 + 10
    reporter._check_down(set(), t0 + 30)
    assert not _warnings(caplog)
    reporter._check_down(set(), t0 + 40)
    assert _warnings(caplog) == [
        "no endpoints discovered in 30s: check the config's targets"]


def test_a_line_counts_the_minute_since_the_last_one() -> None:
    state = State(windows_written=12, last_verdict={
        "verdict": "fail", "reasons": [],
        "paths": [{"path": "checkout", "verdict": "fail", "reasons": ["success rate: x"]}]})
    reporter = ProgressReporter(state)
    state.recorder.calls_by_cohort.update({"1.20.3": 600, "1.21.0": 590})
    state.recorder.errors_by_cohort.update({"1.21.0": 59})
    first = reporter._line({"a", "b"})
    assert "1.20.3 600 (0 errors); 1.21.0 590 (59 errors, 10.0 %)" in first
    assert "endpoints 2 up, 1 down; 12 windows written" in first
    assert first.endswith("verdict fail (checkout: success rate: x)")
    state.recorder.calls_by_cohort["1.20.3"] += 10
    second = reporter._line(set())
    assert "calls in the last 1m00s: 1.20.3 10 (0 errors);" in second
    assert "endpoints 0 up, 3 down" in second


def test_stream_paths_alone_say_nothing_of_endpoints_down() -> None:
    reporter = ProgressReporter(State(), calls=False)
    assert "; endpoints 3; " in reporter._line(set())


def test_verdict_words() -> None:
    assert verdict_words(None) == "none yet"
    assert verdict_words({"verdict": "pass", "reasons": ["x"]}) == "pass"
    assert verdict_words({"verdict": "inconclusive", "reasons": ["why"]}) == (
        "inconclusive (why)")
    # A failing path's reason before the verdict's notes (an overloaded span left out).
    assert verdict_words({"verdict": "fail", "reasons": ["windows left out"], "paths": [
        {"path": "catalog", "verdict": "pass", "reasons": ["fine"]},
        {"path": "checkout", "verdict": "fail", "reasons": ["success rate: -1 pp"]},
    ]}) == "fail (checkout: success rate: -1 pp)"
