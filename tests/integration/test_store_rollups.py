"""The endpoint windows' 60 s rollups (schema v3, `probes.store._strata`) and the path
windows' (v4, `probes.store._strata`): each holds its minute's windows summed, records
merged per id; the writer rolls minutes past its horizon, a window written again under them
re-rolls its minute, a prune deletes them with the rows, an older store is migrated when
opened for writing (read raw read-only) and rolled up by the writer a few minutes a write,
and a damaged rollup is refused in one line. The path windows a verdict pools from them
(`probes.verdict.pooling`) are those it pools from the raw windows.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from probes._parsing import rfc3339
from probes.errors import StoreCorrupt
from probes.store import SCHEMA_VERSION, Store
from probes.store._strata import CATCH_UP_S
from probes.store.columns import concat
from probes.types import EndpointWindow, PathWindow
from probes.verdict.pooling import pooled_windows
from tests.unit.test_verdict_cache import NEW, OLD, T0, W, windows_at

WINDOWS = 60  # ten minutes from 20 s past a minute
HORIZON_S = 85.0


def _hot(k: int) -> EndpointWindow:
    """A pod whose calls all fall in one bucket: a minute of it is 1,200 in that bucket,
    over a stored record's 255."""
    return EndpointWindow(start=T0 + k * W, path="checkout", endpoint="hot-0", cohort=OLD,
                          requests=200, errors=1, attempts_sum=201, attempts_count=200,
                          latency={500: 200, 510: k})


def _written(db: Path, *, roll: bool = True, windows: int = WINDOWS) -> None:
    rng = np.random.default_rng(3)
    with Store.open(db) as store:
        for k in range(windows):
            paths, cells = windows_at(k, rng)
            store.write(paths, [*cells, _hot(k)],
                        roll_before=T0 + k * W - HORIZON_S if roll else None)


def _dropped(db: Path, to: Path, table: str = "endpoint_rollups",
             key: str = "rolled_until") -> Path:
    """A copy of `db` without the rollups of `table` (meta `key` their bound): read raw."""
    shutil.copy(db, to)
    conn = sqlite3.connect(to)
    with conn:
        conn.execute(f"DELETE FROM {table}")
        conn.execute("DELETE FROM meta WHERE key = ?", (key,))
    conn.close()
    return to


def _strata(db: Path, stratum_s: float = 60.0, since: float = T0 + 7.0) -> dict[str, Any]:
    """The endpoint strata a verdict reads, each latency record's (row, bucket) summed."""
    with Store.open(db, readonly=True) as store:
        cols = store.read_endpoint_columns(since=since, stratum_s=stratum_s, latency=True)
    out = {f: getattr(cols, f).tolist() for f in (
        "start", "path", "endpoint", "cohort", "requests", "errors", "attempts_sum",
        "attempts_count", "unrecorded")}
    lat = cols.latency
    merged: dict[tuple[Any, ...], int] = {}
    for key in zip(lat.start.tolist(), lat.path.tolist(), lat.endpoint.tolist(),
                   lat.cohort.tolist(), lat.bucket.tolist(), lat.count.tolist(), strict=True):
        merged[key[:5]] = merged.get(key[:5], 0) + key[5]
    return {**out, "latency": merged}


def _meta(db: Path, key: str) -> Any:
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        rollups = conn.execute("SELECT COUNT(*), MIN(start), MAX(start) FROM endpoint_rollups"
                               ).fetchone() if key == "rolled_until" else None
    finally:
        conn.close()
    return (None if row is None else row[0]), rollups


def test_the_writer_rolls_up_minutes_past_its_horizon(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db)
    rolled, (n, first, last) = _meta(db, "rolled_until")
    newest = T0 + (WINDOWS - 1) * W
    assert float(rolled) == math.floor((newest - HORIZON_S) / 60) * 60
    assert first == math.floor(T0 / 60) * 60 and last == float(rolled) - 60 and n > 0
    raw = _dropped(db, tmp_path / "raw.db")
    for stratum_s, since in ((60.0, T0 + 7.0), (120.0, T0 + 7.0), (60.0, T0 + 200.0),
                             (120.0, T0 - 600.0)):
        assert _strata(db, stratum_s, since) == _strata(raw, stratum_s, since), stratum_s
    # The hot pod's minute holds 1,200 calls in one bucket, in records of at most 255.
    whole = _strata(raw, 60.0, T0 + 40.0)["latency"]
    assert 1200 in {v for k, v in whole.items() if k[4] == 500}


