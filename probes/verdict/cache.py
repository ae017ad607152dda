"""The running probe's verdicts read the store once: windows kept between verdicts, only
the new ones read, the old ones pooled to what the verdict needs.

`skewprobe run` judges after every window and whenever a gate asks; each verdict used to
read the whole rollout again (a day of 50 paths: seconds). `VerdictCache` keeps what was
read and, at each verdict, reads only the windows from `seal` on: the newest window start
seen less `REREAD_S` (for the path windows, moved on a step of at least a minute at a time,
so they are pooled again once a minute rather than at every window), because the probe
re-writes recent windows (late calls, a flush again) by upsert. Windows older than `seal`
are kept pooled:

- path windows, per path × cohort, into one row per stretch of windows between the
  times the verdict's arithmetic turns on (`probes.stats.series`): the first window each
  pair of cohorts shares (kept alone, so the comparison's origin is found as before), the
  window after a cohort's last (so the comparison's end cuts no pooled row), and every
  window that touches an overloaded span (kept alone, so leaving it out leaves out what
  it did before). A pooled row's start and length are its newest window's, so newest ends
  and staleness stay the same; its counts and latency histogram are the sums
  (`probes.store.columns.reduce`). The verdict's totals are sums over the same windows, so
  it is the same verdict, read from a few hundred rows instead of a day's;
- endpoint windows into the time strata the verdict judges in (`stratum_s`), summed as
  the store sums them; each pod's warm-up is still decided at every verdict, from every
  stratum, so a pod start time that changes is judged as in a fresh read;
- the endpoint windows' latency records (what each pod's p99 is judged from) into one
  record per pod and bucket, once they are settled: out of the pod's warm-up, after the
  comparison's origin, and clear of every overload span known (the verdict sums a pod's
  warm records whatever their time, so the sum is the same). The rest stay as stored;
- the pods × strata grids of the sealed strata (`probes.verdict.grids`): a verdict adds
  the strata after the seal to them, and the strata that seal to the kept grids.

What makes it read the store afresh: another file at the path (replaced underneath), rows
gone or older than the first (pruned, or a store swapped in place), a path window written
after the last read that starts before `seal` (a second writer, or writes kept for retry
after a store error), a query from another origin, in other strata or with another
warm-up, and an overload span that reaches into a pooled row or pooled latency records.
Used only for the probe's own verdicts asked "now"
(`since` and `at` unset); everything else reads the store as `skewprobe verdict` does.
Before a rollout (one cohort, no origin) the path windows are pooled from the first on;
the endpoint windows are then read from the store, as before.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import BUCKET_COUNT
from probes.stats.pods import PodGrid, TrackMemo
from probes.stats.series import overlapping
from probes.store import Store
from probes.store.columns import concat, reduce, take
from probes.store.sqlite import stratum_index
from probes.store.table import EndpointColumns, EndpointLatency, LatencyRows, WindowTable
from probes.verdict.grids import (
    Flat,
    Part,
    Rules,
    Stale,
    extend_all,
    flat_hists,
    grids,
    hists,
    seal_all,
)
from probes.verdict.pooling import StalePool, check, pool, pooled_windows

__all__ = ["REREAD_S", "CachedSource", "VerdictCache"]

F64 = npt.NDArray[np.float64]
# The aggregator re-writes a window while it retains it (60 s after its end, plus 5 s of
# grace): twice that is re-read at every verdict.
REREAD_S = 130.0
# The path windows' seal moves on by at least this much at a time: pooling them again at
# every window was a twentieth of a warm verdict; the re-read is this much longer at most.
_POOL_STEP_S = 60.0
# Queries whose pod-level sums are kept at once (a metric of each counts once).
_MEMOS = 8


@dataclass(slots=True)
class _Windows:
    since: float
    sealed: WindowTable  # pooled rows, starts before `seal`
    first: F64  # per pooled row, the start of its first window
    tail: WindowTable  # every window from `seal` on, as stored
    seal: float


@dataclass(slots=True)
class _Grids:
    """The pods × strata grids of the sealed strata (`probes.verdict.grids`), laid out by
    `rules`; `pending`: strata sealed since, to add before they are used."""

    rules: Rules | None = None
    parts: dict[str, Part] | None = None
    pending: list[EndpointColumns] = field(default_factory=list)
    version: int = 0  # bumped when `parts` change
    # The histograms of the latency records before the seal, for the parts of all paths,
    # and the (records' generation, parts' version) they were summed at.
    sealed_hists: tuple[tuple[int, int], Flat] | None = None


@dataclass(slots=True)
class _Pods:
    origin: float
    stratum_s: float | None
    warmup_s: float | None
    joined: EndpointColumns  # strata before `seal`, summed (latency records apart), by path
    tail: EndpointColumns  # endpoint windows from `seal` on, as stored, with latency
    seal: float
    latency: _PooledLatency
    grids: _Grids
    # Strata sealed since `joined` was, summed: joined to it when the rows are read (the
    # kept grids take them as they seal; a day's rows sorted again at each seal was not).
    more: list[EndpointColumns] = field(default_factory=list)

    @property
    def sealed(self) -> EndpointColumns:
        """Every stratum before `seal`, summed, by path."""
        if self.more:
            self.joined = _by_path(functools.reduce(concat, self.more, self.joined))
            self.more = []
        return self.joined


def _in(idx: npt.NDArray[Any], table: tuple[str, ...], names: Iterable[str] | None
        ) -> npt.NDArray[np.bool_]:
    """Which indices into `table` name one of `names` (all, for None)."""
    if names is None:
        return np.ones(len(idx), dtype=bool)
    wanted = set(names)
    return np.isin(idx, [i for i, n in enumerate(table) if n in wanted])


def _names_mask(cols: Any, field: str, names: Iterable[str] | None) -> npt.NDArray[np.bool_]:
    return _in(getattr(cols, field), getattr(cols, field + "s"), names)


def _select(cols: Any, until: float | None, paths: Iterable[str] | None,
            cohorts: Iterable[str] | None) -> Any:
    m = _names_mask(cols, "path", paths) & _names_mask(cols, "cohort", cohorts)
    if until is not None:
        m &= cols.start < until
    return cols if m.all() else take(cols, m)


def _strata(raw: EndpointColumns, stratum_s: float | None) -> EndpointColumns:
    """Stored endpoint windows summed into strata as the store's SQL sums them (each row's
    start its stratum's; an endpoint's rows apart by its start time)."""
    if stratum_s is None or not len(raw.start):
        return raw
    k = stratum_index(raw.start, stratum_s)
    start = stratum_s * k
    _, began = np.unique(raw.started, return_inverse=True)
    parts = [k - k.min(), raw.path, raw.endpoint, raw.cohort, began.ravel()]
    sizes = [int(x.max()) + 1 for x in parts]
    if math.prod(sizes) < 2 ** 62:
        # One integer per (stratum, path, endpoint, cohort, start time), in that order: a
        # sort of integers, not of columns.
        key = np.zeros(len(k), dtype=np.int64)
        for x, size in zip(parts, sizes, strict=True):
            key = key * size + x.astype(np.int64)
        _, group = np.unique(key, return_inverse=True)
    else:
        _, group = np.unique(np.stack([start, *parts[1:]]), axis=1, return_inverse=True)
    group = group.ravel()
    summed = reduce(dataclasses.replace(raw, start=start), group, int(group.max()) + 1)
    out: EndpointColumns = take(summed, np.argsort(summed.start, kind="stable"))
    return out


def _by_path(cols: EndpointColumns) -> EndpointColumns:
    """Rows by path, by start within each: the grids are built a path at a time, and a
    sorted run sorts again in one pass when a few strata are appended."""
    out: EndpointColumns = take(cols, np.argsort(cols.path, kind="stable"))
    return out


def _rows_only(cols: EndpointColumns) -> EndpointColumns:
    """`cols` without its latency records (rows are joined and summed apart from them)."""
    return dataclasses.replace(cols, latency=EndpointLatency.empty())


def _stratum_of(start: F64, stratum_s: float | None) -> F64:
    if stratum_s is None:
        return start
    out: F64 = stratum_s * stratum_index(start, stratum_s)
    return out


def _names_of(cols: EndpointColumns) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    return cols.paths, cols.endpoints, cols.cohorts


def _lookup(names: Sequence[str], where: dict[str, int]) -> npt.NDArray[np.int64]:
    """Each of `names`' position in `where`, added at its end when new."""
    return np.array([where.setdefault(n, len(where)) for n in names] or [0], dtype=np.int64)


