"""The verdict replayed over time: the state at each look, and when each test first crossed.

`probes.verdict.judge` answers "what is the verdict now?" from each cohort's totals since the
origin. A post-incident report asks the same question at every moment of a past rollout:
each look is the same test on the cumulative totals up to that moment, so one vectorised
call over T cumulative rows gives T verdicts, and the first row where E_fail reaches
1/α_share is the time the test crossed (fail). Because the e-values are e-processes, that
first crossing is exactly what a gate asking at those moments would have seen, with the
same false-alarm bound (α over all looks). `evaluate` applies the rules `judge` applies
(`probes.verdict.rules`: the same tests, gates and combine), so its last row is `judge`'s
verdict on the same windows (tests/unit/test_verdict_replay.py).

`judge_paths` rebuilds, for every path of a report, what `probes.verdict.service` would
have judged at each look: the baseline and canary totals from the path's *origin* (the
first window both cohorts have, at or after the range's start) up to the look, with α
shared among the paths in the report. Looks are a few per chart bucket; windows are finer.
Two places are pinned to the window:

- the origin: windows of the origin's look that start before it are taken out again (a
  small read of that stretch), so the sums are exactly the ones `judge` would use;
- the first crossing: when a metric first stands failed at look j, the windows between
  look j − 1 and look j are replayed one by one from the totals at look j − 1, and the
  crossing is the end of the first window at which the test stood crossed.

A crossing that came and went between two looks is not seen (the e-value crossed, then fell
back before the next look); the replay says at which resolution it looked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import LOWER, UPPER
from probes.spec import DEFAULT_ATTEMPTS_MAX, DEFAULT_MIN_SAMPLES, DEFAULT_WINDOW_S
from probes.stats import quantile
from probes.stats.pods import PodTrack, pod_states, pod_track, read_pod_grids
from probes.stats.quantile import quantile_estimate
from probes.stats.series import SCALARS, Totals, columns
from probes.store import Store
from probes.verdict import rules
from probes.verdict.rules import (
    ATTEMPTS,
    CODES,
    LATENCY_P99,
    STREAM_RESETS,
    SUCCESS_RATE,
    State,
    TolerancesLike,
)

__all__ = [
    "PODS",
    "POOLED",
    "Crossing",
    "LookData",
    "LookGrid",
    "MetricTrack",
    "PathJudgement",
    "PodLooks",
    "ReplaySettings",
    "Tracks",
    "estimates",
    "evaluate",
    "first_index",
    "judge_paths",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

_LAYOUT = quantile.Layout.from_edges(LOWER, UPPER)
# Rows per quantile call: the test's work is rows x the widest bucket band among them, and
# early rows (few samples) have wide bands, so small chunks keep late rows cheap.
_LATENCY_CHUNK = 24
_Test = Callable[[npt.NDArray[np.intp]], tuple[F64, F64]]
# How a path's success rate was replayed: per pod, as the live verdict judges it when the
# store holds endpoint windows, or on calls pooled per cohort when it does not.
PODS, POOLED = "pods", "pooled"


@dataclass(frozen=True, slots=True, eq=False)
class MetricTrack:
    """One metric at each look: its state (`rules.CODES`) and log e-values (NaN: not
    tested)."""

    name: str
    state: I8
    log_e_fail: F64
    log_e_pass: F64

    def first(self, state: State) -> int | None:
        return first_index(self.state == CODES[state])


@dataclass(frozen=True, slots=True, eq=False)
class Tracks:
    """A path's metrics and overall state at each look, and the threshold they were held to.

    `state` is n/a (`State.NOT_APPLICABLE`) where neither cohort has data yet, as `judge`
    then has no comparison; metrics that never applied are absent.
    """

    metrics: dict[str, MetricTrack]
    state: I8
    log_threshold: float

    def first(self, state: State, metric: str | None = None) -> int | None:
        """The first look at which the path (or one metric) was in `state`."""
        if metric is None:
            return first_index(self.state == CODES[state])
        track = self.metrics.get(metric)
        return None if track is None else track.first(state)


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
        """Per row: the state (`rules.CODES`) as `pods.pod_states` decides it (the live
        verdict's rule), and log E_fail (worst canary pod left out), log E_pass."""
        at = np.asarray(self.at, dtype=np.int64)
        looks = self.track.log_e_fail.size
        seen = (at >= 0) & (looks > 0)
        pick = np.clip(at, 0, max(looks - 1, 0))
        state = np.full(at.size, CODES[State.INCONCLUSIVE], dtype=np.int8)
        log_fail = log_pass = np.full(at.size, -np.inf)
        if looks:
            state = rules.codes_of(pod_states(self.track, log_threshold)[pick])
            log_fail = self.track.log_e_fail[pick]
            log_pass = self.track.log_e_pass[pick]
        state = rules.hold(state, ~seen)
        return (state, np.where(seen, log_fail, -np.inf).astype(np.float64),
                np.where(seen, log_pass, -np.inf).astype(np.float64))


def _latency(b: Totals, c: Totals, rows: I64, tol: TolerancesLike, thr: float) -> tuple[F64, F64]:
    fail = np.empty(rows.size)
    pas = np.empty(rows.size)
    for lo in range(0, rows.size, _LATENCY_CHUNK):
        r = rows[lo : lo + _LATENCY_CHUNK]
        test = rules.latency_test(np.cumsum(b.latency[r], axis=1),
                                  np.cumsum(c.latency[r], axis=1), _LAYOUT, tol, thr)
        fail[lo : lo + r.size] = test.log_e_fail
        pas[lo : lo + r.size] = test.log_e_pass
    return fail, pas


def evaluate(
    baseline: Totals,
    canary: Totals,
    *,
    tolerances: TolerancesLike,
    alpha_share: float,
    attempts_max: int = DEFAULT_ATTEMPTS_MAX,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    window_s: float = DEFAULT_WINDOW_S,
    ages: tuple[npt.ArrayLike, npt.ArrayLike] | None = None,
    success_pods: PodLooks | None = None,
) -> Tracks:
    """Every metric's test at each row of the cumulative totals (rows are looks in time).

    The parameters are `judge`'s: `alpha_share` is α / (4 × paths judged); `ages` are the
    baseline's and canary's newest windows' ages at each look in seconds (None: fresh), held
    to `window_s` by `rules.gates`, as are `min_samples`. `success_pods` replaces the pooled
    success-rate test with the pod-level one, as `judge` does when it has the pods: its
    e-values at each row, and its states decided by the live verdict's own rule
    (`probes.stats.pods.pod_states`).
    """
    n = len(baseline)
    if len(canary) != n:
        raise ValueError("baseline and canary need the same number of looks")
    thr = rules.log_threshold(alpha_share)
    b, c = baseline, canary
    tol = tolerances

    pod_rows = None if success_pods is None else success_pods.read(thr)
    if pod_rows is not None and pod_rows[0].size != n:
        raise ValueError("success_pods needs one look index per row")

    def track(name: str, test: _Test, invalid: npt.NDArray[np.bool_] | None = None,
              decided: I8 | None = None) -> MetricTrack | None:
        present = rules.applies(name, b) | rules.applies(name, c)
        if not present.any():
            return None
        full = rules.measured(name, b) & rules.measured(name, c)
        if invalid is not None:
            full &= ~invalid
        state = np.where(present, CODES[State.INCONCLUSIVE],
                         CODES[State.NOT_APPLICABLE]).astype(np.int8)
        log_fail = np.full(n, np.nan)
        log_pass = np.full(n, np.nan)
        rows = np.flatnonzero(full)
        if rows.size:
            f, p = test(rows)
            log_fail[rows], log_pass[rows] = f, p
            state[rows] = (rules.decide(f, p, thr) if decided is None else decided[rows])
        return MetricTrack(name, state, log_fail, log_pass)

    def success(r: I64) -> tuple[F64, F64]:
        if pod_rows is not None:
            return pod_rows[1][r], pod_rows[2][r]
        t = rules.success_test(b.requests[r], b.errors[r], c.requests[r], c.errors[r], tol)
        return t.log_e_fail, t.log_e_pass

    def attempts(r: I64) -> tuple[F64, F64]:
        t = rules.attempts_test(b.attempts_sum[r], b.attempts_count[r], c.attempts_sum[r],
                                c.attempts_count[r], tol, attempts_max)
        return t.log_e_fail, t.log_e_pass

    def resets(r: I64) -> tuple[F64, F64]:
        t = rules.resets_test(b.stream_resets[r], b.stream_seconds[r], c.stream_resets[r],
                              c.stream_seconds[r], tol)
        return t.log_e_fail, t.log_e_pass

    def latency(r: I64) -> tuple[F64, F64]:
        return _latency(b, c, r, tol, thr)

    found = [
        track(SUCCESS_RATE, success, decided=None if pod_rows is None else pod_rows[0]),
        track(LATENCY_P99, latency),
        track(ATTEMPTS, attempts,
              rules.attempts_out_of_range(b.attempts_sum, b.attempts_count, attempts_max)
              | rules.attempts_out_of_range(c.attempts_sum, c.attempts_count, attempts_max)),
        track(STREAM_RESETS, resets),
    ]
    metrics = {t.name: t for t in found if t is not None}

    # A side has data when it has requests or streams (what makes it show in `judge`).
    data_b = (b.requests > 0) | rules.applies(STREAM_RESETS, b)
    data_c = (c.requests > 0) | rules.applies(STREAM_RESETS, c)
    gates = rules.gates(b.requests, c.requests, both=data_b & data_c, min_samples=min_samples,
                        window_s=window_s, age_b=None if ages is None else ages[0],
                        age_c=None if ages is None else ages[1])
    codes = np.stack([t.state for t in metrics.values()]) if metrics \
        else np.zeros((0, n), dtype=np.int8)
    state, held = rules.path_states(codes, gates.blocked(), gates.stale())
    for t, row in zip(metrics.values(), held, strict=True):
        t.state[:] = row
    state[~(data_b | data_c)] = CODES[State.NOT_APPLICABLE]
    return Tracks(metrics, state, thr)


class LookGrid(Protocol):
    """The report's time grid as the replay reads it (`probes.report._collect.TimeGrid`)."""

    @property
    def look_starts(self) -> F64: ...
    @property
    def look_ends(self) -> F64: ...
    def bucket_of(self, t: npt.ArrayLike) -> I64: ...
    def look_of_bucket(self, bucket: npt.ArrayLike) -> I64: ...


class LookData(Protocol):
    """The report's one pass over the store as the replay reads it
    (`probes.report._collect.Collected`): per-look sums and which windows have data."""

    @property
    def grid(self) -> LookGrid: ...
    @property
    def since(self) -> float: ...
    @property
    def until(self) -> float: ...
    @property
    def window_s(self) -> float: ...
    @property
    def paths(self) -> tuple[str, ...]: ...
    @property
    def cohorts(self) -> tuple[str, ...]: ...
    @property
    def present(self) -> npt.NDArray[np.bool_]: ...
    def cohort_index(self, name: str) -> int: ...
    def look_totals(self, p: int, c: int) -> Totals: ...
    def starts_of(self, p: int, c: int) -> F64: ...


class ReplaySettings(Protocol):
    """The verdict parameters a replay judges with (`probes.spec.JudgingSettings` satisfies it)."""

    @property
    def tolerances(self) -> TolerancesLike: ...
    @property
    def alpha(self) -> float: ...
    @property
    def min_samples(self) -> int: ...
    @property
    def attempts_max(self) -> int: ...
    @property
    def warmup_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Crossing:
    """When one metric's test first stood crossed (fail), and what the cohorts showed then."""

    metric: str
    at: float
    log_e_fail: float
    baseline: float | None
    canary: float | None


@dataclass(frozen=True, slots=True, eq=False)
class PathJudgement:
    """The replay of one path: states per look (None: the cohorts never overlapped)."""

    path: str
    origin: float | None
    tracks: Tracks | None
    crossings: dict[str, Crossing]
    final: dict[str, float | None]  # estimates at the last look, per "<metric>:<role>"
    success_unit: str | None = None  # PODS or POOLED (None: no comparison)

    @property
    def first(self) -> Crossing | None:
        """The earliest crossing over all metrics."""
        return min(self.crossings.values(), key=lambda c: c.at, default=None)


def estimates(t: Totals, row: int) -> dict[str, float | None]:
    """The four metrics' point estimates from cumulative totals at one row."""
    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    n = float(t.latency[row].sum())
    p99 = None
    if n > 0:
        p99 = float(quantile_estimate(np.cumsum(t.latency[row]), _LAYOUT, 0.99)) * 1000.0
    fail = ratio(float(t.errors[row]), float(t.requests[row]))
    return {
        "success_rate": None if fail is None else 1.0 - fail,
        "latency_p99_ms": p99,
        "attempts_per_request": ratio(float(t.attempts_sum[row]), float(t.attempts_count[row])),
        "stream_resets_per_hour": ratio(float(t.stream_resets[row]),
                                        float(t.stream_seconds[row]) / 3600.0),
    }


@dataclass(frozen=True, slots=True)
class _Span:
    origin: float
    cap: float
    first: int  # the looks holding the origin and the cap
    last: int


class _Replay:
    def __init__(self, store: Store, data: LookData, baseline: str, canary: str,
                 settings: ReplaySettings, paths_judged: int) -> None:
        self.store = store
        self.data = data
        self.b = data.cohort_index(baseline)
        self.c = data.cohort_index(canary)
        self.settings = settings
        self.alpha_share = settings.alpha / (len(rules.METRICS) * max(1, paths_judged))
        self._pod_cache: dict[int, tuple[F64, PodTrack] | None] = {}

    def _evaluate(self, tb: Totals, tc: Totals, ages: tuple[F64, F64] | None,
                  success_pods: PodLooks | None = None) -> Tracks:
        s = self.settings
        return evaluate(tb, tc, tolerances=s.tolerances, alpha_share=self.alpha_share,
                        attempts_max=s.attempts_max, min_samples=s.min_samples,
                        window_s=self.data.window_s, ages=ages, success_pods=success_pods)

    def _pods(self, p: int, origin: float, cap: float) -> tuple[F64, PodTrack] | None:
        """The path's pod-level success-rate test over [origin, cap] (`probes.stats.pods`, as
        the live verdict runs it), run once: each window's end and the track, one look per
        window. None when the store holds no per-pod counts for both cohorts there."""
        if p in self._pod_cache:
            return self._pod_cache[p]
        name = self.data.paths[p]
        b, c = self.data.cohorts[self.b], self.data.cohorts[self.c]
        warm = self.settings.warmup_s
        grids = read_pod_grids(self.store, since=origin, until=cap + self.data.window_s / 2,
                               paths=[name], cohorts=[b, c], warmup_s=warm,
                               window_s=self.data.window_s, per_pod=False)
        grid = (grids or {}).get(name)
        out = None
        if grid is not None and {b, c} <= set(grid.cohorts):
            rows = np.array([x in (b, c) for x in grid.cohorts], dtype=bool)
            canary = np.array([x == c for x in grid.cohorts], dtype=bool)[rows]
            track = pod_track(grid.calls[rows], grid.errors[rows], canary, 1.0,
                              self.settings.tolerances.success_rate_drop_pp / 100.0,
                              log_threshold=math.log(1.0 / self.alpha_share))
            out = (grid.last_starts + self.data.window_s, track)
        self._pod_cache[p] = out
        return out

    def _pod_looks(self, p: int, origin: float, cap: float, at: F64) -> PodLooks | None:
        """The pod-level test as it stood at each time in `at` (the last window ended by
        then), for `evaluate` to take the success rate's states and e-values from."""
        pods = self._pods(p, origin, cap)
        if pods is None:
            return None
        ends, track = pods
        idx = np.searchsorted(ends, np.asarray(at) + 1e-6, side="right") - 1
        return PodLooks(track, idx.astype(np.int64))

    def _window_sums(self, path: str, lo: float, hi: float,
                     origin: float, cap: float) -> tuple[Totals, Totals, F64]:
        """Per-window sums of baseline and canary for windows with start in [lo, hi)."""
        L = self.data.window_s
        n = max(1, math.ceil((hi - lo) / L - 1e-9))
        table = self.store.read_table(since=lo, until=hi, paths=[path])
        cols = columns(table)
        step = np.floor((cols.start - lo) / L + 1e-9).astype(np.int64)
        inside = (cols.start >= origin) & (cols.start <= cap) & (step >= 0) & (step < n)
        out = []
        for name in (self.data.cohorts[self.b], self.data.cohorts[self.c]):
            if name in cols.cohorts:
                mine = inside & (cols.cohort == cols.cohorts.index(name))
                out.append(Totals.sums(cols, np.where(mine, step, -1), n))
            else:
                out.append(Totals.zeros(n))
        ends = lo + L * (np.arange(n, dtype=np.float64) + 1.0)
        return out[0], out[1], np.asarray(ends, dtype=np.float64)

    def _ages(self, p: int, at: F64) -> tuple[F64, F64]:
        """How old the baseline's and the canary's newest windows are at each time (inf:
        none yet), for `rules.gates` to call stale."""
        L = self.data.window_s
        ages = []
        for c in (self.b, self.c):
            starts = self.data.starts_of(p, c)
            idx = np.searchsorted(starts, at - L + 1e-6, side="right") - 1
            newest_end = np.where(idx >= 0, starts[np.maximum(idx, 0)] + L, -np.inf)
            ages.append(np.asarray(at - newest_end, dtype=np.float64))
        return ages[0], ages[1]

    def span(self, p: int) -> _Span | None:
        """The path's origin and cap (the last window both cohorts reached), and their looks."""
        data = self.data
        sb, sc = data.starts_of(p, self.b), data.starts_of(p, self.c)
        common = np.intersect1d(sb, sc, assume_unique=True)
        if not common.size:
            return None
        origin, cap = float(common[0]), float(min(sb[-1], sc[-1]))
        grid = data.grid
        return _Span(origin, cap, int(grid.look_of_bucket(grid.bucket_of(origin))),
                     int(grid.look_of_bucket(grid.bucket_of(cap))))

    def outside(self, spans: dict[int, _Span]) -> dict[tuple[int, int], tuple[Totals, Totals]]:
        """Sums of what lies outside [origin, cap] in each path's first and last look.

        Paths whose stretch is the same (a version reaching every path of a service at
        once) are read together: one read per distinct stretch, not per path.
        """
        data = self.data
        starts, ends = data.grid.look_starts, np.minimum(data.grid.look_ends, data.until)
        wanted: dict[tuple[float, float], list[tuple[int, int]]] = {}
        for p, sp in spans.items():
            lo = max(float(starts[sp.first]), data.since)
            for a, z, row in ((lo, sp.origin, sp.first),
                              (sp.cap + data.window_s / 2, float(ends[sp.last]), sp.last)):
                if z > a and self._has_data(p, a, z):
                    wanted.setdefault((a, z), []).append((p, row))
        out: dict[tuple[int, int], tuple[Totals, Totals]] = {}
        names = (data.cohorts[self.b], data.cohorts[self.c])
        for (a, z), members in wanted.items():
            table = self.store.read_table(since=a, until=z,
                                          paths=sorted({data.paths[p] for p, _ in members}))
            cols = columns(table)
            group = np.full(len(table), -1, dtype=np.int64)
            for k, (p, _) in enumerate(members):
                if data.paths[p] not in cols.paths:
                    continue
                mine = cols.path == cols.paths.index(data.paths[p])
                for role, name in enumerate(names):
                    if name in cols.cohorts:
                        group[mine & (cols.cohort == cols.cohorts.index(name))] = 2 * k + role
            sums = Totals.sums(cols, group, 2 * len(members))
            for k, key in enumerate(members):
                out[key] = (sums.take([2 * k]), sums.take([2 * k + 1]))
        return out

    def path(self, p: int, sp: _Span | None,
             outside: dict[tuple[int, int], tuple[Totals, Totals]]) -> PathJudgement:
        data = self.data
        name = data.paths[p]
        if sp is None:
            return PathJudgement(name, None, None, {}, {})
        tb, tc = data.look_totals(p, self.b), data.look_totals(p, self.c)
        for t in (tb, tc):
            for arr in (*(getattr(t, n) for n in SCALARS), t.latency):
                arr[:sp.first] = 0.0
                arr[sp.last + 1:] = 0.0
        for row in (sp.first, sp.last):
            if (p, row) in outside:
                xb, xc = outside[(p, row)]
                _subtract(tb, xb, row)
                _subtract(tc, xc, row)
        cum_b, cum_c = tb.cumulative(), tc.cumulative()
        looks_at = np.minimum(data.grid.look_ends, data.until)
        pod_looks = self._pod_looks(p, sp.origin, sp.cap, looks_at)
        tracks = self._evaluate(cum_b, cum_c, self._ages(p, looks_at), pod_looks)
        crossings = {}
        for metric in tracks.metrics:
            j = tracks.first(State.FAIL, metric)
            if j is not None:
                crossings[metric] = self._pin(p, metric, j, sp.first, sp.origin, sp.cap,
                                              cum_b, cum_c, tracks)
        final = {}
        last = len(cum_b) - 1
        for role, cum in (("baseline", cum_b), ("canary", cum_c)):
            for metric, value in estimates(cum, last).items():
                final[f"{metric}:{role}"] = value
        return PathJudgement(name, sp.origin, tracks, crossings, final,
                             POOLED if pod_looks is None else PODS)

    def _has_data(self, p: int, lo: float, hi: float) -> bool:
        for c in (self.b, self.c):
            s = self.data.starts_of(p, c)
            if np.any((s >= lo) & (s < hi)):
                return True
        return False

    def _pin(self, p: int, metric: str, j: int, o: int, origin: float, cap: float,
             cum_b: Totals, cum_c: Totals, tracks: Tracks) -> Crossing:
        """The window inside look j at which the metric's test first stood crossed."""
        grid = self.data.grid
        lo = origin if j == o else float(grid.look_starts[j])
        hi = min(float(grid.look_ends[j]), self.data.until, cap + self.data.window_s)
        at = float(min(grid.look_ends[j], self.data.until))
        track = tracks.metrics[metric]
        log_e = float(track.log_e_fail[j])
        row_b, row_c, row = cum_b, cum_c, j
        if hi > lo:
            wb, wc, ends = self._window_sums(self.data.paths[p], lo, hi, origin, cap)
            start_b = None if j == o else cum_b.take([j - 1])
            start_c = None if j == o else cum_c.take([j - 1])
            run_b, run_c = wb.cumulative(start_b), wc.cumulative(start_c)
            fine = self._evaluate(run_b, run_c, None, self._pod_looks(p, origin, cap, ends))
            k = fine.first(State.FAIL, metric)
            if k is not None:
                at = float(ends[k])
                log_e = float(fine.metrics[metric].log_e_fail[k])
                row_b, row_c, row = run_b, run_c, k
        return Crossing(metric, at, log_e, estimates(row_b, row)[metric],
                        estimates(row_c, row)[metric])


def _subtract(t: Totals, part: Totals, row: int) -> None:
    for name in SCALARS:
        getattr(t, name)[row] = max(0.0, float(getattr(t, name)[row] - getattr(part, name)[0]))
    t.latency[row] = np.maximum(0.0, t.latency[row] - part.latency[0])


def judge_paths(store: Store, data: LookData, baseline: str, canary: str,
                settings: ReplaySettings, skip: Collection[str] = ()) -> list[PathJudgement]:
    """The replay for every path in `data` that has data but those in `skip` (relay paths,
    judged as pair matrices), α shared among the paths replayed (module docstring)."""
    with_data = [p for p in range(len(data.paths))
                 if data.present[p].any() and data.paths[p] not in skip]
    replay = _Replay(store, data, baseline, canary, settings, len(with_data))
    spans = {p: replay.span(p) for p in with_data}
    outside = replay.outside({p: sp for p, sp in spans.items() if sp is not None})
    return [replay.path(p, spans[p], outside) for p in with_data]
