"""Path windows as numpy columns: the bulk form for a day of windows.

`PathWindow.latency` is a dense tuple of `BUCKET_COUNT` ints (~15 KB each), right for a
window in flight but not for 864,000 of them (13 GB). A `WindowTable` keeps the same data as
columns and the latency counts in compressed-row form (`latency_ptr`, `latency_bucket`,
`latency_count`; uint16 + uint8, 3 bytes per non-empty bucket: a count above 255 is split
over repeated entries of its bucket, so always sum them), pools histograms by any grouping
in one `bincount`, and turns a selection
back into `PathWindow`s when a caller wants objects.

Rows are ordered by window start (ties in store order). `path` and `cohort` hold indices into
the sorted `paths` and `cohorts` name tuples; `outcomes` and `stream_resets` are dense
matrices whose columns are `outcome_names` and `reset_reasons`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure import sparse
from probes.measure.histogram import BUCKET_COUNT, Histogram
from probes.store import columns
from probes.types import PathWindow

__all__ = [
    "F64",
    "I64",
    "EndpointColumns",
    "EndpointLatency",
    "LatencyRows",
    "TableBuilder",
    "WindowColumns",
    "WindowTable",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
# Entries pooled at once by `latency_by_group`: in cache, and a few tens of MB of int64
# temporaries beside a day's table rather than a few hundred (BENCHMARKS.md D23).
_SLICE = 1 << 20


@dataclass(frozen=True, slots=True, eq=False)
class EndpointLatency:
    """Endpoint windows' latency histograms as one entry per (row, bucket) record: `start`,
    `path`, `endpoint`, `cohort` and `started` as the row's in `EndpointColumns`, `bucket`
    (of `probes.measure.histogram`) and `count` (a bucket may repeat: sum them)."""

    start: F64
    path: I32
    endpoint: I32
    cohort: I32
    started: F64
    bucket: I64
    count: I64

    def __len__(self) -> int:
        return len(self.start)

    @classmethod
    def empty(cls) -> EndpointLatency:
        f, i = np.zeros(0), np.zeros(0, dtype=np.int32)
        return cls(f, i, i, i, f, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def taken(self, keep: npt.NDArray[np.bool_]) -> EndpointLatency:
        """The records where `keep` holds."""
        return EndpointLatency(*(getattr(self, f.name)[keep]
                                 for f in dataclasses.fields(self)))

    @classmethod
    def joined(cls, parts: Sequence[EndpointLatency]) -> EndpointLatency:
        """The records of `parts`, one after the other."""
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts])
                     for f in dataclasses.fields(cls)))


@dataclass(frozen=True, slots=True, eq=False)
class LatencyRows:
    """`EndpointLatency` with what each record shares with its row kept once a row: the
    rows' `start`, `path`, `endpoint`, `cohort` and `started`, `per` records each, then the
    records' `bucket` and `count`. A cold verdict's fold decides a row's records at once
    (a day is tens of millions of records, a few million rows). `last`: for rows that
    span minutes (an hour's rollup, `probes.store._hours`), each one's last minute with
    records (`start` its first); None: each row is at one time."""

    start: F64
    path: I32
    endpoint: I32
    cohort: I32
    started: F64
    per: I64
    bucket: I64
    count: I64
    last: F64 | None = None

    def __len__(self) -> int:
        return len(self.bucket)

    def expanded(self) -> EndpointLatency:
        """One entry a record, each with its row's columns."""
        n = self.per
        return EndpointLatency(
            start=np.repeat(self.start, n), path=np.repeat(self.path, n),
            endpoint=np.repeat(self.endpoint, n), cohort=np.repeat(self.cohort, n),
            started=np.repeat(self.started, n), bucket=self.bucket, count=self.count)


@dataclass(frozen=True, slots=True, eq=False)
class EndpointColumns:
    """Endpoint windows as columns: what the pod-level verdict reads (`probes.stats.pods`).
    `path`, `endpoint` and `cohort` hold indices into the name tuples; rows by start.
    `started`: when the row's pod started, from its endpoint's `start_time` label (the
    Kubernetes start time, the fleet's restart), NaN where the endpoint carries none.
    `attempts_sum` / `attempts_count`: the calls' upstream attempts; `unrecorded`: how many
    of the windows summed into the row were written without per-pod attempts and latency
    (by a v1 store); `latency`: the rows' histograms, when asked for."""

    paths: tuple[str, ...]
    endpoints: tuple[str, ...]
    cohorts: tuple[str, ...]
    start: F64
    path: I32
    endpoint: I32
    cohort: I32
    requests: I64
    errors: I64
    started: F64
    attempts_sum: I64
    attempts_count: I64
    unrecorded: I64
    latency: EndpointLatency

    def __len__(self) -> int:
        return len(self.start)


@dataclass(frozen=True, slots=True, eq=False)
class WindowColumns:
    """The per-window columns `judge()` reads, whatever the source: the store's
    `WindowTable`, or `PrometheusTable` rebuilt from PromQL. Each adds how latency is read."""

    paths: tuple[str, ...]
    cohorts: tuple[str, ...]
    outcome_names: tuple[str, ...]
    reset_reasons: tuple[str, ...]
    start: F64
    length: F64
    path: I32
    cohort: I32
    requests: I64
    successes: I64
    attempts_sum: I64
    attempts_count: I64
    churn: I64
    lag_max_s: F64
    streams_opened: I64
    stream_seconds: F64
    outcomes: I64
    stream_resets: I64

    def __len__(self) -> int:
        return int(self.start.size)


@dataclass(frozen=True, slots=True, eq=False)
class WindowTable(WindowColumns):
    """Columns of path windows; see the module docstring for the layout."""

    latency_ptr: I64
    latency_bucket: npt.NDArray[np.uint16]
    # uint8 as read; rows pooled in memory (`probes.store.columns.reduce`) hold int64 counts.
    latency_count: npt.NDArray[np.uint8] | I64

    def mask(
        self,
        *,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> npt.NDArray[np.bool_]:
        """Rows matching every given filter (window start in [since, until))."""
        m = np.ones(len(self), dtype=bool)
        if paths is not None:
            m &= np.isin(self.path, _positions(self.paths, paths))
        if cohorts is not None:
            m &= np.isin(self.cohort, _positions(self.cohorts, cohorts))
        if since is not None:
            m &= self.start >= since
        if until is not None:
            m &= self.start < until
        return m

    def select(self, rows: npt.ArrayLike) -> WindowTable:
        """A table of the given rows (a boolean mask or indices), in the order given."""
        return columns.take(self, rows)

    def latency_by_group(self, group: npt.ArrayLike, n_groups: int) -> I64:
        """Pooled latency counts per group: `group[row]` in [0, n_groups), or -1 to skip.

        Returns an (n_groups, BUCKET_COUNT) int64 array, e.g. one histogram per path x cohort
        for a verdict, or per time bin x cohort for a report chart.
        """
        g = np.asarray(group, dtype=np.int64)
        if g.shape != (len(self),):
            raise ValueError("group must give one id per row")
        if g.size and int(g.max()) >= n_groups:
            raise ValueError("group ids must be below n_groups")
        pooled = np.zeros(n_groups * BUCKET_COUNT, dtype=np.float64)
        ptr = self.latency_ptr
        # Slices of ~4M entries stay in cache: 4x faster than one pass over 80M entries.
        bounds = np.searchsorted(ptr, np.arange(0, int(ptr[-1]), _SLICE), side="right") - 1
        edges = [*np.unique(bounds).tolist(), len(self)]
        for r0, r1 in itertools.pairwise(edges):
            lo, hi = int(ptr[r0]), int(ptr[r1])
            eg = np.repeat(g[r0:r1], np.diff(ptr[r0 : r1 + 1]))
            keep = eg >= 0
            flat = eg[keep] * BUCKET_COUNT + self.latency_bucket[lo:hi][keep]
            weights = self.latency_count[lo:hi][keep]
            pooled += np.bincount(flat, weights=weights, minlength=pooled.size)
        # float64 sums are exact below 2**53.
        return np.rint(pooled).astype(np.int64).reshape(n_groups, BUCKET_COUNT)

    def latency_histogram(self, rows: npt.ArrayLike | None = None) -> Histogram:
        """The pooled latency histogram of the given rows (a boolean mask), or of all."""
        if rows is None:
            group = np.zeros(len(self), dtype=np.int64)
        else:
            group = np.where(np.asarray(rows, dtype=bool), 0, -1)
        return Histogram(self.latency_by_group(group, 1)[0])

    def latency_dense(self, row: int) -> I64:
        """One row's latency counts as a dense array."""
        lo, hi = int(self.latency_ptr[row]), int(self.latency_ptr[row + 1])
        dense = np.zeros(BUCKET_COUNT, dtype=np.int64)
        np.add.at(dense, self.latency_bucket[lo:hi], self.latency_count[lo:hi].astype(np.int64))
        return dense

    def window(self, row: int) -> PathWindow:
        """Row `row` as a `PathWindow`."""
        return PathWindow(
            start=float(self.start[row]),
            length=float(self.length[row]),
            path=self.paths[self.path[row]],
            cohort=self.cohorts[self.cohort[row]],
            outcomes=_named(self.outcome_names, self.outcomes[row]),
            latency=tuple(self.latency_dense(row).tolist()),
            attempts_sum=int(self.attempts_sum[row]),
            attempts_count=int(self.attempts_count[row]),
            churn=int(self.churn[row]),
            lag_max_s=float(self.lag_max_s[row]),
            streams_opened=int(self.streams_opened[row]),
            stream_seconds=float(self.stream_seconds[row]),
            stream_resets=_named(self.reset_reasons, self.stream_resets[row]),
        )

    def to_windows(self) -> list[PathWindow]:
        """Every row as a `PathWindow`, ordered by start, path, cohort (~20 µs a row)."""
        order = np.lexsort((self.cohort, self.path, self.start))
        return [self.window(int(i)) for i in order]


def _positions(names: tuple[str, ...], wanted: Iterable[str]) -> I64:
    index = {n: i for i, n in enumerate(names)}
    return np.array([index[w] for w in wanted if w in index], dtype=np.int64)


def _named(names: tuple[str, ...], row: I64) -> dict[str, int]:
    return {names[i]: int(row[i]) for i in np.flatnonzero(row)}


_SCALARS: tuple[tuple[str, Any], ...] = (
    ("start", np.float64), ("length", np.float64), ("path_id", np.int64),
    ("cohort_id", np.int64), ("requests", np.int64), ("successes", np.int64),
    ("attempts_sum", np.int64), ("attempts_count", np.int64), ("churn", np.int64),
    ("lag_max_s", np.float64), ("streams_opened", np.int64), ("stream_seconds", np.float64),
)
_BLOBS: tuple[tuple[str, np.dtype[Any], int], ...] = (
    ("outcomes", sparse.COUNTS, sparse.ID_LIMIT),
    ("stream_resets", sparse.COUNTS, sparse.ID_LIMIT),
    ("latency", sparse.LATENCY, BUCKET_COUNT),
)


class _Csr:
    """A preallocated compressed-row array filled chunk by chunk."""

    def __init__(self, rows: int, entries: int, record: np.dtype[Any]) -> None:
        self.ptr = np.zeros(rows + 1, dtype=np.int64)
        self.ids = np.empty(entries, dtype=np.uint16)
        self.counts = np.empty(entries, dtype=record["c"])

    def put(self, r0: int, ptr: I64, ids: npt.NDArray[np.uint16], counts: Any) -> None:
        e0 = int(self.ptr[r0])
        e1 = e0 + int(ptr[-1])
        if e1 > self.ids.size:
            raise ValueError("the store changed while it was read")
        self.ids[e0:e1] = ids
        self.counts[e0:e1] = counts
        self.ptr[r0 + 1 : r0 + ptr.size] = ptr[1:] + e0


class TableBuilder:
    """Fills a `WindowTable` from fetched rows, chunk by chunk, into preallocated arrays.

    The store counts rows and blob bytes first (in the same read transaction), so nothing is
    concatenated at the end: half the peak memory of collecting chunks. Rows carry the
    store's global name ids; `names` maps every id that can appear (paths, cohorts, outcome
    names, reset reasons) to its name. Raises ValueError on a malformed blob.
    """

    # The column order the store must SELECT.
    COLUMNS = (*(name for name, _ in _SCALARS), *(name for name, _, _ in _BLOBS))

    def __init__(self, names: Mapping[int, str], rows: int, blob_bytes: Sequence[int]) -> None:
        self._names = names
        self._rows = rows
        self._filled = 0
        self._scalars = {name: np.empty(rows, dtype=dtype) for name, dtype in _SCALARS}
        self._csr = {
            name: _Csr(rows, nbytes // record.itemsize, record)
            for (name, record, _), nbytes in zip(_BLOBS, blob_bytes, strict=True)
        }

    @staticmethod
    def blob_columns() -> tuple[str, ...]:
        """The blob columns, in the order `blob_bytes` must give their total lengths."""
        return tuple(name for name, _, _ in _BLOBS)

    def add_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        r0, r1 = self._filled, self._filled + len(rows)
        if r1 > self._rows:
            raise ValueError("the store changed while it was read")
        cols = list(zip(*rows, strict=True))
        for (name, _), col in zip(_SCALARS, cols, strict=False):
            self._scalars[name][r0:r1] = col
        for (name, record, limit), col in zip(_BLOBS, cols[len(_SCALARS) :], strict=True):
            self._csr[name].put(r0, *sparse.decode_many(col, record, limit))
        self._filled = r1

    def build(self) -> WindowTable:
        if self._filled != self._rows:
            raise ValueError("the store changed while it was read")
        sc = self._scalars
        paths, path = self._localise(sc["path_id"])
        cohorts, cohort = self._localise(sc["cohort_id"])
        out = self._csr["outcomes"]
        outcome_names, outcomes = self._matrix(out.ptr, out.ids, out.counts)
        res = self._csr["stream_resets"]
        reasons, resets = self._matrix(res.ptr, res.ids, res.counts)
        lat = self._csr["latency"]
        return WindowTable(
            paths=paths,
            cohorts=cohorts,
            outcome_names=outcome_names,
            reset_reasons=reasons,
            start=sc["start"],
            length=sc["length"],
            path=path,
            cohort=cohort,
            requests=sc["requests"],
            successes=sc["successes"],
            attempts_sum=sc["attempts_sum"],
            attempts_count=sc["attempts_count"],
            churn=sc["churn"],
            lag_max_s=sc["lag_max_s"],
            streams_opened=sc["streams_opened"],
            stream_seconds=sc["stream_seconds"],
            outcomes=outcomes,
            stream_resets=resets,
            latency_ptr=lat.ptr,
            latency_bucket=lat.ids,
            latency_count=lat.counts,
        )

    def _localise(self, ids: I64) -> tuple[tuple[str, ...], I32]:
        """Global name ids → indices into the sorted tuple of the names present."""
        present = np.unique(ids)
        names = sorted(self._names[int(i)] for i in present)
        rank = {n: k for k, n in enumerate(names)}
        lookup = np.zeros(int(present.max()) + 1 if present.size else 1, dtype=np.int32)
        for i in present:
            lookup[int(i)] = rank[self._names[int(i)]]
        return tuple(names), lookup[ids]

    def _matrix(
        self, ptr: I64, ids: npt.NDArray[np.uint16], cnt: npt.NDArray[Any]
    ) -> tuple[tuple[str, ...], I64]:
        """CSR (row, name id, count) → a dense rows x names matrix over the names present."""
        names, local = self._localise(ids.astype(np.int64))
        n = ptr.size - 1
        out = np.zeros((n, len(names)), dtype=np.int64)
        rows = np.repeat(np.arange(n), np.diff(ptr))
        np.add.at(out, (rows, local), cnt.astype(np.int64))
        return names, out
