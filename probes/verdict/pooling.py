"""Path windows pooled to what the verdict needs: one row per path, cohort and stretch of
windows between the times the verdict's arithmetic turns on (`probes.verdict.cache`'s
docstring says which), read from the store a range at a time, whole hours and minutes from
the path windows' rollups where the store keeps them (schema v4 and v6,
`probes.store._strata`, `probes.store._path_hours`).

A minute's rollup is its windows pooled already, and an hour's row its minutes, so it
stands for them wherever no cut falls inside it; `_raw_minutes` finds the rows that must be
opened (an hour into its minute rollups, a minute into its stored windows): those whose
windows differ in length or have no data, those an overload span reaches into, those that
may hold the first window two cohorts share (the windows tell where it is), and those a
cut falls into. The rest is read from the rollups: a day's path windows from 360 times
fewer rows.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.errors import StoreError
from probes.stats.series import columns, overlapping
from probes.store import HOUR_S, ROLLUP_S, Store
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


@dataclass(slots=True)
class _Read:
    """What `pooled_windows` has read, in time order: rows pooled (with each row's first
    window start), the stored rows without data, and every stored window's length."""

    parts: list[WindowTable] = field(default_factory=list)
    firsts: list[F64] = field(default_factory=list)
    empty: list[WindowTable] = field(default_factory=list)
    lengths: list[F64] = field(default_factory=list)

    def add(self, table: WindowTable, first: F64, spans: Spans,
            cuts: dict[str, F64] | None = None) -> None:
        """`table`'s rows (`first`: each one's first window) pooled at `cuts`, or at its own
        (rows of stored windows only), its rows without data kept as stored."""
        data = columns(table).has_data
        rows = table
        if not data.all():
            self.empty.append(take(table, ~data))
            if not data.any():
                return
            rows, first = take(table, data), first[data]
        none = take(rows, np.zeros(len(rows.start), dtype=bool))
        pooled, low = pool(rows, first, none, None, math.inf, spans,
                           cut_times(rows, math.inf, spans) if cuts is None else cuts)
        self.parts.append(pooled)
        self.firsts.append(low)


def pooled_windows(store: Store, since: float | None, seal: float, spans: Spans, *,
                   until: float | None = None, paths: Iterable[str] | None = None,
                   cohorts: Iterable[str] | None = None, tail: WindowTable | None = None
                   ) -> tuple[WindowTable, F64, WindowTable, F64]:
    """The path windows of [since, until) with data that start before `seal`, pooled as
    `probes.verdict.cache`'s docstring says (`tail`: the rows from `seal` on, which place
    cuts too), with each pooled row's first start; the stored rows without data (no call
    was made: nothing to pool), and every stored row's length.

    Read and pooled a range of about `POOL_ROWS` rows at a time (a day's table held
    whole, and the copies made of it, were most of a cold verdict's memory: BENCHMARKS.md
    D23): each range at its own cuts, which include every cut of the whole span (a
    window the spans touch, the first window two cohorts share, a cut after each
    cohort's last window: within its range, it is its last there), then the ranges'
    rows pooled again at the whole span's cuts, read from them: a pooled row's start is
    its newest window, so their starts still show each cohort's last window and the
    first window two cohorts share. The whole minutes the store keeps rolled up are read
    from the rollups (module docstring), pooled at the whole span's cuts."""
    hi = seal if until is None else min(seal, until)
    read = _Read()
    rolled = store.path_rollup_keys(since, hi, paths, cohorts)
    if rolled is None:
        _read_raw(store, since, hi, paths, cohorts, spans, read)
    else:
        lo, end, keys, names = rolled
        _read_raw(store, since, lo, paths, cohorts, spans, read)
        lead = (len(read.parts), len(read.empty))
        _read_raw(store, end, hi, paths, cohorts, spans, read)
        _read_rolled(store, _Rollups(lo, end, keys, names), read, lead, seal, spans, tail,
                     paths, cohorts)
    if not read.parts:
        table = (functools.reduce(concat, read.empty) if read.empty
                 else store.read_table(since, hi, paths, cohorts))
        return (take(table, np.zeros(len(table.start), dtype=bool)), np.zeros(0), table,
                table.length)
    rows: WindowTable = functools.reduce(concat, read.parts)
    none = take(rows, np.zeros(len(rows.start), dtype=bool))
    sealed, first = pool(rows, np.concatenate(read.firsts), none, None, seal, spans,
                         cut_times(_with(rows, tail), seal, spans))
    empty = functools.reduce(concat, read.empty) if read.empty else none
    return sealed, first, empty, np.concatenate(read.lengths)