def _as_rows(r: EndpointLatency) -> LatencyRows:
    """`r` as rows of one record each."""
    return LatencyRows(r.start, r.path, r.endpoint, r.cohort, r.started,
                       np.ones(len(r), dtype=np.int64), r.bucket, r.count)


def _rows_taken(r: LatencyRows, keep: npt.NDArray[np.bool_]) -> LatencyRows:
    """The rows of `r` in `keep`, with their records."""
    taken = np.repeat(keep, r.per)
    return LatencyRows(r.start[keep], r.path[keep], r.endpoint[keep], r.cohort[keep],
                       r.started[keep], r.per[keep], r.bucket[taken], r.count[taken])


def _recoded(r: EndpointLatency, own: tuple[Sequence[str], ...],
             into: tuple[tuple[str, ...], ...], keep: npt.NDArray[np.bool_] | None = None
             ) -> EndpointLatency:
    """`r` (indices into the tables `own`) with indices into the tables `into`; records
    whose path, endpoint or cohort is not there are left out, as are those not in `keep`."""
    codes = []
    for idx, names, table in zip((r.path, r.endpoint, r.cohort), own, into, strict=True):
        where = {n: i for i, n in enumerate(table)}
        lookup = np.array([where.get(n, -1) for n in names] or [-1], dtype=np.int64)
        codes.append(lookup[idx.astype(np.int64)])
    ok = (codes[0] >= 0) & (codes[1] >= 0) & (codes[2] >= 0)
    if keep is not None:
        ok &= keep
    return EndpointLatency(
        start=r.start[ok], path=codes[0][ok].astype(np.int32),
        endpoint=codes[1][ok].astype(np.int32), cohort=codes[2][ok].astype(np.int32),
        started=r.started[ok], bucket=r.bucket[ok], count=r.count[ok])


