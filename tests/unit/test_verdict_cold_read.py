"""A cold verdict reads the endpoint windows' latency records a chunk at a time
(`Store.stream_endpoint_columns`) and sums them into each pod's histogram as they come
(`pod_cells.LatencyFold`): the grids, and the verdict, are those of the records read whole.
The store is written by the probe's own writer: pods moving to the canary one by one, a pod
joining, a pod restarted under its own name, and an overload span.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from probes._parsing import rfc3339
from probes.measure.overload import OVERLOAD_EVENT
from probes.stats import pod_cells
from probes.stats.pods import read_pod_grids
from probes.store import Event, Store, _strata
from probes.store import sqlite as store_sqlite
from probes.types import EndpointWindow
from probes.verdict import cache as verdict_cache
from probes.verdict import pooling
from probes.verdict import service as verdict_service
from probes.verdict.service import compute_verdict, overload_spans
from tests.unit.test_verdict_cache import NEW, SETTINGS, T0, W, _same_grids, windows_at

WINDOWS = 160


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("cold") / "probe.db")
    rng = np.random.default_rng(21)
    restarted = {"start_time": rfc3339(T0 + 95 * W)}
    with Store.open(path) as store:
        for k in range(WINDOWS):
            paths, cells = windows_at(k, rng, labels={"shop-3": restarted} if k >= 95 else None)
            if k >= 70:  # a pod joins the canary
                cells.append(EndpointWindow(
                    start=T0 + k * W, path="checkout", endpoint="shop-9", cohort=NEW,
                    requests=30, errors=k % 3, attempts_sum=31, attempts_count=30,
                    latency={450 + k % 7: 30, 500: k % 4}))
            store.write(paths, cells)
        store.write_events([Event(OVERLOAD_EVENT, T0 + 104 * W, detail={"reason": "late"}),
                            Event(OVERLOAD_EVENT, T0 + 125 * W, detail={"reason": None})])
    return path


class _Whole:
    """The store as a source that reads the latency records whole (no streaming)."""

    def __init__(self, store: Store) -> None:
        self.read_endpoint_columns = store.read_endpoint_columns


# Records the fold gathers before summing them: fewer than a chunk's (each chunk summed
# alone, its buffer grown), several chunks' (sums across chunks), and the default.
@pytest.mark.parametrize("fold_records", [16, 300, pod_cells.FOLD_RECORDS])
@pytest.mark.parametrize("stratum_s", [None, 3 * W])
@pytest.mark.parametrize("since", [T0 + 60 * W, T0 + 100 * W])
def test_grids_read_in_chunks_are_those_read_whole(db: str, stratum_s: float | None,
                                                   since: float, fold_records: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cells, "FOLD_RECORDS", fold_records)
    with Store.open(db, readonly=True) as store:
        spans = [(a, b) for a, b, _ in overload_spans(store, T0 + WINDOWS * W + 1, W)]
        assert spans, "the overload span is in the store"
        kw: dict[str, Any] = dict(since=since, until=T0 + WINDOWS * W, warmup_s=30.0,
                                  window_s=W, stratum_s=stratum_s, exclude=spans)
        whole = read_pod_grids(_Whole(store), **kw)
        # Chunks of a few rows each: many chunks, pods and strata split across them.
        chunks: list[int] = []
        stream = store.stream_endpoint_columns

        def small(*args: Any, **kwargs: Any) -> Any:
            return _counted(stream(*args, chunk_rows=7, **kwargs), chunks)

        monkeypatch.setattr(store, "stream_endpoint_columns", small)
        chunked = read_pod_grids(store, **kw)
    _same_grids(chunked, whole)
    assert whole is not None and all(g.latency is not None for g in whole.values())
    assert "shop-9" in whole["checkout"].pods
    # Every record came, in many chunks.
    with Store.open(db, readonly=True) as store:
        records = len(store.read_endpoint_columns(since=since - 30.0, until=kw["until"],
                                                  stratum_s=stratum_s, latency=True).latency)
    assert len(chunks) > 10 and sum(chunks) == records


def _counted(cm: Any, sizes: list[int]) -> Any:
    """`cm` (a `stream_endpoint_columns` block) whose chunks' records are counted in
    `sizes`."""

    @contextlib.contextmanager
    def wrapped() -> Iterator[Any]:
        with cm as (cols, chunks):
            def each() -> Iterator[Any]:
                for chunk in chunks:
                    sizes.append(len(chunk))
                    yield chunk
            yield cols, each()

    return wrapped()


@pytest.mark.parametrize("strata", [None, 40])
def test_the_verdict_read_in_chunks_is_the_verdict_read_whole(
        db: str, strata: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    now = T0 + WINDOWS * W + 1
    if strata is not None:  # a day's strata: windows summed into a few each
        monkeypatch.setattr(verdict_service, "MAX_STRATA", strata)
    whole = compute_verdict(db, SETTINGS, now=now, overload=None)
    monkeypatch.setattr(store_sqlite, "LATENCY_CHUNK_ROWS", 5)
    chunked = compute_verdict(db, SETTINGS, now=now, overload=None)
    assert chunked == whole
    rules = {name: m["rule"] for p in whole["paths"] for name, m in p["metrics"].items()}
    assert rules["latency_p99_ms"] == "pods", rules


def test_read_whole_is_every_chunk_joined(db: str) -> None:
    with Store.open(db, readonly=True) as store:
        whole = store.read_endpoint_columns(since=T0, latency=True)
        with store.stream_endpoint_columns(since=T0, chunk_rows=11) as (cols, chunks):
            parts = list(chunks)
    assert len(parts) > 10 and not len(cols.latency)
    for f in dataclasses.fields(whole.latency):
        np.testing.assert_array_equal(np.concatenate([getattr(p, f.name) for p in parts]),
                                      getattr(whole.latency, f.name), err_msg=f.name)


@pytest.mark.parametrize("chunk_rows", [7, 100_000])
# Strata from the epoch, not from `since`: 30 s strata (the windows' starts are not
# multiples of 30) read from 7 s past a window; 25 s strata from 1 s past one. A stratum
# then straddles two ranges of rows (they start at the first window read).
@pytest.mark.parametrize(("offset", "stratum"), [(7.0, 3 * W), (1.0, 25.0)])
def test_strata_are_the_sums_sqlite_groups(db: str, chunk_rows: int, offset: float,
                                           stratum: float) -> None:
    # The strata are summed in numpy from ranges of rows (a stratum may straddle two):
    # the same rows, in the same order, as SQLite's GROUP BY over every row gives.
    import sqlite3

    since = T0 + offset
    with Store.open(db, readonly=True) as store, store.stream_endpoint_columns(
            since=since, stratum_s=stratum, latency=False, chunk_rows=chunk_rows) as (cols, _):
        pass
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            f"SELECT {stratum!r} * CAST(start / {stratum!r} AS INTEGER) AS s, p.name,"
            " e.name, c.name, SUM(requests), SUM(errors),"
            " SUM(attempts_sum), SUM(attempts_count) FROM endpoint_windows"
            " JOIN names AS p ON p.id = path_id JOIN names AS c ON c.id = cohort_id"
            " JOIN endpoints AS e ON e.id = endpoint_id WHERE start >= ?"
            " GROUP BY s, path_id, endpoint_id, cohort_id ORDER BY s, path_id, endpoint_id,"
            " cohort_id", (since,)).fetchall()
    finally:
        conn.close()
    got = list(zip(cols.start.tolist(), (cols.paths[i] for i in cols.path),
                   (cols.endpoints[i] for i in cols.endpoint),
                   (cols.cohorts[i] for i in cols.cohort), cols.requests.tolist(),
                   cols.errors.tolist(), cols.attempts_sum.tolist(),
                   cols.attempts_count.tolist(), strict=True))
    assert got == [tuple(r) for r in rows]
    assert len(set(cols.start.tolist())) > 50


@pytest.fixture(scope="module")
def stopped(db: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`db` where the canary's path windows of `search` stop 20 windows before the end:
    the comparison ends at the last window both cohorts have."""
    import shutil
    import sqlite3

    path = str(tmp_path_factory.mktemp("stopped") / "probe.db")
    shutil.copy(db, path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "DELETE FROM path_windows WHERE start >= ? AND path_id = (SELECT id FROM names"
            " WHERE kind = 'path' AND name = 'search') AND cohort_id = (SELECT id FROM names"
            " WHERE kind = 'cohort' AND name = ?)", (T0 + (WINDOWS - 20) * W, NEW))
    conn.close()
    return path