def _with(rows: WindowTable, tail: WindowTable | None) -> WindowTable:
    """`rows` and the rows of `tail` with data: whose starts place the cuts."""
    return rows if tail is None else concat(rows, take(tail, columns(tail).has_data))


def _read_raw(store: Store, since: float | None, until: float, paths: Iterable[str] | None,
              cohorts: Iterable[str] | None, spans: Spans, read: _Read) -> None:
    """The stored windows of [since, until) read about `POOL_ROWS` rows at a time, each
    range pooled at its own cuts, into `read`."""
    span = store.window_span(since, until, paths, cohorts)
    if span is None:
        return
    lo, last, stored = span
    step = max((last - lo) * POOL_ROWS / stored, 1e-3)
    while lo <= last:
        part = store.read_table(lo, min(lo + step, _after(last)), paths, cohorts)
        lo += step
        read.lengths.append(part.length)
        read.add(part, part.start, spans)


# A rollup row holds a minute's records, several windows' worth: ranges of fewer rows; an
# hour row holds its minutes' records merged per bucket, several minutes' worth.
_ROLLED_WEIGHT = 4
_HOUR_WEIGHT = 16


@dataclass(frozen=True, slots=True)
class _Rollups:
    """`Store.path_rollup_keys`: the whole minutes [lo, hi) the rollups hold, their rows'
    keys (as columns; `unit`: a minute's row or an hour's) and the names of their ids."""

    lo: float
    hi: float
    keys: dict[str, F64]
    names: dict[int, str]


@dataclass(frozen=True, slots=True)
class _Rows:
    """Rows as `cut_times` reads them."""

    paths: tuple[str, ...]
    start: F64
    length: F64
    path: npt.NDArray[np.int64]
    cohort: npt.NDArray[np.int64]


def _read_rolled(store: Store, rolled: _Rollups, read: _Read, lead: tuple[int, int],
                 seal: float, spans: Spans, tail: WindowTable | None,
                 paths: Iterable[str] | None, cohorts: Iterable[str] | None) -> None:
    """The minutes of `rolled` into `read`, in time order (after the `lead` parts and
    empty rows read before them): from the hour rows and the minute rollups, but the hours
    and minutes `_raw_minutes` opens from their minutes and stored windows, each range of
    rows pooled at the whole span's cuts."""
    raw, cuts, k = _raw_minutes(store, rolled, read, seal, spans, tail, paths, cohorts)
    used = ~np.isin(k["start"], list(raw))
    read.lengths.append(np.repeat(k["length"][used], k["windows"][used].astype(np.int64)))
    out = _Read()
    for lo, hi, hours in _ranges(k, rolled.hi):
        table = store.read_path_rollups(lo, hi, paths, cohorts, hours=hours)
        rows_at = slice(*np.searchsorted(k["start"], [lo, hi]).tolist())
        keep, first = used[rows_at], k["first"][rows_at]
        if len(first) != len(table.start):
            raise StoreError(f"{store.path}: read path rollups: the store changed while it"
                             " was read; ask again")
        if not keep.all():
            table, first = take(table, keep), first[keep]
        stored = [raw[m] for m in sorted(raw) if lo <= m < hi]
        if stored:
            # A pooled row is its group's newest: each group's rows in time order.
            table = functools.reduce(concat, stored, table)
            first = np.concatenate([first, *(t.start for t in stored)])
            order = np.argsort(table.start, kind="stable")
            table, first = take(table, order), first[order]
        out.add(table, first, spans, cuts)
    for m in sorted(raw):
        read.lengths.append(raw[m].length)
    read.parts[lead[0]:lead[0]] = out.parts
    read.firsts[lead[0]:lead[0]] = out.firsts
    read.empty[lead[1]:lead[1]] = out.empty