def _retried(store: Store) -> list[PathWindow]:
    """Window 3 written again long after (a retry), with more calls; its path windows."""
    paths, cells = windows_at(3, np.random.default_rng(9), bump=11)
    store.write(paths, cells, roll_before=T0 + (WINDOWS - 1) * W - HORIZON_S)
    return paths


def test_a_window_written_again_under_the_rollups_rolls_its_minute_again(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db)
    with Store.open(db) as store:
        _retried(store)
        # A second writer of the same file, one transaction each, keeps them true too.
        with Store.open(db) as other:
            other.write([], [dataclasses.replace(_hot(4), requests=999)])
    raw = _dropped(db, tmp_path / "raw.db")
    assert _strata(db) == _strata(raw)
    assert 999 + 5 * 200 in _strata(db)["requests"]  # the hot pod's minute of windows 4-9


def test_a_prune_deletes_rollups_with_their_rows(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db)
    with Store.open(db) as store:
        store.prune(T0 + 25 * W + 5)  # inside a minute: its rollup is made anew
    _, (_, first, _) = _meta(db, "rolled_until")
    assert first == math.floor((T0 + 25 * W + 5) / 60) * 60
    raw = _dropped(db, tmp_path / "raw.db")
    assert _strata(db, since=T0) == _strata(raw, since=T0)
    assert min(_strata(db, since=T0)["start"]) == first


def _as_v2(db: Path) -> None:
    """What schema v2 wrote: no rollups, version 2 in meta and header."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DROP TABLE endpoint_rollups")
        conn.execute("DELETE FROM meta WHERE key = 'rolled_until'")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute("PRAGMA user_version = 2")
    conn.close()


def test_a_v2_store_is_migrated_at_once_and_rolled_up_a_few_minutes_a_write(
        tmp_path: Path) -> None:
    # A migration does no rolling: a large store's would hold the probe's start past its
    # liveness probe. The writer catches up CATCH_UP_S a write, oldest first, and every
    # read on the way is the raw read.
    db = tmp_path / "old.db"
    _written(db, roll=False)
    _as_v2(db)
    before = _strata(db)  # read-only: read raw, as it is
    assert _meta(db, "schema_version")[0] == "2"
    Store.open(db).close()  # writable: migrated, nothing rolled up yet
    assert _meta(db, "schema_version")[0] == str(SCHEMA_VERSION)
    assert _meta(db, "rolled_until") == (None, (0, None, None))
    assert _strata(db) == before
    _caught_up(db, lambda: float(_meta(db, "rolled_until")[0]), lambda: _strata(db), before)


def _caught_up(db: Path, mark: Callable[[], float], read: Callable[[], Any], before: Any
               ) -> None:
    """Writes that catch up `CATCH_UP_S` of the old windows each, oldest first, to the
    newest window's minute (`mark()` their bound), each read (`read()`) as `before`."""
    newest_minute = math.floor((T0 + (WINDOWS - 1) * W) / 60) * 60
    marks: list[float] = []
    with Store.open(db) as store:
        while not marks or marks[-1] < newest_minute:
            store.write([], [], roll_before=T0 + (WINDOWS - 1) * W)
            marks.append(mark())
            assert read() == before, marks
            assert len(marks) <= WINDOWS, marks  # a bound against a loop that never ends
    steps = np.diff([math.floor(T0 / 60) * 60, *marks])
    assert (steps <= CATCH_UP_S).all() and (steps[:-1] == CATCH_UP_S).all(), marks
    assert marks[-1] == newest_minute


