"""The endpoint windows' 60 s rollups (schema v3, `probes.store._strata`): each holds its
minute's windows summed, latency merged per bucket; the writer rolls minutes past its
horizon, a window written again under them re-rolls its minute, a prune deletes them with
the rows, a v2 store is migrated when opened for writing (read raw read-only) and rolled up
by the writer a few minutes a write, and a damaged rollup is refused in one line.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from probes._parsing import rfc3339
from probes.errors import StoreCorrupt
from probes.store import Store
from probes.store._strata import CATCH_UP_S
from probes.types import EndpointWindow
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


def _dropped(db: Path, to: Path) -> Path:
    """A copy of `db` without its rollups: read raw."""
    shutil.copy(db, to)
    conn = sqlite3.connect(to)
    with conn:
        conn.execute("DELETE FROM endpoint_rollups")
        conn.execute("DELETE FROM meta WHERE key = 'rolled_until'")
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


def test_a_window_written_again_under_the_rollups_rolls_its_minute_again(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db)
    with Store.open(db) as store:  # a retry of window 3, long after, with more calls
        paths, cells = windows_at(3, np.random.default_rng(9), bump=11)
        store.write(paths, cells, roll_before=T0 + (WINDOWS - 1) * W - HORIZON_S)
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
    assert _meta(db, "schema_version")[0] == "3"
    assert _meta(db, "rolled_until") == (None, (0, None, None))
    assert _strata(db) == before
    newest_minute = math.floor((T0 + (WINDOWS - 1) * W) / 60) * 60
    marks = []
    with Store.open(db) as store:
        while not marks or marks[-1] < newest_minute:
            store.write([], [], roll_before=T0 + (WINDOWS - 1) * W)
            marks.append(float(_meta(db, "rolled_until")[0]))
            assert _strata(db) == before, marks
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


def test_a_damaged_rollup_is_refused_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _written(db)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE endpoint_rollups SET latency = x'0102' WHERE start ="
                     " (SELECT MIN(start) + 60 FROM endpoint_rollups)")
    conn.close()
    with pytest.raises(StoreCorrupt) as err:
        _strata(db)
    assert "\n" not in str(err.value) and str(db) in str(err.value)
    assert "malformed latency" in str(err.value)
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
