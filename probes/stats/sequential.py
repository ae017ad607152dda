"""The verdict's sequential tests replayed over time: the state at each look, and when each
test first crossed.

`probes.verdict.judge` answers "what is the verdict now?" from each cohort's totals since the
origin. A post-incident report asks the same question at every moment of a past rollout:
each look is the same test on the cumulative totals up to that moment, so one vectorised
call over T cumulative rows gives T verdicts, and the first row where E_fail reaches
1/α_share is the time the test crossed (fail). Because the e-values are e-processes, that
first crossing is exactly what a gate asking at those moments would have seen, with the
same false-alarm bound (α over all looks).

Inputs are `Totals`: per-row sums of what the tests need (probe errors already left out,
as `probes.stats.series` does). `Totals.sums` groups store columns by any row grouping (per
window, per report bucket), `cumulative()` turns increments into running totals, and
`evaluate()` runs the four tests with `judge`'s parameters, applicability rules and gates, so
its last row agrees with `judge` on the same windows (tests/unit/test_stats_sequential.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import BUCKET_COUNT, LOWER, UPPER
from probes.spec import DEFAULT_ATTEMPTS_MAX, DEFAULT_MIN_SAMPLES, Tolerances
from probes.stats import bounded, quantile, rates
from probes.stats.metrics import ATTEMPTS, LATENCY_P99, STREAM_RESETS, SUCCESS_RATE
from probes.stats.pods import PodTrack, pod_states
from probes.stats.series import Columns

__all__ = [
    "FAIL",
    "INCONCLUSIVE",
    "METRICS",
    "NOT_APPLICABLE",
    "PASS",
    "STATE_NAMES",
    "MetricTrack",
    "PodLooks",
    "Totals",
    "Tracks",
    "evaluate",
    "first_index",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

# State codes, ordered so that "worse" is larger (combining is a max over fail/other).
NOT_APPLICABLE, INCONCLUSIVE, PASS, FAIL = 0, 1, 2, 3
STATE_NAMES = {NOT_APPLICABLE: "n/a", INCONCLUSIVE: "inconclusive", PASS: "pass", FAIL: "fail"}
METRICS = (SUCCESS_RATE, LATENCY_P99, ATTEMPTS, STREAM_RESETS)
_LAYOUT = quantile.Layout.from_edges(LOWER, UPPER)
# Rows per quantile call: the test's work is rows x the widest bucket band among them, and
# early rows (few samples) have wide bands, so small chunks keep late rows cheap.
_LATENCY_CHUNK = 24
_Test = Callable[[npt.NDArray[np.intp]], tuple[F64, F64]]


@dataclass(frozen=True, slots=True, eq=False)
class Totals:
    """Sums over some rows of windows: one entry per row (a window, a bucket, a look).

    `requests` and `errors` leave out `probe_error` calls; `latency` is (rows, BUCKET_COUNT)
    bucket counts (per row, not cumulated over buckets).
    """

    requests: F64
    errors: F64
    attempts_sum: F64
    attempts_count: F64
    streams_opened: F64
    stream_seconds: F64
    stream_resets: F64
    latency: F64

    def __len__(self) -> int:
        return int(self.requests.size)

    @classmethod
    def zeros(cls, n: int) -> Totals:
        return cls(**{f.name: np.zeros(n) for f in fields(cls) if f.name != "latency"},
                   latency=np.zeros((n, BUCKET_COUNT)))

    @classmethod
    def sums(cls, cols: Columns, group: npt.ArrayLike, n_groups: int) -> Totals:
        """Per-group sums of the rows of `cols`; `group[row]` in [0, n_groups) or −1 to skip."""
        g = np.asarray(group, dtype=np.int64)
        shifted = g + 1

        def total(values: npt.ArrayLike) -> F64:
            weights = np.asarray(values, dtype=np.float64)
            return np.bincount(shifted, weights=weights, minlength=n_groups + 1)[1:].astype(
                np.float64)

        return cls(
            requests=total(cols.requests),
            errors=total(cols.errors),
            attempts_sum=total(cols.attempts_sum),
            attempts_count=total(cols.attempts_count),
            streams_opened=total(cols.streams_opened),
            stream_seconds=total(cols.stream_seconds),
            stream_resets=total(cols.stream_resets),
            latency=np.asarray(cols.pool(g, n_groups), dtype=np.float64),
        )

    def _map(self, fn: Callable[[F64], F64]) -> Totals:
        return Totals(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def take(self, rows: npt.ArrayLike) -> Totals:
        """The given rows (indices or a boolean mask), in that order."""
        r = np.asarray(rows)
        return self._map(lambda a: a[r])

    def cumulative(self, start: Totals | None = None) -> Totals:
        """Running totals down the rows, added to the single row `start` if given."""
        out = self._map(lambda a: np.cumsum(a, axis=0))
        if start is None:
            return out
        if len(start) != 1:
            raise ValueError("start must be a single row")
        return Totals(**{f.name: getattr(out, f.name) + getattr(start, f.name)
                         for f in fields(self)})

    def total(self) -> Totals:
        """All rows summed into one row."""
        return self._map(lambda a: a.sum(axis=0, keepdims=True))

    @staticmethod
    def concat(parts: list[Totals]) -> Totals:
        if not parts:
            return Totals.zeros(0)
        return Totals(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                         for f in fields(Totals)})


@dataclass(frozen=True, slots=True, eq=False)
class MetricTrack:
    """One metric at each look: its state (codes above) and log e-values (NaN: not tested)."""

    name: str
    state: I8
    log_e_fail: F64
    log_e_pass: F64

    def first(self, code: int) -> int | None:
        return first_index(self.state == code)


@dataclass(frozen=True, slots=True, eq=False)
class Tracks:
    """A path's metrics and overall state at each look, and the threshold they were held to.

    `state` is NOT_APPLICABLE where neither cohort has data yet, as `judge` then has no
    comparison; metrics that never applied are absent.
    """

    metrics: dict[str, MetricTrack]
    state: I8
    log_threshold: float

    def first(self, code: int, metric: str | None = None) -> int | None:
        """The first look at which the path (or one metric) was in state `code`."""
        if metric is None:
            return first_index(self.state == code)
        track = self.metrics.get(metric)
        return None if track is None else track.first(code)


def first_index(mask: npt.ArrayLike) -> int | None:
    """The index of the first True, or None."""
    m = np.asarray(mask, dtype=bool)
    return int(np.argmax(m)) if m.any() else None


@dataclass(frozen=True, slots=True, eq=False)
class PodLooks:
    """The pod-level success-rate test (`probes.stats.pods.pod_track`, one look per window
    of its grid) and, for each row of the totals `evaluate` gets, the index of the track's
    look that row stands at (−1: before its first look, no evidence yet)."""

    track: PodTrack
    at: I64

    def read(self, log_threshold: float) -> tuple[I8, F64, F64]:
        """Per row: the state (codes above) as `pods.pod_states` decides it (the live
        verdict's rule), and log E_fail (worst canary pod left out), log E_pass."""
        at = np.asarray(self.at, dtype=np.int64)
        looks = self.track.log_e_fail.size
        seen = (at >= 0) & (looks > 0)
        pick = np.clip(at, 0, max(looks - 1, 0))
        if looks:
            names = pod_states(self.track, log_threshold)[pick]
            log_fail = self.track.log_e_fail[pick]
            log_pass = self.track.log_e_pass[pick]
        else:
            names = np.full(at.size, "inconclusive")
            log_fail = log_pass = np.full(at.size, -np.inf)
        state = np.select([names == "fail", names == "pass"], [FAIL, PASS], INCONCLUSIVE)
        state = np.where(seen, state, INCONCLUSIVE).astype(np.int8)
        return (state, np.where(seen, log_fail, -np.inf).astype(np.float64),
                np.where(seen, log_pass, -np.inf).astype(np.float64))


def _decide(log_fail: F64, log_pass: F64, thr: float) -> I8:
    return np.where(log_fail >= thr, FAIL, np.where(log_pass >= thr, PASS, INCONCLUSIVE)).astype(
        np.int8)


def _latency(b: Totals, c: Totals, rows: I64, tol: Tolerances, thr: float) -> tuple[F64, F64]:
    fail = np.empty(rows.size)
    pas = np.empty(rows.size)
    margin_s = tol.latency_p99_margin_ms / 1000.0
    for lo in range(0, rows.size, _LATENCY_CHUNK):
        r = rows[lo : lo + _LATENCY_CHUNK]
        test = quantile.two_sample(
            np.cumsum(b.latency[r], axis=1), np.cumsum(c.latency[r], axis=1), _LAYOUT, 0.99,
            tol.latency_p99_ratio, margin_s, thr,
        )
        fail[lo : lo + r.size] = test.log_e_fail
        pas[lo : lo + r.size] = test.log_e_pass
    return fail, pas


def evaluate(
    baseline: Totals,
    canary: Totals,
    *,
    tolerances: Tolerances,
    alpha_share: float,
    attempts_max: int = DEFAULT_ATTEMPTS_MAX,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    fresh: npt.ArrayLike | None = None,
    success_pods: PodLooks | None = None,
) -> Tracks:
    """Every metric's test at each row of the cumulative totals (rows are looks in time).

    The parameters are `judge`'s: `alpha_share` is α / (4 × paths judged); a look where a
    cohort has fewer than `min_samples` requests, or where `fresh` is False (the data a gate
    would have seen was stale), is inconclusive whatever the e-values say, and so are all
    its metrics, as in `judge`. `success_pods` replaces the pooled success-rate test with the
    pod-level one, as `judge` does when it has the pods: its e-values at each row, and its
    states decided by the live verdict's own rule (`probes.stats.pods.pod_states`).
    """
    n = len(baseline)
    if len(canary) != n:
        raise ValueError("baseline and canary need the same number of looks")
    thr = math.log(1.0 / alpha_share)
    b, c = baseline, canary
    tol = tolerances
    span = float(attempts_max - 1)

    pod_rows = None if success_pods is None else success_pods.read(thr)
    if pod_rows is not None and pod_rows[0].size != n:
        raise ValueError("success_pods needs one look index per row")

    def track(name: str, applies_b: npt.NDArray[np.bool_], applies_c: npt.NDArray[np.bool_],
              has_b: npt.NDArray[np.bool_], has_c: npt.NDArray[np.bool_], test: _Test,
              invalid: npt.NDArray[np.bool_] | None = None,
              decided: I8 | None = None) -> MetricTrack | None:
        present = applies_b | applies_c
        if not present.any():
            return None
        full = has_b & has_c
        if invalid is not None:
            full &= ~invalid
        state = np.where(present, INCONCLUSIVE, NOT_APPLICABLE).astype(np.int8)
        log_fail = np.full(n, np.nan)
        log_pass = np.full(n, np.nan)
        rows = np.flatnonzero(full)
        if rows.size:
            f, p = test(rows)
            log_fail[rows], log_pass[rows] = f, p
            state[rows] = (_decide(np.asarray(f), np.asarray(p), thr) if decided is None
                           else decided[rows])
        return MetricTrack(name, state, log_fail, log_pass)

    def success(r: I64) -> tuple[F64, F64]:
        if pod_rows is not None:
            return pod_rows[1][r], pod_rows[2][r]
        t = bounded.two_sample(b.errors[r], b.requests[r], c.errors[r], c.requests[r], 1.0,
                               tol.success_rate_drop_pp / 100.0)
        return t.log_e_fail, t.log_e_pass

    def attempts(r: I64) -> tuple[F64, F64]:
        y_b = (b.attempts_sum[r] - b.attempts_count[r]) / span
        y_c = (c.attempts_sum[r] - c.attempts_count[r]) / span
        ratio = tol.attempts_ratio
        t = bounded.two_sample(y_b, b.attempts_count[r], y_c, c.attempts_count[r], ratio,
                               min((ratio - 1.0) / span, 1 - 1e-12))
        return t.log_e_fail, t.log_e_pass

    def resets(r: I64) -> tuple[F64, F64]:
        t = rates.two_sample(b.stream_resets[r], b.stream_seconds[r] / 3600.0,
                             c.stream_resets[r], c.stream_seconds[r] / 3600.0,
                             tol.stream_resets_ratio, tol.stream_resets_margin_per_hour)
        return t.log_e_fail, t.log_e_pass

    def latency(r: I64) -> tuple[F64, F64]:
        return _latency(b, c, r, tol, thr)

    def out_of_range(t: Totals) -> npt.NDArray[np.bool_]:
        within = (t.attempts_count <= t.attempts_sum) & (
            t.attempts_sum <= attempts_max * t.attempts_count)
        return (t.attempts_count > 0) & ~within

    lat_b, lat_c = b.latency.sum(axis=1) > 0, c.latency.sum(axis=1) > 0
    streams_b = (b.stream_seconds > 0) | (b.streams_opened > 0)
    streams_c = (c.stream_seconds > 0) | (c.streams_opened > 0)
    found = [
        track(SUCCESS_RATE, b.requests > 0, c.requests > 0, b.requests > 0, c.requests > 0,
              success, decided=None if pod_rows is None else pod_rows[0]),
        track(LATENCY_P99, lat_b, lat_c, lat_b, lat_c, latency),
        track(ATTEMPTS, b.attempts_count > 0, c.attempts_count > 0, b.attempts_count > 0,
              c.attempts_count > 0, attempts, out_of_range(b) | out_of_range(c)),
        track(STREAM_RESETS, streams_b, streams_c, b.stream_seconds > 0, c.stream_seconds > 0,
              resets),
    ]
    metrics = {t.name: t for t in found if t is not None}

    any_data = (b.requests > 0) | (c.requests > 0) | streams_b | streams_c
    both = ((b.requests > 0) | streams_b) & ((c.requests > 0) | streams_c)
    gated = ~both
    some_requests = (b.requests > 0) | (c.requests > 0)
    gated |= some_requests & ((b.requests < min_samples) | (c.requests < min_samples))
    if fresh is not None:
        gated |= ~np.asarray(fresh, dtype=bool)
    if metrics:
        states = np.stack([t.state for t in metrics.values()])
        applies = states != NOT_APPLICABLE
        fail = (states == FAIL).any(axis=0)
        all_pass = applies.any(axis=0) & ((states == PASS) | ~applies).all(axis=0)
        state = np.where(fail, FAIL, np.where(all_pass, PASS, INCONCLUSIVE)).astype(np.int8)
    else:
        state = np.full(n, INCONCLUSIVE, dtype=np.int8)
    state[gated] = INCONCLUSIVE
    state[~any_data] = NOT_APPLICABLE
    for t in metrics.values():
        t.state[gated & (t.state != NOT_APPLICABLE)] = INCONCLUSIVE
    return Tracks(metrics, state, thr)
