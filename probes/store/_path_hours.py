"""The path windows' minute rollups rolled up again per hour (schema v6): one row per hour,
path and cohort, its minutes pooled as the verdict pools rows (`probes.store.columns.reduce`):
counts added, `lag_max_s` the largest, the outcome, reset and latency records merged per
id, `first` the oldest window's start, `last` the newest's.

A cold verdict over a day reads 60 times fewer path rows where an hour row stands for its
minutes: `regular` says every minute of it is regular and its windows all one length, and
the reader (`probes.verdict.pooling`) reads the hour's minutes instead wherever a cut of the
verdict's pooling or an overload span falls inside it.

Kept as the endpoint hours are (`probes.store._strata.Rolls`): meta `path_hours_rolled_until`
(an hour's start) says every path minute rollup before it is in an hour row; the writer rolls
an hour once its minutes are rolled up, at most one a write; a minute rolled again under it
re-rolls its hour; a prune deletes hour rows with their minutes and rolls the hour it cuts
anew.
"""

from __future__ import annotations

import sqlite3

import numpy as np

from probes.store._strata import (
    BLOB_RECORDS,
    HOUR_S,
    PATH_ROLLUP_TABLE,
    PATH_ROLLUPS,
    Rolls,
    blobs,
    merged_records,
)

__all__ = ["PATH_HOURS", "PATH_HOUR_ROLLS", "PATH_HOUR_TABLE"]

PATH_HOURS = "path_hours"

# As the minute rollups' table, a row an hour: `first` and `last` its oldest and newest
# window's start, `regular` 1 where every window of the hour had data and one length.
PATH_HOUR_TABLE = PATH_ROLLUP_TABLE.replace(f"CREATE TABLE {PATH_ROLLUPS}",
                                            f"CREATE TABLE {PATH_HOURS}", 1)

_SPAN = "start >= ? AND start < ?"
_SUMS = ("path_id, cohort_id, MIN(first), MAX(last), MIN(length), SUM(windows),"
         " MIN(regular) AND MIN(length) = MAX(length),"
         " SUM(requests), SUM(successes), SUM(attempts_sum), SUM(attempts_count), SUM(churn),"
         " MAX(lag_max_s), SUM(streams_opened), SUM(stream_seconds)")


def _roll_path_hours(conn: sqlite3.Connection, lo: float, hi: float, path: str) -> None:
    """The path hour rows of the hours [lo, hi) made anew from the minute rollups, an hour
    at a time: the counts summed in SQLite, the records merged in numpy."""
    conn.execute(f"DELETE FROM {PATH_HOURS} WHERE {_SPAN}", (lo, hi))
    for at in np.arange(lo, hi, HOUR_S).tolist():
        args = [at, at + HOUR_S]
        rows = conn.execute(f"SELECT {_SUMS} FROM {PATH_ROLLUPS} WHERE {_SPAN}"
                            " GROUP BY path_id, cohort_id ORDER BY path_id, cohort_id",
                            args).fetchall()
        if not rows:
            continue
        key_rows = np.array([(0, *r[:2]) for r in rows], dtype=np.int64)
        merged = []
        for column, record in BLOB_RECORDS:
            found = blobs(conn, PATH_ROLLUPS, column, ("0", "path_id", "cohort_id"), _SPAN,
                          args)
            merged.append(merged_records(key_rows, found, record, path, "path rollups")
                          if found is not None else [b""] * len(rows))
        conn.executemany(
            f"INSERT INTO {PATH_HOURS} VALUES ({', '.join('?' * 19)})",
            ((at, *r, *b) for r, *b in zip(rows, *merged, strict=True)))


# Hours roll from the path minute rollups, one a write at most (once an hour for a running
# probe; a migrated store's hours an hour a write).
PATH_HOUR_ROLLS = Rolls(PATH_ROLLUPS, "path_hours_rolled_until", _roll_path_hours, unit=HOUR_S)
