"""Windows rolled up by the minute, and endpoint rows summed by time: into the verdict's
strata in numpy, a range of start at a time, from the raw windows (`endpoint_windows`) or
the 60 s rollups (`endpoint_rollups`, schema v3), and the rollups kept; the path windows'
rollups (`path_rollups`, schema v4) kept by the same machinery (`Rolls`), as are both kinds'
hour rows (`probes.store._hours`, v5; `probes.store._path_hours`, v6).

A stratum is `stratum_s` long from the epoch (`stratum_index`), so a stratum that is a
whole number of minutes is the sum of its minutes' rollups: a read takes whole minutes
before `rolled_until` from the rollups and the minutes at its two ends, and those not yet
rolled up, raw (`segments`). The sums are the same either way; only the rows read differ.

The endpoint windows' 60 s rollups (schema v3): one row per minute, path, endpoint and
cohort, its windows' counts summed and their latency records merged per bucket.

A cold verdict over a day reads its strata (whole minutes from the epoch) from them, six
times fewer rows than the windows (`segments`). What keeps them
true: meta `rolled_until` (a minute's start) says every raw row before it is rolled up;
the writer rolls the minutes past its rewrite horizon in the transaction that writes a
window (`roll_up`), a window written under `rolled_until` (a retry) re-rolls its minute in
that transaction (`reroll`), and a prune deletes rollups with the rows. A store without
`rolled_until` is read raw.

The path windows' 60 s rollups (schema v4): one row per minute, path and cohort, its
windows summed as a pooled row of the verdict sums them (`probes.store.columns.reduce`):
counts added, `lag_max_s` the largest, the latency, outcome and reset records merged per id,
and `last` / `length` the newest window's, `first` the oldest's start. A cold verdict pools
a day of path windows into a few hundred rows; a minute's rollup is such a pooled row
already, so it reads six times fewer rows (`probes.verdict.pooling`). It uses a rollup only
where pooling the minute's windows is what the raw read would do: `regular` says every
window of it had data and the same length (else the minute is read raw), and the reader
reads raw the minutes that a cut of the verdict's falls into. Meta `paths_rolled_until`.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from probes.errors import StoreCorrupt
from probes.measure.sparse import COUNTS, LATENCY

__all__ = ["BLOB_RECORDS", "CATCH_UP_S", "ENDPOINT_ROLLS", "HOURS", "HOUR_S", "KEYS",
           "PATH_ROLLS", "PATH_ROLLUPS", "PATH_ROLLUP_TABLE", "RAW", "ROLLUPS", "ROLLUP_S",
           "ROLLUP_TABLE",
           "TABLE_COLUMNS", "HourReader", "Range", "Rolls", "blobs", "ints", "keys",
           "latency_blobs", "latency_records", "merged_records", "minute", "reroll", "roll",
           "roll_up", "rolled_until", "segments", "strata_rows", "stratum_index",
           "stratum_sql", "summed", "whole_records", "within"]

RAW = "endpoint_windows"
ROLLUPS = "endpoint_rollups"
ROLLUP_S = 60.0  # a rollup row sums one minute of an endpoint's windows
HOURS = "endpoint_hours"  # the minute rollups of an hour in one row (`probes.store._hours`)
HOUR_S = 3600.0
# Latency records a stored row holds on average (~9 for a window of 10 calls): a range of
# rows is sized by its records too, since a rollup row carries six windows' worth.
RECORDS_A_ROW = 9
_RECORD_BYTES = 3  # `probes.measure.sparse.LATENCY`

# A range of start read at once: (table, from, to).
Range = tuple[str, float, float]


class HourReader(NamedTuple):
    """The hour rollups a read may take whole hours from (`probes.store._hours`): every
    minute rollup before `until` is in one, and `read(conn, where, args)` gives the
    minute rows of the hour rows of `where` (as `_read_ranges` reads a table's), by start."""

    until: float
    read: Callable[[sqlite3.Connection, str, list[Any]], npt.NDArray[np.int64]]


def stratum_sql(stratum_s: float) -> str:
    """SQL for a row's stratum: `stratum_index` in SQLite (the stratum starts at
    `stratum_s * index`, as numpy computes it from the index too)."""
    return f"CAST(start / {stratum_s!r} AS INTEGER)"


def stratum_index(start: npt.NDArray[np.float64], stratum_s: float) -> npt.NDArray[np.float64]:
    """Each start's stratum: strata `stratum_s` long from the epoch, not from a query's
    origin, so a stratum is the same whatever the comparison's start (a stratum of the
    rows a rollout stores is one of every verdict's). As `stratum_sql` in SQLite."""
    out: npt.NDArray[np.float64] = np.trunc(start / stratum_s)
    return out


def within(args: Sequence[Any], lo: float, hi: float) -> list[Any]:
    """`Store._where`'s arguments (its time bounds first) narrowed to [lo, hi): SQLite
    searches the primary key by one pair of bounds, so a second pair would scan from the
    first bound to the end for every range."""
    return [max(args[0], lo), min(args[1], hi), *args[2:]]


def ints(text: str | None) -> npt.NDArray[np.int64]:
    """A `group_concat` of integers as an array."""
    if not text:
        return np.zeros(0, dtype=np.int64)
    return np.fromstring(text, dtype=np.int64, sep=",")


def segments(lo: float, hi: float, stratum_s: float, rolled_until: float | None,
             hours_until: float | None = None) -> list[Range]:
    """[lo, hi) as the tables it is read from: the whole minutes inside it and before
    `rolled_until` from the rollups when the strata are whole minutes (the whole hours
    among them before `hours_until` from the hour rollups), the rest raw."""
    if rolled_until is None or math.fmod(stratum_s, ROLLUP_S):
        return [(RAW, lo, hi)]
    first = math.ceil(lo / ROLLUP_S) * ROLLUP_S
    end = math.floor(min(hi, rolled_until) / ROLLUP_S) * ROLLUP_S
    if not first < end:
        return [(RAW, lo, hi)]
    h0 = math.ceil(first / HOUR_S) * HOUR_S
    h1 = math.floor(min(end, hours_until) / HOUR_S) * HOUR_S if hours_until is not None else h0
    if not h0 < h1:
        return [(RAW, lo, first), (ROLLUPS, first, end), (RAW, end, hi)]
    return [(RAW, lo, first), *([(ROLLUPS, first, h0)] if first < h0 else []),
            (HOURS, h0, h1), *([(ROLLUPS, h1, end)] if h1 < end else []), (RAW, end, hi)]


def strata_rows(conn: sqlite3.Connection, where: str, args: list[Any], stratum_s: float,
                v2: tuple[str, str, str], rows: int, rolled_until: float | None = None,
                hours: HourReader | None = None
                ) -> tuple[npt.NDArray[np.float64], list[Range]]:
    """The endpoint rows of `where` summed into strata, as `_endpoint_columns` takes them
    (by stratum, then path, endpoint and cohort id: start, the ids, requests, errors,
    attempts sum and count, unrecorded windows), and the ranges of start they were read
    in (about `rows` rows' worth of latency records each; `segments` says from which
    table). Read a range at a time as one text column per field (`group_concat`) and
    summed in numpy: SQLite's GROUP BY sorted every row first, and a tuple per row cost
    more than the sums. `v2`: the stored columns of attempts sum and count and latency,
    or "NULL" for a v1 store's. `hours`: whole hours from the hour rollups, an hour a
    range, their minutes as the minute rollups hold them."""
    parts: list[npt.NDArray[np.int64]] = []
    ranges: list[Range] = []
    for table, lo, hi in segments(args[0], args[1], stratum_s, rolled_until,
                                  hours.until if hours is not None else None):
        if table == HOURS and hours is not None:
            for at in np.arange(lo, hi, HOUR_S).tolist():
                bounds = within(args, at, at + HOUR_S)
                ranges.append((HOURS, bounds[0], bounds[1]))
                found = hours.read(conn, where, bounds)
                if len(found):
                    found[:, 0] = stratum_index(found[:, 0].astype(np.float64), stratum_s)
                    parts.append(summed(found))
            continue
        _read_ranges(conn, table, where, within(args, lo, hi), stratum_s, v2, rows,
                     parts, ranges)
    if not parts:
        return np.zeros((0, 9)), ranges
    # A stratum across two ranges is summed once: the ranges are in order, so only the
    # first stratum of a range can be the last of the one before. The parts are copied
    # into the result one by one and let go (joined and sorted again, a day of strata
    # rows was four copies at once: BENCHMARKS.md D23).
    for i in range(1, len(parts)):
        before, part = parts[i - 1], parts[i]
        k = before[-1, 0]
        if part[0, 0] == k:
            m, n = np.searchsorted(before[:, 0], k), np.searchsorted(part[:, 0], k, "right")
            parts[i - 1] = before[:m]
            parts[i] = np.concatenate([summed(np.concatenate([before[m:], part[:n]])),
                                       part[n:]])
    a = np.empty((sum(len(x) for x in parts), 9))
    at = 0
    for i, part in enumerate(parts):
        a[at:at + len(part)] = part
        a[at:at + len(part), 0] = stratum_s * part[:, 0]
        at += len(part)
        parts[i] = part[:0]
    return a, ranges


def _read_ranges(conn: sqlite3.Connection, table: str, where: str, args: list[Any],
                 stratum_s: float, v2: tuple[str, str, str], rows: int,
                 parts: list[npt.NDArray[np.int64]], ranges: list[Range]) -> None:
    """`strata_rows` of one table's segment (`args` narrowed to it), appended to `parts`
    and `ranges`."""
    a_sum, a_count, latency = v2
    unrecorded = "unrecorded" if table == ROLLUPS else f"{a_count} IS NULL"
    fields = (stratum_sql(stratum_s), "path_id", "endpoint_id", "cohort_id", "requests",
              "errors", f"COALESCE({a_sum}, 0)", f"COALESCE({a_count}, 0)", unrecorded)
    select = (f"SELECT {', '.join(f'group_concat({f})' for f in fields)}, COUNT(*),"
              f" COALESCE(SUM(LENGTH({latency})), 0) FROM {table} WHERE {where}")
    first, last = conn.execute(f"SELECT MIN(start), MAX(start) FROM {table}"
                               f" WHERE {where}", args).fetchone()
    # Ranges of whole strata, sized to about `rows` rows' records from the last one's.
    span, lo = stratum_s, first
    while lo is not None and lo <= last:
        hi = lo + span
        bounds = within(args, lo, hi)
        *text, n, size = conn.execute(select, bounds).fetchone()
        ranges.append((table, bounds[0], bounds[1]))  # inside the segment, never past it
        if n:
            parts.append(summed(np.stack([ints(x) for x in text], axis=1)))
        weight = max(n, size / (_RECORD_BYTES * RECORDS_A_ROW), 1)
        # At most twice as long: a gap in the windows says nothing of the rows after it.
        span = stratum_s * max(1.0, min(2 * span / stratum_s,
                                        math.floor(span / stratum_s * rows / weight)))
        lo = hi


def latency_blobs(conn: sqlite3.Connection, table: str, where: str, args: list[Any],
                  stratum_s: float
                  ) -> tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The latency blobs of `table`'s rows of `where` that have any, joined, with each
    row's length in bytes and its (stratum index, path, endpoint, cohort id): one blob and
    one text column per key (`group_concat`), not a Python tuple per row. None: no rows."""
    return blobs(conn, table, "latency", (stratum_sql(stratum_s), "path_id", "endpoint_id",
                                         "cohort_id"), where, args)


def latency_records(conn: sqlite3.Connection, table: str, where: str, args: list[Any],
                    stratum_s: float, path: str
                    ) -> tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """`latency_blobs`, each row's length in records instead of bytes."""
    return whole_records(conn, table, "latency", (stratum_sql(stratum_s), "path_id",
                                                  "endpoint_id", "cohort_id"),
                         where, args, LATENCY, path)


def whole_records(conn: sqlite3.Connection, table: str, column: str, keys: Sequence[str],
                  where: str, args: list[Any], record: np.dtype[Any], path: str
                  ) -> tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """`blobs`, each row's length in `record`s instead of bytes; StoreCorrupt for a blob
    that is not whole records."""
    found = blobs(conn, table, column, keys, where, args)
    if found is None:
        return None
    blob, size, key = found
    if np.any(size % record.itemsize):
        raise StoreCorrupt(f"{path}: read endpoint windows: malformed {column} in"
                           f" {table} (not a whole number of records)")
    return blob, size // record.itemsize, key


def blobs(conn: sqlite3.Connection, table: str, column: str, keys: Sequence[str], where: str,
          args: Sequence[Any]
          ) -> tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The blobs of `column` of `table`'s rows of `where` that have any, joined, with each
    row's length in bytes and its `keys` (SQL integer expressions) as columns."""
    blob, sizes, *found = conn.execute(
        f"SELECT CAST(group_concat({column}, x'') AS BLOB), group_concat(LENGTH({column})),"
        f" {', '.join(f'group_concat({k})' for k in keys)}"
        f" FROM {table} WHERE {where} AND LENGTH({column}) > 0", args).fetchone()
    if blob is None:
        return None
    return blob, ints(sizes), np.stack([ints(x) for x in found], axis=1)


def summed(rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """`rows` (stratum, path, endpoint, cohort, then counts) summed per key, by key."""
    if _increasing(rows[:, :4]):
        return rows  # one row a key, in order already: rollups read in strata of a minute
    order = np.lexsort(rows[:, 3::-1].T)
    rows = rows[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = np.any(rows[1:, :4] != rows[:-1, :4], axis=1)
    at = np.flatnonzero(new)
    out = rows[at].copy()
    out[:, 4:] = np.add.reduceat(rows[:, 4:], at, axis=0)
    return out


def _increasing(keys: npt.NDArray[np.int64]) -> bool:
    """Whether each row of `keys` is after the one before, compared column by column."""
    if len(keys) < 2:
        return True
    step = keys[1:] - keys[:-1]
    first = np.argmax(step != 0, axis=1)  # the first column that differs (0 if none does)
    return bool(np.all(step[np.arange(len(step)), first] > 0))


# --- the rollups kept: rolled, re-rolled, their bound --------------------------------------

ROLLUP_TABLE = """
CREATE TABLE endpoint_rollups (
    start REAL NOT NULL, path_id INTEGER NOT NULL, endpoint_id INTEGER NOT NULL,
    cohort_id INTEGER NOT NULL, requests INTEGER NOT NULL, errors INTEGER NOT NULL,
    attempts_sum INTEGER NOT NULL, attempts_count INTEGER NOT NULL,
    -- windows written without per-pod attempts and latency (by schema v1)
    unrecorded INTEGER NOT NULL,
    -- the windows' latency records merged per bucket, as endpoint_windows.latency
    latency BLOB NOT NULL,
    PRIMARY KEY (start, path_id, endpoint_id, cohort_id)) WITHOUT ROWID
"""

_V2 = ("attempts_sum", "attempts_count", "latency")
# Raw rows rolled up at once: an hour of a day's store (50 paths x 12 pods) is ~216,000
# rows and ~2 M latency records, tens of MB while it is summed.
ROLL_S = 3600.0
# How much of the minutes not rolled up yet one write catches up on (a store migrated from
# v2, a probe that was down): twice what a running probe adds a minute, so a write never
# holds the writer much longer than a steady roll does, and a migration is no work at a
# probe's start (a day's store took 26 s, past a liveness probe's patience on a larger one).
CATCH_UP_S = 120.0


def minute(t: float) -> float:
    """The start of the minute of `t` (a rollup row's start)."""
    return _floor(t, ROLLUP_S)


def _floor(t: float, unit: float) -> float:
    return math.floor(t / unit) * unit


@dataclass(frozen=True, slots=True)
class Rolls:
    """One kind of rollup kept: the raw table it sums, the meta key that says up to which
    `unit` (a minute, or an hour of minute rollups) every raw row is in a rollup, and
    `roll(conn, lo, hi, path)`, which makes the rollups of the units [lo, hi) anew from
    the raw rows."""

    raw: str
    key: str
    roll: Callable[[sqlite3.Connection, float, float, str], None]
    unit: float = ROLLUP_S


def rolled_until(conn: sqlite3.Connection, path: str, kind: Rolls | None = None
                 ) -> float | None:
    """Meta `rolled_until` (or `kind`'s key): every raw row before it is in a rollup
    (None: none is)."""
    key = (kind or ENDPOINT_ROLLS).key
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    if row is None:
        return None
    try:
        return float(row[0])
    except ValueError:
        raise StoreCorrupt(f"{path}: meta {key} {row[0]!r} is not a time") from None


def roll_up(conn: sqlite3.Connection, before: float, path: str,
            most_s: float | None = None, kind: Rolls | None = None) -> None:
    """Roll up the whole minutes (`kind`'s units) before `before` not rolled up yet, oldest
    first, at most `most_s` of them (None: all), inside the caller's write transaction."""
    kind = kind or ENDPOINT_ROLLS
    end = _floor(before, kind.unit)
    done = rolled_until(conn, path, kind)
    if done is None:
        first = conn.execute(f"SELECT MIN(start) FROM {kind.raw}").fetchone()[0]
        done = end if first is None else min(_floor(first, kind.unit), end)
    if most_s is not None:
        end = min(end, done + most_s)
    if end <= done:
        return
    kind.roll(conn, done, end, path)
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                 (kind.key, repr(end)))


def reroll(conn: sqlite3.Connection, starts: Iterable[float], path: str,
           kind: Rolls | None = None) -> None:
    """Roll up again the minutes (`kind`'s units) of raw rows just written at `starts` that
    lie under `rolled_until` (a window written again late, a prune that cut a minute)."""
    kind = kind or ENDPOINT_ROLLS
    done = rolled_until(conn, path, kind)
    if done is None:
        return
    for m in sorted({_floor(t, kind.unit) for t in starts if t < done}):
        kind.roll(conn, m, m + kind.unit, path)


def roll(conn: sqlite3.Connection, lo: float, hi: float, path: str) -> None:
    """The rollups of the minutes [lo, hi) made anew from the raw rows, an hour at a time."""
    conn.execute(f"DELETE FROM {ROLLUPS} WHERE start >= ? AND start < ?", (lo, hi))
    at = lo
    while at < hi:
        to = min(at + ROLL_S, hi)
        args: list[float] = [at, to]
        rows, _ = strata_rows(conn, "start >= ? AND start < ?", args, ROLLUP_S, _V2,
                              rows=1 << 30)
        if len(rows):
            found = latency_blobs(conn, RAW, "start >= ? AND start < ?", args, ROLLUP_S)
            keys = np.column_stack([rows[:, 0] // ROLLUP_S, rows[:, 1:4]]).astype(np.int64)
            merged = (merged_records(keys, found, LATENCY, path, "endpoint windows")
                      if found is not None else [b""] * len(rows))
            conn.executemany(
                f"INSERT INTO {ROLLUPS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ((t, *r, b) for t, r, b in zip(rows[:, 0].tolist(),
                                               rows[:, 1:].astype(np.int64).tolist(),
                                               merged, strict=True)))
        at = to


ENDPOINT_ROLLS = Rolls(RAW, "rolled_until", roll)


def merged_records(key_rows: npt.NDArray[np.int64],
                   found: tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]],
                   record: np.dtype[Any], path: str, what: str) -> list[bytes]:
    """Per row of `key_rows` (the rolled rows' integer keys, sorted), the records of its raw
    rows (`blobs` of the same range, by the same keys) merged per id, as a blob."""
    blob, size, keys = found
    if np.any(size % record.itemsize):
        raise StoreCorrupt(f"{path}: roll up {what}: malformed blob (not a whole number of"
                           " records)")
    rec = np.frombuffer(blob, dtype=record)
    per = size // record.itemsize
    # Each record's row of `key_rows`: the keys in dense ranks (`key_rows` is sorted by them,
    # so their mixed-radix codes are increasing), then searched.
    codes = np.zeros(len(key_rows), dtype=np.int64)
    record_codes = np.zeros(len(keys), dtype=np.int64)
    for j in range(key_rows.shape[1]):
        present = np.unique(key_rows[:, j])
        codes = codes * len(present) + np.searchsorted(present, key_rows[:, j])
        record_codes = record_codes * len(present) + np.searchsorted(present, keys[:, j])
    row = np.repeat(np.searchsorted(codes, record_codes), per)
    count_max = int(np.iinfo(record["c"]).max)  # a larger merged count takes several records
    # Summed per (row, id), in order; a count over a record's width split as the
    # store's writer splits it (`probes.measure.sparse.encode`).
    cell = row * (1 << 16) + rec["i"]
    order = np.argsort(cell, kind="stable")
    cell = cell[order]
    new = np.ones(len(cell), dtype=bool)
    new[1:] = cell[1:] != cell[:-1]
    at = np.flatnonzero(new)
    total = np.add.reduceat(rec["c"][order].astype(np.int64), at)
    cell = cell[at]
    parts = (total + count_max - 1) // count_max
    entry = np.repeat(np.arange(len(cell)), parts)
    k = np.arange(len(entry)) - np.repeat(np.cumsum(parts) - parts, parts)
    out = np.empty(len(entry), dtype=record)
    out["i"] = cell[entry] & 0xFFFF
    out["c"] = np.minimum(count_max, total[entry] - count_max * k)
    bounds = np.searchsorted(cell[entry] >> 16, np.arange(len(key_rows) + 1)) * record.itemsize
    data = out.tobytes()
    return [data[bounds[i]:bounds[i + 1]] for i in range(len(key_rows))]


