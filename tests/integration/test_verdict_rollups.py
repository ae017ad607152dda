"""A cold verdict reads whole minutes of endpoint windows from the store's 60 s rollups
(schema v3), whole hours of them from their hour rollups (v5), whole minutes of path
windows from theirs (v4), whole hours of them from their hour rows (v6), and the rest raw:
the verdict is the one the raw windows give, byte for byte.

One store, written as the probe writes it (a window at a time, minutes rolled up past the
rewrite horizon): pods moving to the canary one by one, a pod joining, a pod restarted
under its own name, a window written again under the rolled minutes (a retry), and two
overload spans of late sends. Judged as written and with its rollups dropped or emptied
(and with each kind of rollup tampered with, to show it was read),
at several `--at`, warm-ups, origins and both cohort orders, in strata (`MAX_STRATA`
patched low), by `skewprobe verdict --store` and by a restarted probe's first verdict.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from typing import Any

import numpy as np
import pytest

from probes._parsing import rfc3339
from probes.measure.overload import OVERLOAD_EVENT
from probes.spec import JudgingSettings
from probes.store import Event, Store
from probes.store.records import RESTART_EVENT
from probes.types import EndpointWindow
from probes.verdict import service as verdict_service
from probes.verdict.cache import VerdictCache
from probes.verdict.service import compute_verdict
from tests.unit.test_verdict_cache import NEW, OLD, T0, W, windows_at

# 3 h 3 min, from 20 s past a minute (T0): whole hours from T0 + 2,800 s, the first with a
# restart the probe saw (shop-1's, at T0 + 4,500 s: its pod's minutes read, the rest whole)
# and a window written again inside it, the second with late sends (read by minute, the
# path windows' hour too); both sealed in a restarted probe's cache too.
WINDOWS = 1100
# What the probe's writer leaves raw behind the newest window: its rewrite horizon (a
# window is written again up to 60 s after it ends, plus 5 s of grace) and a window.
HORIZON_S = 75.0
RETRIED = 30  # a window written again long after (a retry), under the rolled minutes


def _write(store: Store, k: int, rng: np.random.Generator, bump: int = 0) -> None:
    restarted = {"shop-3": {"start_time": rfc3339(T0 + 95 * W)}} if k >= 95 else None
    paths, cells = windows_at(k, rng, labels=restarted, bump=bump)
    if 750 <= k < 761:  # sends 40 ms late around the overload span inside the second hour
        paths = [dataclasses.replace(p, lag_max_s=0.04) for p in paths]
    if k >= 70:  # a pod joins the canary
        cells.append(EndpointWindow(
            start=T0 + k * W, path="checkout", endpoint="shop-9", cohort=NEW,
            requests=30 + bump, errors=k % 3, attempts_sum=31, attempts_count=30,
            latency={450 + k % 7: 30 + bump, 500: k % 4}))
    # As the probe's writer writes (`run._window_writer`): the minutes past its rewrite
    # horizon rolled up in the same transaction.
    store.write(paths, cells, roll_before=T0 + k * W - HORIZON_S)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The store as written, copies with its rollups dropped and emptied, and one whose
    rollups count an error more each (what reads them tells)."""
    base = tmp_path_factory.mktemp("rollups")
    db = str(base / "written.db")
    rng = np.random.default_rng(31)
    with Store.open(db) as store:
        for k in range(WINDOWS):
            _write(store, k, rng)
            if k == 200:
                _write(store, RETRIED, np.random.default_rng(5), bump=7)
            if k == 700:  # under the first whole hour: its minute and hour rolled again
                _write(store, 500, np.random.default_rng(6), bump=5)
        store.write_events([
            Event(OVERLOAD_EVENT, T0 + 60 * W, detail={"reason": "late"}),
            Event(OVERLOAD_EVENT, T0 + 66 * W, detail={"reason": None}),
            Event(OVERLOAD_EVENT, T0 + 104 * W, detail={"reason": "late"}),
            Event(OVERLOAD_EVENT, T0 + 125 * W, detail={"reason": None}),
            Event(OVERLOAD_EVENT, T0 + 755 * W, detail={"reason": "late"}),
            Event(OVERLOAD_EVENT, T0 + 761 * W, detail={"reason": None}),
            Event(RESTART_EVENT, T0 + 4500.0, cohort=NEW, endpoint="shop-1")])
    out = {"written": db}
    for name, sql in (
            ("dropped", "DROP TABLE endpoint_rollups; DROP TABLE path_rollups;"
                        " DROP TABLE endpoint_hours; DROP TABLE path_hours"),
            ("emptied", "DELETE FROM endpoint_rollups; DELETE FROM path_rollups;"
                        " DELETE FROM endpoint_hours; DELETE FROM path_hours"),
            ("hours dropped", "DROP TABLE endpoint_hours; DROP TABLE path_hours"),
            ("tampered", "UPDATE endpoint_rollups SET errors = errors + 1"),
            ("paths tampered", "UPDATE path_rollups SET requests = requests + 5"),
            ("path hours tampered", "UPDATE path_hours SET requests = requests + 5"),
            # An hour's first minute cut from its counts; its latency records cut.
            ("hour counts tampered", "UPDATE endpoint_hours SET minutes = substr(minutes, 42)"),
            ("hour latency tampered",
             "UPDATE endpoint_hours SET latency = substr(latency, 4) WHERE start > 0")):
        copy = str(base / f"{name}.db")
        shutil.copy(db, copy)
        conn = sqlite3.connect(copy)
        with conn:
            conn.executescript(sql)
            if "tampered" not in name:
                conn.execute("DELETE FROM meta WHERE key IN ('rolled_until',"
                             " 'paths_rolled_until', 'hours_rolled_until',"
                             " 'path_hours_rolled_until')")
        conn.close()
        out[name] = copy
    return out


