"""Per-pod attempts and latency for the pods × windows grid (`probes.stats.pods.PodGrid`).

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
from probes.stats.pods import PodGrid
from probes.stats.series import overlapping

__all__ = ["PerPod", "add_per_pod", "by_path", "per_pod_of"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Bool = npt.NDArray[np.bool_]


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
    at = np.minimum(np.searchsorted(keys, key), max(len(keys) - 1, 0))
    known = keys[at] == key if len(keys) else np.zeros(len(key), dtype=bool)
    t = per_pod.lat_start[on]
    started = per_pod.lat_started[on]
    began = np.where(np.isnan(started), first[at], started)
    use = known & (t >= began + warmup_s)
    if since is not None:
        use &= t >= since
    flat = at[use] * BUCKET_COUNT + per_pod.lat_bucket[on][use]
    hist = np.asarray(np.bincount(flat, weights=per_pod.lat_count[on][use].astype(np.float64),
                                  minlength=len(keys) * BUCKET_COUNT),
                      dtype=np.float64).reshape(len(keys), BUCKET_COUNT)
    # Rows that carry none at all (a writer that keeps no per-pod attempts or latency, as
    # tests' and benchmarks' stores) leave the metric to the pooled test, as v1 rows do.
    any_attempts = bool(per_pod.attempts_count[rows][kept].sum() > 0)
    any_latency = bool(np.any(t[known] >= (since if since is not None else -np.inf)))
    return replace(grid, attempts_calls=a_n if any_attempts else None,
                   attempts_sum=a_s if any_attempts else None,
                   latency=hist if any_latency else None, per_pod_metrics=recorded)
