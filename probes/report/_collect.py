"""One pass over the store's windows: everything the report's charts and tests need.

The range is read a slice of looks at a time (`Store.read_table`), so memory is bounded by
the slice, not by the span: a day of 50 paths is ~360 MB as one table but a few tens of MB a
slice. From each slice this keeps, per path x cohort:

- per chart bucket: request, error, attempt and stream sums, and the p99 of the bucket's
  pooled histogram (counts added over the bucket's windows, never averaged percentiles);
- per look: the same sums and the pooled histogram (kept sparse), from which
  `probes.verdict.replay` builds the cumulative totals the sequential tests replay;
- over the whole range: the pooled totals and outcome counts for the figures table;
- which windows have data, to find each path's origin and staleness.

Calls with outcome `probe_error` are left out of requests and errors, as the verdict does.

The report's time axis (`TimeGrid`, `choose_grid`): chart buckets and the looks at which
the verdict is replayed.

A chart needs at most a few hundred points to be read on a laptop, and a day of 10 s windows
is 8,640 of them, so windows are pooled into buckets: the smallest "round" size (10 s, 30 s,
1 min, 5 min, ...) that keeps a chart under `MAX_POINTS`. A bucket is a whole number of
windows, aligned to the epoch like the windows themselves, so every window falls in exactly
one bucket and a bucket's end is a window boundary.

The verdict is replayed at the end of every `k`-th bucket (a *look*), `k` chosen so a path
has at most `MAX_LOOKS` looks: each look costs one p99 test on pooled histograms, the
expensive one. First crossings are then pinned to the window inside the look
(`probes.verdict.replay`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import BUCKET_COUNT, LOWER, UPPER
from probes.spec import DEFAULT_WINDOW_S
from probes.stats.quantile import Layout, quantile_estimate
from probes.stats.series import SCALARS, Totals, columns, without_latency
from probes.store import Store, WindowTable

__all__ = ["MAX_LOOKS", "MAX_POINTS", "SCALARS", "Collected", "TimeGrid", "choose_grid", "collect",
           "window_length"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
LAYOUT = Layout.from_edges(LOWER, UPPER)
# Dense pooled histograms per slice: path x cohort x bucket groups of BUCKET_COUNT float64
# each; 1,500 groups are ~23 MB.
_GROUP_BUDGET = 1500


MAX_POINTS = 300
MAX_LOOKS = 80
_ROUND = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800,
          21600, 43200, 86400)


@dataclass(frozen=True, slots=True)
class TimeGrid:
    """Buckets [start + i·step, start + (i+1)·step) for i < count, looks every `per_look`."""

    start: float
    step: float
    count: int
    per_look: int

    @property
    def stop(self) -> float:
        return self.start + self.step * self.count

    @property
    def edges(self) -> F64:
        return self.start + self.step * np.arange(self.count + 1, dtype=np.float64)

    @property
    def centers(self) -> F64:
        return self.start + self.step * (np.arange(self.count, dtype=np.float64) + 0.5)

    def bucket_of(self, t: npt.ArrayLike) -> I64:
        """The bucket of each time (−1 outside the grid)."""
        tt = np.asarray(t, dtype=np.float64)
        # A small nudge keeps a window start that is an exact edge in its own bucket.
        idx = np.floor((tt - self.start) / self.step + 1e-9).astype(np.int64)
        return np.where((idx >= 0) & (idx < self.count), idx, -1)

    @property
    def looks(self) -> int:
        return -(-self.count // self.per_look)

    def look_of_bucket(self, bucket: npt.ArrayLike) -> I64:
        b = np.asarray(bucket, dtype=np.int64)
        return np.where(b >= 0, b // self.per_look, -1)

    @property
    def look_ends(self) -> F64:
        """The time of each look: the end of its last bucket."""
        last = np.minimum((np.arange(self.looks) + 1) * self.per_look, self.count)
        return self.start + self.step * last.astype(np.float64)

    @property
    def look_starts(self) -> F64:
        return self.start + self.step * (np.arange(self.looks) * self.per_look).astype(np.float64)


def choose_grid(since: float, until: float, window_s: float,
                max_points: int = MAX_POINTS, max_looks: int = MAX_LOOKS) -> TimeGrid:
    """Buckets over [since, until) for windows of `window_s` seconds (module docstring)."""
    if until <= since:
        raise ValueError("the grid needs since < until")
    window = max(float(window_s), 1e-3)
    span = until - since
    want = span / max_points
    step = None
    for r in _ROUND:
        ratio = r / window
        if r >= want and r >= window and abs(ratio - round(ratio)) < 1e-9:
            step = float(r)
            break
    if step is None:  # an odd window length: whole windows, as few as keep the bound
        step = window * max(1, math.ceil(want / window))
    start = math.floor(since / step) * step
    count = max(1, math.ceil((until - start) / step - 1e-9))
    per_look = max(1, math.ceil(count / max_looks))
    return TimeGrid(start=start, step=step, count=count, per_look=per_look)


@dataclass(frozen=True, slots=True, eq=False)
class Collected:
    """What one pass gathered; arrays are indexed [path, cohort, bucket or look]."""

    grid: TimeGrid
    since: float
    until: float
    window_s: float
    paths: tuple[str, ...]
    cohorts: tuple[str, ...]
    present: npt.NDArray[np.bool_]  # [path, cohort]: has data in the range
    chart: dict[str, F64]  # SCALARS + "samples" + "p99_s", each [P, C, buckets]
    look_sums: dict[str, F64]  # SCALARS, each [P, C, looks]
    look_latency: tuple[npt.NDArray[np.int32], npt.NDArray[np.uint16], npt.NDArray[np.uint32]]
    # ^ sparse: (flat [P, C, look] index, bucket, count), sorted by the flat index
    pooled: Totals  # one row per path x cohort (p * C + c)
    outcomes: dict[str, F64]  # outcome name -> counts per path x cohort (p * C + c)
    # [path x cohort, window]: the window starting at grid.start + i * window_s has data
    # (one byte per window: a day of 50 paths x 2 cohorts is 0.9 MB)
    has_data: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros((0, 0), bool))

    def path_index(self, name: str) -> int:
        return self.paths.index(name)

    def cohort_index(self, name: str) -> int:
        return self.cohorts.index(name)

    def look_totals(self, p: int, c: int) -> Totals:
        """Per-look sums of one path x cohort, with dense pooled histograms."""
        looks = self.grid.looks
        flat, bucket, count = self.look_latency
        base = (p * len(self.cohorts) + c) * looks
        lo, hi = np.searchsorted(flat, [base, base + looks])
        latency = np.zeros((looks, BUCKET_COUNT))
        np.add.at(latency, (flat[lo:hi].astype(np.int64) - base, bucket[lo:hi]), count[lo:hi])
        return Totals(**{name: self.look_sums[name][p, c].copy() for name in SCALARS},
                      latency=latency)

    def starts_of(self, p: int, c: int) -> F64:
        """Start times of the windows of one path x cohort that have data, ascending."""
        row = self.has_data[p * len(self.cohorts) + c]
        return self.grid.start + self.window_s * np.flatnonzero(row).astype(np.float64)


def window_length(store: Store, since: float, until: float,
                  paths: list[str] | None) -> float:
    """The windows' length: read from the first windows of the range (the probe's setting)."""
    first = since
    span = store.time_range()
    if span is not None:
        first = max(since, span[0])
    for lo in (first, since):
        probe = store.read_table(since=lo, until=min(until, lo + 900.0), paths=paths)
        if len(probe):
            return float(np.median(probe.length))
    return DEFAULT_WINDOW_S


class _Pass:
    """Accumulates slices of the store into the arrays of `Collected`."""

    def __init__(self, grid: TimeGrid, paths: tuple[str, ...], cohorts: tuple[str, ...],
                 window_s: float, exclude: Sequence[tuple[float, float]] = ()):
        self.grid = grid
        self.exclude = exclude
        self.paths = paths
        self.cohorts = cohorts
        n_p, n_c = len(paths), len(cohorts)
        self.shape = (n_p, n_c)
        self.chart = {name: np.zeros((n_p, n_c, grid.count))
                      for name in (*SCALARS, "samples")}
        self.chart["p99_s"] = np.full((n_p, n_c, grid.count), np.nan)
        self.looks = {name: np.zeros((n_p, n_c, grid.looks)) for name in SCALARS}
        self.sparse: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.uint16],
                                npt.NDArray[np.uint32]]] = []
        self.pooled_latency = np.zeros((n_p * n_c, BUCKET_COUNT))
        self.pooled = {name: np.zeros(n_p * n_c) for name in SCALARS}
        self.outcomes: dict[str, F64] = {}
        self.window_s = window_s
        windows = max(1, math.ceil((grid.stop - grid.start) / window_s - 1e-9))
        self.has_data = np.zeros((n_p * n_c, windows), dtype=bool)

    def add(self, table: WindowTable) -> None:
        if not len(table):
            return
        grid = self.grid
        n_p, n_c = self.shape
        gp = _lookup(table.paths, self.paths)[table.path]
        gc = _lookup(table.cohorts, self.cohorts)[table.cohort]
        bucket = grid.bucket_of(table.start)
        keep = (gp >= 0) & (gc >= 0) & (bucket >= 0)
        if not keep.any():
            return
        cols = without_latency(columns(table), self.exclude)
        b0, b1 = int(bucket[keep].min()), int(bucket[keep].max()) + 1
        nb = b1 - b0
        pc = gp * n_c + gc
        group = np.where(keep, pc * nb + (bucket - b0), -1)
        sums = Totals.sums(cols, group, n_p * n_c * nb)
        for name in SCALARS:
            per = getattr(sums, name).reshape(n_p, n_c, nb)
            self.chart[name][:, :, b0:b1] += per
            self.pooled[name] += per.sum(axis=2).ravel()
            self._to_looks(name, per, b0, b1)
        latency = sums.latency.reshape(n_p, n_c, nb, BUCKET_COUNT)
        self.pooled_latency += latency.sum(axis=2).reshape(n_p * n_c, BUCKET_COUNT)
        self._latency_to_looks(latency, b0, b1)
        # Last use of the counts: cumulate in place (a day is ~60 M cells, once).
        cum = np.cumsum(latency, axis=3, out=latency)
        samples = cum[..., -1]
        self.chart["samples"][:, :, b0:b1] += samples
        with np.errstate(invalid="ignore"):
            p99 = quantile_estimate(cum, LAYOUT, 0.99)
        self.chart["p99_s"][:, :, b0:b1] = np.where(samples > 0, p99, np.nan)
        weight = np.where(keep, pc, -1) + 1
        for j, name in enumerate(table.outcome_names):
            counts = np.bincount(weight, weights=table.outcomes[:, j], minlength=n_p * n_c + 1)
            self.outcomes[name] = self.outcomes.get(name, np.zeros(n_p * n_c)) + counts[1:]
        has = keep & cols.has_data
        index = np.rint((table.start[has] - grid.start) / self.window_s).astype(np.int64)
        inside = (index >= 0) & (index < self.has_data.shape[1])
        self.has_data[pc[has][inside], index[inside]] = True

    def _look_bounds(self, b0: int, b1: int) -> tuple[I64, I64]:
        """Per look touched by buckets [b0, b1): its id, and offsets of its first bucket."""
        look = self.grid.look_of_bucket(np.arange(b0, b1))
        change = np.flatnonzero(np.diff(look)) + 1
        offsets = np.concatenate([[0], change]).astype(np.int64)
        return look[offsets], offsets

    def _to_looks(self, name: str, per: F64, b0: int, b1: int) -> None:
        ids, offsets = self._look_bounds(b0, b1)
        self.looks[name][:, :, ids] += np.add.reduceat(per, offsets, axis=2)

    def _latency_to_looks(self, latency: F64, b0: int, b1: int) -> None:
        ids, offsets = self._look_bounds(b0, b1)
        per_look = np.add.reduceat(latency, offsets, axis=2)  # [P, C, looks here, buckets]
        p, c, k, j = np.nonzero(per_look)
        flat = (p * self.shape[1] + c) * self.grid.looks + ids[k]
        # 10 bytes an entry: a day of 50 paths is ~2 M non-empty (path, cohort, look, bucket).
        self.sparse.append((flat.astype(np.int32), j.astype(np.uint16),
                            np.rint(per_look[p, c, k, j]).astype(np.uint32)))

    def result(self, since: float, until: float, window_s: float) -> Collected:
        n_p, n_c = self.shape
        present = self.has_data.any(axis=1).reshape(n_p, n_c)
        if self.sparse:
            flat, bucket, count = (np.concatenate(x) for x in zip(*self.sparse, strict=True))
            order = np.argsort(flat, kind="stable")
            sparse = (flat[order], bucket[order], count[order])
        else:
            sparse = (np.zeros(0, np.int32), np.zeros(0, np.uint16), np.zeros(0, np.uint32))
        pooled = Totals(**{name: self.pooled[name] for name in SCALARS},
                        latency=self.pooled_latency)
        return Collected(
            grid=self.grid, since=since, until=until, window_s=window_s,
            paths=self.paths, cohorts=self.cohorts, present=present, chart=self.chart,
            look_sums=self.looks, look_latency=sparse, pooled=pooled,
            outcomes=self.outcomes, has_data=self.has_data,
        )


def _lookup(local: tuple[str, ...], wanted: tuple[str, ...]) -> I64:
    """Map a table's local name indices to indices in `wanted` (−1: not wanted)."""
    index = {n: i for i, n in enumerate(wanted)}
    return np.array([index.get(n, -1) for n in local] or [-1], dtype=np.int64)