def _verdict(db: str, warmup_s: float, query: dict[str, Any], now: float,
             cache: bool = False) -> str:
    settings = JudgingSettings(warmup_s=warmup_s)
    out = compute_verdict(db, settings, now=now, cache=VerdictCache(db) if cache else None,
                          **query)
    return json.dumps(out, sort_keys=True)


# (window of `--at`, seconds past its end, warm-up, origin, cohorts swapped, MAX_STRATA)
CASES = [
    (WINDOWS, 1.0, 30.0, None, False, 20),
    (WINDOWS, 1.0, 30.0, None, False, 45),
    (WINDOWS, 7.0, 90.0, None, True, 20),
    (WINDOWS, 1.0, 0.0, "-25m", False, 20),
    (WINDOWS, 3.0, 30.0, rfc3339(T0 + 47 * W + 3), False, 45),
    (200, 1.0, 30.0, None, False, 20),
    (163, 4.0, 90.0, rfc3339(T0 + 20 * W), True, 45),
    (110, 1.0, 30.0, None, False, 20),  # inside the second late span
    (123, 9.0, 0.0, None, True, 20),
]


@pytest.mark.parametrize(("at", "past", "warmup_s", "since", "swapped", "strata"), CASES)
def test_the_verdict_from_rollups_is_the_verdict_from_raw_windows(
        stores: dict[str, str], at: int, past: float, warmup_s: float, since: str | None,
        swapped: bool, strata: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict_service, "MAX_STRATA", strata)
    lengths = _strata_seen(monkeypatch)
    now = T0 + at * W + past
    query: dict[str, Any] = {"since": since, "overload": None}
    if swapped:
        query |= {"baseline": NEW, "canary": OLD}
    written = _verdict(stores["written"], warmup_s, query, now)
    assert written == _verdict(stores["dropped"], warmup_s, query, now)
    assert written == _verdict(stores["emptied"], warmup_s, query, now)
    assert written != _verdict(stores["tampered"], warmup_s, query, now)  # rollups were read
    assert written != _verdict(stores["paths tampered"], warmup_s, query, now)
    # The path hours are read where the comparison holds a whole hour (the first; the
    # second is read by minute: an overload span inside it).
    whole_hour = at == WINDOWS and since != "-25m"
    assert (written != _verdict(stores["path hours tampered"], warmup_s, query, now)
            ) == whole_hour
    # A verdict that judges pods, in strata, with a canary.
    result = json.loads(written)
    assert result["canary"] == (OLD if swapped else NEW)
    rules = {name: m["rule"] for p in result["paths"] for name, m in p["metrics"].items()}
    assert rules["success_rate"] == "pods", rules
    assert lengths and all(s is not None and s % 60 == 0 for s in lengths), lengths


