"""The path windows' hours (schema v6, `probes.store._path_hours`): the writer rolls an
hour of path minute rollups once its minutes are rolled up, a window written again under
them re-rolls its minute and hour, a prune deletes hour rows with their minutes and rolls
the hour it cuts anew, a v5 store is migrated with nothing rolled and caught up an hour a
write, and a damaged hour row is refused in one line. The path windows a verdict pools
from them (`probes.verdict.pooling`: an hour row where nothing cuts it, its minutes where
a cut, an overload span or an irregular minute falls inside) are those it pools from the
raw windows.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from probes.errors import StoreCorrupt
from probes.store import SCHEMA_VERSION, Store
from probes.store.columns import concat
from probes.types import PathWindow
from probes.verdict.pooling import pooled_windows
from tests.integration.test_store_rollups import (
    HORIZON_S,
    _as_version,
    _dropped,
    _meta,
    _pooled,
    _raw_paths,
    _written_paths,
    hours_caught_up,
)
from tests.unit.test_verdict_cache import NEW, OLD, T0, W, windows_at

# 4 h 3 min from T0 (800 s into an hour): the hours from T0 - 800 s rolled, the store's
# first part of an hour, then three whole ones: the first clean, the second with an
# irregular minute, the third with the canary of `search` stopping inside it (a cut).
WINDOWS = 1460
HOURS = [T0 - 800, T0 + 2800, T0 + 6400, T0 + 10_000]


def _odd(k: int) -> list[PathWindow]:
    """A window without calls (window 700) and a shorter one (720), in the third hour."""
    if k == 700:
        paths, _ = windows_at(0, np.random.default_rng(0))
        return [PathWindow(start=T0 + k * W, length=W, path="checkout", cohort=OLD,
                           outcomes={}, latency=(0,) * len(paths[0].latency))]
    if k == 720:
        paths, _ = windows_at(k, np.random.default_rng(k))
        return [dataclasses.replace(paths[-1], length=W / 2)]
    return []


def _gone(k: int, w: PathWindow) -> bool:
    """The canary misses the last window of its first minute (the first window both
    cohorts share), and that of `search` stops inside the fourth hour (window 1100)."""
    return w.cohort == NEW and (k == 15 or (w.path == "search" and k > 1100))


def _write(db: Path) -> None:
    _written_paths(db, WINDOWS, odd_at=_odd, gone=_gone)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("path-hours") / "s.db"
    _write(db)
    return db


def _copy(db: Path, to: Path) -> Path:
    shutil.copy(db, to)
    return to


def _no_hours(db: Path, to: Path) -> Path:
    """A copy of `db` without its path hours: its minutes from the minute rollups."""
    return _dropped(db, to, "path_hours", "path_hours_rolled_until")


def _hours_meta(db: Path) -> tuple[float | None, list[tuple[Any, ...]]]:
    """Meta `path_hours_rolled_until` and the hour rows' (start, regular), one per hour."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'path_hours_rolled_until'"
                           ).fetchone()
        hours = conn.execute("SELECT start, MIN(regular) FROM path_hours GROUP BY start"
                             " ORDER BY start").fetchall()
    finally:
        conn.close()
    return (None if row is None else float(row[0])), hours


def _tampered(db: Path, to: Path, sql: str) -> Path:
    _copy(db, to)
    conn = sqlite3.connect(to)
    with conn:
        conn.execute(sql)
    conn.close()
    return to


# From T0 (the first hour read by minute), from no start (-inf: the cache before a
# rollout; None: the whole store, its first hour from its hour row), from inside the second
# hour; with overload spans inside the second hour, and across the first two.
POOLED = [(T0, ()), (-math.inf, ()), (None, ()), (T0 + 3001.0, ()),
          (T0, ((T0 + 4001.0, T0 + 4017.0),)),
          (None, ((T0 + 2700.0, T0 + 2900.0), (T0 + 9000.0, T0 + 9001.0)))]


