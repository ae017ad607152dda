"""The embedded store: windows, events and inventory snapshots in one SQLite file.

Durability: WAL journal with `synchronous=FULL`; `write` is one transaction, so a window
whose `write` returned survives `kill -9` (and power loss), and a write cut short leaves the
file as it was before it.

Writes replace: writing a window whose (start, path, cohort) key exists replaces the row
(endpoint windows likewise by (start, path, endpoint, cohort)). The aggregator always emits
whole windows, so re-writing after a late call or a retried commit is idempotent and never
double-counts. Events keep the first of equal (at, kind, path, cohort, endpoint); an inventory
snapshot replaces one at the same `at`.

Layout (schema v2, `_schema.py`): names (paths, cohorts, outcome names, reset reasons) are
interned in `names`; outcome and reset counts and the latency histogram are blobs of raw
fixed-width records (`probes.measure.sparse`), which `read_table` decodes a chunk at a time
in numpy: 24 h x 50 paths x 2 cohorts of 10 s windows (864,000 rows, ~340 MB) loads in
about 3 s into ~360 MB of arrays. `read_windows` builds `PathWindow`s (a 15 KB dense latency
tuple each) and is for bounded ranges: ~40 µs a window. Schema v3 and v4 add the endpoint and
path windows' per-minute rollups (`_strata`): `path_rollup_keys` and
`read_path_rollups` give a cold verdict the path windows' whole minutes pooled already.
Schema v5 rolls the endpoint rollups up again per hour (`_hours`): a cold verdict reads a
day's strata and latency records from 20 times fewer rows; schema v6 the path rollups
(`_path_hours`), which `path_rollup_keys` gives whole hours of.

Errors: every sqlite3 error is mapped here to `StoreError` (full disk, locked, unreadable)
or `StoreCorrupt` (not a database, malformed), with a one-line message naming the file.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from probes.errors import StoreCorrupt, StoreError
from probes.measure.histogram import sparse_from_tuple
from probes.measure.sparse import LATENCY, decode, decode_many, encode_latency_map, encode_map
from probes.spec import DEFAULT_STORE_PATH
from probes.store._hours import HOUR_ROLLS, Whole, hour_latency, hour_rows
from probes.store._path_hours import PATH_HOUR_ROLLS, PATH_HOURS
from probes.store._schema import (
    ENDPOINT_V2_COLUMNS,
    SCHEMA_VERSION,
    UPSERT_WINDOW,
    check_schema,
    create_schema,
    hours_orphaned,
    mapped,
    migrate,
)
from probes.store._strata import (
    CATCH_UP_S,
    ENDPOINT_ROLLS,
    HOUR_S,
    HOURS,
    PATH_ROLLS,
    PATH_ROLLUPS,
    ROLLUP_S,
    ROLLUPS,
    TABLE_COLUMNS,
    HourReader,
    Range,
    Rolls,
    keys,
    latency_records,
    minute,
    reroll,
    roll_up,
    rolled_until,
    strata_rows,
    stratum_index,
    within,
)
from probes.store.records import (
    START_EVENTS,
    START_EVENTS_SQL,
    Event,
    InventoryRow,
    InventorySnapshot,
    known_starts,
)
from probes.store.table import (
    EndpointColumns,
    EndpointLatency,
    LatencyRows,
    TableBuilder,
    WindowTable,
)
from probes.types import EndpointWindow, PathWindow

# The rollups' tables: a store without one of them is migrated when opened for writing.
_ROLLUP_TABLES = frozenset({ROLLUPS, PATH_ROLLUPS, HOURS, PATH_HOURS})

__all__ = ["DEFAULT_PATH", "SCHEMA_VERSION", "Store", "StoreMarks", "stratum_index"]

DEFAULT_PATH = DEFAULT_STORE_PATH
_CHUNK = 4096  # small fetches keep buffers in the allocator: 20 % faster than 64k rows
# Endpoint rows whose latency records a cold verdict holds at once (`stream_endpoint_columns`):
# ~9 records a row of 10 calls, 44 bytes each decoded, so about 50 MB a chunk.
LATENCY_CHUNK_ROWS = 32_768
_FAR = 1e300
# An endpoint row's 9 numbers (`_rows_of`) and its latency blob.
_WITH_BLOB = np.dtype([*((f"x{i}", np.float64) for i in range(9)), ("blob", object)])
# Endpoint ids cached by labels object; cleared when it holds this many (label churn).
_OBJECT_CACHE_MAX = 50_000


@dataclass(frozen=True, slots=True)
class StoreMarks:
    """`Store.marks`: the newest path-window row id, the first and newest window starts
    (None: no windows), and how many path windows written after row `after_id` start
    before `before` (written late, under what a reader already holds)."""

    last_id: int
    first_start: float | None
    newest_start: float | None
    first_endpoint_start: float | None
    late: int


def _time_filter(since: float | None, until: float | None) -> tuple[float, float]:
    return (-_FAR if since is None else float(since), _FAR if until is None else float(until))


class Store:
    """One SQLite store file. Open with `Store.open(path)`; usable as a context manager.

    Thread-safe (one lock around the connection), so the engine may write from a worker
    thread while the API reads.
    """

    def __init__(self, conn: sqlite3.Connection, path: str, readonly: bool,
                 version: int = SCHEMA_VERSION, *, rollups: bool = True,
                 path_rollups: bool = True, hours: bool = True,
                 path_hours: bool = True) -> None:
        self._conn = conn
        self._path = path
        self._readonly = readonly
        # Whether the endpoint windows' rollups exist (a v2 store or one whose rollups
        # were dropped, opened read-only, is read raw).
        self._rollups = rollups
        self._path_rollups = path_rollups  # likewise the path windows' (schema v4)
        self._hours = hours  # and the endpoint rollups' per hour (schema v5)
        self._path_hours = path_hours  # and the path rollups' (schema v6)
        # A v1 store opened read-only is read as it is: its endpoint windows lack the v2
        # columns, which its reads then take as NULL.
        self._endpoint_v2 = ", ".join(
            name if version >= 2 else "NULL" for name, _ in ENDPOINT_V2_COLUMNS)
        self._lock = threading.Lock()
        self._names: dict[tuple[str, str], int] = {}
        self._endpoints: dict[tuple[str, str], int] = {}
        self._endpoints_by_object: dict[tuple[str, int], tuple[Any, int]] = {}

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str] = DEFAULT_PATH, readonly: bool = False) -> Store:
        """Open (or, unless `readonly`, create) the store at `path`.

        Raises StoreCorrupt for a file that is not a SQLite database, and StoreError for a
        missing file opened read-only, a database that is not a skewprobe store, or a schema
        newer than this version understands. An older store is migrated in place unless
        `readonly` (then read as it is).
        """
        p = os.fspath(path)
        if readonly and not os.path.exists(p):
            raise StoreError(f"{p}: no store at this path")
        if os.path.isdir(p):
            raise StoreError(f"{p}: is a directory, not a store file")
        with mapped(p, "open"):
            if readonly:
                conn = sqlite3.connect(
                    f"file:{quote(os.path.abspath(p))}?mode=ro",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                conn = sqlite3.connect(p, isolation_level=None, check_same_thread=False)
        version = SCHEMA_VERSION
        try:
            with mapped(p, "open"):
                conn.execute("PRAGMA busy_timeout = 5000")
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
                if not tables:
                    if readonly:
                        raise StoreError(f"{p}: empty file, not a skewprobe store")
                    create_schema(conn)
                else:
                    version = check_schema(conn, p, tables)
                    if not readonly and (version < SCHEMA_VERSION
                                         or not tables >= _ROLLUP_TABLES
                                         or hours_orphaned(conn)):
                        migrate(conn, p)
                        version = SCHEMA_VERSION
                        tables |= _ROLLUP_TABLES
                if not readonly:
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            raise
        return cls(conn, p, readonly, version, rollups=ROLLUPS in tables or not tables,
                   path_rollups=PATH_ROLLUPS in tables or not tables,
                   hours=HOURS in tables or not tables,
                   path_hours=PATH_HOURS in tables or not tables)

    @property
    def path(self) -> str:
        return self._path

    def close(self) -> None:
        with self._lock, mapped(self._path, "close"):
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self) -> None:
        """Run SQLite's quick_check over the whole file; StoreCorrupt if it finds damage."""
        with self._lock, mapped(self._path, "check"):
            rows = self._conn.execute("PRAGMA quick_check").fetchall()
        if [r[0] for r in rows] != ["ok"]:
            raise StoreCorrupt(f"{self._path}: check: {rows[0][0]}")

    # -- writing -------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        if self._readonly:
            raise StoreError(f"{self._path}: {action}: store opened read-only")
        with self._lock, mapped(self._path, action):
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # Ids interned inside the failed transaction are gone with it.
                self._names.clear()
                self._endpoints.clear()
                self._endpoints_by_object.clear()
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _intern(self, conn: sqlite3.Connection, kind: str, name: str) -> int:
        key = (kind, name)
        found = self._names.get(key)
        if found is not None:
            return found
        conn.execute("INSERT OR IGNORE INTO names (kind, name) VALUES (?, ?)", key)
        row = conn.execute("SELECT id FROM names WHERE kind = ? AND name = ?", key).fetchone()
        ident = int(row[0])
        if kind in ("outcome", "reason") and ident >= 2**16:
            raise StoreError(f"{self._path}: too many distinct names to store {name!r}")
        self._names[key] = ident
        return ident

    def _counts_blob(self, conn: sqlite3.Connection, kind: str, counts: Any) -> bytes:
        return encode_map({self._intern(conn, kind, k): v for k, v in counts.items()})

    def write(
        self,
        path_windows: Iterable[PathWindow],
        endpoint_windows: Iterable[EndpointWindow] = (),
        *,
        roll_before: float | None = None,
    ) -> int:
        """Write windows in one transaction, replacing rows with the same key.

        `roll_before`: the endpoint windows' minutes before it are rolled up in the same
        transaction, at most `CATCH_UP_S` of them a write (`probes.store._strata`; the writer
        passes its rewrite horizon), and an
        endpoint window written under a rolled-up minute re-rolls that minute, whatever
        `roll_before` says. Returns the number of path windows written. Raises StoreError
        (full disk, read-only, locked past the busy timeout); nothing of a failed call is
        kept.
        """
        n = 0
        starts: set[float] = set()
        path_starts: set[float] = set()
        with self._transaction("write windows") as conn:
            rows = []
            for w in path_windows:
                path_starts.add(w.start)
                rows.append((
                    w.start, self._intern(conn, "path", w.path),
                    self._intern(conn, "cohort", w.cohort), w.length, w.requests, w.successes,
                    w.attempts_sum, w.attempts_count, w.churn, w.lag_max_s, w.streams_opened,
                    w.stream_seconds, self._counts_blob(conn, "outcome", w.outcomes),
                    self._counts_blob(conn, "reason", w.stream_resets),
                    sparse_from_tuple(w.latency),
                ))
            conn.executemany(UPSERT_WINDOW, rows)
            n = len(rows)
            # A generator, not a list: each row is bound and dropped before the next is
            # made, so thousands of rows never live at once (see `Taken.endpoint_windows`).
            def endpoint_rows() -> Iterator[tuple[Any, ...]]:
                for e in endpoint_windows:
                    starts.add(e.start)
                    yield (e.start, self._intern(conn, "path", e.path),
                           self._endpoint_id(conn, e.endpoint, e.labels),
                           self._intern(conn, "cohort", e.cohort), e.requests, e.errors,
                           e.attempts_sum, e.attempts_count, encode_latency_map(e.latency))

            conn.executemany(
                "INSERT OR REPLACE INTO endpoint_windows (start, path_id, endpoint_id,"
                " cohort_id, requests, errors, attempts_sum, attempts_count, latency)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", endpoint_rows())
            reroll(conn, starts, self._path)
            reroll(conn, starts, self._path, HOUR_ROLLS)  # from the minutes just rolled
            reroll(conn, path_starts, self._path, PATH_ROLLS)
            reroll(conn, path_starts, self._path, PATH_HOUR_ROLLS)
            if roll_before is not None:
                roll_up(conn, roll_before, self._path, most_s=CATCH_UP_S)
                _roll_hours(conn, self._path, most_s=HOUR_S)
                roll_up(conn, roll_before, self._path, most_s=CATCH_UP_S, kind=PATH_ROLLS)
                _roll_hours(conn, self._path, most_s=HOUR_S, kind=PATH_HOUR_ROLLS)
        return n

    def roll_up(self, before: float | None = None) -> None:
        """Roll up the endpoint and path windows' whole minutes before `before` (default:
        each table's newest window's minute) at once, in one transaction: what the writer
        catches up on a few minutes a write (a store prepared ahead of its first cold
        verdict)."""
        with self._transaction("roll up windows") as conn:
            for kind in (ENDPOINT_ROLLS, PATH_ROLLS):
                until = before if before is not None else conn.execute(
                    f"SELECT MAX(start) FROM {kind.raw}").fetchone()[0]
                if until is not None:
                    roll_up(conn, until, self._path, kind=kind)
            _roll_hours(conn, self._path)
            _roll_hours(conn, self._path, kind=PATH_HOUR_ROLLS)

    def _endpoint_id(self, conn: sqlite3.Connection, name: str, labels: Any) -> int:
        # By the labels object first: an endpoint's windows share its labels mapping, and
        # encoding them as JSON for every row was most of a window write at 2,400
        # endpoints. The entry holds the mapping, so its id cannot be reused meanwhile.
        seen = self._endpoints_by_object.get((name, id(labels)))
        if seen is not None and seen[0] is labels:
            return seen[1]
        found = self._endpoint_id_by_value(conn, name, labels)
        if len(self._endpoints_by_object) >= _OBJECT_CACHE_MAX:
            self._endpoints_by_object.clear()  # discovery made new label objects: start over
        self._endpoints_by_object[(name, id(labels))] = (labels, found)
        return found

    def _endpoint_id_by_value(self, conn: sqlite3.Connection, name: str, labels: Any) -> int:
        key = (name, json.dumps(dict(labels), sort_keys=True, separators=(",", ":")))
        found = self._endpoints.get(key)
        if found is None:
            conn.execute("INSERT OR IGNORE INTO endpoints (name, labels) VALUES (?, ?)", key)
            row = conn.execute(
                "SELECT id FROM endpoints WHERE name = ? AND labels = ?", key
            ).fetchone()
            found = self._endpoints[key] = int(row[0])
        return found

    def write_events(self, events: Iterable[Event]) -> None:
        """Record events; an event equal in (at, kind, path, cohort, endpoint) is kept once."""
        rows = []
        for e in events:
            try:
                detail = json.dumps(dict(e.detail), sort_keys=True)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"event {e.kind!r} detail is not JSON: {exc}") from exc
            rows.append((e.at, e.kind, e.path, e.cohort, e.endpoint, detail))
        with self._transaction("write events") as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO events (at, kind, path, cohort, endpoint, detail)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )

    def write_inventory(self, at: float, rows: Iterable[InventoryRow]) -> None:
        """Record the whole inventory at `at` (replacing a snapshot at the same time)."""
        data = [(at, r.namespace, r.workload, r.proxy_version, r.pods, r.max_age_s) for r in rows]
        keys = {d[1:4] for d in data}
        if len(keys) != len(data):
            raise ValueError("inventory rows repeat a (namespace, workload, proxy_version)")
        with self._transaction("write inventory") as conn:
            conn.execute("INSERT OR IGNORE INTO inventory_snapshots VALUES (?)", (at,))
            conn.execute("DELETE FROM inventory WHERE at = ?", (at,))
            conn.executemany("INSERT INTO inventory VALUES (?, ?, ?, ?, ?, ?)", data)

    def prune(self, before: float) -> None:
        """Delete windows, events and inventory snapshots older than `before` (retention).

        The last inventory snapshot before `before` is kept: it is the state at `before`.
        """
        with self._transaction("prune") as conn:
            conn.execute("DELETE FROM path_windows WHERE start < ?", (before,))
            conn.execute("DELETE FROM endpoint_windows WHERE start < ?", (before,))
            conn.execute(f"DELETE FROM {ROLLUPS} WHERE start < ?", (before,))
            reroll(conn, [before], self._path)  # the minute `before` cuts, if it does
            conn.execute(f"DELETE FROM {HOURS} WHERE start < ?", (before,))
            reroll(conn, [before], self._path, HOUR_ROLLS)  # the hour it cuts
            conn.execute(f"DELETE FROM {PATH_ROLLUPS} WHERE start < ?", (before,))
            reroll(conn, [before], self._path, PATH_ROLLS)
            conn.execute(f"DELETE FROM {PATH_HOURS} WHERE start < ?", (before,))
            reroll(conn, [before], self._path, PATH_HOUR_ROLLS)
            conn.execute("DELETE FROM events WHERE at < ?", (before,))
            row = conn.execute(
                "SELECT MAX(at) FROM inventory_snapshots WHERE at <= ?", (before,)
            ).fetchone()
            if row[0] is not None:
                conn.execute("DELETE FROM inventory WHERE at < ?", (row[0],))
                conn.execute("DELETE FROM inventory_snapshots WHERE at < ?", (row[0],))

    # -- reading -------------------------------------------------------------------------

    def _read(self, action: str, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock, mapped(self._path, action):
            return self._conn.execute(sql, args).fetchall()

    def _ids(self, kind: str, names: Iterable[str] | None) -> str:
        """A SQL `IN (...)` list of the ids of `names` (ints only, safe to inline)."""
        if names is None:
            return ""
        wanted = list(names)
        found = self._read(
            "read names",
            f"SELECT id FROM names WHERE kind = ? AND name IN ({','.join('?' * len(wanted))})",
            [kind, *wanted],
        )
        return "(" + ",".join(str(int(r[0])) for r in found) + ")"

    def _where(
        self, since: float | None, until: float | None,
        paths: Iterable[str] | None, cohorts: Iterable[str] | None, table: str = "",
    ) -> tuple[str, list[Any]]:
        lo, hi = _time_filter(since, until)
        t = f"{table}." if table else ""
        where = f"{t}start >= ? AND {t}start < ?"
        path_ids, cohort_ids = self._ids("path", paths), self._ids("cohort", cohorts)
        if path_ids:
            where += f" AND {t}path_id IN {path_ids}"
        if cohort_ids:
            where += f" AND {t}cohort_id IN {cohort_ids}"
        return where, [lo, hi]

    def read_table(
        self,
        since: float | None = None,
        until: float | None = None,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
    ) -> WindowTable:
        """Path windows with start in [since, until) as numpy columns: the bulk read."""
        where, args = self._where(since, until, paths, cohorts)
        with self._read_transaction("read windows") as conn:
            return self._table(conn, "path_windows", TableBuilder.COLUMNS, where, args)

    @contextmanager
    def _read_transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        """One read transaction: what is counted first is what is then fetched."""
        with self._lock, mapped(self._path, action):
            conn = self._conn
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # a read: nothing to keep

    def _table(self, conn: sqlite3.Connection, table: str, select: Sequence[str], where: str,
               args: list[Any]) -> WindowTable:
        """The rows of `table` of `where` (by start, path and cohort id) as a `WindowTable`,
        `select` naming its columns as `TableBuilder.COLUMNS` reads them."""
        names = dict(conn.execute("SELECT id, name FROM names").fetchall())
        sizes = ", ".join(f"COALESCE(SUM(LENGTH({c})), 0)" for c in TableBuilder.blob_columns())
        try:
            counted = conn.execute(
                f"SELECT COUNT(*), {sizes} FROM {table} WHERE {where}", args).fetchone()
            builder = TableBuilder(names, int(counted[0]), [int(x) for x in counted[1:]])
            cur = conn.execute(f"SELECT {', '.join(select)} FROM {table} WHERE {where}"
                               " ORDER BY start, path_id, cohort_id", args)
            while rows := cur.fetchmany(_CHUNK):
                builder.add_rows(rows)
            return builder.build()
        except (ValueError, KeyError) as exc:
            raise StoreCorrupt(f"{self._path}: read windows: malformed row ({exc})") from exc

    def path_rollup_keys(
        self, since: float | None, until: float | None, paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None, *, hours: bool = True,
    ) -> tuple[float, float, dict[str, npt.NDArray[np.float64]], dict[int, str]] | None:
        """The whole minutes [lo, hi) of [since, until) that the path windows' rollups hold
        (schema v4, `probes.store._strata`), their rows' `KEYS` (one row each, `unit` its
        length: the whole hours among them that the hour rows hold, schema v6, as one row
        an hour unless `hours` is False, the other minutes a row each) and the names of
        their ids; None when they hold none of it (read it raw)."""
        if not self._path_rollups:
            return None
        where, args = self._where(since, until, paths, cohorts)
        with self._read_transaction("read path rollups") as conn:
            done = rolled_until(conn, self._path, PATH_ROLLS)
            if done is None:
                return None
            # No lower bound (-inf: the cache before a rollout) stays none.
            lo = math.ceil(args[0] / ROLLUP_S) * ROLLUP_S if math.isfinite(args[0]) else args[0]
            hi = minute(min(args[1], done))
            if not lo < hi:
                return None
            names = dict(conn.execute("SELECT id, name FROM names").fetchall())
            hours_done = rolled_until(conn, self._path, PATH_HOUR_ROLLS) if (
                hours and self._path_hours) else None
            try:
                if hours_done is None:
                    return lo, hi, _united(keys(conn, where, within(args, lo, hi))), names
                h0 = math.ceil(lo / HOUR_S) * HOUR_S if math.isfinite(lo) else lo
                h1 = max(h0, math.floor(min(hi, hours_done) / HOUR_S) * HOUR_S)
                parts = [_united(keys(conn, where, within(args, lo, min(h0, hi)))),
                         _united(keys(conn, where, within(args, h0, h1), PATH_HOURS), HOUR_S),
                         _united(keys(conn, where, within(args, h1, hi)))]
            except (ValueError, TypeError) as exc:  # a key that is not a number
                raise StoreCorrupt(f"{self._path}: read path rollups: malformed row ({exc})"
                                   ) from exc
            return lo, hi, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, names

    def read_path_rollups(
        self, since: float, until: float, paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None, *, hours: bool = False,
    ) -> WindowTable:
        """The path rollups of the minutes [since, until) (with `hours`: the hour rows of
        the hours) as pooled rows, one a minute (an hour), path and cohort (each row's start
        and length its newest window's), in the order of `path_rollup_keys`' rows."""
        where, args = self._where(since, until, paths, cohorts)
        with self._read_transaction("read path rollups") as conn:
            return self._table(conn, PATH_HOURS if hours else PATH_ROLLUPS, TABLE_COLUMNS,
                               where, args)

    def read_windows(
        self,
        since: float | None = None,
        until: float | None = None,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
    ) -> list[PathWindow]:
        """Path windows with start in [since, until), ordered by start, path, cohort.

        Each window carries a dense latency tuple (~15 KB): fine for hours of a few paths;
        for a day of many paths use `read_table`.
        """
        return self.read_table(since, until, paths, cohorts).to_windows()

    def read_endpoint_windows(
        self,
        since: float | None = None,
        until: float | None = None,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
    ) -> list[EndpointWindow]:
        """Endpoint windows with start in [since, until), ordered by start, path, endpoint.
        Rows a v1 store wrote read with no attempts and an empty latency histogram."""
        where, args = self._where(since, until, paths, cohorts, table="w")
        v2 = ", ".join(c if c == "NULL" else f"w.{c}" for c in self._endpoint_v2.split(", "))
        rows = self._read(
            "read endpoint windows",
            f"SELECT w.start, p.name, e.name, c.name, w.requests, w.errors, e.labels, {v2}"
            " FROM endpoint_windows AS w JOIN names AS p ON p.id = w.path_id"
            " JOIN names AS c ON c.id = w.cohort_id JOIN endpoints AS e ON e.id = w.endpoint_id"
            f" WHERE {where}"
            " ORDER BY w.start, p.name, e.name, c.name",
            args,
        )
        return [
            EndpointWindow(start=r[0], path=r[1], endpoint=r[2], cohort=r[3], requests=r[4],
                           errors=r[5], labels=json.loads(r[6]), attempts_sum=r[7] or 0,
                           attempts_count=r[8] or 0, latency=self._histogram(r[9]))
            for r in rows
        ]

    def _histogram(self, blob: bytes | None) -> dict[int, int]:
        if not blob:
            return {}
        try:
            ids, counts = decode(blob, LATENCY)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._path}: read endpoint windows: malformed latency"
                               f" ({exc})") from exc
        out: dict[int, int] = {}
        for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
            out[i] = out.get(i, 0) + c
        return out

    def read_endpoint_columns(
        self,
        since: float | None = None,
        until: float | None = None,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
        *,
        stratum_s: float | None = None,
        latency: bool = False,
    ) -> EndpointColumns:
        """Endpoint windows with start in [since, until) as numpy columns, by start: the
        verdict's bulk read (a rollout's hours of windows for every pod of every path).
        With `stratum_s`, summed in SQLite into strata that long, anchored at multiples of
        it since the epoch (each row's start is its stratum's; `stratum_index`): a day of a
        rollout in a few times fewer rows. With
        `latency`, also the rows' latency histograms (one entry per stored bucket record,
        each at its row's stratum): `stream_endpoint_columns` gives them a chunk at a time."""
        with self.stream_endpoint_columns(since, until, paths, cohorts, stratum_s=stratum_s,
                                          latency=latency) as (cols, chunks):
            parts = list(chunks)
        if not parts:
            return cols
        return replace(cols, latency=EndpointLatency.joined(parts))

    @contextmanager
    def stream_endpoint_columns(
        self,
        since: float | None = None,
        until: float | None = None,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
        *,
        stratum_s: float | None = None,
        latency: bool = True,
        chunk_rows: int | None = None,
        by_row: bool = False,
        whole: Whole | None = None,
    ) -> Iterator[tuple[EndpointColumns, Iterator[Any]]]:
        """`read_endpoint_columns` (its `latency` left empty) and the rows' latency records
        as an iterator of chunks (`EndpointLatency`; `LatencyRows` with `by_row`), each of
        about `chunk_rows` rows' records (`LATENCY_CHUNK_ROWS` unless given), indexed into
        the columns' name tables; both read in one transaction, which lasts while the block
        runs (iterate inside it). A cold verdict folds the chunks into each pod's histogram
        as they come: a day of 12 pods' records held whole was gigabytes (BENCHMARKS.md D23).
        `whole` (with `by_row` and strata of whole minutes): which rows of an hour's rollup
        (`LatencyRows` with `last`) the caller takes whole, asked with the columns this
        yields, its records at the stratum of the first minute that has any; the others'
        minutes are read instead. Without it, every row is one stratum's. Rows not in strata
        that fit one chunk (the running probe's re-read of its last minutes) come with their
        latency in one query."""
        where, args = self._where(since, until, paths, cohorts)
        v2 = self._endpoint_v2.split(", ")
        a_sum, a_count, _ = v2
        rows = max(1, chunk_rows or LATENCY_CHUNK_ROWS)
        with self._lock, mapped(self._path, "read endpoint windows"):
            conn = self._conn
            # One read transaction: every histogram read belongs to a row of counts read.
            conn.execute("BEGIN")
            chunks: Iterator[Any] = iter(())
            try:
                names = dict(conn.execute("SELECT id, name FROM names").fetchall())
                blobs: npt.NDArray[Any] | None = None
                if stratum_s is None:
                    select = ("SELECT start, path_id, endpoint_id, cohort_id, requests, errors,"
                              f" COALESCE({a_sum}, 0), COALESCE({a_count}, 0),"
                              f" {a_count} IS NULL{{}} FROM endpoint_windows WHERE {where}"
                              " ORDER BY start")
                    if latency and a_sum != "NULL" and conn.execute(
                            f"SELECT COUNT(*) FROM endpoint_windows WHERE {where}",
                            args).fetchone()[0] <= rows:
                        # At most a chunk's rows (the running probe's re-read of its last
                        # minutes): their latency in the same pass, not a second query.
                        a, blobs = _rows_with_blobs(
                            conn, select.format(", COALESCE(latency, X'')"), args)
                    else:
                        a = _rows_of(conn, select.format(""), args)
                    ranges: list[Range] = []
                else:
                    # Whole minutes from the rollups where the store has them.
                    rolled = rolled_until(conn, self._path) if self._rollups else None
                    hours_done = rolled_until(conn, self._path, HOUR_ROLLS) if (
                        self._hours) else None
                    hours = None if hours_done is None or rolled is None else HourReader(
                        min(hours_done, rolled), hour_rows(self._path))
                    a, ranges = strata_rows(conn, where, args, float(stratum_s),
                                            (a_sum, a_count, v2[2]), rows, rolled, hours)
                endpoint_rows = conn.execute("SELECT id, name, labels FROM endpoints").fetchall()
                started_of = np.full(max((r[0] for r in endpoint_rows), default=0) + 1, np.nan)
                for i, _, labels in endpoint_rows:
                    started_of[i] = _started(labels)
                # What the probe saw of pods' starts, for rows without a start_time label
                # (read only if some endpoint has none: Kubernetes' pods all have one).
                start_events = conn.execute(START_EVENTS_SQL, START_EVENTS).fetchall() if (
                    len(a) and np.isnan(started_of[a[:, 2].astype(np.int64)]).any()) else []
                cols, ids = _endpoint_columns(a, names, endpoint_rows, started_of, start_events)
                if latency and a_sum != "NULL" and len(a):
                    lookups = (*(_positions(i, idx) for i, idx in zip(
                        ids, (cols.path, cols.endpoint, cols.cohort), strict=True)), started_of,
                        cols.endpoints, cols.cohorts, start_events)
                    chunks = (self._latency_once(a, blobs, lookups) if blobs is not None
                              else self._latency_rows(conn.execute(
                        "SELECT latency, start, path_id, endpoint_id, cohort_id FROM"
                        f" endpoint_windows WHERE {where} AND LENGTH(latency) > 0", args),
                        lookups, rows) if stratum_s is None else self._latency_strata(
                        conn, where, args, float(stratum_s), ranges, lookups,
                        functools.partial(whole, cols) if whole and by_row else None))
                    if not by_row:
                        chunks = _expanded(chunks)
                # What the rows were read into is let go before the chunks come: a day of
                # strata is tens of MB (BENCHMARKS.md D23).
                del a, ids, blobs
                yield cols, chunks
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # a chunk iterator left part-read: its cursor goes first
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # a read: nothing to keep

    def _latency_rows(self, cursor: sqlite3.Cursor, lookups: tuple[Any, ...], chunk_rows: int
                      ) -> Iterator[LatencyRows]:
        """The latency records of `cursor`'s rows (blob, start, path, endpoint and cohort
        ids), `chunk_rows` rows at a time, indexed by `lookups` (`_records`)."""
        try:
            while batch := cursor.fetchmany(chunk_rows):
                b = np.array([r[1:] for r in batch], dtype=np.float64)
                yield self._records([r[0] for r in batch], b[:, 0],
                                    b[:, 1:4].astype(np.int64), lookups)
        finally:
            cursor.close()

    def _latency_once(self, a: npt.NDArray[np.float64], blobs: npt.NDArray[Any],
                      lookups: tuple[Any, ...]) -> Iterator[LatencyRows]:
        """`_latency_rows` of rows read with their blobs (`_rows_with_blobs`): one chunk,
        the rows with records, in the rows' order."""
        has = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs)) > 0
        if has.any():
            yield self._records(blobs[has].tolist(), a[has, 0], a[has, 1:4].astype(np.int64),
                                lookups)

    def _latency_strata(self, conn: sqlite3.Connection, where: str, args: list[Any],
                        stratum_s: float, ranges: Sequence[Range],
                        lookups: tuple[Any, ...],
                        whole: Callable[[LatencyRows], npt.NDArray[np.bool_]] | None = None
                        ) -> Iterator[LatencyRows]:
        """The latency records of the rows in `ranges` (of start, each from its table: raw
        windows or rollups), a range at a time, each at its row's stratum; an hour's rows
        those `whole` takes (`stream_endpoint_columns`), else its minutes'."""
        for table, lo, hi in ranges:
            if table == HOURS and whole is not None:
                yield from hour_latency(
                    conn, where, within(args, lo, hi), self._path, stratum_s,
                    lambda rec, start, ids, per: self._records(
                        [rec.tobytes()], start, ids, lookups, per=per), whole)
                continue
            found = latency_records(conn, ROLLUPS if table == HOURS else table, where,
                                    within(args, lo, hi), stratum_s, self._path)
            if found is not None:
                blob, per, key = found
                yield self._records([blob], stratum_s * key[:, 0], key[:, 1:], lookups,
                                    per=per)

    def _records(self, blobs: list[bytes], start: Any, ids: Any, lookups: tuple[Any, ...],
                 per: Any = None) -> LatencyRows:
        """The records of `blobs` (one a row, or all rows' joined with `per` records a row),
        each at its row's `start` and stored (path, endpoint, cohort) `ids`, indexed by
        `lookups` (stored id -> name index for each, stored endpoint id -> start time, and
        what `known_starts` reads for rows without one)."""
        try:
            ptr, bucket, count = decode_many(blobs, LATENCY)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._path}: read endpoint windows: malformed latency"
                               f" ({exc})") from exc
        n = np.diff(ptr) if per is None else per
        p_lookup, e_lookup, c_lookup, started_of, endpoints, cohorts, events = lookups
        endpoint, cohort = e_lookup[ids[:, 1]], c_lookup[ids[:, 2]]
        started = known_starts(started_of[ids[:, 1]], start, endpoint, cohort, endpoints,
                               cohorts, events)
        return LatencyRows(
            start=np.asarray(start, dtype=np.float64), path=p_lookup[ids[:, 0]],
            endpoint=endpoint, cohort=cohort, started=started, per=np.asarray(n, np.int64),
            bucket=bucket.astype(np.int64), count=count.astype(np.int64))

    def read_endpoint_totals(
        self,
        since: float | None = None,
        until: float | None = None,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
        *,
        endpoints: Iterable[str] | None = None,
        failing_only: bool = False,
    ) -> list[EndpointWindow]:
        """Endpoint windows with start in [since, until) summed per (path, endpoint, cohort).

        One `EndpointWindow` per group, its `start` the group's earliest window, ordered by
        path, endpoint, cohort: the bulk form for reports (a day of 50 paths x 6 pods is 2.6
        million endpoint windows). `endpoints` keeps only those endpoint names.
        `failing_only` sums only the windows that had errors: the error counts are exact and
        the call is fast (most windows have none), but `requests` then counts only calls of
        those windows; use it to find the failing endpoints, then ask for them by name.
        """
        where, args = self._where(since, until, paths, cohorts)
        if endpoints is not None:
            names = list(endpoints)
            found = self._read(
                "read endpoints",
                f"SELECT id FROM endpoints WHERE name IN ({','.join('?' * len(names))})",
                names,
            )
            where += " AND endpoint_id IN (" + ",".join(str(int(r[0])) for r in found) + ")"
        if failing_only:
            where += " AND errors > 0"
        rows = self._read(
            "read endpoint totals",
            "SELECT g.first, p.name, e.name, c.name, g.requests, g.errors, e.labels FROM ("
            " SELECT path_id, endpoint_id, cohort_id, MIN(start) AS first,"
            " SUM(requests) AS requests, SUM(errors) AS errors FROM endpoint_windows"
            f" WHERE {where} GROUP BY path_id, endpoint_id, cohort_id) AS g"
            " JOIN names AS p ON p.id = g.path_id JOIN names AS c ON c.id = g.cohort_id"
            " JOIN endpoints AS e ON e.id = g.endpoint_id ORDER BY p.name, e.name, c.name",
            args,
        )
        return [
            EndpointWindow(start=r[0], path=r[1], endpoint=r[2], cohort=r[3], requests=r[4],
                           errors=r[5], labels=json.loads(r[6]))
            for r in rows
        ]

    def marks(self, after_id: int = 0, before: float = -_FAR) -> StoreMarks:
        """What a reader that keeps windows in memory checks before trusting them
        (`probes.verdict.cache`), in one cheap read: see `StoreMarks`."""
        row = self._read(
            "read marks",
            "SELECT (SELECT MAX(id) FROM path_windows), (SELECT MIN(start) FROM path_windows),"
            " (SELECT MAX(start) FROM path_windows), (SELECT MIN(start) FROM endpoint_windows),"
            # `+start`: by row id, the rows written since; the start index would walk them all.
            " (SELECT COUNT(*) FROM path_windows WHERE id > ? AND +start < ?)",
            (int(after_id), float(before)),
        )[0]
        return StoreMarks(int(row[0] or 0), row[1], row[2], row[3], int(row[4]))

    def paths(self) -> list[str]:
        """Every path that has windows, sorted."""
        return self._names_in("path")

    def cohorts(self) -> list[str]:
        """Every cohort that has windows, sorted."""
        return self._names_in("cohort")

    def _names_in(self, kind: str) -> list[str]:
        col = f"{kind}_id"
        return [
            r[0]
            for r in self._read(
                f"read {kind}s",
                f"SELECT name FROM names WHERE kind = ? AND (EXISTS (SELECT 1 FROM path_windows"
                f" WHERE {col} = names.id) OR EXISTS (SELECT 1 FROM endpoint_windows"
                f" WHERE {col} = names.id)) ORDER BY name",
                (kind,),
            )
        ]

    def newest_window_end(self, until: float | None = None) -> float | None:
        """When the newest path window ended (None: no windows): a probe that writes this
        store is running if it is recent. `until`: among the windows ended by then."""
        _, hi = _time_filter(None, until)
        row = self._read("read windows",
                         "SELECT MAX(start + length) FROM path_windows WHERE start + length <= ?",
                         (hi,))
        return None if not row or row[0][0] is None else float(row[0][0])

    def lateness(self, since: float, until: float) -> tuple[float, int]:
        """Over the path windows that share time with [since, until): the largest send
        lateness (`lag_max_s`) and how many window starts there are."""
        row = self._read("read lateness",
                         "SELECT MAX(lag_max_s), COUNT(DISTINCT start) FROM path_windows"
                         " WHERE start < ? AND start + length > ?", (until, since))
        return (0.0 if not row or row[0][0] is None else float(row[0][0]),
                int(row[0][1]) if row else 0)

    def first_window(self, cohort: str, since: float | None = None) -> float | None:
        """Start of the earliest window of `cohort` at or after `since` (None: no data).

        A verdict's sequential test starts where the canary cohort first appeared, a time
        that stays fixed while the rollout runs, so every later look is covered.
        """
        lo, _ = _time_filter(since, None)
        row = self._read(
            "read first window",
            "SELECT MIN(w.start) FROM path_windows w JOIN names n ON n.id = w.cohort_id"
            " WHERE n.kind = 'cohort' AND n.name = ? AND w.start >= ?",
            (cohort, lo),
        )
        return None if row[0][0] is None else float(row[0][0])

    def window_span(self, since: float | None = None, until: float | None = None,
                    paths: Iterable[str] | None = None, cohorts: Iterable[str] | None = None,
                    ) -> tuple[float, float, int] | None:
        """(first start, last start, rows) of the path windows with start in [since,
        until); None when there are none."""
        where, args = self._where(since, until, paths, cohorts)
        row = self._read("read windows", "SELECT MIN(start), MAX(start), COUNT(*) FROM"
                         f" path_windows WHERE {where}", args)[0]
        return None if row[0] is None else (float(row[0]), float(row[1]), int(row[2]))

    def time_range(self) -> tuple[float, float] | None:
        """(start of the first window, end of the last), or None for a store with no windows."""
        first = self._read("read time range", "SELECT MIN(start) FROM path_windows")[0][0]
        if first is None:
            return None
        last = self._read(
            "read time range",
            "SELECT start + length FROM path_windows ORDER BY start DESC LIMIT 1",
        )[0][0]
        return float(first), float(last)

    def read_events(
        self,
        since: float | None = None,
        until: float | None = None,
        kinds: Iterable[str] | None = None,
        paths: Iterable[str] | None = None,
    ) -> list[Event]:
        """Events with `at` in [since, until), ordered by time."""
        lo, hi = _time_filter(since, until)
        sql = "SELECT kind, at, path, cohort, endpoint, detail FROM events WHERE at >= ? AND at < ?"
        args: list[Any] = [lo, hi]
        for col, values in (("kind", kinds), ("path", paths)):
            if values is not None:
                vals = list(values)
                sql += f" AND {col} IN ({','.join('?' * len(vals))})"
                args += vals
        rows = self._read("read events", sql + " ORDER BY at, id", args)
        return [Event(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    def read_inventory(
        self, since: float | None = None, until: float | None = None
    ) -> list[InventorySnapshot]:
        """Snapshots with `at` in [since, until), preceded by the last one before `since`.

        The extra leading snapshot is the inventory in force at `since`, so a chart of the
        rollout's progress starts from the right state.
        """
        lo, hi = _time_filter(since, until)
        first = self._read(
            "read inventory", "SELECT MAX(at) FROM inventory_snapshots WHERE at <= ?", (lo,)
        )[0][0]
        lo = first if first is not None else lo
        times = [r[0] for r in self._read(
            "read inventory",
            "SELECT at FROM inventory_snapshots WHERE at >= ? AND at < ? ORDER BY at", (lo, hi),
        )]
        rows = self._read(
            "read inventory",
            "SELECT at, namespace, workload, proxy_version, pods, max_age_s FROM inventory"
            " WHERE at >= ? AND at < ? ORDER BY at, namespace, workload, proxy_version",
            (lo, hi),
        )
        by_time: dict[float, list[InventoryRow]] = {t: [] for t in times}
        for r in rows:
            by_time[r[0]].append(InventoryRow(r[1], r[2], r[3], r[4], r[5]))
        return [InventorySnapshot(t, tuple(by_time[t])) for t in times]


def _united(k: dict[str, npt.NDArray[np.float64]], unit: float = ROLLUP_S
            ) -> dict[str, npt.NDArray[np.float64]]:
    """Rollup keys with their rows' length of time (`unit`) as a column."""
    k["unit"] = np.full(len(k["start"]), unit)
    return k


def _roll_hours(conn: sqlite3.Connection, path: str, most_s: float | None = None,
                kind: Rolls = HOUR_ROLLS) -> None:
    """The hours whose minutes are all rolled up, rolled up in turn (`kind`: the endpoint
    hours, `_hours`, or the path hours, `_path_hours`)."""
    minutes = rolled_until(conn, path, PATH_ROLLS if kind is PATH_HOUR_ROLLS else None)
    if minutes is not None:
        roll_up(conn, minutes, path, most_s=most_s, kind=kind)


def _rows_of(conn: sqlite3.Connection, select: str, args: Sequence[Any]
             ) -> npt.NDArray[np.float64]:
    """The rows of `select` (9 numbers each) as one array."""
    # Rows streamed into arrays, never held as a list of tuples: tens of thousands of live
    # tuples would make the running probe's collector walk them while its event loop
    # waits (BENCHMARKS.md D15).
    return np.fromiter(conn.execute(select, args), dtype=np.dtype((np.float64, 9))
                       ).astype(np.float64, copy=False)


def _rows_with_blobs(conn: sqlite3.Connection, select: str, args: Sequence[Any]
                     ) -> tuple[npt.NDArray[np.float64], npt.NDArray[Any]]:
    """The rows of `select` (9 numbers and a blob, never NULL, each) as `_rows_of`'s
    array and the blobs."""
    got = np.fromiter(conn.execute(select, args), dtype=_WITH_BLOB)
    return np.stack([got[f"x{i}"] for i in range(9)], axis=1), got["blob"]


def _endpoint_columns(a: npt.NDArray[np.float64], names: Mapping[int, str],
                      endpoint_rows: Sequence[tuple[int, str, str]], started_of: Any,
                      start_events: Sequence[tuple[str, str, float, str]]
                      ) -> tuple[EndpointColumns, tuple[Any, Any, Any]]:
    """The endpoint rows `a` (start, path, endpoint and cohort ids, requests, errors,
    attempts sum and count, unrecorded) as `EndpointColumns` without latency, and the rows'
    stored (path, endpoint, cohort) ids; each row's pod start from `started_of` (by stored
    endpoint id) or else `start_events` (`known_starts`)."""
    endpoint_names = {i: name for i, name, _ in endpoint_rows}
    if len(a):
        start, path_id, endpoint_id, cohort_id = a[:, 0].copy(), *a[:, 1:4].astype(np.int64).T
        requests, errors, attempts_sum, attempts_count, unrecorded = (
            a[:, k].astype(np.int64) for k in range(4, 9))
    else:
        start = np.zeros(0)
        path_id = endpoint_id = cohort_id = requests = errors = np.zeros(0, dtype=np.int64)
        attempts_sum = attempts_count = unrecorded = requests

    def index(ids: Any, name_of: Mapping[int, str]) -> tuple[tuple[str, ...], Any]:
        # Two endpoint ids may share a name (different labels): one pod either way.
        present = np.unique(ids)
        found = sorted({name_of[int(i)] for i in present})
        position = {n: k for k, n in enumerate(found)}
        lookup = np.zeros(int(present.max()) + 1 if present.size else 1, dtype=np.int32)
        for i in present:
            lookup[i] = position[name_of[int(i)]]
        return tuple(found), lookup[ids]

    path_names, path = index(path_id, names)
    endpoints, endpoint = index(endpoint_id, endpoint_names)
    cohort_names, cohort = index(cohort_id, names)
    return EndpointColumns(
        paths=path_names, endpoints=endpoints, cohorts=cohort_names, start=start,
        path=path, endpoint=endpoint, cohort=cohort, requests=requests, errors=errors,
        started=known_starts(started_of[endpoint_id], start, endpoint, cohort, endpoints,
                             cohort_names, start_events), attempts_sum=attempts_sum,
        attempts_count=attempts_count, unrecorded=unrecorded, latency=EndpointLatency.empty(),
    ), (path_id, endpoint_id, cohort_id)


def _expanded(chunks: Iterator[LatencyRows]) -> Iterator[EndpointLatency]:
    """`chunks` one entry a record (`LatencyRows.expanded`); closing it closes them."""
    try:
        for chunk in chunks:
            yield chunk.expanded()
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _positions(ids: Any, index: Any) -> Any:
    """A lookup array from stored ids to the name indices `index` gave the same rows."""
    out = np.zeros(int(ids.max()) + 1 if len(ids) else 1, dtype=np.int32)
    out[ids] = index
    return out


def _started(labels: str) -> float:
    """The `start_time` label of an endpoint's stored labels (RFC 3339, as the Kubernetes API
    writes it) as epoch seconds; NaN when absent or not such a time (the verdict then counts
    a pod's warm-up from its first window)."""
    try:
        text = json.loads(labels).get("start_time")
        when = datetime.fromisoformat(text) if isinstance(text, str) and text else None
    except (ValueError, AttributeError):
        return math.nan
    return when.timestamp() if when is not None and when.tzinfo is not None else math.nan