def _ranges(k: dict[str, F64], end: float) -> list[tuple[float, float, bool]]:
    """The rows of `k` as ranges of start [lo, hi) read at once, each of hour rows only
    (True) or minute rows only, about `POOL_ROWS` rows' worth of records each."""
    starts, at, count = np.unique(k["start"], return_index=True, return_counts=True)
    if not len(starts):
        return []
    hour = k["unit"][at] > ROLLUP_S
    weight = np.cumsum(count * np.where(hour, _HOUR_WEIGHT, _ROLLED_WEIGHT))
    part = weight // POOL_ROWS
    new = np.ones(len(starts), dtype=bool)
    new[1:] = (part[1:] != part[:-1]) | (hour[1:] != hour[:-1])
    first = np.flatnonzero(new)
    bounds = [*starts[first].tolist(), end]
    # Each range ends after its own last row's unit: an hour opened whose first minute has
    # no rollup, or an hour row past the keys (`until` inside an hour), is not read with it.
    last = starts[np.append(first[1:], len(starts)) - 1]
    ends = (last + np.where(hour[first], HOUR_S, ROLLUP_S)).tolist()
    return [(bounds[i], min(bounds[i + 1], ends[i]), bool(hour[j]))
            for i, j in enumerate(first.tolist())]


def _raw_minutes(store: Store, rolled: _Rollups, read: _Read, seal: float, spans: Spans,
                 tail: WindowTable | None, paths: Iterable[str] | None,
                 cohorts: Iterable[str] | None
                 ) -> tuple[dict[float, WindowTable], dict[str, F64], dict[str, F64]]:
    """The minutes of `rolled` to read raw, read (by minute), the whole span's cuts, and
    the rollups' keys with the hours opened into their minutes: an hour or minute row is
    opened (an hour into its minute rollups, a minute into its stored windows) when it is
    irregular or an overload span reaches into it, when it may hold the first window two
    cohorts of a path share before the first one the rows opened show, and when a cut
    falls inside it; a row opened may show another, so until none does."""
    k = rolled.keys
    raw: dict[float, WindowTable] = {}
    known = list(read.parts)
    if tail is not None:
        known.append(take(tail, columns(tail).has_data))
    while True:
        used = ~np.isin(k["start"], list(raw))
        todo = set(k["start"][used & ((k["regular"] == 0) | overlapping(
            k["first"], k["last"] + k["length"] - k["first"], spans))].tolist())
        if not todo:
            exact = [*known, *(take(t, columns(t).has_data) for t in raw.values())]
            rows = _rows(exact, k, used, rolled.names)
            todo = _shared_minutes(rows, k["start"], used)
            cuts = cut_times(rows, seal, spans)
            if not todo:
                todo = _straddled(rows, cuts, k, used)
            if not todo:
                return raw, cuts, k
        hours = sorted(set(k["start"][k["unit"] > ROLLUP_S].tolist()) & todo)
        if hours:
            k = _opened(store, k, hours, paths, cohorts)
        for m in sorted(todo - raw.keys() - set(hours)):
            raw[m] = store.read_table(m, m + ROLLUP_S, paths, cohorts)


