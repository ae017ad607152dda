"""The store's schema (v6), its version check and migration, and the sqlite3 -> store
error mapping.

The schema is versioned in the `meta` table (`application`, `schema_version`) and mirrored
in SQLite's header (`application_id`, `user_version`) so tools can tell the file apart.
A store whose version is newer than this code, or a SQLite file that is not a skewprobe
store, is refused with a StoreError. An older store is migrated in place when opened for
writing (`migrate`), and read as it is when opened read-only.

Versions:
- v1: endpoint windows hold requests and errors.
- v2: endpoint windows also hold their calls' attempts (`attempts_sum`, `attempts_count`)
  and latency histogram (`latency`, as `path_windows.latency`), so the verdict can take the
  pod as the unit for p99 and attempts too. Rows written by v1 keep NULL there: "no
  per-pod data", which the verdict reads as a reason to pool those metrics, never as zero.
- v3: `endpoint_rollups`, the endpoint windows summed per minute (`probes.store._strata`),
  and meta `rolled_until`, up to which they hold every raw row. A cold verdict over a day
  reads its strata from them; a v2 store gets the table empty when opened for writing (the
  writer then rolls the old windows up a few minutes a write), and is read raw when opened
  read-only.
- v4: `path_rollups`, the path windows summed per minute (`probes.store._strata`),
  and meta `paths_rolled_until`, kept and migrated as the endpoint rollups are.
- v5: `endpoint_hours`, the endpoint rollups of each hour in one row (`probes.store._hours`),
  and meta `hours_rolled_until`; a migrated store's hours are rolled by the writer, an hour
  a write.
- v6: `path_hours`, the path rollups of each hour in one row (`probes.store._path_hours`),
  and meta `path_hours_rolled_until`, kept and migrated as the endpoint hours are.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from probes.errors import StoreCorrupt, StoreError
from probes.store._hours import HOUR_TABLE
from probes.store._path_hours import PATH_HOUR_TABLE, PATH_HOURS
from probes.store._strata import HOURS, PATH_ROLLUP_TABLE, PATH_ROLLUPS, ROLLUP_TABLE

__all__ = [
    "ENDPOINT_V2_COLUMNS",
    "SCHEMA_VERSION",
    "UPSERT_WINDOW",
    "check_schema",
    "create_schema",
    "mapped",
    "migrate",
]

SCHEMA_VERSION = 6
_APPLICATION = "skewprobe"
_APPLICATION_ID = 0x736B6577  # "skew": lets file(1) and sqlite tools tell our files apart

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE names (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, name TEXT NOT NULL, UNIQUE (kind, name));
CREATE TABLE path_windows (
    id INTEGER PRIMARY KEY,
    start REAL NOT NULL, path_id INTEGER NOT NULL, cohort_id INTEGER NOT NULL,
    length REAL NOT NULL, requests INTEGER NOT NULL, successes INTEGER NOT NULL,
    attempts_sum INTEGER NOT NULL, attempts_count INTEGER NOT NULL, churn INTEGER NOT NULL,
    lag_max_s REAL NOT NULL, streams_opened INTEGER NOT NULL, stream_seconds REAL NOT NULL,
    -- probes.measure.sparse records: (names.id u16, count u32) for outcomes and
    -- stream_resets, (bucket of probes.measure.histogram u16, count u8) for latency
    outcomes BLOB NOT NULL, stream_resets BLOB NOT NULL, latency BLOB NOT NULL,
    UNIQUE (start, path_id, cohort_id));
CREATE TABLE endpoints (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, labels TEXT NOT NULL, UNIQUE (name, labels));
CREATE TABLE endpoint_windows (
    start REAL NOT NULL, path_id INTEGER NOT NULL, endpoint_id INTEGER NOT NULL,
    cohort_id INTEGER NOT NULL, requests INTEGER NOT NULL, errors INTEGER NOT NULL,
    -- v2, NULL in rows a v1 store wrote (no per-pod attempts and latency then)
    attempts_sum INTEGER, attempts_count INTEGER, latency BLOB,
    PRIMARY KEY (start, path_id, endpoint_id, cohort_id)) WITHOUT ROWID;
CREATE TABLE events (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, path TEXT NOT NULL,
    cohort TEXT NOT NULL, endpoint TEXT NOT NULL, detail TEXT NOT NULL,
    UNIQUE (at, kind, path, cohort, endpoint));
CREATE TABLE inventory_snapshots (at REAL PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE inventory (
    at REAL NOT NULL, namespace TEXT NOT NULL, workload TEXT NOT NULL,
    proxy_version TEXT NOT NULL, pods INTEGER NOT NULL, max_age_s REAL NOT NULL,
    PRIMARY KEY (at, namespace, workload, proxy_version)) WITHOUT ROWID;
""" + ROLLUP_TABLE + ";" + PATH_ROLLUP_TABLE + ";" + HOUR_TABLE + ";" + PATH_HOUR_TABLE

