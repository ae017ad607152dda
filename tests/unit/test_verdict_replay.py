"""probes.verdict.replay: the rules of `probes.verdict.rules` at every look.

`judge` is the same rules at the last look, so the replay's rows must be `judge`'s verdicts
on the windows up to each look: the state, the per-metric states and the e-values. The
windows are simulated as in tests/unit/test_verdict.py (fixed seeds).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from probes.measure.histogram import BUCKET_COUNT, index_of
from probes.spec import Tolerances
from probes.stats.pods import PodGrid, pod_states, pod_track
from probes.stats.series import Totals, columns
from probes.types import PathWindow
from probes.verdict.judge import judge
from probes.verdict.replay import PodLooks, evaluate, first_index
from probes.verdict.rules import STATES, State

T0 = 1_700_000_000.0
OLD, NEW = "1.20.3", "1.21.0"
ALPHA = 0.01


def _windows(rng: np.random.Generator, cohort: str, count: int, *, n: int = 300,
             err: float = 0.001, scale: float = 1.0, retry: float = 0.01,
             resets_per_hour: float = 2.0, offset: int = 0,
             streams: bool = True) -> list[PathWindow]:
    out = []
    for i in range(offset, offset + count):
        e = int(rng.binomial(n, err))
        lat = rng.lognormal(math.log(0.05), 0.5, n) * scale
        hist = np.bincount(index_of(lat), minlength=BUCKET_COUNT)
        kw: dict = {}
        if streams:
            kw.update(streams_opened=6, stream_seconds=60.0,
                      stream_resets={"goaway": int(rng.poisson(resets_per_hour / 60))})
        out.append(PathWindow(
            start=T0 + 10 * i, length=10.0, path="checkout", cohort=cohort,
            outcomes={"ok": n - e, "http_5xx": e}, latency=tuple(hist.tolist()),
            attempts_sum=n + int(rng.binomial(4 * n, retry)), attempts_count=n, **kw,
        ))
    return out


def _replay(windows: list[PathWindow], looks: int, **kw: object):
    """Cumulative totals per cohort at each window boundary, evaluated."""
    cols = columns(windows)
    step = ((cols.start - T0) // 10).astype(np.int64)
    out = []
    for name in (OLD, NEW):
        cohort = cols.cohorts.index(name)
        group = np.where(cols.cohort == cohort, step, -1)
        out.append(Totals.sums(cols, group, looks).cumulative())
    return evaluate(out[0], out[1], tolerances=Tolerances(), alpha_share=ALPHA / 4, **kw)


@pytest.mark.parametrize(
    ("canary", "metric"),
    [
        ({"err": 0.02}, "success_rate"),
        ({"scale": 1.6}, "latency_p99_ms"),
        ({"retry": 0.1}, "attempts_per_request"),
        ({"resets_per_hour": 400.0}, "stream_resets_per_hour"),
    ],
)
def test_every_look_agrees_with_judge(canary: dict, metric: str) -> None:
    looks = 14
    rng = np.random.default_rng(3)
    windows = _windows(rng, OLD, looks) + _windows(rng, NEW, looks, **canary)
    tracks = _replay(windows, looks)
    assert set(tracks.metrics) == {"success_rate", "latency_p99_ms", "attempts_per_request",
                                   "stream_resets_per_hour"}
    seen_fail = False
    for k in range(looks):
        end = T0 + 10 * (k + 1)
        v = judge([w for w in windows if w.start < end], now=end, alpha=ALPHA).paths[0]
        assert STATES[int(tracks.state[k])] == v.verdict, k
        for mv in v.metrics:
            track = tracks.metrics[mv.name]
            assert STATES[int(track.state[k])] == mv.verdict, (k, mv.name)
            assert mv.e_fail is not None and mv.e_pass is not None
            for mine, theirs in ((track.log_e_fail[k], mv.e_fail),
                                 (track.log_e_pass[k], mv.e_pass)):
                assert math.isclose(min(mine, 700.0), math.log(theirs), rel_tol=1e-6,
                                    abs_tol=1e-6), (k, mv.name)
        seen_fail |= v.metric(metric).verdict == "fail"  # type: ignore[union-attr]
    assert seen_fail, "the regression must fail within the looks for this test to bite"
    first = tracks.first(State.FAIL, metric)
    assert first is not None
    # The first crossing is the first look at which judge said fail for that metric.
    for k in range(first):
        end = T0 + 10 * (k + 1)
        v = judge([w for w in windows if w.start < end], now=end, alpha=ALPHA).paths[0]
        assert v.metric(metric).verdict != "fail"  # type: ignore[union-attr]


def test_equal_cohorts_never_fail_and_end_passing() -> None:
    looks = 60
    rng = np.random.default_rng(11)
    windows = (_windows(rng, OLD, looks, err=0.0, streams=False)
               + _windows(rng, NEW, looks, err=0.0, streams=False))
    tracks = _replay(windows, looks)
    assert "stream_resets_per_hour" not in tracks.metrics  # never applied: absent
    assert tracks.first(State.FAIL) is None
    assert STATES[tracks.state[-1]] == State.PASS
    assert tracks.first(State.PASS) is not None


def test_min_samples_and_staleness_gate_every_metric() -> None:
    looks = 6
    rng = np.random.default_rng(5)
    windows = _windows(rng, OLD, looks, err=0.0) + _windows(rng, NEW, looks, err=0.5)
    tracks = _replay(windows, looks, min_samples=700)  # 300 calls a look: gated for 2 looks
    assert [STATES[c] for c in tracks.state[:3]] == [State.INCONCLUSIVE] * 2 + [State.FAIL]
    assert all(STATES[t.state[1]] == State.INCONCLUSIVE for t in tracks.metrics.values())
    age = np.zeros(looks)
    age[3] = 20.5  # more than two 10 s windows: stale
    age[4] = 20.0  # exactly two: still fresh
    stale = _replay(windows, looks, window_s=10.0, ages=(np.zeros(looks), age))
    # A stale look keeps its fail (anytime-valid); it would hold a pass (test_verdict_rules).
    assert [STATES[c] for c in stale.state[3:5]] == [State.FAIL, State.FAIL]


def test_looks_before_the_canary_are_not_applicable() -> None:
    looks = 8
    rng = np.random.default_rng(2)
    windows = _windows(rng, OLD, looks) + _windows(rng, NEW, 5, err=0.3, offset=3)
    cols = columns(windows)
    step = ((cols.start - T0) // 10).astype(np.int64)
    origin = 3  # the first window both cohorts have: the cumulative sums start there
    parts = []
    for name in (OLD, NEW):
        group = np.where((cols.cohort == cols.cohorts.index(name)) & (step >= origin), step, -1)
        parts.append(Totals.sums(cols, group, looks).cumulative())
    tracks = evaluate(*parts, tolerances=Tolerances(), alpha_share=ALPHA / 4)
    assert [STATES[c] for c in tracks.state[:3]] == [State.NOT_APPLICABLE] * 3
    first = tracks.first(State.FAIL)
    assert first is not None and first >= 3


def test_totals_arithmetic() -> None:
    rng = np.random.default_rng(1)
    windows = _windows(rng, OLD, 4)
    cols = columns(windows)
    per = Totals.sums(cols, np.array([0, 1, -1, 1]), 2)
    assert list(per.requests) == [300.0, 600.0]
    assert per.latency.shape == (2, BUCKET_COUNT) and per.latency[1].sum() == 600
    run = per.cumulative(start=per.take([0]))
    assert list(run.requests) == [600.0, 1200.0]
    assert list(per.total().requests) == [900.0]
    assert len(Totals.concat([per, per.take([1])])) == 3
    assert len(Totals.zeros(3)) == 3
    assert first_index([False, True, True]) == 1 and first_index([False]) is None
    with pytest.raises(ValueError):
        per.cumulative(start=per)
    with pytest.raises(ValueError):
        evaluate(per, per.take([0]), tolerances=Tolerances(), alpha_share=0.01)


def _pod_estate(rng: np.random.Generator, rates: list[float], canary: list[bool],
                looks: int, calls: int = 50) -> tuple[PodGrid, list[PathWindow]]:
    """A pods × windows grid and the path windows it sums to (one per cohort and window)."""
    n = rng.poisson(calls, (len(rates), looks))
    s = rng.binomial(n, np.array(rates)[:, None])
    flags = np.array(canary)
    grid = PodGrid(
        pods=tuple(f"pod-{i}" for i in range(len(rates))),
        cohorts=tuple(NEW if c else OLD for c in canary),
        starts=T0 + 10.0 * np.arange(looks), calls=n.astype(float), errors=s.astype(float),
        warmup_calls=np.zeros(len(rates)), warmup_errors=np.zeros(len(rates)),
        last_starts=T0 + 10.0 * np.arange(looks))
    windows = []
    for k in range(looks):
        for name, rows in ((OLD, ~flags), (NEW, flags)):
            calls_k, errors_k = int(n[rows, k].sum()), int(s[rows, k].sum())
            windows.append(PathWindow(
                start=T0 + 10 * k, length=10.0, path="checkout", cohort=name,
                outcomes={"ok": calls_k - errors_k, "http_5xx": errors_k},
                latency=tuple([0] * BUCKET_COUNT)))
    return grid, windows


def _upto(grid: PodGrid, k: int) -> PodGrid:
    return PodGrid(grid.pods, grid.cohorts, grid.starts[:k], grid.calls[:, :k],
                   grid.errors[:, :k], grid.warmup_calls, grid.warmup_errors,
                   grid.last_starts[:k])


@pytest.mark.parametrize(
    ("rates", "fails"),
    [
        ([0.001] * 4 + [0.02] * 4, True),  # every canary pod worse: the version fails
        ([0.001] * 4 + [0.2, 0.001, 0.001, 0.001], False),  # one sick canary pod: never
        ([0.01, 0.001, 0.001, 0.001] + [0.001] * 4, False),  # a sick baseline pod: never
    ],
)
def test_pod_level_success_rate_at_every_look_agrees_with_judge(rates: list[float],
                                                                fails: bool) -> None:
    """One rule for both: the replay's success-rate state and e-values at every look, read
    from one `pod_track` over the whole grid, are what `judge` with the pods says on the
    windows up to then; its first fail is judge's first fail."""
    looks = 40
    canary = [False] * 4 + [True] * 4
    grid, windows = _pod_estate(np.random.default_rng(7), rates, canary, looks)
    track = pod_track(grid.calls, grid.errors, np.array(canary), 1.0,
                      Tolerances().success_rate_drop_pp / 100.0,
                      log_threshold=math.log(4 / ALPHA))
    tracks = _replay(windows, looks,
                     success_pods=PodLooks(track, np.arange(looks, dtype=np.int64)))
    mine = tracks.metrics["success_rate"]
    assert [STATES[c] for c in mine.state] == [
        State(str(x)) for x in pod_states(track, tracks.log_threshold)]
    judged_fail = None
    for k in range(looks):
        end = T0 + 10 * (k + 1)
        v = judge([w for w in windows if w.start < end], now=end, alpha=ALPHA,
                  pods={"checkout": _upto(grid, k + 1)}).paths[0]
        mv = v.metric("success_rate")
        assert mv is not None and mv.pods is not None  # judged per pod
        assert STATES[int(mine.state[k])] == mv.verdict, k
        for log_e, e in ((mine.log_e_fail[k], mv.e_fail), (mine.log_e_pass[k], mv.e_pass)):
            assert e is not None
            assert math.isclose(math.exp(min(log_e, 700.0)), e, rel_tol=1e-6), k
        if mv.verdict == "fail" and judged_fail is None:
            judged_fail = k
    assert mine.first(State.FAIL) == judged_fail
    assert (judged_fail is not None) == fails