def _opened(store: Store, k: dict[str, F64], hours: list[float],
            paths: Iterable[str] | None, cohorts: Iterable[str] | None) -> dict[str, F64]:
    """`k` with the hour rows of `hours` replaced by their minute rollups' rows."""
    kept = ~np.isin(k["start"], hours) | (k["unit"] <= ROLLUP_S)
    parts = [{name: col[kept] for name, col in k.items()}]
    for h in hours:
        found = store.path_rollup_keys(h, h + HOUR_S, paths, cohorts, hours=False)
        if found is None:
            raise StoreError(f"{store.path}: read path rollups: the store changed while it"
                             " was read; ask again")
        parts.append(found[2])
    out = {name: np.concatenate([p[name] for p in parts]) for name in k}
    order = np.lexsort((out["cohort_id"], out["path_id"], out["start"]))
    return {name: col[order] for name, col in out.items()}


def _rows(exact: list[WindowTable], k: dict[str, F64], used: npt.NDArray[np.bool_],
          names: dict[int, str]) -> _Rows:
    """The stored rows `exact` and the rollups `used` (each at its newest window) as one
    set of rows, the rollups last."""
    codes = []
    tables: list[tuple[str, ...]] = []
    for name, ids in (("path", k["path_id"][used]), ("cohort", k["cohort_id"][used])):
        present, inverse = np.unique(ids.astype(np.int64), return_inverse=True)
        own = [names[int(i)] for i in present]
        union = sorted({*own, *(n for t in exact for n in getattr(t, name + "s"))})
        where = {n: i for i, n in enumerate(union)}
        parts = [np.array([where[n] for n in getattr(t, name + "s")] or [0], dtype=np.int64)[
            getattr(t, name)] for t in exact]
        parts.append(np.array([where[n] for n in own] or [0], dtype=np.int64)[inverse.ravel()])
        codes.append(np.concatenate(parts))
        tables.append(tuple(union))
    return _Rows(tables[0], np.concatenate([*(t.start for t in exact), k["last"][used]]),
                 np.concatenate([*(t.length for t in exact), k["length"][used]]), *codes)


def _shared_minutes(rows: _Rows, minute: F64, used: npt.NDArray[np.bool_]) -> set[float]:
    """Per path and pair of cohorts, the first minute held by a rollup where both have
    windows before the first start their stored rows share: it may hold an earlier
    window both share, which only its raw windows tell (the rollups are `rows`' last)."""
    n_rolled = int(used.sum())
    rolled = np.zeros(len(rows.start), dtype=bool)
    rolled[len(rows.start) - n_rolled:] = True
    at = np.where(rolled, 0.0, np.floor(rows.start / ROLLUP_S) * ROLLUP_S)
    at[rolled] = minute[used]
    out: set[float] = set()
    for p in np.unique(rows.path):
        on = rows.path == p
        per = {c: on & (rows.cohort == c) for c in np.unique(rows.cohort[on])}
        for a, b in itertools.combinations(per.values(), 2):
            common = np.intersect1d(rows.start[a & ~rolled], rows.start[b & ~rolled])
            first = float(common[0]) if common.size else math.inf
            both = np.intersect1d(at[a], at[b])
            maybe = both[(both < first) & np.isin(both, at[(a | b) & rolled])]
            if maybe.size:
                out.add(float(maybe[0]))
    return out


def _straddled(rows: _Rows, cuts: dict[str, F64], k: dict[str, F64],
               used: npt.NDArray[np.bool_]) -> set[float]:
    """The minutes of the rollups `used` that a cut falls inside (after the first window,
    at or before the last)."""
    n = int(used.sum())
    path = rows.path[len(rows.start) - n:]
    first, last, minute = k["first"][used], k["last"][used], k["start"][used]
    out: set[float] = set()
    for p in np.unique(path):
        cut = cuts.get(rows.paths[int(p)])
        if cut is None:
            continue
        on = path == p
        hit = np.searchsorted(cut, first[on], "right") != np.searchsorted(cut, last[on], "right")
        out.update(minute[on][hit].tolist())
    return out