def test_path_windows_pooled_from_hours_are_those_pooled_from_raw_windows(
        written: Path, tmp_path: Path) -> None:
    rolled, _ = _meta(written, "paths_rolled_until")
    done, hours = _hours_meta(written)
    assert done == math.floor(float(rolled) / 3600) * 3600 == T0 + 13_600
    # The third hour irregular (its minutes of windows 700 and 720), the others regular.
    assert hours == [(HOURS[0], 1), (HOURS[1], 1), (HOURS[2], 0), (HOURS[3], 1)]
    raw = _raw_paths(written, tmp_path / "raw.db")
    minutes = _no_hours(written, tmp_path / "minutes.db")
    for since, spans in POOLED:
        expected = _pooled(raw, since, spans)
        assert _pooled(written, since, spans) == expected, (since, spans)
        assert _pooled(minutes, since, spans) == expected, (since, spans)
    # The hour rows were read where nothing cuts them (the second hour's), and only there:
    # a count changed in every hour row changes what is pooled, one in the irregular hour's
    # and the cut one's does not.
    tampered = _tampered(written, tmp_path / "t.db", "UPDATE path_hours SET churn = churn + 1")
    assert _pooled(tampered) != _pooled(written)
    opened = _tampered(written, tmp_path / "o.db", "UPDATE path_hours SET churn = churn + 1"
                       f" WHERE start IN ({HOURS[2]!r}, {HOURS[3]!r})")
    assert _pooled(opened) == _pooled(written)
    # A span inside the second hour opens it: its row changed is not read then.
    kept = _tampered(written, tmp_path / "k.db", "UPDATE path_hours SET churn = churn + 1"
                     f" WHERE start = {HOURS[1]!r}")
    assert _pooled(kept) != _pooled(written)
    assert _pooled(kept, *POOLED[4]) == _pooled(written, *POOLED[4])


def test_a_path_window_written_again_under_the_hours_rolls_its_hour_again(
        written: Path, tmp_path: Path) -> None:
    db = _copy(written, tmp_path / "s.db")
    paths, cells = windows_at(300, np.random.default_rng(9), bump=11)  # in the second hour
    with Store.open(db) as store:
        store.write(paths, cells, roll_before=T0 + (WINDOWS - 1) * W - HORIZON_S)
    raw = _raw_paths(db, tmp_path / "raw.db")
    assert _pooled(db) == _pooled(raw)
    conn = sqlite3.connect(db)
    try:
        hour, = conn.execute("SELECT SUM(requests) FROM path_hours WHERE start = ?",
                             (HOURS[1],)).fetchone()
        windows, = conn.execute("SELECT SUM(requests) FROM path_windows WHERE start >= ?"
                                " AND start < ?", (HOURS[1], HOURS[1] + 3600)).fetchone()
    finally:
        conn.close()
    assert hour == windows and sum(w.requests for w in paths) > 0


def test_a_prune_deletes_path_hours_with_their_minutes(written: Path, tmp_path: Path) -> None:
    db = _copy(written, tmp_path / "s.db")
    with Store.open(db) as store:
        store.prune(T0 + 4000.0 + 5)  # inside the second hour: its hour row is made anew
    conn = sqlite3.connect(db)
    first = conn.execute("SELECT MIN(start), MIN(first) FROM path_hours").fetchone()
    conn.close()
    assert first == (HOURS[1], T0 + 4010.0)
    raw = _raw_paths(db, tmp_path / "raw.db")
    for since in (None, T0 + 4005.0):
        assert _pooled(db, since) == _pooled(raw, since)


def test_a_v5_store_gets_path_hours_and_the_writer_catches_up_an_hour_a_write(
        written: Path, tmp_path: Path) -> None:
    db = _copy(written, tmp_path / "old.db")
    _as_version(db, 5, "path_hours", "path_hours_rolled_until")
    before = _pooled(db, None)  # read-only: its minutes from the minute rollups, as it is
    Store.open(db).close()  # writable: migrated, nothing rolled up yet
    assert _meta(db, "schema_version")[0] == str(SCHEMA_VERSION)
    assert _hours_meta(db) == (None, [])
    marks = hours_caught_up(db, 5, T0 + (WINDOWS - 1) * W - HORIZON_S,
                            lambda: _hours_meta(db)[0], lambda: _pooled(db, None), before)
    assert marks == [*HOURS[1:], T0 + 13_600, T0 + 13_600]  # an hour a write, oldest first
    assert _hours_meta(db) == _hours_meta(written)


@pytest.mark.parametrize("damage", ["latency = x'0102'", "first = 'x'", "windows = 'many'"])
def test_a_damaged_path_hour_is_refused_in_one_line(written: Path, tmp_path: Path,
                                                    damage: str) -> None:
    db = _tampered(written, tmp_path / "s.db",
                   f"UPDATE path_hours SET {damage} WHERE start = {HOURS[1]!r}")
    with pytest.raises(StoreCorrupt) as err:
        _pooled(db)
    assert "\n" not in str(err.value) and str(db) in str(err.value)
    assert "malformed" in str(err.value)


