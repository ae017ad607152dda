"""Path windows pooled to what the verdict needs: one row per path, cohort and stretch of
windows between the times the verdict's arithmetic turns on (`probes.verdict.cache`'s
docstring says which), read from the store a range at a time.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.stats.series import columns, overlapping
from probes.store import Store
from probes.store.columns import concat, reduce, take
from probes.store.table import WindowTable

__all__ = ["POOL_ROWS", "StalePool", "check", "cut_times", "pool", "pooled_windows"]

F64 = npt.NDArray[np.float64]
Spans = Sequence[tuple[float, float]]


class StalePool(Exception):
    """A pooled row no longer holds: read the store afresh."""


def _after(t: float) -> float:
    return float(np.nextafter(t, math.inf))


def cut_times(table: Any, seal: float, spans: Spans,
              rows: npt.NDArray[np.bool_] | None = None) -> dict[str, F64]:
    """Per path name, the times at which a pooled stretch must end (`probes.verdict.cache`'s
    docstring says which), from the rows of `table` (those in `rows`, if given): a
    `WindowTable`, or any rows with its `paths`, `start`, `length`, `path` and `cohort`."""
    out: dict[str, F64] = {}
    touch = overlapping(table.start, table.length, spans)
    if rows is not None:
        touch &= rows
    for p in np.unique(table.path if rows is None else table.path[rows]):
        on = table.path == p
        if rows is not None:
            on &= rows
        start, cohort = table.start[on], table.cohort[on]
        cut = [*table.start[on & touch], *map(_after, table.start[on & touch])]
        per = {c: np.unique(start[cohort == c]) for c in np.unique(cohort)}
        cut += [_after(s[-1]) for s in per.values() if s[-1] < seal]
        for a, b in itertools.combinations(per.values(), 2):
            common = np.intersect1d(a, b, assume_unique=True)
            if common.size:
                cut += [float(common[0]), _after(float(common[0]))]
        out[table.paths[int(p)]] = np.unique(np.asarray(cut, dtype=np.float64))
    return out


def check(sealed: WindowTable, first: F64, spans: Sequence[tuple[float, float]]) -> None:
    """StalePool when an overload span reaches into a row that pools several windows."""
    several = first < sealed.start
    if several.any() and spans:
        ends = sealed.start + sealed.length
        if (overlapping(first, ends - first, spans) & several).any():
            raise StalePool


def pool(sealed: WindowTable, first: F64, moving: WindowTable, tail: WindowTable | None,
          seal: float, spans: Sequence[tuple[float, float]],
          cuts: dict[str, F64] | None = None) -> tuple[WindowTable, F64]:
    """`sealed` (pooled rows) and `moving` (stored rows now before `seal`) pooled anew, at
    `cuts` if given (`pooled_windows`: placed from every row), else from these and `tail`."""
    moving = take(moving, columns(moving).has_data)
    rows = concat(sealed, moving)
    firsts = np.concatenate([first, moving.start])
    if not len(rows.start):
        return rows, firsts
    if cuts is None:
        assert tail is not None
        cuts = cut_times(concat(rows, take(tail, columns(tail).has_data)), seal, spans)
    pooled = np.arange(len(rows.start)) < len(sealed.start)
    several = pooled & (firsts < rows.start)
    code = {name: i for i, name in enumerate(rows.paths)}
    if several.any():
        hit = np.zeros(len(rows.start), dtype=bool)
        for p, cut in cuts.items():
            on = several & (rows.path == code.get(p, -1))
            hit |= on & (np.searchsorted(cut, firsts, "right")
                         != np.searchsorted(cut, rows.start, "right"))
        if hit.any():
            raise StalePool
    stretch = np.zeros(len(rows.start), dtype=np.int64)
    for p, cut in cuts.items():
        on = rows.path == code.get(p, -1)
        stretch[on] = np.searchsorted(cut, rows.start[on], "right")
    key = (rows.path.astype(np.int64) * len(rows.cohorts) + rows.cohort) * (
        int(stretch.max()) + 1) + stretch
    uniq, group = np.unique(key, return_inverse=True)
    low = np.full(uniq.size, np.inf)
    np.minimum.at(low, group, firsts)
    return reduce(rows, group, uniq.size), low


# Stored path windows pooled at once by `pooled_windows`: their latency entries (~50 a
# window) are most of a day's table, so a range of this many rows holds tens of MB.
POOL_ROWS = 65_536


def pooled_windows(store: Store, since: float | None, seal: float,
                   spans: Sequence[tuple[float, float]], *, until: float | None = None,
                   paths: Iterable[str] | None = None, cohorts: Iterable[str] | None = None,
                   tail: WindowTable | None = None) -> tuple[WindowTable, F64, WindowTable, F64]:
    """The path windows of [since, until) with data that start before `seal`, pooled as
    `probes.verdict.cache`'s docstring says (`tail`: the rows from `seal` on, which place cuts too),
    with each pooled row's first start; the stored rows without data (no call was made:
    nothing to pool), and every stored row's length.

    Read and pooled a range of about `POOL_ROWS` rows at a time (a day's table held
    whole, and the copies made of it, were most of a cold verdict's memory: BENCHMARKS.md
    D23): each range at its own cuts, which include every cut of the whole span (a
    window the spans touch, the first window two cohorts share, a cut after each
    cohort's last window: within its range, it is its last there), then the ranges'
    rows pooled again at the whole span's cuts, read from them: a pooled row's start is
    its newest window, so their starts still show each cohort's last window and the
    first window two cohorts share."""
    hi = seal if until is None else min(seal, until)
    span = store.window_span(since, hi, paths, cohorts)
    parts: list[WindowTable] = []
    empty: list[WindowTable] = []
    firsts: list[F64] = []
    lengths: list[F64] = []
    if span is not None:
        lo, last, stored = span
        step = max((last - lo) * POOL_ROWS / stored, 1e-3)
        while lo <= last:
            part = store.read_table(lo, min(lo + step, _after(last)), paths, cohorts)
            lo += step
            data = columns(part).has_data
            lengths.append(part.length)
            empty.append(take(part, ~data))
            if data.any():
                none = take(part, np.zeros(len(part.start), dtype=bool))
                pooled, first = pool(none, np.zeros(0), part, None, math.inf, spans,
                                      cut_times(part, math.inf, spans, data))
                parts.append(pooled)
                firsts.append(first)
    if not parts:
        table = (functools.reduce(concat, empty) if empty
                 else store.read_table(since, hi, paths, cohorts))
        return (take(table, np.zeros(len(table.start), dtype=bool)), np.zeros(0), table,
                table.length)
    rows: WindowTable = functools.reduce(concat, parts)
    whole = rows if tail is None else concat(rows, take(tail, columns(tail).has_data))
    none = take(rows, np.zeros(len(rows.start), dtype=bool))
    sealed, first = pool(rows, np.concatenate(firsts), none, None, seal, spans,
                          cut_times(whole, seal, spans))
    return sealed, first, functools.reduce(concat, empty), np.concatenate(lengths)