UPSERT_WINDOW = """
INSERT INTO path_windows (start, path_id, cohort_id, length, requests, successes,
    attempts_sum, attempts_count, churn, lag_max_s, streams_opened, stream_seconds,
    outcomes, stream_resets, latency)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (start, path_id, cohort_id) DO UPDATE SET
    length = excluded.length, requests = excluded.requests, successes = excluded.successes,
    attempts_sum = excluded.attempts_sum, attempts_count = excluded.attempts_count,
    churn = excluded.churn, lag_max_s = excluded.lag_max_s,
    streams_opened = excluded.streams_opened, stream_seconds = excluded.stream_seconds,
    outcomes = excluded.outcomes, stream_resets = excluded.stream_resets,
    latency = excluded.latency
"""

# What v2 added to endpoint_windows, in order (`migrate` adds them to a v1 store).
ENDPOINT_V2_COLUMNS = (("attempts_sum", "INTEGER"), ("attempts_count", "INTEGER"),
                       ("latency", "BLOB"))

# SQLite primary result codes (the low byte of extended codes).
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_NOTADB = 26


@contextmanager
def mapped(path: str, action: str) -> Iterator[None]:
    """Translate sqlite3 errors into the store's exceptions, one line each."""
    try:
        yield
    except sqlite3.Error as exc:
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if code == _SQLITE_NOTADB:
            raise StoreCorrupt(f"{path}: {action}: not a SQLite database ({text})") from exc
        if code == _SQLITE_CORRUPT:
            raise StoreCorrupt(f"{path}: {action}: store file is corrupted ({text})") from exc
        if code == _SQLITE_FULL:
            raise StoreError(f"{path}: {action}: disk full ({text})") from exc
        raise StoreError(f"{path}: {action}: {text}") from exc


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: committed if the block ends, rolled back if it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the current schema in an empty database, in one transaction."""
    conn.execute("PRAGMA journal_mode = WAL")
    with _immediate(conn):
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("application", _APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
        )
        conn.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def check_schema(conn: sqlite3.Connection, path: str, tables: set[str]) -> int:
    """Refuse a database that is not a skewprobe store or has a schema we cannot read;
    return its schema version (older than `SCHEMA_VERSION`: `migrate` brings it up)."""
    if "meta" not in tables:
        raise StoreError(f"{path}: a SQLite database but not a skewprobe store")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("application") != _APPLICATION:
        raise StoreError(f"{path}: a SQLite database but not a skewprobe store")
    raw = meta.get("schema_version", "")
    if not raw.isdigit():
        raise StoreError(f"{path}: unknown store schema version {raw!r}")
    version = int(raw)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: store schema v{version} is newer than this skewprobe reads "
            f"(v{SCHEMA_VERSION}); upgrade skewprobe"
        )
    if version < 1:
        raise StoreError(f"{path}: unknown store schema v{version}")
    return version


# Each hour table is rolled from a minute table: hours kept while their minutes are made
# anew (a table dropped, or emptied with its bound) would be rolled again, for a retried
# window or a prune, from minutes not rolled up yet, and read as whole hours all the same.
_HOURS_OF = (("rolled_until", HOURS, "hours_rolled_until"),
             ("paths_rolled_until", PATH_HOURS, "path_hours_rolled_until"))


def hours_orphaned(conn: sqlite3.Connection) -> bool:
    """Whether an hour table's bound stands without its minute table's (see `_HOURS_OF`)."""
    keys = {key for (key,) in conn.execute("SELECT key FROM meta")}
    return any(hours in keys and minutes not in keys for minutes, _, hours in _HOURS_OF)


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring an older store (or one whose rollups were dropped) to the current schema in
    place, in one transaction: the rollups' tables made empty, the writer rolling the old
    windows up a few minutes a write (`_strata.CATCH_UP_S`), read raw until then. The
    version is read again inside it, so two processes opening the same old store migrate it
    once."""
    with _immediate(conn):
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if int(row[0]) < 2:
            for name, kind in ENDPOINT_V2_COLUMNS:
                conn.execute(f"ALTER TABLE endpoint_windows ADD COLUMN {name} {kind}")
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'endpoint_rollups'"
                        ).fetchone() is None:
            conn.execute(ROLLUP_TABLE)
            conn.execute("DELETE FROM meta WHERE key = 'rolled_until'")
        for table, create, key in ((PATH_ROLLUPS, PATH_ROLLUP_TABLE, "paths_rolled_until"),
                                   (HOURS, HOUR_TABLE, "hours_rolled_until"),
                                   (PATH_HOURS, PATH_HOUR_TABLE, "path_hours_rolled_until")):
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)
                            ).fetchone() is None:
                conn.execute(create)
                conn.execute("DELETE FROM meta WHERE key = ?", (key,))
        if hours_orphaned(conn):
            keys = {key for (key,) in conn.execute("SELECT key FROM meta")}
            for minutes, table, hours in _HOURS_OF:
                if minutes not in keys:
                    conn.execute(f"DELETE FROM {table}")
                    conn.execute("DELETE FROM meta WHERE key = ?", (hours,))
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     (str(SCHEMA_VERSION),))
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
