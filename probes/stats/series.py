"""Per-path, per-cohort totals over the comparison span, from path windows.

The tests in this package need only each cohort's totals (requests, errors, attempt sums,
stream exposure and resets, the pooled latency histogram) over one span of windows that is
the same for both cohorts: from the *origin*, the first window (at or after `since`) in which
both cohorts have data, to the last window both have reached. The origin is what makes the
anytime-valid guarantee meaningful: with `since` fixed (the rollout's start), every later
verdict is one more look at the same growing sample.

Input is either a sequence of `PathWindow`s or the store's columnar `WindowTable` (any object
with its columns, duck-typed): a day of windows for many paths is only practical in the
latter, where this module works on whole columns and pools histograms in one `bincount`.

Calls with the outcome `probe_error` (the probe could not run them) count neither as
requests nor as errors: they say nothing about the callee.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import BUCKET_COUNT
from probes.stats._num import overlapping
from probes.types import Outcome, PathWindow

__all__ = ["SCALARS", "CohortTotals", "Columns", "PathSeries", "Totals", "columns",
           "overlapping", "path_series", "without_latency"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class CohortTotals:
    """One cohort's sums over the comparison span; `latency` is the pooled bucket counts."""

    windows: int
    requests: int
    errors: int
    attempts_sum: int
    attempts_count: int
    streams_opened: int
    stream_seconds: float
    stream_resets: int
    latency: I64


@dataclass(frozen=True, slots=True, eq=False)
class PathSeries:
    """What the verdict needs to know about one path.

    `newest_end` maps each cohort with data (at or after `since`) to the end of its newest
    window, for the staleness check. `span` is [origin start, end of the last common window)
    or None when the two cohorts never share a window; the totals are None exactly then.
    """

    path: str
    cohorts: tuple[str, ...]
    newest_end: Mapping[str, float]
    span: tuple[float, float] | None
    baseline: CohortTotals | None
    canary: CohortTotals | None


@dataclass(frozen=True, slots=True, eq=False)
class Columns:
    """Path windows as columns; `pool(group, n)` sums latency rows by group id (−1 = skip)."""

    paths: tuple[str, ...]
    cohorts: tuple[str, ...]
    start: F64
    length: F64
    path: I64
    cohort: I64
    requests: I64
    errors: I64
    attempts_sum: I64
    attempts_count: I64
    streams_opened: I64
    stream_seconds: F64
    stream_resets: I64
    lag_max_s: F64
    pool: Callable[[I64, int], I64]

    @property
    def has_data(self) -> npt.NDArray[np.bool_]:
        return (self.requests > 0) | (self.stream_seconds > 0) | (self.streams_opened > 0)


def _from_windows(windows: Sequence[PathWindow]) -> Columns:
    paths = tuple(sorted({w.path for w in windows}))
    cohorts = tuple(sorted({w.cohort for w in windows}))
    p_index = {p: i for i, p in enumerate(paths)}
    c_index = {c: i for i, c in enumerate(cohorts)}
    n = len(windows)
    ints = np.zeros((8, n), dtype=np.int64)
    floats = np.zeros((4, n), dtype=np.float64)
    for i, w in enumerate(windows):
        probe_errors = w.outcomes.get(Outcome.PROBE_ERROR, 0)
        requests = w.requests - probe_errors
        ints[:, i] = (
            p_index[w.path], c_index[w.cohort], requests, requests - w.successes,
            w.attempts_sum, w.attempts_count, w.streams_opened, sum(w.stream_resets.values()),
        )
        floats[:, i] = (w.start, w.length, w.stream_seconds, w.lag_max_s)

    def pool(group: I64, n_groups: int) -> I64:
        out = np.zeros((n_groups, BUCKET_COUNT), dtype=np.int64)
        for i in np.flatnonzero(group >= 0):
            latency = windows[int(i)].latency
            if len(latency) != BUCKET_COUNT:
                raise ValueError(
                    f"window latency has {len(latency)} buckets, the layout has {BUCKET_COUNT}"
                )
            out[group[i]] += np.asarray(latency, dtype=np.int64)
        return out

    return Columns(
        paths, cohorts, floats[0], floats[1], ints[0], ints[1], ints[2], ints[3], ints[4],
        ints[5], ints[6], floats[2], ints[7], floats[3], pool,
    )


def _from_table(table: Any) -> Columns:
    names = tuple(table.outcome_names)
    probe = (
        table.outcomes[:, names.index(Outcome.PROBE_ERROR)]
        if Outcome.PROBE_ERROR in names else 0
    )
    requests = np.asarray(table.requests - probe, dtype=np.int64)
    resets = table.stream_resets
    resets = resets.sum(axis=1) if resets.ndim == 2 else resets
    return Columns(
        tuple(table.paths), tuple(table.cohorts),
        np.asarray(table.start, dtype=np.float64), np.asarray(table.length, dtype=np.float64),
        np.asarray(table.path, dtype=np.int64), np.asarray(table.cohort, dtype=np.int64),
        requests, np.asarray(requests - table.successes, dtype=np.int64),
        np.asarray(table.attempts_sum, dtype=np.int64),
        np.asarray(table.attempts_count, dtype=np.int64),
        np.asarray(table.streams_opened, dtype=np.int64),
        np.asarray(table.stream_seconds, dtype=np.float64),
        np.asarray(resets, dtype=np.int64), np.asarray(table.lag_max_s, dtype=np.float64),
        lambda group, n_groups: np.asarray(table.latency_by_group(group, n_groups)),
    )


def columns(windows: Sequence[PathWindow] | Any) -> Columns:
    """Columns from a sequence of `PathWindow`s or from a store `WindowTable`."""
    if isinstance(windows, Columns):
        return windows
    if hasattr(windows, "latency_by_group"):
        return _from_table(windows)
    return _from_windows(list(windows))


