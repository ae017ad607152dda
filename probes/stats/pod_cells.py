"""The pods × windows grid (`PodGrid`), the pod-level verdict's input, and its per-pod
attempts and latency.

`pods.pod_grids` lays out each path's pods, windows and warm-up; this adds what the store's
endpoint windows hold besides calls and errors (schema v2): each pod's upstream attempts per
window, and its warm calls' latency histogram. A grid carries them only when every warm cell
was written with them (`per_pod_metrics`): a span written by an older store is judged on
pooled calls for those metrics, never read as "no slow calls".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import BUCKET_COUNT
from probes.stats._num import overlapping

__all__ = ["MAX_GRID_CELLS", "LatencyFold", "PerPod", "PodGrid", "add_per_pod", "by_path",
           "per_pod_of", "warm_latency"]

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
                 count: I64, *, since: float | None, warmup_s: float) -> tuple[F64, Bool]:
    """The warm latency histograms (flat: pods × `BUCKET_COUNT`) of the pods `keys`
    (sorted; `first` each one's first row) from the records of pods `key` (records of
    other pods left out) at `t`: a record counts from `since` once its pod is out of
    warm-up (from `started`, else from its first row). Also which pods have a record from
    `since`. Additive over records: a cold read sums it chunk by chunk (`LatencyFold`)."""
    at = np.minimum(np.searchsorted(keys, key), max(len(keys) - 1, 0))
    known = keys[at] == key if len(keys) else np.zeros(len(key), dtype=bool)
    began = np.where(np.isnan(started), first[at], started) if len(keys) else t
    use = known & (t >= began + warmup_s)
    recent = known if since is None else known & (t >= since)
    if since is not None:
        use &= recent
    flat = np.asarray(np.bincount(at[use] * BUCKET_COUNT + bucket[use],
                                  weights=count[use].astype(np.float64),
                                  minlength=len(keys) * BUCKET_COUNT), dtype=np.float64)
    seen = np.zeros(len(keys), dtype=bool)
    seen[at[recent]] = True
    return flat, seen


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
        self._keys, pod = np.unique(self._key(cols.path, cols.endpoint, cols.cohort),
                                    return_inverse=True)
        self._first = np.full(len(self._keys), np.inf)
        np.minimum.at(self._first, pod.ravel(), cols.start)
        self._hist = np.zeros(len(self._keys) * BUCKET_COUNT)
        self._seen = np.zeros(len(self._keys), dtype=bool)

    def _key(self, path: I32, endpoint: I32, cohort: I32) -> I64:
        e, c = len(self._cols.endpoints), len(self._cols.cohorts)
        return np.asarray((path.astype(np.int64) * e + endpoint) * c + cohort, dtype=np.int64)

    def add(self, lat: Any) -> None:
        """The records `lat` (`EndpointLatency`, indexed as the columns), those of windows
        touching an `exclude` span left out as `per_pod_of` leaves them out."""
        keep = ~overlapping(lat.start, self._length, self._exclude)
        flat, seen = warm_latency(
            self._keys, self._first, self._key(lat.path[keep], lat.endpoint[keep],
                                               lat.cohort[keep]),
            lat.start[keep], lat.started[keep], lat.bucket[keep], lat.count[keep],
            since=self._since, warmup_s=self._warmup)
        self._hist += flat
        self._seen |= seen

    def grids(self, grids: dict[str, PodGrid]) -> dict[str, PodGrid]:
        """`grids` (`pod_grids`' of the columns) with the histograms summed so far, as
        `add_per_pod` gives them."""
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