def test_a_store_rolled_up_at_once_reads_as_raw(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _written(db, roll=False)
    _as_v2(db)
    before = _strata(db)
    with Store.open(db) as store:
        store.roll_up()  # to the newest window's minute, in one transaction
    rolled, (n, _, last) = _meta(db, "rolled_until")
    assert float(rolled) == math.floor((T0 + (WINDOWS - 1) * W) / 60) * 60 == last + 60
    assert n > 0 and _strata(db) == before
    Store.open(db).close()  # opened again: nothing changes
    assert _meta(db, "rolled_until")[1][0] == n


def _refused(db: Path, table: str, read: Callable[[], Any]) -> str:
    """What `read()` says, in one line naming the file, of a rollup of `table` whose
    latency is not a whole number of records."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"UPDATE {table} SET latency = x'0102' WHERE start ="
                     f" (SELECT MIN(start) + 60 FROM {table})")
    conn.close()
    with pytest.raises(StoreCorrupt) as err:
        read()
    assert "\n" not in str(err.value) and str(db) in str(err.value)
    return str(err.value)


def test_a_damaged_rollup_is_refused_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db)
    assert "malformed latency" in _refused(db, "endpoint_rollups", lambda: _strata(db))
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE meta SET value = 'soon' WHERE key = 'rolled_until'")
    conn.close()
    with pytest.raises(StoreCorrupt, match="rolled_until 'soon' is not a time"):
        _strata(db)


def test_the_command_says_a_damaged_rollup_in_one_line_and_exits_4(tmp_path: Path) -> None:
    # Over 1,500 windows: the command judges in 60 s strata, read from the rollups.
    db = tmp_path / "s.db"
    with Store.open(db) as store:
        for k in range(1600):
            t = T0 + k * W
            cells = [EndpointWindow(start=t, path="checkout", endpoint=f"{c}-{i}", cohort=c,
                                    requests=20, errors=0, attempts_sum=20, attempts_count=20,
                                    latency={500: 20}) for c in (OLD, NEW) for i in range(2)]
            paths, _ = windows_at(k, np.random.default_rng(k))
            store.write([p for p in paths if p.path == "checkout"], cells,
                        roll_before=t - HORIZON_S)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE endpoint_rollups SET latency = x'01'")
    conn.close()
    done = subprocess.run([sys.executable, "-m", "probes.cli", "verdict", "--store", str(db),
                           "--baseline", OLD, "--canary", NEW, "--at",
                           rfc3339(T0 + 1600 * W + 1)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 4, (done.stdout, done.stderr)
    [line] = done.stderr.strip().splitlines()
    assert str(db) in line and "malformed latency" in line, line


# --- the path windows' rollups --------------------------------------------------------------

def _odd(k: int) -> list[PathWindow]:
    """Windows that keep their minute raw: one without calls (window 33), one shorter
    (window 27)."""
    t = T0 + k * W
    if k == 33:
        return [PathWindow(start=t, length=W, path="checkout", cohort=OLD, outcomes={},
                           latency=(0,) * len(windows_at(0, np.random.default_rng(0))[0][0]
                                              .latency))]
    if k == 27:
        paths, _ = windows_at(k, np.random.default_rng(k))
        return [dataclasses.replace(paths[-1], length=W / 2)]
    return []


def _gone(k: int, w: PathWindow) -> bool:
    """The canary misses the last window of its first minute (the first window both
    cohorts share is then inside a minute whose newest windows differ), and that of
    `search` stops in the middle of a minute (after window 42) while the baseline goes on."""
    return w.cohort == NEW and (k == 15 or (w.path == "search" and k > 42))


def _written_paths(db: Path, windows: int = WINDOWS, *, roll: bool = True,
                   odd_at: Callable[[int], list[PathWindow]] = _odd,
                   gone: Callable[[int, PathWindow], bool] = _gone) -> None:
    """As the probe's writer writes path windows, `odd_at(k)` replacing window k's (or
    added), those `gone` left out."""
    rng = np.random.default_rng(5)
    with Store.open(db) as store:
        for k in range(windows):
            paths, cells = windows_at(k, rng)
            odd = {(w.path, w.cohort): w for w in odd_at(k)}
            paths = [odd.pop((w.path, w.cohort), w) for w in paths if not gone(k, w)]
            store.write([*paths, *odd.values()], cells,
                        roll_before=T0 + k * W - HORIZON_S if roll else None)


def _raw_paths(db: Path, to: Path) -> Path:
    """A copy of `db` without its path rollups: read raw."""
    return _dropped(db, to, "path_rollups", "paths_rolled_until")


def _pooled(db: Path, since: float | None = T0,
            spans: tuple[tuple[float, float], ...] = ()) -> dict[str, Any]:
    """Every column of the path windows a cold verdict pools, their first starts and the
    stored windows' lengths."""
    with Store.open(db, readonly=True) as store:
        sealed, first, empty, lengths = pooled_windows(store, since, math.inf, spans)
    table = concat(sealed, empty)
    out = {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}
    return {**{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in out.items()},
            "first": first.tolist(), "lengths": sorted(lengths.tolist())}


def _path_meta(db: Path) -> tuple[str | None, int, int]:
    """Meta `paths_rolled_until`, the path rollups and how many of them are regular."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'paths_rolled_until'").fetchone()
        n, regular = conn.execute("SELECT COUNT(*), TOTAL(regular) FROM path_rollups").fetchone()
    finally:
        conn.close()
    return (None if row is None else row[0]), int(n), int(regular)


# Comparisons from T0, from inside a minute and from no start at all (a cohort alone,
# before a rollout: the cache pools from -inf), with overload spans that touch windows in
# the middle of minutes, and one that spans a minute and a half.
POOLED = [(T0, ()), (T0 + 95.0, ()), (-math.inf, ()), (None, ()),
          (T0, ((T0 + 101.0, T0 + 117.0),)),
          (T0 + 33.0, ((T0 + 150.0, T0 + 240.0), (T0 + 401.0, T0 + 402.0)))]


def test_path_windows_pooled_from_rollups_are_those_pooled_from_raw_windows(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written_paths(db)
    rolled, n, regular = _path_meta(db)
    newest = T0 + (WINDOWS - 1) * W
    assert rolled is not None and float(rolled) == math.floor((newest - HORIZON_S) / 60) * 60
    assert n > regular > 0  # the minutes of windows 33 and 27 are not regular
    raw = _raw_paths(db, tmp_path / "raw.db")
    for since, spans in POOLED:
        assert _pooled(db, since, spans) == _pooled(raw, since, spans), (since, spans)
    pooled = _pooled(db)
    assert len(pooled["start"]) < WINDOWS and W / 2 in pooled["lengths"]
    # The rollups were read: changing them changes what is pooled.
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE path_rollups SET churn = churn + 1")
    conn.close()
    assert _pooled(db) != pooled


def test_a_path_window_written_again_under_the_rollups_rolls_its_minute_again(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written_paths(db)
    with Store.open(db) as store:
        paths = _retried(store)
    raw = _raw_paths(db, tmp_path / "raw.db")
    assert _pooled(db) == _pooled(raw)
    with Store.open(raw, readonly=True) as store:
        retried = store.read_table(T0 + 3 * W, T0 + 4 * W)
    assert retried.requests.sum() == sum(w.requests for w in paths)


def test_a_prune_deletes_path_rollups_with_their_rows(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written_paths(db)
    with Store.open(db) as store:
        store.prune(T0 + 25 * W + 5)  # inside a minute: its rollup is made anew
    conn = sqlite3.connect(db)
    first = conn.execute("SELECT MIN(start), MIN(first) FROM path_rollups").fetchone()
    conn.close()
    assert first == (math.floor((T0 + 25 * W + 5) / 60) * 60, T0 + 26 * W)
    raw = _raw_paths(db, tmp_path / "raw.db")
    assert _pooled(db) == _pooled(raw)


def _as_version(db: Path, version: int, table: str, key: str) -> None:
    """What schema `version` wrote: without the newer `table` (meta `key` its bound)."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"DROP TABLE {table}")
        conn.execute("DELETE FROM meta WHERE key = ?", (key,))
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


def test_a_v3_store_gets_path_rollups_and_the_writer_catches_up(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _written_paths(db, roll=False)
    _as_version(db, 3, "path_rollups", "paths_rolled_until")
    before = _pooled(db)  # read-only: read raw, as it is
    Store.open(db).close()  # writable: migrated, nothing rolled up yet
    assert _meta(db, "schema_version")[0] == str(SCHEMA_VERSION)
    assert _path_meta(db) == (None, 0, 0)
    assert _pooled(db) == before
    _caught_up(db, lambda: float(_path_meta(db)[0] or "nan"), lambda: _pooled(db), before)


def test_a_damaged_path_rollup_is_refused_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written_paths(db)
    assert "malformed" in _refused(db, "path_rollups", lambda: _pooled(db))


# --- the endpoint rollups' hours (schema v5) -------------------------------------------------

HOUR_WINDOWS = 700  # to T0 + 7,000 s: whole hours from T0 + 2,800 s, and the store's first part


def _hours_meta(db: Path) -> tuple[float | None, list[float]]:
    """Meta `hours_rolled_until` and the hours the hour rollups hold."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'hours_rolled_until'").fetchone()
        hours = [r[0] for r in conn.execute("SELECT DISTINCT start FROM endpoint_hours"
                                            " ORDER BY start")]
    finally:
        conn.close()
    return (None if row is None else float(row[0])), hours


def _no_hours(db: Path, to: Path) -> Path:
    return _dropped(db, to, "endpoint_hours", "hours_rolled_until")


def _hour_records(db: Path, whole: bool, since: float = T0) -> dict[tuple[Any, ...], int]:
    """Each pod's latency records per bucket as a cold verdict streams them by row, an
    hour row taken `whole` or never (its minutes then), and the strata's counts."""
    out: dict[tuple[Any, ...], int] = {}
    with Store.open(db, readonly=True) as store, store.stream_endpoint_columns(
            since=since, stratum_s=60.0, by_row=True,
            whole=lambda _cols, rows: np.full(len(rows.start), whole)) as (cols, chunks):
        for chunk in chunks:
            lat = chunk.expanded()
            for key in zip(lat.path.tolist(), lat.endpoint.tolist(), lat.cohort.tolist(),
                           lat.bucket.tolist(), lat.count.tolist(), strict=True):
                out[key[:4]] = out.get(key[:4], 0) + key[4]
        out[("requests",)] = int(cols.requests.sum())
        out[("rows",)] = len(cols.start)
    return out


def test_the_writer_rolls_hours_once_their_minutes_are_rolled_up(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db, windows=HOUR_WINDOWS)
    rolled, _ = _meta(db, "rolled_until")
    hours_done, hours = _hours_meta(db)
    assert hours_done == math.floor(float(rolled) / 3600) * 3600 == T0 + 6400
    assert hours == [T0 - 800, T0 + 2800]  # the store's first part of an hour, then whole
    raw = _no_hours(db, tmp_path / "raw.db")
    for stratum_s, since in ((60.0, T0 + 7.0), (120.0, T0 + 7.0), (60.0, T0 + 3000.0),
                             (3600.0, T0 - 600.0)):
        assert _strata(db, stratum_s, since) == _strata(raw, stratum_s, since), stratum_s
    # An hour's records taken whole are its minutes' records.
    expected = _hour_records(raw, whole=True)
    assert _hour_records(db, whole=True) == expected == _hour_records(db, whole=False)


def test_a_window_written_again_under_the_hours_rolls_its_hour_again(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db, windows=HOUR_WINDOWS)
    with Store.open(db) as store:
        paths, cells = windows_at(300, np.random.default_rng(9), bump=11)  # in [T0 + 2,800 s, +1 h)
        store.write(paths, [*cells, dataclasses.replace(_hot(300), requests=777)],
                    roll_before=T0 + (HOUR_WINDOWS - 1) * W - HORIZON_S)
    raw = _no_hours(db, tmp_path / "raw.db")
    assert _strata(db, 3600.0, T0) == _strata(raw, 3600.0, T0)
    assert _hour_records(db, whole=True) == _hour_records(raw, whole=True)
    assert 777 + 359 * 200 in _strata(db, 3600.0, T0)["requests"]  # the hot pod's hour


def test_a_prune_deletes_hours_with_their_minutes(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db, windows=HOUR_WINDOWS)
    with Store.open(db) as store:
        store.prune(T0 + 4000.0 + 5)  # inside an hour: its hour row is made anew
    assert _hours_meta(db)[1] == [T0 + 2800]
    raw = _no_hours(db, tmp_path / "raw.db")
    assert _strata(db, 3600.0, T0) == _strata(raw, 3600.0, T0)
    assert _hour_records(db, whole=True) == _hour_records(raw, whole=True)
    assert min(_strata(db, 3600.0, T0)["start"]) == T0 + 2800


def test_a_v4_store_gets_hours_and_the_writer_catches_up_an_hour_a_write(
        tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _written(db, windows=HOUR_WINDOWS)
    _as_version(db, 4, "endpoint_hours", "hours_rolled_until")
    before = _strata(db, 3600.0, T0), _hour_records(db, whole=True)  # read-only: as it is
    Store.open(db).close()  # writable: migrated, nothing rolled up yet
    assert _meta(db, "schema_version")[0] == str(SCHEMA_VERSION)
    assert _hours_meta(db) == (None, [])
    marks = hours_caught_up(db, 3, T0 + (HOUR_WINDOWS - 1) * W - HORIZON_S,
                            lambda: _hours_meta(db)[0],
                            lambda: (_strata(db, 3600.0, T0), _hour_records(db, whole=True)),
                            before)
    assert marks == [T0 + 2800, T0 + 6400, T0 + 6400]  # an hour a write, oldest first


def hours_caught_up(db: Path, writes: int, roll_before: float, mark: Callable[[], Any],
                    read: Callable[[], Any], before: Any) -> list[Any]:
    """`mark()` after each of `writes` writes that roll what is due (`roll_before`), each
    read (`read()`) as `before`."""
    marks = []
    with Store.open(db) as store:
        for _ in range(writes):
            store.write([], [], roll_before=roll_before)
            marks.append(mark())
            assert read() == before, marks
    return marks


def test_a_damaged_hour_rollup_is_refused_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db, windows=HOUR_WINDOWS)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE endpoint_hours SET minutes = x'0102' WHERE start = ?",
                     (T0 + 2800,))
    conn.close()
    with pytest.raises(StoreCorrupt) as err:
        _strata(db, 3600.0, T0)
    assert "\n" not in str(err.value) and str(db) in str(err.value)
    assert "malformed minutes" in str(err.value)