def collect(store: Store, since: float, until: float, paths: list[str] | None,
            *, window_s: float | None = None,
            exclude: Sequence[tuple[float, float]] = ()) -> Collected:
    """Read windows with start in [since, until) of `paths` (None: all) in slices; the
    latency of windows touching an `exclude` span (late sends) left out, as the verdict
    leaves it out of p99 (`probes.verdict.service.late_spans`).

    The range is first narrowed to what the store holds (`Collected.since/until`): a range
    asked wider than the data would squeeze the data into a few buckets at one edge.
    """
    span = store.time_range()
    if span is not None and span[0] < until and span[1] > since:
        since, until = max(since, span[0]), min(until, span[1])
    names = tuple(sorted(paths)) if paths else tuple(store.paths())
    cohorts = tuple(store.cohorts())
    length = window_s or window_length(store, since, until, paths)
    grid = choose_grid(since, until, length)
    acc = _Pass(grid, names, cohorts, length, exclude)
    groups = max(1, len(names) * len(cohorts))
    looks_per_slice = max(1, (_GROUP_BUDGET // groups) // grid.per_look)
    starts = grid.look_starts
    slices = []
    for first in range(0, grid.looks, looks_per_slice):
        lo = max(since, float(starts[first]))
        nxt = first + looks_per_slice
        hi = min(until, float(starts[nxt]) if nxt < grid.looks else grid.stop)
        if hi > lo:
            slices.append((lo, hi))
    # The next slice is read while this one is summed: SQLite and numpy release the GIL for
    # most of their work, so on two cores the reads hide much of the summing. Two slices
    # at most are held at once.
    with ThreadPoolExecutor(max_workers=1) as reader:
        ahead = [reader.submit(store.read_table, lo, hi, paths) for lo, hi in slices[:1]]
        for i in range(len(slices)):
            table = ahead.pop(0).result()
            if i + 1 < len(slices):
                ahead.append(reader.submit(store.read_table, *slices[i + 1], paths))
            acc.add(table)
    return acc.result(since, until, length)
