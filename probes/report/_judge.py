"""The verdict replayed over the report's range, and each test's first crossing.

For every path this rebuilds what `probes.verdict.service` would have judged at each look:
the baseline and canary totals from the path's *origin* (the first window both cohorts
have, at or after the range's start) up to the look, with `judge`'s gates (min_samples,
stale data) and α shared among the paths in the report. `probes.stats.sequential.evaluate`
runs the four tests at every look in one call per path.

Looks are a few per chart bucket; windows are finer. Two places are pinned to the window:

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
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from probes.report._collect import LAYOUT, SCALARS, Collected
from probes.spec import JudgingSettings
from probes.stats.pods import PodTrack, pod_track, read_pod_grids
from probes.stats.quantile import quantile_estimate
from probes.stats.sequential import FAIL, PodLooks, Totals, Tracks, evaluate, first_index
from probes.stats.series import columns
from probes.store import Store

__all__ = ["PODS", "POOLED", "Crossing", "PathJudgement", "estimates", "judge_paths"]

F64 = npt.NDArray[np.float64]

# How a path's success rate was replayed: per pod, as the live verdict judges it when the
# store holds endpoint windows, or on calls pooled per cohort when it does not.
PODS, POOLED = "pods", "pooled"


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
        p99 = float(quantile_estimate(np.cumsum(t.latency[row]), LAYOUT, 0.99)) * 1000.0
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
    def __init__(self, store: Store, data: Collected, baseline: str, canary: str,
                 settings: JudgingSettings, paths_judged: int) -> None:
        self.store = store
        self.data = data
        self.b = data.cohort_index(baseline)
        self.c = data.cohort_index(canary)
        self.settings = settings
        self.alpha_share = settings.alpha / (4 * max(1, paths_judged))
        self._pod_cache: dict[int, tuple[F64, PodTrack] | None] = {}

    def _evaluate(self, tb: Totals, tc: Totals, fresh: npt.ArrayLike | None,
                  success_pods: PodLooks | None = None) -> Tracks:
        s = self.settings
        return evaluate(tb, tc, tolerances=s.tolerances, alpha_share=self.alpha_share,
                        attempts_max=s.attempts_max, min_samples=s.min_samples, fresh=fresh,
                        success_pods=success_pods)

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

    def _fresh(self, p: int, at: F64) -> F64:
        """Whether both cohorts' newest windows at each time are at most two windows old."""
        L = self.data.window_s
        ok = np.ones(at.size, dtype=bool)
        for c in (self.b, self.c):
            starts = self.data.starts_of(p, c)
            idx = np.searchsorted(starts, at - L + 1e-6, side="right") - 1
            newest_end = np.where(idx >= 0, starts[np.maximum(idx, 0)] + L, -np.inf)
            ok &= at - newest_end <= 2 * L + 1e-6
        return ok

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
        tracks = self._evaluate(cum_b, cum_c, self._fresh(p, looks_at), pod_looks)
        crossings = {}
        for metric in tracks.metrics:
            j = tracks.first(FAIL, metric)
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
            k = first_index(fine.metrics[metric].state == FAIL) if metric in fine.metrics \
                else None
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


def judge_paths(store: Store, data: Collected, baseline: str, canary: str,
                settings: JudgingSettings, skip: Collection[str] = ()) -> list[PathJudgement]:
    """The replay for every path in `data` that has data but those in `skip` (relay paths,
    judged as pair matrices), α shared among the paths replayed (module docstring)."""
    with_data = [p for p in range(len(data.paths))
                 if data.present[p].any() and data.paths[p] not in skip]
    replay = _Replay(store, data, baseline, canary, settings, len(with_data))
    spans = {p: replay.span(p) for p in with_data}
    outside = replay.outside({p: sp for p, sp in spans.items() if sp is not None})
    return [replay.path(p, spans[p], outside) for p in with_data]