PATH_ROLLUPS = "path_rollups"
_PATH_RAW = "path_windows"

PATH_ROLLUP_TABLE = """
CREATE TABLE path_rollups (
    start REAL NOT NULL, path_id INTEGER NOT NULL, cohort_id INTEGER NOT NULL,
    -- the oldest and newest window's start, and the newest's length
    first REAL NOT NULL, last REAL NOT NULL, length REAL NOT NULL,
    windows INTEGER NOT NULL,
    -- 1: every window had data and the same length (else the minute is read raw)
    regular INTEGER NOT NULL,
    requests INTEGER NOT NULL, successes INTEGER NOT NULL,
    attempts_sum INTEGER NOT NULL, attempts_count INTEGER NOT NULL, churn INTEGER NOT NULL,
    lag_max_s REAL NOT NULL, streams_opened INTEGER NOT NULL, stream_seconds REAL NOT NULL,
    -- as path_windows', merged per id
    outcomes BLOB NOT NULL, stream_resets BLOB NOT NULL, latency BLOB NOT NULL,
    PRIMARY KEY (start, path_id, cohort_id)) WITHOUT ROWID
"""

# A rollup row as `probes.store.table.TableBuilder.COLUMNS` reads a path window: a pooled
# row's start is its newest window's.
TABLE_COLUMNS = ("last", "length", "path_id", "cohort_id", "requests", "successes",
                 "attempts_sum", "attempts_count", "churn", "lag_max_s", "streams_opened",
                 "stream_seconds", "outcomes", "stream_resets", "latency")
