"""The endpoint windows' minute rollups rolled up again per hour (schema v5): one row per
hour, path, endpoint and cohort, holding its minutes' counts as they are (`minutes`, one
`MINUTE` record each) and their latency records merged per bucket (`latency`), with the
first and last minute that has any (`first`, `last`).

A cold verdict over a day reads 20 times fewer rows for its strata's counts (an hour row's
minutes are the minute rollups' rows, `hour_rows`) and about 20 times fewer latency
records: an hour's records are taken whole where every minute of them counts alike
(`hour_latency`: the reader's rule, asked at the stratum of the hour's first minute with
records, says the pod is warm and after the comparison's origin, no overload span touches
the strata from `first`'s to `last`'s, and no pod start falls inside), else the hour's
minute rollups are read.

Kept as the minute rollups are (`probes.store._strata.Rolls`): meta `hours_rolled_until`
(an hour's start) says every minute rollup before it is in an hour row; the writer rolls
an hour once its minutes are rolled up, at most one a write (a migrated store catches up
an hour a write, oldest first); a minute rolled again under it re-rolls its hour; a prune
deletes hour rows with their minutes and rolls the hour it cuts anew.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.errors import StoreCorrupt
from probes.measure.sparse import LATENCY
from probes.store._strata import (
    HOUR_S,
    HOURS,
    ROLLUP_S,
    ROLLUPS,
    Rolls,
    blobs,
    ints,
    latency_records,
    merged_records,
    stratum_index,
    whole_records,
)
from probes.store.table import EndpointColumns, LatencyRows

__all__ = ["HOUR_ROLLS", "HOUR_TABLE", "MINUTE", "hour_latency", "hour_rows"]

HOUR_TABLE = """
CREATE TABLE endpoint_hours (
    start REAL NOT NULL, path_id INTEGER NOT NULL, endpoint_id INTEGER NOT NULL,
    cohort_id INTEGER NOT NULL,
    -- the first and last minute whose rollup has latency records (the hour's start: none)
    first REAL NOT NULL, last REAL NOT NULL,
    -- the hour's minute rollups, one MINUTE record each, by minute
    minutes BLOB NOT NULL,
    -- their latency records merged per bucket, as endpoint_rollups.latency
    latency BLOB NOT NULL,
    PRIMARY KEY (start, path_id, endpoint_id, cohort_id)) WITHOUT ROWID
"""

# One minute rollup in an hour row: its minute of the hour and its counts.
MINUTE = np.dtype([("m", "<u1"), ("requests", "<i8"), ("errors", "<i8"),
                   ("attempts_sum", "<i8"), ("attempts_count", "<i8"), ("unrecorded", "<i8")])
_COUNTS = ("requests", "errors", "attempts_sum", "attempts_count", "unrecorded")
_KEYS = ("path_id", "endpoint_id", "cohort_id")
_SPAN = "start >= ? AND start < ?"


def _roll_hours(conn: sqlite3.Connection, lo: float, hi: float, path: str) -> None:
    """The hour rows of the hours [lo, hi) made anew from the minute rollups, an hour at a
    time."""
    conn.execute(f"DELETE FROM {HOURS} WHERE {_SPAN}", (lo, hi))
    for at in np.arange(lo, hi, HOUR_S).tolist():
        args = [at, at + HOUR_S]
        fields = (f"CAST((start - {at!r}) / {ROLLUP_S!r} AS INTEGER)", *_KEYS, *_COUNTS,
                  "LENGTH(latency) > 0")
        *text, n = conn.execute(
            f"SELECT {', '.join(f'group_concat({f})' for f in fields)}, COUNT(*)"
            f" FROM {ROLLUPS} WHERE {_SPAN}", args).fetchone()
        if not n:
            continue
        cols = np.stack([ints(x) for x in text], axis=1)
        cols = cols[np.lexsort((cols[:, 0], *cols[:, 3:0:-1].T))]  # by key, then minute
        new = np.ones(len(cols), dtype=bool)
        new[1:] = np.any(cols[1:, 1:4] != cols[:-1, 1:4], axis=1)
        at_row = np.flatnonzero(new)
        bounds = [*at_row.tolist(), len(cols)]
        rec = np.empty(len(cols), dtype=MINUTE)
        rec["m"] = cols[:, 0]
        for k, name in enumerate(_COUNTS):
            rec[name] = cols[:, 4 + k]
        data = rec.tobytes()
        # The first and last minute with latency records, per row.
        timed = np.where(cols[:, -1] > 0, cols[:, 0], -1)
        last = np.maximum.reduceat(timed, at_row)
        first = np.minimum.reduceat(np.where(timed < 0, 60, timed), at_row)
        none = last < 0
        first[none], last[none] = 0, 0
        key_rows = np.column_stack([np.zeros(len(at_row), dtype=np.int64), cols[at_row, 1:4]])
        found = blobs(conn, ROLLUPS, "latency", ("0", *_KEYS), _SPAN, args)
        merged = (merged_records(key_rows, found, LATENCY, path, "endpoint rollups")
                  if found is not None else [b""] * len(at_row))
        size = MINUTE.itemsize
        conn.executemany(
            f"INSERT INTO {HOURS} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            ((at, *key, at + ROLLUP_S * f, at + ROLLUP_S * t,
              data[bounds[i] * size:bounds[i + 1] * size], b)
             for i, (key, f, t, b) in enumerate(zip(
                 cols[at_row, 1:4].tolist(), first.tolist(), last.tolist(), merged,
                 strict=True))))


# Hours roll from the minute rollups, one a write at most (once an hour for a running
# probe; a migrated store's hours an hour a write).
HOUR_ROLLS = Rolls(ROLLUPS, "hours_rolled_until", _roll_hours, unit=HOUR_S)


def _decoded(conn: sqlite3.Connection, column: str, keys: Sequence[str], where: str,
             args: list[Any], record: np.dtype[Any], path: str
             ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The records of `column` of the hour rows of `where`, each row's record count and
    its `keys`."""
    found = whole_records(conn, HOURS, column, keys, where, args, record, path)
    if found is None:
        return None
    blob, per, key = found
    return np.frombuffer(blob, dtype=record), per, key


def hour_rows(path: str) -> Callable[[sqlite3.Connection, str, list[Any]],
                                     npt.NDArray[np.int64]]:
    """`HourReader.read` of the store at `path`: the minute rows (start, path, endpoint
    and cohort ids, requests, errors, attempts sum and count, unrecorded) of the hour rows
    of `where`, by start then ids, as the minute rollups hold them."""

    def read(conn: sqlite3.Connection, where: str, args: list[Any]) -> npt.NDArray[np.int64]:
        found = _decoded(conn, "minutes", ("CAST(start AS INTEGER)", *_KEYS), where, args,
                         MINUTE, path)
        if found is None:
            return np.zeros((0, 9), dtype=np.int64)
        rec, per, key = found
        if np.any(rec["m"] >= HOUR_S / ROLLUP_S):
            raise StoreCorrupt(f"{path}: read endpoint windows: malformed minutes in an hour"
                               " rollup (a minute past the hour)")
        out = np.empty((len(rec), 9), dtype=np.int64)
        out[:, 0] = np.repeat(key[:, 0], per) + rec["m"].astype(np.int64) * int(ROLLUP_S)
        out[:, 1:4] = np.repeat(key[:, 1:], per, axis=0)
        for k, name in enumerate(_COUNTS):
            out[:, 4 + k] = rec[name]
        # By minute, each minute's rows in the hour rows' order (by ids), as a scan of the
        # minute rollups gives them.
        return out[np.argsort(out[:, 0], kind="stable")]

    return read


# Which rows of a chunk of hour rows (`LatencyRows`, each at the stratum of its first minute
# with records, `last` at its last's) a reader takes whole, given the endpoint rows the
# stream read them with (`EndpointColumns`); the others are read by minute.
Whole = Callable[[EndpointColumns, LatencyRows], npt.NDArray[np.bool_]]
# The store's indexing of records: (records, each row's start, stored ids, records a row).
Index = Callable[[npt.NDArray[Any], npt.NDArray[np.float64], npt.NDArray[np.int64],
                  npt.NDArray[np.int64]], LatencyRows]


def hour_latency(conn: sqlite3.Connection, where: str, args: list[Any], path: str,
                 stratum_s: float, index: Index,
                 whole: Callable[[LatencyRows], npt.NDArray[np.bool_]]
                 ) -> Iterator[LatencyRows]:
    """The latency records of the hour rows of `where` (one hour): the rows `whole` takes
    as they are, each at the stratum of its first minute with records (`last`: of its
    last), as its minutes would be read (never one with a pod start inside: its `started`
    the same at both), then the minute rollups of the others' pods, each at its stratum."""
    found = _decoded(conn, "latency", ("CAST(first AS INTEGER)", "CAST(last AS INTEGER)",
                                        *_KEYS), where, args, LATENCY, path)
    if found is None:
        return
    rec, per, key = found
    # At the strata of their first and last minute, as those minutes' rows are read: a
    # stratum may start before the hour, and the reader's rule is asked at its start.
    first, last = (stratum_s * stratum_index(key[:, k].astype(np.float64), stratum_s)
                   for k in (0, 1))
    ids = key[:, 2:]
    rows = index(rec, first, ids, per)
    ended = index(rec[:0], last, ids, np.zeros(len(ids), dtype=np.int64)).started
    same = (rows.started == ended) | (np.isnan(rows.started) & np.isnan(ended))
    take = same & whole(_spanning(rows, last))
    if take.any():
        kept = np.repeat(take, per)
        yield LatencyRows(first[take], rows.path[take], rows.endpoint[take],
                          rows.cohort[take], rows.started[take], per[take],
                          rows.bucket[kept], rows.count[kept], last=last[take])
    if take.all():
        return
    # The minutes of the other rows' pods only, named in the query when they are few (the
    # pods a rollout moved in that hour, not every pod of the hour at the origin).
    others = ids[~take]
    only = "" if 2 * len(others) > len(ids) else " AND (path_id, endpoint_id, cohort_id) IN" \
        f" (VALUES {', '.join(f'({int(a)}, {int(b)}, {int(c)})' for a, b, c in others)})"
    minutes = latency_records(conn, ROLLUPS, where + only, args, stratum_s, path)
    if minutes is None:
        return
    blob, mper, mkey = minutes
    keep = np.isin(_codes(mkey[:, 1:], ids), _codes(others, ids))
    mrec = np.frombuffer(blob, dtype=LATENCY)[np.repeat(keep, mper)]
    yield index(mrec, stratum_s * mkey[keep, 0].astype(np.float64), mkey[keep, 1:],
                mper[keep])


def _spanning(rows: LatencyRows, last: npt.NDArray[np.float64]) -> LatencyRows:
    return LatencyRows(rows.start, rows.path, rows.endpoint, rows.cohort, rows.started,
                       rows.per, rows.bucket, rows.count, last=last)


def _codes(ids: npt.NDArray[np.int64], within: npt.NDArray[np.int64]
           ) -> npt.NDArray[np.int64]:
    """Stored (path, endpoint, cohort) ids as one integer each, mixed-radix by the largest
    ids of `within` (ids beyond them are never among its codes)."""
    e, c = int(within[:, 1].max()) + 1, int(within[:, 2].max()) + 1
    out = (ids[:, 0] * (e + 1) + np.minimum(ids[:, 1], e)) * (c + 1) + np.minimum(ids[:, 2], c)
    return np.asarray(out, dtype=np.int64)
