"""The verdict cache's pods × strata grids, kept between verdicts: each verdict adds only its
new strata to them instead of laying out a day of strata again.

`probes.stats.pods.read_pod_grids` lays each path's endpoint rows out as a grid (pods ×
strata, each pod's warm-up apart, the latency of windows with late sends left out;
`pods.pod_grids`, with `pod_cells.add_per_pod`'s attempts and latency). Every cell is a sum
of the rows of one pod and stratum, so the grid of the sealed strata
(`probes.verdict.cache`) is kept as a `Part` and a verdict appends the columns of the
strata after the seal. A row's cell depends on its pod's first row (the warm-up of a pod
without a start time counts from it); new rows come after the sealed ones, so the first
rows stay the sealed ones' (`Stale` when they do not: the caller lays the grids out
afresh). The rules a part was laid out by (origin, warm-up, overloaded spans, window
length) are kept with it: other rules, another part.

The pods' latency histograms are summed for all paths at once by `pod_cells.add_per_pod`'s
rule: those of the cache's records before the seal (pooled or not) kept until they change,
plus those of the records after it, at every verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import BUCKET_COUNT
from probes.stats.pod_cells import dense_unique, ordered_unique
from probes.stats.pods import MAX_GRID_CELLS, PodGrid
from probes.stats.series import overlapping
from probes.store.table import EndpointColumns, EndpointLatency

__all__ = ["Flat", "Part", "Rules", "Stale", "by_path", "extend", "extend_all", "flat_hists",
           "grids", "hists", "seal_all"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Pod = tuple[str, str]  # (endpoint, cohort)


class Stale(Exception):
    """A part's warm-up no longer holds (a pod's rows begin before its part's): lay out
    afresh."""


@dataclass(frozen=True, slots=True)
class Rules:
    """What a part's cells turn on besides its rows: the comparison's origin `since`, the
    warm-up, and the overloaded spans with the length a row is taken to last."""

    since: float
    warmup_s: float
    length_s: float
    exclude: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True, eq=False)
class Part:
    """One path's grid as `pods.pod_grids` lays it out (merge 1), with what adding rows
    needs: each pod's first row start (`first`) and where each pod is (`at`). `pods` sorted
    by endpoint then cohort, the store's order. Its first `fixed` columns are those of
    every part of its `lineage`, cell for cell: a part that only appends columns to another
    is of its lineage (`seal_all` marks a kept part's columns fixed); one laid out anew, or
    with pods or columns moved, begins another (the grids' `PodGrid.settled`)."""

    pods: tuple[Pod, ...]
    at: Mapping[Pod, int]
    first: F64
    starts: F64
    calls: F64
    errors: F64
    attempts_calls: F64
    attempts_sum: F64
    warmup_calls: F64
    warmup_errors: F64
    unrecorded: bool  # a warm row from `since` written without per-pod attempts / latency
    attempts: bool  # a row from `since` has attempts
    fixed: int = 0
    lineage: object = field(default_factory=object)


def _cells(old: F64 | None, at: tuple[I64, I64], x: F64, shape: tuple[int, int],
           place: tuple[I64, I64] | None, appended: int) -> F64:
    """`old` (a part's cells) with `x` added at `at`: the cells' indices in the `appended`
    columns after old's when old's pods are the grid's (`place` None), else in a grid of
    `shape` (`_extend` finds both); old put at its `place` (pod rows, columns) first."""
    p, c = shape
    if old is not None and place is None:
        new = np.bincount(at[0], weights=x, minlength=p * appended).reshape(p, appended)
        return _appended(old, np.asarray(new, dtype=np.float64))
    out = np.asarray(np.bincount(at[1], weights=x, minlength=p * c),
                     dtype=np.float64).reshape(p, c)
    if old is not None and place is not None:
        out[place] += old
    return out


# Columns a part's cells have room for beyond their own: at least this many, or a
# quarter more; a day of strata in minutes then grows into new cells about once an hour.
_ROOM = 64


def _appended(old: F64, new: F64) -> F64:
    """`old` with `new`'s columns after its own, written into the room its cells have
    after them (a part's cells are the first columns of a wider array) rather than copied
    whole at every verdict; into wider cells when there is none. Only a kept part is
    extended, and the columns after its own hold nothing kept: a verdict's newest strata,
    which the next verdict reads again (`TrackMemo` keeps copies of those it checks)."""
    w, a = old.shape[1], new.shape[1]
    room = old.base
    if (isinstance(room, np.ndarray) and room.ndim == 2 and room.shape[0] == old.shape[0]
            and room.shape[1] >= w + a and room.strides == old.strides
            and room.__array_interface__["data"][0] == old.__array_interface__["data"][0]):
        room[:, w:w + a] = new
        return room[:, :w + a]
    out = np.empty((old.shape[0], w + a + max(_ROOM, (w + a) // 4)))
    out[:, :w], out[:, w:w + a] = old, new
    return out[:, :w + a]


def extend(part: Part | None, cols: EndpointColumns, rows: npt.NDArray[np.intp],
           rules: Rules) -> Part:
    """`part` (None: none yet) with the endpoint rows `rows` of `cols` (one path's, in
    strata, starting after the part's) added, as `pods.pod_grids` lays them out. `Stale`
    when a pod's rows begin before its part's."""
    return _extend(part, cols, rows, rules)[0]


def _extend(part: Part | None, cols: EndpointColumns, rows: npt.NDArray[np.intp],
            rules: Rules) -> tuple[Part, bool]:
    """`extend`, and whether the new part's pods are the part's with columns appended
    (its first columns are the part's cells, copied)."""
    t = cols.start[rows]
    n_coh = len(cols.cohorts)
    key = cols.endpoint[rows].astype(np.int64) * n_coh + cols.cohort[rows]
    keys, pod = np.unique(key, return_inverse=True)
    pod = pod.ravel()
    names = [(cols.endpoints[k // n_coh], cols.cohorts[k % n_coh]) for k in keys.tolist()]
    first_new = np.full(len(keys), np.inf)
    np.minimum.at(first_new, pod, t)
    old_rows: I64 | None = None
    if part is None:
        pods = tuple(names)
        at: Mapping[Pod, int] = {p: i for i, p in enumerate(pods)}
        first = first_new
        idx = np.arange(len(keys))
    else:
        found = [part.at.get(p, -1) for p in names]
        if -1 in found:
            pods = tuple(sorted({*part.pods, *names}))
            at = {p: i for i, p in enumerate(pods)}
            idx = np.array([at[p] for p in names], dtype=np.int64)
            old_rows = np.array([at[p] for p in part.pods], dtype=np.int64)
        else:
            pods, at, idx = part.pods, part.at, np.array(found, dtype=np.int64)
        first = np.full(len(pods), np.inf)
        first[old_rows if old_rows is not None else slice(None)] = part.first
        np.minimum.at(first, idx, first_new)
        if np.any(first[old_rows if old_rows is not None else slice(None)] < part.first):
            raise Stale
    r = idx[pod]
    started = cols.started[rows]
    began = np.where(np.isnan(started), first[r], started)
    kept = t >= rules.since
    warm = (t >= began + rules.warmup_s)[kept]
    starts_new, window = ordered_unique(t[kept])
    old_starts = part.starts if part is not None else np.zeros(0)
    place: tuple[I64, I64] | None = None
    if not len(old_starts) or not len(starts_new) or starts_new[0] > old_starts[-1]:
        starts = np.concatenate([old_starts, starts_new])
        col = window + len(old_starts)
        if old_rows is not None:
            place = (old_rows[:, None], np.arange(len(old_starts))[None, :])
    else:  # strata that meet the part's last (a stratum's start rounded across the seal)
        starts = np.union1d(old_starts, starts_new)
        col = np.searchsorted(starts, starts_new)[window]
        rows_of = old_rows if old_rows is not None else np.arange(len(pods))
        place = (rows_of[:, None], np.searchsorted(starts, old_starts)[None, :])
    shape = (len(pods), len(starts))
    kr = r[kept]
    hot = ~warm

    # Late sends (`rules.exclude`) leave out latency alone (`flat_hists`), never calls.
    def column(x: npt.NDArray[Any]) -> F64:
        return x[rows][kept].astype(np.float64)

    n, s = column(cols.requests), column(cols.errors)
    a_n, a_s = column(cols.attempts_count), column(cols.attempts_sum)
    unrec = cols.unrecorded[rows][kept]

    # Each warm row's cell, in the columns appended and in the whole grid: the same for
    # every figure, found once.
    rw, cw = kr[warm], col[warm]
    cell_at = (rw * len(starts_new) + (cw - (shape[1] - len(starts_new))), rw * shape[1] + cw)

    def cells(old: F64 | None, x: F64) -> F64:
        return _cells(old, cell_at, x[warm], shape, place, len(starts_new))

    def per_pod(old: F64 | None, x: F64) -> F64:
        w = np.bincount(kr[hot], weights=x[hot], minlength=len(pods)).astype(np.float64)
        if old is not None:
            w[old_rows if old_rows is not None else slice(None)] += old
        return w

    if part is None:
        return Part(pods, at, first, starts, cells(None, n), cells(None, s),
                    cells(None, a_n), cells(None, a_s), per_pod(None, n), per_pod(None, s),
                    bool(np.any(unrec[warm] > 0)), bool(a_n.sum() > 0)), False
    appended = place is None
    return Part(
        pods, at, first, starts, cells(part.calls, n), cells(part.errors, s),
        cells(part.attempts_calls, a_n), cells(part.attempts_sum, a_s),
        per_pod(part.warmup_calls, n), per_pod(part.warmup_errors, s),
        part.unrecorded or bool(np.any(unrec[warm] > 0)), part.attempts or bool(a_n.sum() > 0),
        *((part.fixed, part.lineage) if appended else ())
    ), appended


def by_path(cols: EndpointColumns) -> dict[str, npt.NDArray[np.intp]]:
    """Each path's rows of `cols`, in their order."""
    if not len(cols.start):
        return {}
    order = np.argsort(cols.path, kind="stable")
    p = cols.path[order]
    cuts = np.flatnonzero(p[1:] != p[:-1]) + 1
    return {cols.paths[int(p[at])]: rows
            for at, rows in zip([0, *cuts.tolist()], np.split(order, cuts), strict=True)}


def extend_all(parts: dict[str, Part], cols: EndpointColumns, rules: Rules
               ) -> dict[str, Part]:
    """`parts` with the rows of `cols` added, path by path (a new dict). Each part of
    `parts` that the new one only appends strata to is replaced in `parts`, path by path,
    by views of the new one's first columns: the kept grids and a verdict's, a few strata
    longer, share their cells instead of being held twice."""
    out = dict(parts)
    each = by_path(cols)
    at_once = _appending(parts, cols, list(each), rules)
    for name, rows in each.items():
        old = parts.get(name)
        out[name], appended = (at_once[name], True) if at_once is not None else _extend(
            old, cols, rows, rules)
        if old is not None and appended:
            n = len(old.starts)
            parts[name] = replace(old, **{f: getattr(out[name], f)[:, :n] for f in _CELLS})
    return out


_CELLS = ("calls", "errors", "attempts_calls", "attempts_sum")


def _appending(parts: Mapping[str, Part], cols: EndpointColumns, names: Sequence[str],
               rules: Rules) -> dict[str, Part] | None:
    """`_extend` of every path `names` (`cols`' paths) at once where each only appends
    the same strata to its kept part, its pods all in it (a verdict's newest strata): one
    pass over every path's rows instead of one per path, the same cells (each a sum of
    the same rows in the same order). None where one does not (path by path then)."""
    if not names or not len(cols.start) or any(name not in parts for name in names):
        return None
    olds = [parts[name] for name in names]
    n_end, n_coh = len(cols.endpoints), len(cols.cohorts)
    code = (cols.path.astype(np.int64) * n_end + cols.endpoint) * n_coh + cols.cohort
    keys, inverse = np.unique(code, return_inverse=True)
    where = {name: i for i, name in enumerate(names)}
    offsets = [0]
    for old in olds:
        offsets.append(offsets[-1] + len(old.pods))
    row_of, path_of = [], []
    for k in keys.tolist():
        i = where[cols.paths[k // (n_end * n_coh)]]
        j = olds[i].at.get((cols.endpoints[k // n_coh % n_end], cols.cohorts[k % n_coh]))
        if j is None:
            return None  # a pod new to its part
        row_of.append(offsets[i] + j)
        path_of.append(i)
    g = np.array(row_of, dtype=np.int64)[inverse.ravel()]
    path = np.array(path_of, dtype=np.int64)[inverse.ravel()]
    t = cols.start
    first = np.concatenate([old.first for old in olds])
    first_new = np.full(len(first), np.inf)
    np.minimum.at(first_new, g, t)
    if np.any(first_new < first):
        return None  # `_extend` says Stale
    began = np.where(np.isnan(cols.started), first[g], cols.started)
    kept = t >= rules.since
    warm = (t >= began + rules.warmup_s)[kept]
    starts_new, window = ordered_unique(t[kept])
    a, total = len(starts_new), offsets[-1]
    pk, gk = path[kept], g[kept]
    if (not a or len(np.unique(pk * a + window)) != len(olds) * a
            or any(len(old.starts) and starts_new[0] <= old.starts[-1] for old in olds)):
        return None
    cell = gk[warm] * a + window[warm]
    hot = gk[~warm]

    def column(x: npt.NDArray[Any]) -> F64:
        return x[kept].astype(np.float64)

    n, e = column(cols.requests), column(cols.errors)
    new = {f: np.asarray(np.bincount(cell, weights=x[warm], minlength=total * a),
                         dtype=np.float64).reshape(total, a)
           for f, x in zip(_CELLS, (n, e, column(cols.attempts_count),
                                     column(cols.attempts_sum)), strict=True)}
    warmup = [np.bincount(hot, weights=x[~warm], minlength=total).astype(np.float64)
              for x in (n, e)]
    unrecorded = np.bincount(pk[warm], weights=cols.unrecorded[kept][warm] > 0,
                             minlength=len(olds)) > 0
    attempts = np.bincount(pk, weights=column(cols.attempts_count), minlength=len(olds)) > 0
    out = {}
    for i, (name, old) in enumerate(zip(names, olds, strict=True)):
        lo, hi = offsets[i], offsets[i + 1]
        calls, errors, a_n, a_s = (_appended(getattr(old, f), new[f][lo:hi]) for f in _CELLS)
        w_n, w_e = warmup[0][lo:hi], warmup[1][lo:hi]
        w_n += old.warmup_calls
        w_e += old.warmup_errors
        out[name] = Part(old.pods, old.at, first[lo:hi], np.concatenate([old.starts, starts_new]),
                         calls, errors, a_n, a_s, w_n, w_e,
                         old.unrecorded or bool(unrecorded[i]), old.attempts or bool(attempts[i]),
                         old.fixed, old.lineage)
    return out


def seal_all(parts: dict[str, Part]) -> dict[str, Part]:
    """`parts` with every column fixed: the kept parts of the sealed strata, which no
    verdict changes (their lineage ends when one is laid out anew)."""
    return {name: replace(p, fixed=len(p.starts)) for name, p in parts.items()}


# Every pod's histogram, the parts' one after the other (`hists`), and which pods have a
# record from `since`.
Flat = tuple[F64, npt.NDArray[np.bool_]]


def flat_hists(parts: Sequence[tuple[str, Part]],
               sources: Sequence[tuple[EndpointLatency, tuple[Sequence[str], ...]]],
               rules: Rules, base: Flat | None = None) -> Flat:
    """The pods' warm latency histograms of `parts` from the latency records of `sources`
    (records, and the name tables they index: paths, endpoints, cohorts), by
    `pod_cells.add_per_pod`'s rule (records of windows that touch an overloaded span left
    out, as `per_pod_of` does), added to `base` (those of other records, for the same
    parts)."""
    offsets = np.cumsum([0, *(len(p.pods) for _, p in parts)])
    total = int(offsets[-1])
    row_of = {(name, *pod): int(offsets[i]) + j
              for i, (name, p) in enumerate(parts) for pod, j in p.at.items()}
    first = (np.concatenate([p.first for _, p in parts]) if parts else np.zeros(0))
    flat = np.zeros(total * BUCKET_COUNT) if base is None else base[0].copy()
    seen = np.zeros(total, dtype=bool) if base is None else base[1].copy()
    for lat, (paths, endpoints, cohorts) in sources:
        if not len(lat):
            continue
        keep = ~overlapping(lat.start, rules.length_s, rules.exclude)
        if not keep.all():  # else the columns as they are: a restarted probe's millions
            lat = lat.taken(keep)
        e_n, c_n = max(len(endpoints), 1), max(len(cohorts), 1)
        key = (lat.path.astype(np.int64) * e_n + lat.endpoint) * c_n + lat.cohort
        # Pods counted in a table, not sorted (`dense_unique`).
        uniq, inv = dense_unique(key, max(len(paths), 1) * e_n * c_n)
        lut = np.array([row_of.get((paths[k // (e_n * c_n)], endpoints[k // c_n % e_n],
                                    cohorts[k % c_n]), -1) for k in uniq.tolist()]
                       or [-1], dtype=np.int64)
        row = lut[inv]
        known = row >= 0
        began = np.where(np.isnan(lat.started), first[np.maximum(row, 0)] if total else 0.0,
                         lat.started)
        recent = known & (lat.start >= rules.since)
        use = recent & (lat.start >= began + rules.warmup_s)
        seen[row[recent]] = True
        # In place: a bincount's array is as large as every pod's histograms (9 MB at 6
        # pods of 50 paths, 77 MB at 50), made at every verdict for a window's records.
        np.add.at(flat, row[use] * BUCKET_COUNT + lat.bucket[use],
                  lat.count[use].astype(np.float64))
    return flat, seen


def hists(parts: Sequence[tuple[str, Part]], flat: Flat) -> tuple[list[F64], list[bool]]:
    """`flat_hists`' histograms per part (pods, buckets), and whether the part's path has
    any record from `since`."""
    offsets = np.cumsum([0, *(len(p.pods) for _, p in parts)])
    hist = flat[0].reshape(-1, BUCKET_COUNT)
    out = [hist[offsets[i]:offsets[i + 1]] for i in range(len(parts))]
    anyl = [bool(flat[1][offsets[i]:offsets[i + 1]].any()) for i in range(len(parts))]
    return out, anyl


def grids(parts: Sequence[tuple[str, Part]], hist: Sequence[F64], any_latency: Sequence[bool]
          ) -> dict[str, PodGrid] | None:
    """The `PodGrid` of each part with strata from `since`, as `pods.pod_grids` gives it;
    None when one would be merged into coarser columns (`MAX_GRID_CELLS`: lay out afresh)."""
    out: dict[str, PodGrid] = {}
    for (name, p), h, lat in zip(parts, hist, any_latency, strict=True):
        if not len(p.starts):
            continue
        if len(p.pods) * len(p.starts) > MAX_GRID_CELLS:
            return None
        out[name] = PodGrid(
            pods=tuple(e for e, _ in p.pods), cohorts=tuple(c for _, c in p.pods),
            starts=p.starts, calls=p.calls, errors=p.errors, warmup_calls=p.warmup_calls,
            warmup_errors=p.warmup_errors, last_starts=p.starts,
            attempts_calls=p.attempts_calls if p.attempts else None,
            attempts_sum=p.attempts_sum if p.attempts else None,
            latency=h if lat else None, per_pod_metrics=not p.unrecorded,
            settled=(p.lineage, p.fixed))
    return out