@pytest.mark.parametrize("at", [WINDOWS, 110, 85])  # the end; inside the late span; before it
@pytest.mark.parametrize("since", [None, "-15m"])
@pytest.mark.parametrize("store", ["db", "stopped"])
def test_the_verdict_from_path_windows_pooled_in_ranges_is_the_verdict_read_whole(
        store: str, at: int, since: str | None, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `skewprobe verdict --store` pools the path windows a range of rows at a time instead
    # of holding the table whole: the verdict must not change by a byte, p99's late span,
    # the pods moving, a cohort that stops and the comparison's origin included.
    db = request.getfixturevalue(store)
    now = T0 + at * W + 1
    pooled: list[int] = []
    pool = pooling.pooled_windows

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = pool(*args, **kwargs)
        pooled.append(len(out[0]))
        return out

    monkeypatch.setattr(pooling, "POOL_ROWS", 9)
    monkeypatch.setattr(verdict_cache, "pooled_windows", counted)
    monkeypatch.setattr(verdict_service, "pooled_windows", counted)
    ranged = compute_verdict(db, SETTINGS, now=now, since=since, overload=None)
    monkeypatch.setattr(verdict_service, "_PooledStore", lambda store, _: store)
    whole = compute_verdict(db, SETTINGS, now=now, since=since, overload=None)
    assert json.dumps(ranged, sort_keys=True) == json.dumps(whole, sort_keys=True)
    assert whole["baseline"] and whole["canary"] == NEW
    # The comparison's rows were pooled: fewer than a cohort's windows (the stored rows are
    # one per window, path and cohort), those the late span touches kept alone.
    assert pooled and max(pooled) < WINDOWS, pooled
    if at == 110:
        p99 = [p["metrics"]["latency_p99_ms"]["reason"] for p in whole["paths"]]
        assert all("left out of p99" in r for r in p99), p99


def test_window_span_is_the_first_and_last_start_and_the_rows(db: str) -> None:
    with Store.open(db, readonly=True) as store:
        table = store.read_table(since=T0 + 30 * W, until=T0 + 90 * W, paths=["search"])
        span = store.window_span(T0 + 30 * W, T0 + 90 * W, ["search"])
        assert store.window_span(T0 + WINDOWS * W) is None
    assert span == (table.start.min(), table.start.max(), len(table)) and len(table) == 120


def test_a_day_is_judged_in_strata_of_a_minute() -> None:
    # Windows each up to MAX_STRATA; then the shortest minute x 2^k, from the epoch.
    length = verdict_service.stratum_length
    assert length(4 * 3600, W) is None
    assert length(24 * 3600 + 120, W) == 60.0  # a day and its warm-up
    assert length(2 * 24 * 3600, W) == 120.0 and length(3 * 24 * 3600, W) == 240.0


def test_strata_are_anchored_at_the_epoch_not_the_origin(
        db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two comparisons 70 s apart are judged in the same strata (starts that are multiples
    # of the stratum, cells equal where both have them): a stratum does not depend on the
    # canary's first window, so one summed once stands for every verdict's.
    monkeypatch.setattr(verdict_service, "MAX_STRATA", 20)
    until = T0 + WINDOWS * W
    with Store.open(db, readonly=True) as store:
        early, late = (verdict_service._pod_grids(store, since, until, None, 0.0, window_s=W)
                       for since in (T0 + 40 * W, T0 + 47 * W))
    assert early and late and early.keys() == late.keys()
    for name, g in late.items():
        e = early[name]
        assert len(g.starts) > 10 and not np.any(np.fmod(g.starts, 60.0))
        assert np.diff(g.starts).min() == 60.0
        at = np.searchsorted(e.starts, g.starts)
        np.testing.assert_array_equal(e.starts[at], g.starts)
        for k, pod in enumerate(zip(g.pods, g.cohorts, strict=True)):
            row = list(zip(e.pods, e.cohorts, strict=True)).index(pod)
            np.testing.assert_array_equal(e.calls[row, at], g.calls[k], err_msg=str(pod))
            np.testing.assert_array_equal(e.errors[row, at], g.errors[k], err_msg=str(pod))


def test_kept_grids_share_their_cells_with_the_verdicts(db: str) -> None:
    # The cache keeps the sealed strata's grids and a verdict appends the newer strata:
    # the kept parts become views of the verdict's (not a second copy of a day's cells),
    # with the same values; a part whose pods change (a pod joins) keeps its own cells.
    from probes.store.columns import take
    from probes.verdict.cache import _strata
    from probes.verdict.grids import Rules, extend_all

    with Store.open(db, readonly=True) as store:
        cols = _strata(store.read_endpoint_columns(since=T0), 60.0)
    rules = Rules(T0 + 10 * W, 30.0, 60.0, ())
    seal = T0 + 60 * W  # before shop-9 joins the canary of checkout
    kept = extend_all({}, take(cols, cols.start < seal), rules)
    before = {name: (p.calls.copy(), p.pods) for name, p in kept.items()}
    out = extend_all(kept, take(cols, cols.start >= seal), rules)
    for name, p in kept.items():
        calls, pods = before[name]
        np.testing.assert_array_equal(p.calls, calls)
        shared = np.shares_memory(p.calls, out[name].calls)
        assert shared == (out[name].pods == pods), name
    assert not np.shares_memory(kept["checkout"].calls, out["checkout"].calls)
    assert np.shares_memory(kept["search"].calls, out["search"].calls)
    # The next verdict appends its strata again into the room after the kept columns
    # (what the last verdict appended there is read again), not into a copy of them all;
    # the kept columns stay as they were.
    search = kept["search"].calls.copy()
    again = extend_all(kept, take(cols, cols.start >= seal), rules)
    for name, p in again.items():
        np.testing.assert_array_equal(p.calls, out[name].calls, err_msg=name)
    np.testing.assert_array_equal(kept["search"].calls, search)
    assert again["search"].calls.ctypes.data == out["search"].calls.ctypes.data


def test_strata_rows_are_summed_per_key_in_key_order() -> None:
    # (stratum, path, endpoint, cohort, then counts), as a range's rows come.
    rows = np.array([[5, 1, 2, 3, 10, 1], [5, 1, 2, 4, 20, 2], [5, 2, 0, 0, 30, 3],
                     [6, 0, 0, 0, 40, 4]], dtype=np.int64)
    assert np.array_equal(_strata.summed(rows), rows)  # one row a key, in order
    twice = np.concatenate([rows, rows[1:2]])  # a key again, after keys above it
    expected = rows.copy()
    expected[1, 4:] *= 2
    assert np.array_equal(_strata.summed(twice), expected)
    assert np.array_equal(_strata.summed(rows[::-1].copy()), rows)
    same = np.array([[5, 1, 2, 3, 1, 0], [5, 1, 2, 3, 2, 1]], dtype=np.int64)
    assert np.array_equal(_strata.summed(same), [[5, 1, 2, 3, 3, 1]])


@pytest.mark.parametrize("last", [13, WINDOWS])
def test_a_read_of_one_chunk_is_the_read_chunk_by_chunk(
        db: str, tmp_path: Any, last: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that fit one chunk (the running probe's re-read of its last windows) come with
    their latency records from one query: the columns and records of a chunked read, a
    pod without latency records in a window included."""
    path = str(tmp_path / "copy.db")
    with Store.open(db, readonly=True) as src, Store.open(path) as store:
        store.write(src.read_windows(since=T0), src.read_endpoint_windows(since=T0))
        store.write([], [EndpointWindow(
            start=T0 + (WINDOWS - 1) * W, path="checkout", endpoint="shop-10", cohort=NEW,
            requests=0, errors=0, attempts_sum=0, attempts_count=0, latency={})])
    once: list[int] = []
    real = store_sqlite._rows_with_blobs

    def counted(*args: Any) -> Any:
        once.append(1)
        return real(*args)

    monkeypatch.setattr(store_sqlite, "_rows_with_blobs", counted)
    since = T0 + (WINDOWS - last) * W
    with Store.open(path, readonly=True) as store:
        whole = store.read_endpoint_columns(since=since, latency=True)
        assert once == [1]
        monkeypatch.setattr(store_sqlite, "LATENCY_CHUNK_ROWS", 11)
        chunked = store.read_endpoint_columns(since=since, latency=True)
        assert once == [1]
    assert "shop-10" in whole.endpoints and len(whole.latency) > 1000
    for f in dataclasses.fields(whole):
        a, b = getattr(whole, f.name), getattr(chunked, f.name)
        if f.name == "latency":
            for g in dataclasses.fields(a):
                np.testing.assert_array_equal(getattr(a, g.name), getattr(b, g.name),
                                              err_msg=g.name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=f.name)
