"""The endpoint windows' 60 s rollups (schema v3): one row per minute, path, endpoint and
cohort, its windows' counts summed and their latency records merged per bucket.

A cold verdict over a day reads its strata (whole minutes from the epoch) from them, six
times fewer rows than the windows (`probes.store._strata.segments`). What keeps them
true: meta `rolled_until` (a minute's start) says every raw row before it is rolled up;
the writer rolls the minutes past its rewrite horizon in the transaction that writes a
window (`roll_up`), a window written under `rolled_until` (a retry) re-rolls its minute in
that transaction (`reroll`), and a prune deletes rollups with the rows. A store without
`rolled_until` is read raw.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from probes.errors import StoreCorrupt
from probes.measure.sparse import LATENCY
from probes.store._strata import (
    RAW,
    ROLLUP_S,
    ROLLUPS,
    latency_blobs,
    strata_rows,
)

__all__ = ["ROLLUP_TABLE", "reroll", "roll", "roll_up", "rolled_until"]

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
_ROLL_S = 3600.0
_COUNT_MAX = int(np.iinfo(LATENCY["c"]).max)  # a larger merged count takes several records


def _minute(t: float) -> float:
    return math.floor(t / ROLLUP_S) * ROLLUP_S


def rolled_until(conn: sqlite3.Connection, path: str) -> float | None:
    """Meta `rolled_until`: every raw row before it is in a rollup (None: none is)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'rolled_until'").fetchone()
    if row is None:
        return None
    try:
        return float(row[0])
    except ValueError:
        raise StoreCorrupt(f"{path}: meta rolled_until {row[0]!r} is not a time") from None


def roll_up(conn: sqlite3.Connection, before: float, path: str) -> None:
    """Roll up every whole minute before `before` not rolled up yet (inside the caller's
    write transaction)."""
    end = _minute(before)
    done = rolled_until(conn, path)
    if done is None:
        first = conn.execute(f"SELECT MIN(start) FROM {RAW}").fetchone()[0]
        done = end if first is None else min(_minute(first), end)
    if end <= done:
        return
    roll(conn, done, end, path)
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('rolled_until', ?)",
                 (repr(end),))


def reroll(conn: sqlite3.Connection, starts: Iterable[float], path: str) -> None:
    """Roll up again the minutes of raw rows just written at `starts` that lie under
    `rolled_until` (a window written again late, a prune that cut a minute)."""
    done = rolled_until(conn, path)
    if done is None:
        return
    for m in sorted({_minute(t) for t in starts if t < done}):
        roll(conn, m, m + ROLLUP_S, path)


def roll(conn: sqlite3.Connection, lo: float, hi: float, path: str) -> None:
    """The rollups of the minutes [lo, hi) made anew from the raw rows, an hour at a time."""
    conn.execute(f"DELETE FROM {ROLLUPS} WHERE start >= ? AND start < ?", (lo, hi))
    at = lo
    while at < hi:
        to = min(at + _ROLL_S, hi)
        args: list[float] = [at, to]
        rows, _ = strata_rows(conn, "start >= ? AND start < ?", args, ROLLUP_S, _V2,
                              rows=1 << 30)
        if len(rows):
            found = latency_blobs(conn, RAW, "start >= ? AND start < ?", args, ROLLUP_S)
            blobs = _merged(rows, found, path) if found is not None else [b""] * len(rows)
            conn.executemany(
                f"INSERT INTO {ROLLUPS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ((t, *r, b) for t, r, b in zip(rows[:, 0].tolist(),
                                               rows[:, 1:].astype(np.int64).tolist(),
                                               blobs, strict=True)))
        at = to


def _merged(rows: npt.NDArray[np.float64],
            found: tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.int64]], path: str
            ) -> list[bytes]:
    """Per row of `rows` (`strata_rows` of one range, in minutes), its raw windows' latency
    records (`latency_blobs` of the same range) merged per bucket, as a blob."""
    blob, size, keys = found
    if np.any(size % LATENCY.itemsize):
        raise StoreCorrupt(f"{path}: roll up endpoint windows: malformed latency (sparse"
                           " blob is not a whole number of records)")
    rec = np.frombuffer(blob, dtype=LATENCY)
    per = size // LATENCY.itemsize
    # Each record's row of `rows`: the keys in dense ranks (`rows` is sorted by them, so
    # their mixed-radix codes are increasing), then searched.
    key_rows = np.column_stack([rows[:, 0] // ROLLUP_S, rows[:, 1:4]]).astype(np.int64)
    codes = np.zeros(len(rows), dtype=np.int64)
    record_codes = np.zeros(len(keys), dtype=np.int64)
    for j in range(4):
        present = np.unique(key_rows[:, j])
        codes = codes * len(present) + np.searchsorted(present, key_rows[:, j])
        record_codes = record_codes * len(present) + np.searchsorted(present, keys[:, j])
    row = np.repeat(np.searchsorted(codes, record_codes), per)
    # Summed per (row, bucket), in order; a count over a record's u8 split as the
    # store's writer splits it (`probes.measure.sparse.encode`).
    cell = row * (1 << 16) + rec["i"]
    order = np.argsort(cell, kind="stable")
    cell = cell[order]
    new = np.ones(len(cell), dtype=bool)
    new[1:] = cell[1:] != cell[:-1]
    at = np.flatnonzero(new)
    total = np.add.reduceat(rec["c"][order].astype(np.int64), at)
    cell = cell[at]
    parts = (total + _COUNT_MAX - 1) // _COUNT_MAX
    entry = np.repeat(np.arange(len(cell)), parts)
    k = np.arange(len(entry)) - np.repeat(np.cumsum(parts) - parts, parts)
    out = np.empty(len(entry), dtype=LATENCY)
    out["i"] = cell[entry] & 0xFFFF
    out["c"] = np.minimum(_COUNT_MAX, total[entry] - _COUNT_MAX * k)
    bounds = np.searchsorted(cell[entry] >> 16, np.arange(len(rows) + 1)) * LATENCY.itemsize
    data = out.tobytes()
    return [data[bounds[i]:bounds[i + 1]] for i in range(len(rows))]