def _down(k: int, w: PathWindow) -> bool:
    """The probe down for the first two minutes of the second and third hours (no window of
    any path), besides `_gone`'s."""
    return 280 <= k < 292 or 640 <= k < 652 or _gone(k, w)


def _pooled_until(db: Path, since: float | None, until: float) -> dict[str, Any]:
    with Store.open(db, readonly=True) as store:
        sealed, first, empty, lengths = pooled_windows(store, since, math.inf, (),
                                                       until=until)
    table = concat(sealed, empty)
    out = {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}
    return {**{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in out.items()},
            "first": first.tolist(), "lengths": sorted(lengths.tolist())}


def test_hours_whose_first_minutes_are_empty_are_pooled_as_raw_windows(
        tmp_path: Path) -> None:
    """Hours the probe was down at the start of: one read whole, then one opened into its
    minutes (irregular), and a verdict `--at` inside the first; each range of rows ends
    with its own rows, not at the next range's first start (which took in an hour row no
    key named, and the read was refused as a store changed under it)."""
    db = tmp_path / "down.db"
    _written_paths(db, WINDOWS, odd_at=_odd, gone=_down)
    _, hours = _hours_meta(db)
    assert (HOURS[1], 1) in hours and (HOURS[2], 0) in hours
    raw = _raw_paths(db, tmp_path / "raw.db")
    for since in (None, T0, T0 + 3001.0):
        assert _pooled(db, since) == _pooled(raw, since), since
    # `until` inside the second hour (rolled, its first minute empty), from before it and
    # from inside it: the window lengths are the range's only.
    for since, until in ((None, HOURS[1] + 605.0), (T0, HOURS[1] + 1801.0),
                         (HOURS[1] + 300.0, HOURS[1] + 1801.0)):
        rolled = _pooled_until(db, since, until)
        assert rolled == _pooled_until(raw, since, until), (since, until)
        assert rolled["lengths"]


@pytest.mark.parametrize("how", ["DROP TABLE path_rollups",
                                 "DELETE FROM path_rollups; DELETE FROM meta"
                                 " WHERE key = 'paths_rolled_until'"])
def test_path_minutes_made_anew_take_their_hours_with_them(
        written: Path, tmp_path: Path, how: str) -> None:
    """Hours kept over minutes made anew would be rolled again, for a retried window, from
    minutes not back yet: the hours go with them and are rolled again after them."""
    db = _copy(written, tmp_path / "s.db")
    conn = sqlite3.connect(db)
    conn.executescript(how)
    conn.close()
    paths, cells = windows_at(300, np.random.default_rng(9), bump=11)  # in the second hour
    with Store.open(db) as store:
        assert _hours_meta(db) == (None, [])
        store.write(paths, cells, roll_before=None)
        store.roll_up()
    assert _hours_meta(db)[0] == _hours_meta(written)[0]
    raw = _raw_paths(db, tmp_path / "raw.db")
    assert _pooled(db, None) == _pooled(raw, None)


def test_endpoint_minutes_made_anew_take_their_hours_with_them(
        written: Path, tmp_path: Path) -> None:
    db = _copy(written, tmp_path / "s.db")
    assert _meta(db, "hours_rolled_until")[0] is not None
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE endpoint_rollups")
    conn.close()
    Store.open(db).close()
    conn = sqlite3.connect(db)
    rows, = conn.execute("SELECT COUNT(*) FROM endpoint_hours").fetchone()
    conn.close()
    assert (_meta(db, "hours_rolled_until")[0], rows) == (None, 0)
    assert _hours_meta(db) == _hours_meta(written)  # the path hours' minutes stand


def _short_minute(k: int) -> list[PathWindow]:
    """A whole minute of one path's baseline windows shorter than the others (windows
    364-369: regular as a minute, not as the second hour)."""
    if 364 <= k < 370:
        paths, _ = windows_at(k, np.random.default_rng(k))
        return [dataclasses.replace(paths[0], length=W / 2)]
    return []


def test_an_hour_of_minutes_regular_each_but_of_two_lengths_is_read_by_minute(
        tmp_path: Path) -> None:
    db = tmp_path / "short.db"
    _written_paths(db, WINDOWS, odd_at=_short_minute, gone=_gone)
    _, hours = _hours_meta(db)
    assert (HOURS[1], 0) in hours
    raw = _raw_paths(db, tmp_path / "raw.db")
    for since in (None, T0):
        assert _pooled(db, since) == _pooled(raw, since), since