def _strata_seen(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The stratum lengths the verdicts are judged in, as they are asked for."""
    seen: list[float | None] = []
    length = verdict_service.stratum_length

    def spied(span_s: float, window_s: float) -> float | None:
        seen.append(length(span_s, window_s))
        return seen[-1]

    monkeypatch.setattr(verdict_service, "stratum_length", spied)
    return seen


@pytest.mark.parametrize("at", [WINDOWS, 163])
def test_a_restarted_probes_first_verdict_from_rollups_is_the_one_from_raw_windows(
        stores: dict[str, str], at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict_service, "MAX_STRATA", 20)
    now = T0 + at * W + 1
    query: dict[str, Any] = {"since": None, "overload": None}
    first = _verdict(stores["written"], 30.0, query, now, cache=True)
    assert first == _verdict(stores["dropped"], 30.0, query, now, cache=True)
    assert first != _verdict(stores["tampered"], 30.0, query, now, cache=True)
    # Asked at the store's end, the cache pools the path windows from their rollups too
    # (asked before its end, it reads the stored windows up to then).
    tampered = _verdict(stores["paths tampered"], 30.0, query, now, cache=True)
    assert (first != tampered) == (at == WINDOWS)
    tampered = _verdict(stores["path hours tampered"], 30.0, query, now, cache=True)
    assert (first != tampered) == (at == WINDOWS)
    assert first == _verdict(stores["dropped"], 30.0, query, now)


DAY_S = 86_400.0


@pytest.mark.parametrize("cache", [False, True])
def test_a_stopped_probes_store_judged_a_day_later_is_judged_as_at_its_end(
        stores: dict[str, str], cache: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked long after the probe stopped, the verdict compares the same windows in the
    same strata as at the data's end, read by range from the same origin: every metric's
    figures the same, each path held inconclusive by the stale-data gate, whose reason
    names the `--at` that gives the end's decisions."""
    monkeypatch.setattr(verdict_service, "MAX_STRATA", 20)
    lengths = _strata_seen(monkeypatch)
    reads = _endpoint_reads(monkeypatch)
    end = T0 + WINDOWS * W
    query: dict[str, Any] = {"since": None, "overload": None}
    at_end = json.loads(_verdict(stores["written"], 30.0, query, end))
    read_at_end, strata_at_end = list(reads), list(lengths)
    later = json.loads(_verdict(stores["written"], 30.0, query, end + DAY_S, cache=cache))
    assert lengths[len(strata_at_end):] == strata_at_end  # not strata of a day and more
    # Read by range: from the origin's warm-up on (not the whole store), in its strata.
    origin, _, stratum = read_at_end[0]
    assert origin is not None and stratum is not None
    read_later = reads[len(read_at_end):]
    assert read_later[0][2] == stratum
    assert all(r[0] is not None and r[0] >= origin for r in read_later), read_later
    assert at_end["window"] == later["window"] and at_end["canary"] == NEW
    decided = {m["verdict"] for p in at_end["paths"] for m in p["metrics"].values()}
    assert decided & {"pass", "fail"}, decided  # what staleness holds back is decided
    stale = f"`skewprobe verdict --at {rfc3339(end)}` gives the verdict as it stood then"
    for before, after in zip(at_end["paths"], later["paths"], strict=True):
        assert after["verdict"] == "inconclusive" and stale in after["reasons"][0]
        assert before["metrics"].keys() == after["metrics"].keys()
        for name, m in before["metrics"].items():
            assert {**m, "verdict": None} == {**after["metrics"][name], "verdict": None}
            assert after["metrics"][name]["verdict"] in ("inconclusive", "n/a")


def _endpoint_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The (since, until, stratum_s) of each stream of endpoint windows a verdict reads."""
    seen: list[tuple[Any, ...]] = []
    stream = Store.stream_endpoint_columns

    def spied(self: Store, since: float | None = None, until: float | None = None,
              *args: Any, **kwargs: Any) -> Any:
        seen.append((since, until, kwargs.get("stratum_s")))
        return stream(self, since, until, *args, **kwargs)

    monkeypatch.setattr(Store, "stream_endpoint_columns", spied)
    return seen


# (window of `--at`, warm-up, origin, MAX_STRATA, whether an hour's latency records are
# taken whole): at the store's end, with and without warm-up (16 and 8 minute strata); from
# an origin inside the first hour; from one in the 8-minute stratum that the first hour's
# first minutes share with the hour before (its first stratum is cut by the origin, so the
# hour is read by minute); from one in the second hour (late sends: read by minute); at the
# second hour's start (the first hour whole but for the restarted pod); in strata longer
# than an hour.
HOUR_CASES = [
    (WINDOWS, 30.0, None, 20, True),
    (WINDOWS, 0.0, None, 45, True),
    (WINDOWS, 90.0, rfc3339(T0 + 300 * W + 3), 20, False),
    (WINDOWS, 30.0, rfc3339(T0 + 2700.0), 20, False),
    (WINDOWS, 30.0, rfc3339(T0 + 600 * W), 45, False),
    (700, 30.0, None, 20, True),
    (WINDOWS, 30.0, None, 2, False),  # strata of 128 minutes, from before the moves warm
]


@pytest.mark.parametrize(("at", "warmup_s", "since", "strata", "whole"), HOUR_CASES)
def test_the_verdict_from_hour_rollups_is_the_verdict_from_raw_windows(
        stores: dict[str, str], at: int, warmup_s: float, since: str | None, strata: int,
        whole: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict_service, "MAX_STRATA", strata)
    _hours_read(stores["written"])
    now = T0 + at * W + 1
    query: dict[str, Any] = {"since": since, "overload": None}
    written = _verdict(stores["written"], warmup_s, query, now)
    assert written == _verdict(stores["dropped"], warmup_s, query, now)
    assert written == _verdict(stores["hours dropped"], warmup_s, query, now)
    # An hour row's counts were read, and its records where they count whole: changing
    # them changes the verdict.
    assert written != _verdict(stores["hour counts tampered"], warmup_s, query, now)
    tampered = _verdict(stores["hour latency tampered"], warmup_s, query, now)
    assert (written != tampered) == whole
    # A restarted probe's first verdict too, its cache filled from the same hours (asked
    # at the store's end: asked before it, the cache reads the store up to then).
    first = _verdict(stores["written"], warmup_s, query, now, cache=True)
    assert first == _verdict(stores["dropped"], warmup_s, query, now, cache=True)
    tampered = _verdict(stores["hour latency tampered"], warmup_s, query, now, cache=True)
    assert (first != tampered) == (whole and at == WINDOWS)


def _hours_read(db: str) -> None:
    """The store holds its whole hours, rolled up."""
    conn = sqlite3.connect(db)
    try:
        done = conn.execute("SELECT value FROM meta WHERE key = 'hours_rolled_until'"
                            ).fetchone()
        hours = [r[0] for r in conn.execute("SELECT DISTINCT start FROM endpoint_hours")]
    finally:
        conn.close()
    assert done is not None and float(done[0]) == T0 + 10_000
    assert hours == [T0 - 800, T0 + 2800, T0 + 6400]  # the first: the store's start on
