"""The pods × windows grid (`PodGrid`), the pod-level verdict's input: laid out from the
store's endpoint rows (`read_pod_grids`, `pod_grids`: each pod's warm-up apart, windows
merged where a grid would grow too large), with its per-pod attempts and latency.

`pod_grids` lays out each path's pods, windows and warm-up; `add_per_pod` adds what the store's
endpoint windows hold besides calls and errors (schema v2): each pod's upstream attempts per
window, and its warm calls' latency histogram. A grid carries them only when every warm cell
was written with them (`per_pod_metrics`): a span written by an older store is judged on
pooled calls for those metrics, never read as "no slow calls".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import BUCKET_COUNT
from probes.stats._num import overlapping

__all__ = ["MAX_GRID_CELLS", "LatencyFold", "PerPod", "PodGrid", "add_per_pod", "by_path",
           "dense_unique", "ordered_unique", "per_pod_of", "pod_grids", "read_pod_grids",
           "warm_latency"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Bool = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class PodGrid:
    """One path's calls and errors per pod and window: the input of the pod-level verdict.

    A pod is an endpoint in one cohort (a pod restarted onto the new proxy is a new pod).
    `calls` / `errors` are (pods, windows) over the windows `starts`, with each pod's
    warm-up left out; `warmup_calls` / `warmup_errors` are what the warm-up held, per pod.
    A column is one window, or adjacent ones merged to bound the grid's size: `starts` is
    when each column's first window began, `last_starts` when its last one did.
    Per-pod attempts and latency, where the source keeps them (`per_pod_metrics`: every
    warm cell was written with them): `attempts_calls` / `attempts_sum` (pods, windows) as
    `calls`, and `latency` (pods, buckets of `probes.measure.histogram`), the warm calls'
    histogram over all the grid's windows; None where no row from `since` has any.
    `settled` (a token, a count of columns): the grid's first columns are those of every
    grid its source gave with the same token, cell for cell (the running probe's verdict
    cache: its sealed strata), so sums over them may be kept between verdicts
    (`pods.TrackMemo`); None where nothing is vouched for.
    """

    pods: tuple[str, ...]
    cohorts: tuple[str, ...]
    starts: F64
    calls: F64
    errors: F64
    warmup_calls: F64
    warmup_errors: F64
    last_starts: F64
    attempts_calls: F64 | None = None
    attempts_sum: F64 | None = None
    latency: F64 | None = None
    per_pod_metrics: bool = False
    settled: tuple[object, int] | None = None

    def of(self, cohort: str) -> Bool:
        return np.array([c == cohort for c in self.cohorts], dtype=bool)


# A grid above this many cells is judged in coarser time strata (adjacent windows merged):
# memory stays bounded for hundreds of pods over a day, and strata of a few windows still
# cancel an outage shared by both cohorts.
MAX_GRID_CELLS = 2_000_000


@dataclass(frozen=True, slots=True, eq=False)
class PerPod:
    """The endpoint rows' attempts and unrecorded counts (per row, as `EndpointColumns`),
    and their latency entries (`EndpointLatency`'s columns, one per bucket record)."""

    attempts_sum: I64
    attempts_count: I64
    unrecorded: I64
    lat_start: F64
    lat_path: I32
    lat_endpoint: I32
    lat_cohort: I32
    lat_started: F64
    lat_bucket: I64
    lat_count: I64
    # Where each path's entries lie when they are sorted by path (`by_path`): offsets
    # indexed by path, else None (a mask per path finds them).
    lat_bounds: I64 | None = None


def per_pod_of(cols: Any, length_s: float,
               exclude: Sequence[tuple[float, float]]) -> PerPod:
    """What `EndpointColumns` (read with `latency`) holds besides calls and errors, with
    the histogram entries of windows `length_s` long touching an `exclude` span (late
    sends) left out: latency alone, as `verdict._without` leaves out the pooled p99's."""
    lat = cols.latency
    keep = ~overlapping(lat.start, length_s, exclude)
    return PerPod(cols.attempts_sum, cols.attempts_count, cols.unrecorded, lat.start[keep],
                  lat.path[keep], lat.endpoint[keep], lat.cohort[keep], lat.started[keep],
                  lat.bucket[keep], lat.count[keep])


# Entries sorted by path at most (a warm verdict's pooled records are a few hundred
# thousand): sorting copies every entry column once, and a day's cold read holds tens of
# millions, where a mask per path costs a byte per entry instead.
SORT_ENTRIES_MAX = 2_000_000


def by_path(per_pod: PerPod, n_paths: int) -> PerPod:
    """`per_pod` with its latency entries sorted by path (stably, so each path's keep their
    order) and `lat_bounds` set, when there are at most `SORT_ENTRIES_MAX`: each path's
    entries are then a slice, not a mask over every entry per path."""
    if len(per_pod.lat_path) > SORT_ENTRIES_MAX:
        return per_pod
    order = np.argsort(per_pod.lat_path, kind="stable")
    bounds = np.searchsorted(per_pod.lat_path[order], np.arange(n_paths + 1))
    return replace(per_pod, lat_start=per_pod.lat_start[order],
                   lat_path=per_pod.lat_path[order], lat_endpoint=per_pod.lat_endpoint[order],
                   lat_cohort=per_pod.lat_cohort[order],
                   lat_started=per_pod.lat_started[order],
                   lat_bucket=per_pod.lat_bucket[order], lat_count=per_pod.lat_count[order],
                   lat_bounds=bounds.astype(np.int64))


def add_per_pod(grid: PodGrid, per_pod: PerPod, rows: npt.NDArray[np.intp], path: int,
                keys: I64,
                pod: I64, kept: Bool, warm: Bool, window: I64, *, n_cohorts: int,
                since: float | None, warmup_s: float, first: F64) -> PodGrid:
    """`grid` with its pods' attempts and latency (`pods.pod_grids`' inner state for one
    path: `rows` the indices of the path's rows in order, `keys` its pod keys (endpoint ×
    cohorts + cohort), `pod` each row's pod, `kept` / `warm` the rows from `since` / out of
    warm-up, `window` each kept row's column, `first` each pod's first row)."""
    shape = grid.calls.shape
    cold = ~warm[kept]
    cell = pod[kept][~cold] * shape[1] + window[~cold]

    def summed(x: I64) -> F64:
        return np.asarray(np.bincount(cell, weights=x[rows][kept][~cold].astype(np.float64),
                                      minlength=shape[0] * shape[1]),
                          dtype=np.float64).reshape(shape)

    a_n, a_s = summed(per_pod.attempts_count), summed(per_pod.attempts_sum)
    recorded = not bool(np.any(per_pod.unrecorded[rows][kept][~cold] > 0))

    b = per_pod.lat_bounds
    on = slice(int(b[path]), int(b[path + 1])) if b is not None else per_pod.lat_path == path
    key = per_pod.lat_endpoint[on].astype(np.int64) * n_cohorts + per_pod.lat_cohort[on]
    flat, seen = warm_latency(keys, first, key, per_pod.lat_start[on], per_pod.lat_started[on],
                              per_pod.lat_bucket[on], per_pod.lat_count[on], since=since,
                              warmup_s=warmup_s)
    hist = flat.reshape(len(keys), BUCKET_COUNT)
    # Rows that carry none at all (a writer that keeps no per-pod attempts or latency, as
    # tests' and benchmarks' stores) leave the metric to the pooled test, as v1 rows do.
    any_attempts = bool(per_pod.attempts_count[rows][kept].sum() > 0)
    any_latency = bool(seen.any())
    return replace(grid, attempts_calls=a_n if any_attempts else None,
                   attempts_sum=a_s if any_attempts else None,
                   latency=hist if any_latency else None, per_pod_metrics=recorded)


def warm_latency(keys: I64, first: F64, key: I64, t: F64, started: F64, bucket: I64,
                 count: I64, *, since: float | None, warmup_s: float,
                 per: I64 | None = None, kept: Bool | None = None) -> tuple[F64, Bool]:
    """The warm latency histograms (flat: pods × `BUCKET_COUNT`) of the pods `keys`
    (sorted; `first` each one's first row) from the records of pods `key` (records of
    other pods left out) at `t`: a record counts from `since` once its pod is out of
    warm-up (from `started`, else from its first row). Also which pods have a record from
    `since`. With `per`, `key`, `t` and `started` are rows', `per` records each (every
    record of a row is decided at once), those not `kept` left out. Additive over
    records: a cold read sums it chunk by chunk (`LatencyFold`)."""
    at, use, recent = _warm_rows(keys, first, key, t, started, since=since,
                                 warmup_s=warmup_s)
    cell = at * BUCKET_COUNT
    if per is not None:
        if kept is not None:
            use &= kept
            recent &= kept
        use = np.repeat(use, per)
        cell = np.repeat(cell, per)
        recent &= per > 0
    flat = np.asarray(np.bincount(cell[use] + bucket[use],
                                  weights=count[use].astype(np.float64),
                                  minlength=len(keys) * BUCKET_COUNT), dtype=np.float64)
    seen = np.zeros(len(keys), dtype=bool)
    seen[at[recent]] = True
    return flat, seen


def _warm_rows(keys: I64, first: F64, key: I64, t: F64, started: F64, *,
               since: float | None, warmup_s: float) -> tuple[I64, Bool, Bool]:
    """`warm_latency`'s rule per row (or record): each one's pod among `keys`, whether it
    counts (its pod known and warm, from `since`) and whether it is from `since`."""
    at = np.minimum(np.searchsorted(keys, key), max(len(keys) - 1, 0))
    known = keys[at] == key if len(keys) else np.zeros(len(key), dtype=bool)
    began = np.where(np.isnan(started), first[at], started) if len(keys) else t
    use = known & (t >= began + warmup_s)
    recent = known if since is None else known & (t >= since)
    if since is not None:
        use &= recent
    return at, use, recent


# Records `LatencyFold` gathers before it sums them into the histograms: a sum costs a pass
# over every pod's histograms (~18 MB at 12 pods of 50 paths), so it is made once for many
# chunks, not once a chunk; the buffers are 16 MB.
FOLD_RECORDS = 1 << 20


class LatencyFold:
    """Every pod's warm latency histogram of endpoint columns read without latency
    (`cols`), summed from their latency records chunk by chunk (`add`) as `add_per_pod`
    sums them from records held whole: a day of 12 pods per path is tens of millions of
    records, its histograms a few MB. `grids` puts them into `pods.pod_grids`' grids."""

    def __init__(self, cols: Any, *, since: float | None, warmup_s: float, length_s: float,
                 exclude: Sequence[tuple[float, float]]) -> None:
        self._cols, self._since, self._warmup = cols, since, warmup_s
        self._length, self._exclude = length_s, exclude
        # A pod is (path, endpoint, cohort), in `pod_grids`' order within each path.
        self._keys, pod = dense_unique(self._key(cols.path, cols.endpoint, cols.cohort),
                                        len(cols.paths) * len(cols.endpoints) * len(cols.cohorts))
        self._first = np.full(len(self._keys), np.inf)
        np.minimum.at(self._first, pod, cols.start)
        self._hist = np.zeros(len(self._keys) * BUCKET_COUNT)
        self._seen = np.zeros(len(self._keys), dtype=bool)
        # Records gathered, not summed yet (`_sum`): their cells and counts.
        self._cells = np.zeros(0, dtype=np.int64)
        self._counts = np.zeros(0)
        self._held = 0

    def _key(self, path: I32, endpoint: I32, cohort: I32) -> I64:
        e, c = len(self._cols.endpoints), len(self._cols.cohorts)
        return np.asarray((path.astype(np.int64) * e + endpoint) * c + cohort, dtype=np.int64)

    def whole(self, rows: Any) -> Bool:
        """Which of `rows` (`LatencyRows` spanning minutes, an hour's rollup: `start` the
        stratum of its first with records, `last` of its last, one pod start throughout)
        count whole: their pod is warm and from `since` at the first (so at every later
        one), and no `exclude` span touches any of their strata. `add` takes those as it
        takes any row."""
        _, use, _ = _warm_rows(self._keys, self._first,
                               self._key(rows.path, rows.endpoint, rows.cohort), rows.start,
                               rows.started, since=self._since, warmup_s=self._warmup)
        return use & ~overlapping(rows.start, rows.last - rows.start + self._length,
                                  self._exclude)

    def add(self, lat: Any) -> None:
        """The records `lat` (`LatencyRows`, indexed as the columns), those of windows
        touching an `exclude` span left out as `per_pod_of` leaves them out."""
        keep = ~overlapping(lat.start, self._length, self._exclude)
        at, use, recent = _warm_rows(
            self._keys, self._first, self._key(lat.path, lat.endpoint, lat.cohort),
            lat.start, lat.started, since=self._since, warmup_s=self._warmup)
        use &= keep
        self._seen[at[recent & keep & (lat.per > 0)]] = True
        # Most rows count (warm, clear of late sends): their records are taken whole.
        if use.all():
            base, per, bucket, count = at * BUCKET_COUNT, lat.per, lat.bucket, lat.count
        else:
            records = np.repeat(use, lat.per)
            base, per = at[use] * BUCKET_COUNT, lat.per[use]
            bucket, count = lat.bucket[records], lat.count[records]
        n = len(bucket)
        if self._held + n > len(self._cells):
            self._sum()
        if n > len(self._cells):
            size = max(n, FOLD_RECORDS)
            self._cells, self._counts = np.empty(size, dtype=np.int64), np.empty(size)
        into = slice(self._held, self._held + n)
        np.add(np.repeat(base, per), bucket, out=self._cells[into])
        self._counts[into] = count
        self._held += n

    def _sum(self) -> None:
        """The records gathered summed into the histograms, in place: a bincount's array as
        large as every pod's histograms (77 MB at 50 pods of 50 paths), made and faulted in
        at every sum, cost ten times the sum (exact: float sums of counts below 2**53)."""
        if self._held:
            np.add.at(self._hist, self._cells[:self._held], self._counts[:self._held])
            self._held = 0

    def grids(self, grids: dict[str, PodGrid]) -> dict[str, PodGrid]:
        """`grids` (`pod_grids`' of the columns) with the histograms summed so far, as
        `add_per_pod` gives them."""
        self._sum()
        per_path = len(self._cols.endpoints) * len(self._cols.cohorts)
        bounds = np.searchsorted(self._keys, np.arange(len(self._cols.paths) + 1) * per_path)
        hist = self._hist.reshape(-1, BUCKET_COUNT)
        out = dict(grids)
        for p, name in enumerate(self._cols.paths):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if name in out:
                out[name] = replace(out[name], latency=hist[lo:hi]
                                    if self._seen[lo:hi].any() else None)
        return out


def read_pod_grids(source: Any, *, since: float | None, until: float | None,
                   paths: Iterable[str] | None = None, cohorts: Iterable[str] | None = None,
                   warmup_s: float, window_s: float, stratum_s: float | None = None,
                   exclude: Sequence[tuple[float, float]] = (),
                   per_pod: bool = True) -> dict[str, PodGrid] | None:
    """Per path, the pods × windows grid read from `source` (its `read_endpoint_columns`,
    the SQLite store's) as every reader takes it: from `warmup_s` before `since`, so a pod
    seen then is warm at `since`; `stratum_s` sums windows into coarser strata; windows
    touching an `exclude` span (late sends) keep their calls but not their latency. With
    `per_pod`, the grids carry the pods' attempts and latency too
    (`probes.stats.pod_cells`). None when the source keeps no per-pod counts (Prometheus
    series)."""
    read = getattr(source, "read_endpoint_columns", None)
    if read is None:
        return None
    lo = None if since is None else since - warmup_s
    length_s = stratum_s or window_s
    stream = getattr(source, "stream_endpoint_columns", None)
    if per_pod and stream is not None:
        # The latency records a chunk at a time, summed into each pod's histogram as they
        # come: a day's records held whole grew with pods past the store's size (BENCHMARKS.md D23).
        # Whole hours of a pod's records where they all count (`LatencyFold.whole`): the
        # fold is made once the rows are read, before the records come.
        folds: list[LatencyFold] = []
        with stream(since=lo, until=until, paths=paths, cohorts=cohorts,
                    stratum_s=stratum_s, by_row=True,
                    whole=lambda _cols, rows: folds[0].whole(rows)) as (cols, chunks):
            fold = LatencyFold(cols, since=since, warmup_s=warmup_s, length_s=length_s,
                               exclude=exclude)
            folds.append(fold)
            for chunk in chunks:
                fold.add(chunk)
        return fold.grids(_grids_of(cols, since, warmup_s, length_s, exclude, per_pod))
    cols = read(since=lo, until=until, paths=paths, cohorts=cohorts, stratum_s=stratum_s,
                **({"latency": True} if per_pod else {}))
    return _grids_of(cols, since, warmup_s, length_s, exclude, per_pod)


def _grids_of(cols: Any, since: float | None, warmup_s: float, length_s: float,
              exclude: Sequence[tuple[float, float]], per_pod: bool) -> dict[str, PodGrid]:
    """`pod_grids` of endpoint columns read for `read_pod_grids`, rows `length_s` long."""
    extra = None
    if per_pod:
        extra = per_pod_of(cols, length_s, exclude)
    return pod_grids(
        cols.start, cols.path, cols.endpoint, cols.cohort,
        cols.requests, cols.errors,
        paths=cols.paths, endpoints=cols.endpoints, cohorts=cols.cohorts, since=since,
        warmup_s=warmup_s, started=cols.started, per_pod=extra,
    )


# Pod keys counted in a table up to this many possible keys (8 bytes each), else sorted.
_KEY_TABLE_MAX = 1 << 22


def dense_unique(key: I64, size: int) -> tuple[I64, I64]:
    """`np.unique(key, return_inverse=True)` of pod keys in [0, `size`): counted in a table
    of every possible key, not sorted (a day's strata are a million rows of a thousand pods)."""
    if size > _KEY_TABLE_MAX:
        keys, inverse = np.unique(key, return_inverse=True)
        return keys, inverse.ravel()
    counted = np.bincount(key, minlength=size) > 0
    return np.flatnonzero(counted), (np.cumsum(counted) - 1)[key]


def ordered_unique(t: F64) -> tuple[F64, npt.NDArray[np.intp]]:
    """`np.unique(t, return_inverse=True)`, without its sort when `t` is in order already
    (the verdict cache keeps each path's strata by start)."""
    if t.size and np.all(t[1:] >= t[:-1]):
        new = np.empty(t.size, dtype=bool)
        new[0] = True
        np.not_equal(t[1:], t[:-1], out=new[1:])
        return t[new], np.cumsum(new) - 1
    starts, window = np.unique(t, return_inverse=True)
    return starts, window.ravel()


def pod_grids(start: F64, path: npt.NDArray[np.int32], endpoint: npt.NDArray[np.int32],
              cohort: npt.NDArray[np.int32], requests: I64, errors: I64, *,
              paths: tuple[str, ...], endpoints: tuple[str, ...], cohorts: tuple[str, ...],
              since: float | None, warmup_s: float,
              started: F64 | None = None, per_pod: Any = None) -> dict[str, PodGrid]:
    """Per path, the pods × windows grid of the rows with start ≥ `since` (columns as
    `EndpointColumns` holds them). A pod's warm-up is its first `warmup_s` from when it
    started (`started`, per row, where known) or else from the first window the rows show
    it in, so pass rows from `warmup_s` before `since` too: a pod seen then has warmed up by
    `since`. A pod restarted under its own name (a StatefulSet's) has a new start.
    `per_pod` (`probes.stats.pod_cells.PerPod`): the rows' attempts and latency, which the
    grids then carry too (`pod_cells.add_per_pod`)."""
    out: dict[str, PodGrid] = {}
    if not len(start):
        return out
    # Rows grouped by path once (stable: each path's rows keep their order), not a mask
    # over every row per path: a day of 50 paths' pods was mostly that.
    order = np.argsort(path, kind="stable")
    sorted_paths = path[order]
    if per_pod is not None:
        per_pod = by_path(per_pod, len(paths))
    cuts = np.flatnonzero(sorted_paths[1:] != sorted_paths[:-1]) + 1
    for rows in np.split(order, cuts):
        p = path[rows[0]]
        t, e, c = start[rows], endpoint[rows], cohort[rows]
        n, k = requests[rows].astype(np.float64), errors[rows].astype(np.float64)
        pod_key = e.astype(np.int64) * len(cohorts) + c
        keys, pod = dense_unique(pod_key, len(endpoints) * len(cohorts))
        first = np.full(len(keys), np.inf)
        np.minimum.at(first, pod, t)
        began = first[pod] if started is None else np.where(
            np.isnan(started[rows]), first[pod], started[rows])
        warm = t >= began + warmup_s
        kept = t >= since if since is not None else np.ones(len(t), dtype=bool)
        starts, window = ordered_unique(t[kept])
        if not len(starts):
            continue
        merge = max(1, math.ceil(len(keys) * len(starts) / MAX_GRID_CELLS))
        window = window // merge
        cols = int(window.max()) + 1 if len(window) else 0
        shape = (len(keys), cols)
        pk, wk, hot = pod[kept], window, ~warm[kept]
        cell = pk[~hot] * cols + wk[~hot]

        def summed(at: I64, x: F64, size: int) -> F64:
            return np.bincount(at, weights=x, minlength=size).astype(np.float64)

        grid_n = summed(cell, n[kept][~hot], shape[0] * cols).reshape(shape)
        grid_s = summed(cell, k[kept][~hot], shape[0] * cols).reshape(shape)
        w_n = summed(pk[hot], n[kept][hot], len(keys))
        w_s = summed(pk[hot], k[kept][hot], len(keys))
        grid = PodGrid(
            pods=tuple(endpoints[int(x) // len(cohorts)] for x in keys),
            cohorts=tuple(cohorts[int(x) % len(cohorts)] for x in keys),
            starts=starts[::merge], calls=grid_n, errors=grid_s,
            warmup_calls=w_n, warmup_errors=w_s,
            last_starts=starts[np.minimum((np.arange(cols) + 1) * merge, len(starts)) - 1],
        )
        if per_pod is not None:
            grid = add_per_pod(grid, per_pod, rows, p, keys, pod, kept, warm, window,
                               n_cohorts=len(cohorts), since=since, warmup_s=warmup_s,
                               first=first)
        out[paths[int(p)]] = grid
    return out