# `_unique_ints` tables at most this many entries (5 bytes each, while it runs); larger
# ranges are sorted, as `np.unique` does.
_DENSE_MAX = 1 << 24


def _unique_ints(x: npt.NDArray[np.int64], size: int, *, first: bool = True
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """`np.unique(x, return_index=True, return_inverse=True)` of integers in [0, `size`),
    by a table of `size` instead of a sort: a restarted probe pools tens of millions of
    latency records, and their sorts were half its first verdict's CPU. Without `first`,
    the indices returned are empty (finding them is a third of the work)."""
    if size > _DENSE_MAX or not len(x):
        uniq, at, inverse = np.unique(x, return_index=True, return_inverse=True)
        return uniq, at, inverse.ravel()
    present = np.zeros(size, dtype=bool)
    present[x] = True
    uniq = np.flatnonzero(present)
    lut = np.zeros(size, dtype=np.int32)
    lut[uniq] = np.arange(len(uniq), dtype=np.int32)
    inverse = lut[x].astype(np.int64)
    at = np.full(len(uniq) if first else 0, len(x), dtype=np.int64)
    if first:
        np.minimum.at(at, inverse, np.arange(len(x), dtype=np.int64))
    return uniq.astype(np.int64), at, inverse


def _unique_floats(x: F64, times: F64) -> tuple[F64, npt.NDArray[np.int64]]:
    """`np.unique(x, return_inverse=True)` for `x` whose values are mostly among the few
    sorted `times` (the records' pod start times, those of their rows): a search of those,
    not a sort of `x`; sorted when some value is not there."""
    when = np.minimum(np.searchsorted(times, x), max(len(times) - 1, 0))
    if len(times) and np.array_equal(times[when], x):
        used = np.zeros(len(times), dtype=bool)
        used[when] = True
        if used.all():
            return times, when.astype(np.int64)
        renumber = np.cumsum(used) - 1
        return times[used], renumber[when].astype(np.int64)
    uniq, inverse = np.unique(x, return_inverse=True)
    return uniq, inverse.ravel().astype(np.int64)


# `_extremes` scatters a run of equal times at a time up to this many runs (a chunk of
# strata has a few dozen); more runs, or times out of order, take ufunc.at.
_RUNS_MAX = 256


def _extremes(t: F64, group: npt.NDArray[np.int64], n: int, last: F64 | None = None
              ) -> tuple[F64, F64]:
    """The largest of `last` (default `t`) and the smallest of `t` per group (`group` in
    [0, `n`); +-inf where none), in one pass: records come in order of their stratum, so
    each run of one stratum (and last) is scattered whole, later runs over earlier ones,
    instead of a ufunc.at over every record."""
    top = t if last is None else last
    newest, oldest = np.full(n, -math.inf), np.full(n, math.inf)
    change = t[1:] != t[:-1]
    if last is not None:
        change |= top[1:] != top[:-1]
    cuts = np.flatnonzero(change) + 1
    if len(cuts) < _RUNS_MAX and not np.any(top[cuts] < top[cuts - 1]):
        for lo, hi in itertools.pairwise([0, *cuts.tolist(), len(t)]):
            g = group[lo:hi]
            newest[g] = top[lo]
            oldest[g] = np.minimum(oldest[g], t[lo])
        return newest, oldest
    np.maximum.at(newest, group, top)
    np.minimum.at(oldest, group, t)
    return newest, oldest


class _PooledLatency:
    """The latency records of the strata before the seal: each settled record (out of its
    pod's warm-up by the verdict's rule, at or after the comparison's origin, and clear of
    every overload span known) pooled with its pod's records of the same bucket (`start`
    the newest stratum, `first` the oldest); the others kept as stored. A margin keeps a
    record on a boundary unpooled: an unpooled record is judged as a fresh read judges it.
    Records are added window by window; name tables only grow, so indices stay valid."""

    _MARGIN = 1e-6

    def __init__(self, origin: float, stratum_s: float | None, warmup_s: float) -> None:
        self._origin, self._stratum, self._warmup = origin, stratum_s, warmup_s
        self._where: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        self._first_seen: dict[tuple[int, int, int], float] = {}  # each pod's first stratum
        self._row_starts: F64 = np.zeros(0)  # the pod start times of every row added (-inf: none)
        # Pooled records by key, pod (its codes and start time) and bucket: each pod's id,
        # and the keys (id << 32 | bucket) in order with their rows.
        self._pod_id: dict[tuple[int, int, int, float], int] = {}
        self._keys = np.zeros(0, dtype=np.int64)
        self._key_rows = np.zeros(0, dtype=np.int64)
        self.pooled = EndpointLatency.empty()
        self.pooled_first: F64 = np.zeros(0)
        self._loose: list[EndpointLatency] = []  # joined when read (`loose`)
        self.spans: frozenset[tuple[float, float]] = frozenset()
        self.generation = 0  # bumped by every `add`

    @property
    def loose(self) -> EndpointLatency:
        """The records not pooled, as stored: joined once when read, not at every `add`
        (a day's cold read adds a chunk at a time)."""
        if len(self._loose) != 1:
            self._loose = [EndpointLatency.joined(self._loose) if self._loose
                           else EndpointLatency.empty()]
        return self._loose[0]

    @property
    def names(self) -> tuple[list[str], list[str], list[str]]:
        paths, endpoints, cohorts = (list(w) for w in self._where)
        return paths, endpoints, cohorts

    def add(self, moving: EndpointColumns, length_s: float,
            spans: Sequence[tuple[float, float]], *, summed: bool = False,
            records: LatencyRows | None = None) -> None:
        """The latency records of `moving` (endpoint windows now before the seal, as stored;
        `summed`: read in strata already), each read `length_s` long against `spans`;
        `records`: theirs by row instead of `moving.latency` (a cold read's chunk)."""
        self.generation += 1
        stratum = None if summed else self._stratum
        self._row_starts = np.union1d(self._row_starts, np.where(
            np.isnan(moving.started), -math.inf, moving.started))
        codes = [_lookup(names, where)[idx.astype(np.int64)] for names, where, idx in zip(
            _names_of(moving), self._where, (moving.path, moving.endpoint, moving.cohort),
            strict=True)] if len(moving.start) else []
        if codes:
            t = _stratum_of(moving.start, stratum)
            pod = (codes[0] * len(self._where[1]) + codes[1]) * len(self._where[2]) + codes[2]
            # By a table of the pods, not a sort: a cold fill's rows are a day's strata.
            uniq, _, inv = _unique_ints(pod, math.prod(len(w) for w in self._where),
                                        first=False)
            low = np.full(uniq.size, math.inf)
            np.minimum.at(low, inv, t)
            first_rows = np.zeros(uniq.size, dtype=np.int64)
            first_rows[inv] = np.arange(pod.size)
            for r, lo in zip(first_rows.tolist(), low.tolist(), strict=True):
                name = (int(codes[0][r]), int(codes[1][r]), int(codes[2][r]))
                if lo < self._first_seen.get(name, math.inf):
                    self._first_seen[name] = lo
        # Decided a row at a time (its records share its stratum, pod and start time), each
        # row's records taken whole: a day's cold read is tens of millions of records.
        lat = records if records is not None else _as_rows(moving.latency)
        self.spans = frozenset(spans)
        if not len(lat):
            return
        start = _stratum_of(lat.start, stratum)
        p, e, c, settled = self._settled(moving, lat, start, length_s, spans)
        sizes = [len(w) for w in self._where]
        rows = LatencyRows(start, p.astype(np.int32), e.astype(np.int32), c.astype(np.int32),
                           lat.started, lat.per, lat.bucket, lat.count)
        if settled.all():
            s, bucket, count = np.arange(len(settled)), lat.bucket, lat.count
        else:
            self._loose.append(_rows_taken(rows, ~settled).expanded())
            s = np.flatnonzero(settled)
            if not s.size:
                return
            taken = np.repeat(settled, lat.per)
            bucket, count = lat.bucket[taken], lat.count[taken]
        started = np.where(np.isnan(lat.started[s]), -math.inf, lat.started[s])
        # Each row's pod (codes and start time) named once per distinct pod, not per row.
        times, when = _unique_floats(started, self._row_starts)
        pod = ((p[s] * sizes[1] + e[s]) * sizes[2] + c[s]) * len(times) + when
        pods, _, which = _unique_ints(pod, math.prod(sizes) * len(times), first=False)
        ids = np.array([self._pod_id.setdefault(
            (int(x // len(times) // sizes[2] // sizes[1]), int(x // len(times) // sizes[2]
                                                               % sizes[1]),
             int(x // len(times) % sizes[2]), float(times[x % len(times)])),
            len(self._pod_id)) for x in pods.tolist()], dtype=np.int64)
        per_row = lat.per[s]
        per = max(BUCKET_COUNT, int(bucket.max()) + 1)
        dense, _, inverse = _unique_ints(np.repeat(ids[which] * per, per_row) + bucket,
                                         (int(ids.max()) + 1) * per, first=False)
        uniq = ((dense // per) << 32) | (dense % per)  # (id << 32 | bucket), in the same order
        # Per key, the row of one of its records, the sum of their counts (exact in floats
        # below 2**53) and their newest and oldest stratum: scatters and a bincount.
        some = np.empty(len(uniq), dtype=np.int64)
        some[inverse] = np.repeat(s, per_row)
        total = np.rint(np.bincount(inverse, weights=count, minlength=len(uniq)))
        # Rows of an hour's rollup: newest at their last minute, oldest at their first.
        newest, oldest = _extremes(
            np.repeat(start[s], per_row), inverse, len(uniq),
            None if lat.last is None else np.repeat(lat.last[s], per_row))
        at_key = np.searchsorted(self._keys, uniq)
        known = at_key < len(self._keys)
        known[known] = self._keys[at_key[known]] == uniq[known]
        grown = len(self.pooled)
        row_of = np.empty(len(uniq), dtype=np.int64)
        row_of[known] = self._key_rows[at_key[known]]
        # New keys get rows in the order of their keys.
        new = np.flatnonzero(~known)
        row_of[new] = grown + np.arange(len(new))
        if len(new):
            self._keys = np.insert(self._keys, at_key[new], uniq[new])
            self._key_rows = np.insert(self._key_rows, at_key[new], row_of[new])
            at = some[new]
            self.pooled = EndpointLatency.joined([self.pooled, EndpointLatency(
                np.full(len(new), -math.inf), rows.path[at], rows.endpoint[at],
                rows.cohort[at], rows.started[at], (uniq[new] & 0xFFFFFFFF).astype(np.int64),
                np.zeros(len(new), dtype=np.int64))])
            self.pooled_first = np.concatenate([self.pooled_first,
                                                np.full(len(new), math.inf)])
        assert len(self.pooled) == grown + len(new) == len(self._keys)
        # `row_of` names each row once: plain indexed updates, not ufunc.at.
        self.pooled.count[row_of] += total.astype(np.int64)
        self.pooled.start[row_of] = np.maximum(self.pooled.start[row_of], newest)
        self.pooled_first[row_of] = np.minimum(self.pooled_first[row_of], oldest)

    def _settled(self, moving: EndpointColumns, lat: LatencyRows, start: F64,
                 length_s: F64 | float, spans: Sequence[tuple[float, float]]
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                            npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """The rows of `lat` (at `start`, `length_s` long) as codes into the name tables
        (path, endpoint, cohort), and which are settled."""
        p, e, c = (_lookup(names, where)[idx.astype(np.int64)] for names, where, idx in zip(
            _names_of(moving), self._where, (lat.path, lat.endpoint, lat.cohort),
            strict=True))
        # Each pod's first stratum looked up once per pod, not once per row.
        sizes = [len(w) for w in self._where]
        pods, _, which = _unique_ints((p * sizes[1] + e) * sizes[2] + c, math.prod(sizes),
                                      first=False)
        seen = np.array([self._first_seen.get(
            (x // sizes[2] // sizes[1], x // sizes[2] % sizes[1], x % sizes[2]), -math.inf)
            for x in pods.tolist()], dtype=np.float64)[which]
        began = np.where(np.isnan(lat.started), seen, lat.started)
        settled = ((start > began + self._warmup + self._MARGIN)
                   & (start > self._origin + self._warmup + self._MARGIN)
                   & ~overlapping(start, length_s, spans))
        return p, e, c, settled

    def whole(self, moving: EndpointColumns, rows: LatencyRows, length_s: float,
              spans: Sequence[tuple[float, float]]) -> npt.NDArray[np.bool_]:
        """Which of `rows` (an hour's rollups, `start` to `last`, read in strata as
        `moving`) are settled at every minute: settled at their first (then at every later
        one: one pod start throughout) and clear of `spans` to their last's end. Their
        records are then pooled whole (`add`), the others' read by minute."""
        assert rows.last is not None
        length = rows.last - rows.start + length_s
        return self._settled(moving, rows, rows.start, length, spans)[3]

    def stale(self, spans: Sequence[tuple[float, float]], length_s: float) -> bool:
        """True when the pooled records no longer hold: a span known when they were pooled
        is gone, or a new one reaches into records pooled together."""
        now = frozenset(spans)
        if not self.spans <= now:
            return True
        new = sorted(now - self.spans)
        if not new:
            return False
        first, last = self.pooled_first, self.pooled.start
        return bool((overlapping(first, last - first + length_s, new) & (first < last)).any())

    def records(self, into: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
                paths: Iterable[str] | None, cohorts: Iterable[str] | None) -> EndpointLatency:
        """Every record, pooled or not, of `paths` and `cohorts`, indexed into `into`."""
        both = EndpointLatency.joined([self.pooled, self.loose])
        own = self.names
        keep = _in(both.path, tuple(own[0]), paths) & _in(both.cohort, tuple(own[2]), cohorts)
        return _recoded(both, own, into, keep)


class VerdictCache:
    """The windows of one store, kept for the verdicts of the probe that writes it.

    Thread-safe: one verdict at a time reads it (`open`, then `source`)."""

    def __init__(self, path: str, *, reread_s: float = REREAD_S) -> None:
        self._path = path
        self._reread = float(reread_s)
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._ident: tuple[int, int] | None = None
        self._last_id = 0
        self._firsts: tuple[float | None, float | None] | None = None
        self._newest: float | None = None  # the newest window start, as of `open`
        self._windows: _Windows | None = None
        self._pods: _Pods | None = None
        self._first_window: dict[tuple[str, float | None], float] = {}
        # The pod-level tests' sums kept between verdicts, by query and metric, the most
        # recently used first out (each checks the grids it is given: `pods.TrackMemo`).
        self._memos: OrderedDict[Hashable, TrackMemo] = OrderedDict()
        # How often it read everything again, path windows and endpoint windows (for tests).
        self.reads_afresh = {"windows": 0, "pods": 0}

    def close(self) -> None:
        with self._lock:
            self._forget()

    def _forget(self) -> None:
        if self._store is not None:
            self._store.close()
        self._store, self._ident, self._windows, self._pods = None, None, None, None
        self._firsts, self._last_id = None, 0
        self._first_window.clear()
        self._memos.clear()

    def track_memo(self, key: Hashable) -> TrackMemo:
        """The kept sums of one query's metric (`probes.verdict.judge`'s `memos`): a few
        queries at once (the probe's own verdict, a gate's path) each keep theirs."""
        memo = self._memos.pop(key, None) or TrackMemo()
        self._memos[key] = memo
        while len(self._memos) > _MEMOS:
            self._memos.popitem(last=False)
        return memo

    @contextmanager
    def open(self) -> Iterator[Store]:
        """The store, checked (module docstring); the cache is held until the block ends."""
        with self._lock:
            st = os.stat(self._path) if os.path.exists(self._path) else None
            ident = None if st is None else (st.st_dev, st.st_ino)
            if self._store is None or ident != self._ident:
                self._forget()
                self._store = Store.open(self._path, readonly=True)
                self._ident = ident
            marks = self._store.marks(self._last_id, self._sealed_at())
            firsts = (marks.first_start, marks.first_endpoint_start)
            if (marks.last_id < self._last_id or marks.late
                    or (self._firsts is not None and firsts != self._firsts)):
                self._windows, self._pods = None, None
                self._first_window.clear()
            self._last_id, self._firsts = marks.last_id, firsts
            self._newest = marks.newest_start
            yield self._store

    def _sealed_at(self) -> float:
        seals = [s.seal for s in (self._windows, self._pods) if s is not None]
        return max(seals, default=-math.inf)

    def source(self, exclude: Sequence[tuple[float, float]] = (), *,
               warmup_s: float | None = None) -> CachedSource:
        """What one verdict reads (inside `open`); `exclude` as `verdict_from_source`'s.
        With the verdict's `warmup_s`, the endpoint windows' latency records are kept
        pooled too; without it, a verdict that asks for them reads them from the store."""
        assert self._store is not None, "source() is used inside open()"
        return CachedSource(self, self._store, tuple(exclude), warmup_s)

    # -- path windows ---------------------------------------------------------------------

    def _seal(self) -> float:
        return -math.inf if self._newest is None else self._newest - self._reread

    def _build_windows(self, store: Store, since: float,
                       spans: Sequence[tuple[float, float]]) -> _Windows:
        self.reads_afresh["windows"] += 1
        seal = max(since, self._seal())
        tail = store.read_table(since=seal)
        sealed, first, _, _ = pooled_windows(store, since, seal, spans, tail=tail)
        return _Windows(since, sealed, first, tail, seal)

    def _refresh_windows(self, store: Store, w: _Windows,
                         spans: Sequence[tuple[float, float]]) -> _Windows:
        fresh = store.read_table(since=w.seal)
        seal = max(w.seal, self._seal())
        if seal < w.seal + _POOL_STEP_S:
            return _Windows(w.since, w.sealed, w.first, fresh, w.seal)
        old = fresh.start < seal
        tail = take(fresh, ~old)
        sealed, first = pool(w.sealed, w.first, take(fresh, old), tail, seal, spans)
        return _Windows(w.since, sealed, first, tail, seal)

    def windows(self, store: Store, since: float, spans: Sequence[tuple[float, float]],
                refresh: bool) -> _Windows:
        w = self._windows
        try:
            if w is None or w.since != since:
                w = self._build_windows(store, since, spans)
            elif refresh:
                check(w.sealed, w.first, spans)
                w = self._refresh_windows(store, w, spans)
        except StalePool:
            w = self._build_windows(store, since, spans)
        self._windows = w
        return w

    # -- endpoint windows ------------------------------------------------------------------

    def _pod_seal(self, origin: float, stratum_s: float | None) -> float:
        seal = max(origin, self._seal())
        if stratum_s is None or not math.isfinite(seal):
            return seal
        # A stratum's start (strata are anchored at the epoch), or the origin: no stratum
        # is summed on both sides of the seal.
        return max(origin, stratum_s * math.floor(seal / stratum_s))

    def _length_bound(self, stratum_s: float | None) -> float:
        """At least the length the verdict gives an endpoint row when it leaves out overload
        spans (its stratum, or the median window length of what it read): the longest
        window the cache has read, or no bound before it has read any."""
        w = self._windows
        if w is None:
            return math.inf
        lengths = [float(t.length.max()) for t in (w.sealed, w.tail) if len(t.length)]
        return max([stratum_s or 0.0, *lengths]) if lengths else math.inf

    def _build_pods(self, store: Store, origin: float, stratum_s: float | None,
                    warmup_s: float | None, spans: Sequence[tuple[float, float]]) -> _Pods:
        self.reads_afresh["pods"] += 1
        seal = self._pod_seal(origin, stratum_s)
        with_latency = warmup_s is not None
        lat = _PooledLatency(origin, stratum_s, warmup_s or 0.0)
        length = self._length_bound(stratum_s)
        # An hour's records pooled whole where every minute of it is settled.
        with store.stream_endpoint_columns(
                since=origin, until=seal, stratum_s=stratum_s, latency=with_latency,
                by_row=True, whole=lambda cols, rows: lat.whole(cols, rows, length, spans)
        ) as (sealed, chunks):
            # The rows first (each pod's first stratum), then their latency records pooled
            # a chunk at a time: a day's records held whole were gigabytes (BENCHMARKS.md D23).
            if with_latency:
                lat.add(sealed, length, spans, summed=True)
            none = take(sealed, np.zeros(len(sealed.start), dtype=bool))
            for chunk in chunks:
                lat.add(none, length, spans, summed=True, records=chunk)
        tail = store.read_endpoint_columns(since=seal, latency=with_latency)
        return _Pods(origin, stratum_s, warmup_s, _by_path(_rows_only(sealed)), tail, seal, lat,
                     _Grids())

    def pods(self, store: Store, origin: float, stratum_s: float | None, refresh: bool,
             warmup_s: float | None = None, spans: Sequence[tuple[float, float]] = ()
             ) -> _Pods:
        """The endpoint windows from `origin`; with `warmup_s` (the verdict's), their
        latency records too, pooled as the module docstring says."""
        p = self._pods
        if (p is None or p.origin != origin or p.stratum_s != stratum_s
                or p.warmup_s != warmup_s
                or (warmup_s is not None
                    and p.latency.stale(spans, self._length_bound(stratum_s)))):
            p = self._build_pods(store, origin, stratum_s, warmup_s, spans)
        elif refresh:
            fresh = store.read_endpoint_columns(since=p.seal, latency=warmup_s is not None)
            seal = max(p.seal, self._pod_seal(origin, stratum_s))
            old = fresh.start < seal
            more = p.more
            if old.any():
                moving = _rows_only(take(fresh, old))
                summed = _strata(moving, stratum_s)
                more = [*more, summed]
                if p.grids.parts is not None:
                    p.grids.pending.append(summed)
                if warmup_s is not None:
                    p.latency.add(dataclasses.replace(
                        moving, latency=fresh.latency.taken(fresh.latency.start < seal)),
                        self._length_bound(stratum_s), spans)
            tail = dataclasses.replace(take(fresh, ~old), latency=
                fresh.latency.taken(fresh.latency.start >= seal))
            p = _Pods(origin, stratum_s, warmup_s, p.joined, tail, seal, p.latency, p.grids,
                      more)
        self._pods = p
        return p


class CachedSource:
    """One verdict's view of a `VerdictCache`: the `WindowSource` that
    `probes.verdict.service.verdict_from_source` reads, and the endpoint columns of
    `probes.stats.pods.read_pod_grids`. Reads the store for anything the cache does not
    hold (another origin, a time before the re-read span)."""

    def __init__(self, cache: VerdictCache, store: Store,
                 exclude: tuple[tuple[float, float], ...], warmup_s: float | None = None
                 ) -> None:
        self._cache, self._store, self._exclude = cache, store, exclude
        self._warmup_s = warmup_s
        self._fresh_windows = self._fresh_pods = False

    @property
    def path(self) -> str:
        return self._store.path

    def track_memo(self, key: Hashable) -> TrackMemo:
        return self._cache.track_memo(key)

    def paths(self) -> list[str]:
        return self._store.paths()

    def first_window(self, cohort: str, since: float | None = None) -> float | None:
        memo = self._cache._first_window
        key = (cohort, since)
        if key not in memo:
            found = self._store.first_window(cohort, since)
            if found is None:
                return None
            memo[key] = found
        return memo[key]

    def read_table(self, since: float | None = None, until: float | None = None,
                   paths: Iterable[str] | None = None,
                   cohorts: Iterable[str] | None = None) -> WindowTable:
        w = self._cache._windows
        if w is not None and since is not None and since >= w.seal and since != w.since:
            w = self._windows(w.since)
            return _select(take(w.tail, w.tail.start >= since), until, paths, cohorts)
        # No origin (one cohort, before a rollout): every window, pooled alike.
        w = self._windows(-math.inf if since is None else since)
        if until is not None and until < w.seal:
            return self._store.read_table(since, until, paths, cohorts)
        table: WindowTable = concat(_select(w.sealed, None, paths, cohorts),
                                    _select(w.tail, until, paths, cohorts))
        return table

    def _windows(self, since: float) -> _Windows:
        w = self._cache.windows(self._store, since, self._exclude,
                                refresh=not self._fresh_windows)
        self._fresh_windows = True
        return w

    def read_endpoint_columns(self, since: float | None = None, until: float | None = None,
                              paths: Iterable[str] | None = None,
                              cohorts: Iterable[str] | None = None, *,
                              stratum_s: float | None = None,
                              latency: bool = False) -> EndpointColumns:
        if since is None or (latency and self._warmup_s is None):
            return self._store.read_endpoint_columns(since, until, paths, cohorts,
                                                     stratum_s=stratum_s, latency=latency)
        p = self._cache.pods(self._store, since, stratum_s, refresh=not self._fresh_pods,
                             warmup_s=self._warmup_s, spans=self._exclude)
        self._fresh_pods = True
        if until is not None and until < p.seal:
            return self._store.read_endpoint_columns(since, until, paths, cohorts,
                                                     stratum_s=stratum_s, latency=latency)
        tail = _select(p.tail, until, paths, cohorts)
        rows = _strata(_rows_only(tail), stratum_s)
        out: EndpointColumns = concat(_select(p.sealed, None, paths, cohorts), rows)
        if not latency:
            return out
        names = _names_of(out)
        t = tail.latency
        keep = _in(t.path, tail.paths, paths) & _in(t.cohort, tail.cohorts, cohorts)
        if until is not None:
            keep &= t.start < until
        recent = _recoded(dataclasses.replace(t, start=_stratum_of(t.start, stratum_s)),
                          _names_of(tail), names, keep)
        return dataclasses.replace(out, latency=EndpointLatency.joined(
            [p.latency.records(names, paths, cohorts), recent]))

    def pod_grids(self, *, since: float | None, until: float | None,
                  paths: Sequence[str] | None, warmup_s: float, window_s: float,
                  stratum_s: float | None, exclude: Sequence[tuple[float, float]]
                  ) -> dict[str, PodGrid] | None:
        """`probes.stats.pods.read_pod_grids` of this source (with per-pod attempts and
        latency) from the grids the cache keeps for the sealed strata and the strata after
        them (`probes.verdict.grids`); None when the cache does not hold what it reads (the
        caller reads the grids as from a store)."""
        if (since is None or self._warmup_s is None or warmup_s != self._warmup_s
                or tuple(exclude) != self._exclude):
            return None
        lo = since - warmup_s
        p = self._cache.pods(self._store, lo, stratum_s, refresh=not self._fresh_pods,
                             warmup_s=self._warmup_s, spans=self._exclude)
        self._fresh_pods = True
        if until is not None and until < p.seal:
            return None
        rules = Rules(since, warmup_s, stratum_s or window_s, self._exclude)
        g = p.grids
        try:
            if g.parts is None or g.rules != rules:
                raise Stale
            for cols in g.pending:
                g.parts = seal_all(extend_all(g.parts, cols, rules))
                g.version += 1
        except Stale:
            g.parts, g.rules = seal_all(extend_all({}, p.sealed, rules)), rules
            g.version += 1
        g.pending.clear()
        tail = _select(p.tail, until, paths, None)
        try:
            parts = extend_all(g.parts, _strata(_rows_only(tail), stratum_s), rules)
        except Stale:
            return None
        chosen = [(name, parts[name]) for name in sorted(parts)
                  if paths is None or name in set(paths)]
        t = p.tail.latency
        keep = _in(t.path, p.tail.paths, paths)
        if until is not None:
            keep &= t.start < until
        recent = t.taken(keep)
        recent = dataclasses.replace(recent, start=_stratum_of(recent.start, stratum_s))
        sealed = sorted(g.parts.items())
        key = (p.latency.generation, g.version)
        if g.sealed_hists is None or g.sealed_hists[0] != key:
            pooled = EndpointLatency.joined([p.latency.pooled, p.latency.loose])
            g.sealed_hists = key, flat_hists(sealed, [(pooled, tuple(p.latency.names))], rules)
        # The kept histograms hold when every path's pods are laid out as the sealed grids'.
        base = g.sealed_hists[1] if [(n, q.pods) for n, q in chosen] == [
            (n, q.pods) for n, q in sealed] else flat_hists(chosen, [(EndpointLatency.joined(
                [p.latency.pooled, p.latency.loose]), tuple(p.latency.names))], rules)
        flat = flat_hists(chosen, [(recent, _names_of(p.tail))], rules, base)
        return grids(chosen, *hists(chosen, flat))