def _slice(starts: F64, lo: int, hi: int, first: float, last: float) -> tuple[int, int]:
    """Within the sorted slice [lo, hi), the sub-slice of windows starting in [first, last]."""
    part = starts[lo:hi]
    return lo + int(np.searchsorted(part, first, "left")), lo + int(
        np.searchsorted(part, last, "right"))


_SUMMED = (
    "requests", "errors", "attempts_sum", "attempts_count", "streams_opened", "stream_seconds",
    "stream_resets",
)


def path_series(
    cols: Columns,
    baseline: str | None,
    canary: str | None,
    *,
    since: float | None = None,
    paths: Iterable[str] | None = None,
) -> list[PathSeries]:
    """One `PathSeries` per path with data at or after `since` (or per path asked for)."""
    keep = cols.has_data
    if since is not None:
        keep &= cols.start >= since
    rows_all = np.flatnonzero(keep)
    n_c = max(1, len(cols.cohorts))
    if paths is not None:
        wanted = sorted(set(paths))
    else:
        seen = np.bincount(cols.path[rows_all], minlength=len(cols.paths)) > 0
        wanted = [cols.paths[i] for i in np.flatnonzero(seen)]
    p_index = {p: i for i, p in enumerate(cols.paths)}
    c_index = {c: i for i, c in enumerate(cols.cohorts)}
    # Rows sorted by (path, cohort, start), so each path x cohort is one slice and the rows of
    # a span are a sub-slice; totals are differences of prefix sums.
    start_all = cols.start[rows_all]
    if start_all.size > 1 and np.any(start_all[1:] < start_all[:-1]):  # stores sort by start
        rows_all = rows_all[np.argsort(start_all, kind="stable")]
    key = cols.path[rows_all] * n_c + cols.cohort[rows_all]
    by_key = np.argsort(key, kind="stable")
    order = rows_all[by_key]
    sorted_key = key[by_key]
    starts = cols.start[order]
    ends = starts + cols.length[order]

    def bounds(p: int, c: int) -> tuple[int, int]:
        g = p * n_c + c
        lo, hi = np.searchsorted(sorted_key, [g, g + 1])
        return int(lo), int(hi)

    group = np.full(cols.start.size, -1, dtype=np.int64)
    pending: list[tuple[str, dict[str, float], tuple[float, float] | None,
                        tuple[int, int] | None, tuple[int, int] | None]] = []
    for name in wanted:
        p = p_index.get(name)
        newest: dict[str, float] = {}
        if p is not None:
            for c_name, c in c_index.items():
                lo, hi = bounds(p, c)
                if hi > lo:
                    newest[c_name] = float(ends[lo:hi].max())
        span = None
        sb = sc = None
        if p is not None and baseline in c_index and canary in c_index and baseline != canary:
            lb, hb = bounds(p, c_index[baseline])
            lc, hc = bounds(p, c_index[canary])
            # Starts are unique per path x cohort (one window each), so no unique() pass.
            common = np.intersect1d(starts[lb:hb], starts[lc:hc], assume_unique=True)
            if common.size:
                first = float(common[0])
                last = min(float(starts[hb - 1]), float(starts[hc - 1]))
                sb = _slice(starts, lb, hb, first, last)
                sc = _slice(starts, lc, hc, first, last)
                span = (first, float(max(ends[sb[0]:sb[1]].max(), ends[sc[0]:sc[1]].max())))
                group[order[sb[0]:sb[1]]] = 2 * len(pending)
                group[order[sc[0]:sc[1]]] = 2 * len(pending) + 1
        pending.append((name, newest, span, sb, sc))

    n_groups = 2 * len(pending)
    pooled = cols.pool(group, n_groups) if pending else np.zeros((0, BUCKET_COUNT))
    # Per-group sums in one bincount per column (group −1, outside every span, lands in 0).
    shifted = group + 1
    sums = {
        name: np.bincount(shifted, weights=getattr(cols, name), minlength=n_groups + 1)[1:]
        for name in _SUMMED
    }
    sums["windows"] = np.bincount(shifted, minlength=n_groups + 1)[1:].astype(np.float64)

    def count(name: str, g: int) -> int:
        return int(np.rint(sums[name][g]))  # float64 sums of counts are exact below 2**53

    def totals(g: int) -> CohortTotals:
        return CohortTotals(
            windows=count("windows", g),
            requests=count("requests", g),
            errors=count("errors", g),
            attempts_sum=count("attempts_sum", g),
            attempts_count=count("attempts_count", g),
            streams_opened=count("streams_opened", g),
            stream_seconds=float(sums["stream_seconds"][g]),
            stream_resets=count("stream_resets", g),
            latency=pooled[g],
        )

    out = []
    for i, (name, newest, span, sb, sc) in enumerate(pending):
        tb = totals(2 * i) if sb is not None else None
        tc = totals(2 * i + 1) if sc is not None else None
        out.append(PathSeries(name, tuple(sorted(newest)), newest, span, tb, tc))
    return out


def without_latency(cols: Columns, spans: Sequence[tuple[float, float]]) -> Columns:
    """`cols` with the latency of the windows that overlap any of `spans` left out of what
    `pool` sums (the probe's sends were late then); their calls, errors, attempts and
    streams still count. The rule the verdict and the report's replay share."""
    if not spans:
        return cols
    out = overlapping(cols.start, cols.length, spans)
    if not out.any():
        return cols
    pool = cols.pool
    return replace(cols, pool=lambda group, n: pool(np.where(out, -1, group), n))


# The sums `Totals` holds besides the latency histogram, in its field order.
SCALARS = ("requests", "errors", "attempts_sum", "attempts_count", "streams_opened",
           "stream_seconds", "stream_resets")


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