# What a reader decides from before it reads the rows (`keys`), in this order.
KEYS = ("start", "path_id", "cohort_id", "first", "last", "length", "windows", "regular")

_HAS_DATA = "(requests > 0 OR stream_seconds > 0 OR streams_opened > 0)"
_SUMS = (f"{stratum_sql(ROLLUP_S)} AS m, path_id, cohort_id, MIN(start), MAX(start),"
         " MIN(length), COUNT(*),"
         f" MIN(length) = MAX(length) AND SUM({_HAS_DATA}) = COUNT(*),"
         " SUM(requests), SUM(successes), SUM(attempts_sum), SUM(attempts_count), SUM(churn),"
         " MAX(lag_max_s), SUM(streams_opened), SUM(stream_seconds)")
# The path rows' record columns and their records.
BLOB_RECORDS = (("outcomes", COUNTS), ("stream_resets", COUNTS), ("latency", LATENCY))


def _roll_paths(conn: sqlite3.Connection, lo: float, hi: float, path: str) -> None:
    """The path rollups of the minutes [lo, hi) made anew from the raw rows, an hour at a
    time: the counts summed in SQLite, the records merged in numpy."""
    conn.execute(f"DELETE FROM {PATH_ROLLUPS} WHERE start >= ? AND start < ?", (lo, hi))
    at = lo
    while at < hi:
        to = min(at + ROLL_S, hi)
        where, args = "start >= ? AND start < ?", [at, to]
        rows = conn.execute(f"SELECT {_SUMS} FROM {_PATH_RAW} WHERE {where}"
                            " GROUP BY m, path_id, cohort_id ORDER BY m, path_id, cohort_id",
                            args).fetchall()
        if rows:
            key_rows = np.array([r[:3] for r in rows], dtype=np.int64)
            merged = []
            for column, record in BLOB_RECORDS:
                found = blobs(conn, _PATH_RAW, column, (stratum_sql(ROLLUP_S), "path_id",
                                                   "cohort_id"), where, args)
                merged.append(merged_records(key_rows, found, record, path, "path windows")
                              if found is not None else [b""] * len(rows))
            conn.executemany(
                f"INSERT INTO {PATH_ROLLUPS} VALUES ({', '.join('?' * 19)})",
                ((r[0] * ROLLUP_S, *r[1:], *b) for r, *b in zip(rows, *merged, strict=True)))
        at = to


PATH_ROLLS = Rolls(_PATH_RAW, "paths_rolled_until", _roll_paths)


def keys(conn: sqlite3.Connection, where: str, args: list[Any], table: str = PATH_ROLLUPS
         ) -> dict[str, npt.NDArray[np.float64]]:
    """The `KEYS` of the rollup rows of `where` (of `table`: the minute rollups, or the
    hour rows) as columns, by start, path and cohort id."""
    a: npt.NDArray[np.float64] = np.fromiter(
        conn.execute(f"SELECT {', '.join(KEYS)} FROM {table} WHERE {where}"
                     " ORDER BY start, path_id, cohort_id", args),
        dtype=np.dtype((np.float64, len(KEYS)))).reshape(-1, len(KEYS)).astype(np.float64)
    return {name: a[:, i].copy() for i, name in enumerate(KEYS)}
