"""The path windows' 60 s rollups (schema v4): one row per minute, path and cohort, its
windows summed as a pooled row of the verdict sums them (`probes.store.columns.reduce`):
counts added, `lag_max_s` the largest, the latency, outcome and reset records merged per id,
and `last` / `length` the newest window's, `first` the oldest's start.

A cold verdict pools a day of path windows into a few hundred rows; a minute's rollup is
such a pooled row already, so it reads six times fewer rows (`probes.verdict.cache`,
`pooled_windows`). It uses a rollup only where pooling the minute's windows is what the raw
read would do: `regular` says every window of it had data and the same length (else the
minute is read raw), and the reader reads raw the minutes that a cut of the verdict's falls
into. What keeps them true is the endpoint rollups' machinery (`probes.store._strata`:
`roll_up`, `reroll`, `CATCH_UP_S`), under meta `paths_rolled_until`.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure.sparse import COUNTS, LATENCY
from probes.store._strata import ROLL_S, ROLLUP_S, Rolls, blobs, merged_records, stratum_sql

__all__ = ["KEYS", "PATH_ROLLS", "PATH_ROLLUPS", "PATH_ROLLUP_TABLE", "TABLE_COLUMNS", "keys"]

PATH_ROLLUPS = "path_rollups"
_RAW = "path_windows"

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
_BLOBS = (("outcomes", COUNTS), ("stream_resets", COUNTS), ("latency", LATENCY))


def _roll(conn: sqlite3.Connection, lo: float, hi: float, path: str) -> None:
    """The path rollups of the minutes [lo, hi) made anew from the raw rows, an hour at a
    time: the counts summed in SQLite, the records merged in numpy."""
    conn.execute(f"DELETE FROM {PATH_ROLLUPS} WHERE start >= ? AND start < ?", (lo, hi))
    at = lo
    while at < hi:
        to = min(at + ROLL_S, hi)
        where, args = "start >= ? AND start < ?", [at, to]
        rows = conn.execute(f"SELECT {_SUMS} FROM {_RAW} WHERE {where}"
                            " GROUP BY m, path_id, cohort_id ORDER BY m, path_id, cohort_id",
                            args).fetchall()
        if rows:
            key_rows = np.array([r[:3] for r in rows], dtype=np.int64)
            merged = []
            for column, record in _BLOBS:
                found = blobs(conn, _RAW, column, (stratum_sql(ROLLUP_S), "path_id",
                                                   "cohort_id"), where, args)
                merged.append(merged_records(key_rows, found, record, path, "path windows")
                              if found is not None else [b""] * len(rows))
            conn.executemany(
                f"INSERT INTO {PATH_ROLLUPS} VALUES ({', '.join('?' * 19)})",
                ((r[0] * ROLLUP_S, *r[1:], *b) for r, *b in zip(rows, *merged, strict=True)))
        at = to


PATH_ROLLS = Rolls(_RAW, "paths_rolled_until", _roll)


def keys(conn: sqlite3.Connection, where: str, args: list[Any]
         ) -> dict[str, npt.NDArray[np.float64]]:
    """The `KEYS` of the rollup rows of `where` as columns, by start, path and cohort id."""
    a: npt.NDArray[np.float64] = np.fromiter(
        conn.execute(f"SELECT {', '.join(KEYS)} FROM {PATH_ROLLUPS} WHERE {where}"
                     " ORDER BY start, path_id, cohort_id", args),
        dtype=np.dtype((np.float64, len(KEYS)))).reshape(-1, len(KEYS)).astype(np.float64)
    return {name: a[:, i].copy() for i, name in enumerate(KEYS)}
