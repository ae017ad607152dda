"""Pods × windows grids (`PodGrid`) laid out from the store's endpoint rows: each pod's
warm-up apart, windows merged where a grid would grow too large."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.stats._num import F64, I64
from probes.stats.pod_cells import MAX_GRID_CELLS, LatencyFold, PodGrid, add_per_pod, per_pod_of
from probes.stats.pod_cells import by_path as entries_by_path

__all__ = ["pod_grids", "read_pod_grids"]


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
        with stream(since=lo, until=until, paths=paths, cohorts=cohorts,
                    stratum_s=stratum_s) as (cols, chunks):
            fold = LatencyFold(cols, since=since, warmup_s=warmup_s, length_s=length_s,
                               exclude=exclude)
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


def _unique(t: F64) -> tuple[F64, npt.NDArray[np.intp]]:
    """`np.unique(t, return_inverse=True)`, without its sort when `t` is in order already
    (the verdict cache keeps each path's strata by start)."""
    if t.size and np.all(t[1:] >= t[:-1]):
        new = np.empty(t.size, dtype=bool)
        new[0] = True
        np.not_equal(t[1:], t[:-1], out=new[1:])
        return t[new], np.cumsum(new) - 1
    starts, window = np.unique(t, return_inverse=True)
    return starts, window


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
    by_path = path[order]
    if per_pod is not None:
        per_pod = entries_by_path(per_pod, len(paths))
    cuts = np.flatnonzero(by_path[1:] != by_path[:-1]) + 1
    for rows in np.split(order, cuts):
        p = path[rows[0]]
        t, e, c = start[rows], endpoint[rows], cohort[rows]
        n, k = requests[rows].astype(np.float64), errors[rows].astype(np.float64)
        pod_key = e.astype(np.int64) * len(cohorts) + c
        keys, pod = np.unique(pod_key, return_inverse=True)
        first = np.full(len(keys), np.inf)
        np.minimum.at(first, pod, t)
        began = first[pod] if started is None else np.where(
            np.isnan(started[rows]), first[pod], started[rows])
        warm = t >= began + warmup_s
        kept = t >= since if since is not None else np.ones(len(t), dtype=bool)
        starts, window = _unique(t[kept])
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
