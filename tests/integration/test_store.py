"""The SQLite store: round trips, replace-on-write, schema guard, corruption, kill -9, full disk."""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

import probes.store
from probes.errors import StoreCorrupt, StoreError
from probes.measure.histogram import BUCKET_COUNT, Histogram
from probes.measure.window import WindowAggregator
from probes.store import Event, InventoryRow, Store
from probes.types import CallOutcome, CallResult, EndpointWindow, Outcome, PathWindow
from tests.servers.tiny_disk import on_tiny_disk


def window(
    start: float,
    path: str = "checkout",
    cohort: str = "1.20.3",
    *,
    values: tuple[float, ...] = (0.002, 0.003),
    outcomes: dict[str, int] | None = None,
    **extra: object,
) -> PathWindow:
    return PathWindow(
        start=start, length=10.0, path=path, cohort=cohort,
        outcomes=outcomes if outcomes is not None else {Outcome.OK: len(values)},
        latency=Histogram.from_values(values).to_window(), **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "skewprobe.db")
    yield s
    s.close()


def aggregated_windows() -> tuple[list[PathWindow], list[EndpointWindow]]:
    """Realistic windows from the aggregator: two paths, two cohorts, a stream path."""
    rng = np.random.default_rng(4)
    agg = WindowAggregator(length_s=10.0, grace_s=1.0)
    for i in range(3000):
        outcome = CallOutcome(
            Outcome.HTTP_5XX if i % 50 == 0 else Outcome.OK,
            attempts=None if i % 7 == 0 else 1 + (i % 3 == 0), churn=int(i % 101 == 0),
        )
        agg.add(
            CallResult(("checkout", "search")[i % 2], f"pod-{i % 6}",
                       ("1.20.3", "1.21.0")[i % 3 > 0], 1000.0 + i * 0.02,
                       float(rng.lognormal(-6, 0.7)), i * 1e-5, outcome),
            {"pod": f"pod-{i % 6}", "namespace": "shop"},
        )
    labels = {"pod": "pod-9"}
    agg.add_stream_open("watch", "1.21.0", "pod-9", at=1001.0, labels=labels)
    agg.add_stream_reset("watch", "1.21.0", "pod-9", "goaway", at=1012.0, labels=labels)
    agg.add_stream_time("watch", "1.21.0", "pod-9", 1001.0, 1015.0)
    return agg.flush(now=1e9)


def test_round_trip_of_aggregated_windows(store: Store) -> None:
    paths, endpoints = aggregated_windows()
    assert store.write(paths, endpoints) == len(paths)
    assert store.read_windows() == sorted(paths, key=lambda w: (w.start, w.path, w.cohort))
    got = store.read_endpoint_windows()
    assert sorted(got, key=lambda e: (e.start, e.path, e.endpoint)) == sorted(
        endpoints, key=lambda e: (e.start, e.path, e.endpoint)
    )
    assert store.paths() == ["checkout", "search", "watch"]
    assert store.cohorts() == ["1.20.3", "1.21.0"]
    assert store.time_range() == (1000.0, 1060.0)  # last call at 1059.98


def test_rewriting_a_key_replaces_it(store: Store) -> None:
    store.write([window(10.0), window(20.0)])
    store.write([window(10.0), window(20.0)])  # a retried write: no double counting
    assert [w.requests for w in store.read_windows()] == [2, 2]
    store.write([window(10.0, values=(0.002, 0.002, 0.004))])  # the same window, now whole
    got = store.read_windows()
    assert [w.requests for w in got] == [3, 2]
    assert Histogram.from_window(got[0].latency).count == 3
    e = EndpointWindow(10.0, "checkout", "pod-0", "1.20.3", 3, 1, {"pod": "pod-0"})
    store.write([], [e])
    store.write([], [EndpointWindow(10.0, "checkout", "pod-0", "1.20.3", 5, 2, {"pod": "pod-0"})])
    assert [(x.requests, x.errors) for x in store.read_endpoint_windows()] == [(5, 2)]


def test_an_endpoints_labels_are_stored_as_they_are_in_each_window(store: Store) -> None:
    # Endpoint ids are cached by labels object; a pod back with new labels (a new object)
    # must not get the old ones, and an equal new object must not make a second endpoint.
    before = MappingProxyType({"pod": "pod-0", "proxy_version": "1.20.3"})
    after = MappingProxyType({"pod": "pod-0", "proxy_version": "1.21.0"})
    store.write([], [EndpointWindow(10.0, "checkout", "pod-0", "1.20.3", 1, 0, before)])
    store.write([], [EndpointWindow(20.0, "checkout", "pod-0", "1.21.0", 1, 0, after)])
    store.write([], [EndpointWindow(30.0, "checkout", "pod-0", "1.21.0", 1, 0, dict(after))])
    got = store.read_endpoint_windows()
    assert [w.labels["proxy_version"] for w in got] == ["1.20.3", "1.21.0", "1.21.0"]
    totals = store.read_endpoint_totals()
    assert sorted(t.requests for t in totals) == [1, 2]


def test_filters_and_order(store: Store) -> None:
    store.write(
        [window(t, p, c) for t in (30.0, 10.0, 20.0) for p in ("b", "a") for c in ("v2", "v1")]
    )
    got = store.read_windows(since=15.0, until=30.0, paths=["a"], cohorts=["v1", "v2"])
    assert [(w.start, w.path, w.cohort) for w in got] == [(20.0, "a", "v1"), (20.0, "a", "v2")]
    assert [(w.start, w.path, w.cohort) for w in store.read_windows(since=30.0)][:2] == [
        (30.0, "a", "v1"), (30.0, "a", "v2"),
    ]
    assert store.read_windows(paths=["nope"]) == []
    assert len(store.read_table(cohorts=["v2"])) == 6


def test_endpoint_totals_sum_windows_per_endpoint(store: Store) -> None:
    paths, endpoints = aggregated_windows()
    store.write(paths, endpoints)
    got = store.read_endpoint_totals()
    want: dict[tuple[str, str, str], list[float]] = {}
    for e in endpoints:
        acc = want.setdefault((e.path, e.endpoint, e.cohort), [e.start, 0, 0])
        acc[0] = min(acc[0], e.start)
        acc[1] += e.requests
        acc[2] += e.errors
    assert [(t.path, t.endpoint, t.cohort) for t in got] == sorted(want)
    for t in got:
        assert [t.start, t.requests, t.errors] == want[(t.path, t.endpoint, t.cohort)]
        assert t.labels["pod"] == t.endpoint
    # Filters: the range, paths, cohorts, endpoint names; failing_only sums error windows.
    later = store.read_endpoint_totals(since=1020.0, paths=["checkout"], cohorts=["1.21.0"])
    assert {t.path for t in later} == {"checkout"} and {t.cohort for t in later} == {"1.21.0"}
    assert all(t.start >= 1020.0 for t in later)
    pod = store.read_endpoint_totals(endpoints=["pod-0", "nope"])
    assert {t.endpoint for t in pod} == {"pod-0"}
    failing = store.read_endpoint_totals(failing_only=True)
    assert {(t.path, t.endpoint, t.cohort): t.errors for t in failing} == {
        k: v[2] for k, v in want.items() if v[2]}
    assert store.read_endpoint_totals(endpoints=[]) == []


def test_table_columns_and_pooled_histograms(store: Store) -> None:
    rng = np.random.default_rng(8)
    samples: dict[tuple[str, str], list[np.ndarray]] = {}
    windows = []
    for k in range(4500):  # > one fetch chunk
        path, cohort = ("a", "b", "c")[k % 3], ("v1", "v2")[k % 2]
        values = rng.lognormal(-6, 0.4, 40)
        samples.setdefault((path, cohort), []).append(values)
        windows.append(window(10.0 * (k // 6), path, cohort, values=tuple(values),
                              outcomes={Outcome.OK: 39, "grpc_UNAVAILABLE": 1},
                              attempts_sum=50, attempts_count=40))
    # A window whose one bucket holds more than 255 calls (stored split over records).
    windows.append(window(1e6, "a", "v1", values=(0.005,) * 1000))
    samples[("a", "v1")].append(np.full(1000, 0.005))
    store.write(windows)
    table = store.read_table()
    assert len(table) == 4501 and table.paths == ("a", "b", "c") and table.cohorts == ("v1", "v2")
    assert list(table.start) == sorted(table.start)
    assert table.outcome_names == ("grpc_UNAVAILABLE", "ok")
    assert table.outcomes[:, 1].sum() == 4500 * 39 + 1000 and table.requests[-1] == 1000
    group = table.path * 2 + table.cohort
    pooled = table.latency_by_group(group, 6)
    for (path, cohort), parts in samples.items():
        g = table.paths.index(path) * 2 + table.cohorts.index(cohort)
        assert np.array_equal(pooled[g], Histogram.from_values(np.concatenate(parts)).counts)
    sel = table.select(table.mask(paths=["a"], cohorts=["v1"], since=1e6))
    assert len(sel) == 1 and sel.latency_histogram().count == 1000
    assert sel.window(0) == windows[-1]


def test_events(store: Store) -> None:
    storm = Event("storm", 100.0, path="watch", cohort="1.21.0",
                  detail={"resets": 40, "endpoints": ["pod-1", "pod-2"]})
    store.write_events([storm, storm, Event("restart", 50.0, endpoint="pod-1")])
    assert [e.kind for e in store.read_events()] == ["restart", "storm"]
    got = store.read_events(since=60.0, kinds=["storm"], paths=["watch"])
    assert got == [storm] and got[0].detail["endpoints"] == ["pod-1", "pod-2"]
    assert store.read_events(until=50.0) == []
    with pytest.raises(ValueError, match="JSON"):
        store.write_events([Event("bad", 1.0, detail={"x": object()})])


def test_inventory_snapshots(store: Store) -> None:
    a = InventoryRow("shop", "checkout", "1.20.3", 10, 86400.0)
    b = InventoryRow("shop", "checkout", "1.21.0", 2, 60.0)
    store.write_inventory(100.0, [a])
    store.write_inventory(200.0, [a, b])
    store.write_inventory(300.0, [])  # every pod gone is a state too
    store.write_inventory(200.0, [b])  # replaces the snapshot at 200
    snaps = store.read_inventory()
    assert [(s.at, s.rows) for s in snaps] == [(100.0, (a,)), (200.0, (b,)), (300.0, ())]
    # The state in force at `since` comes first.
    assert [s.at for s in store.read_inventory(since=250.0)] == [200.0, 300.0]
    with pytest.raises(ValueError):
        store.write_inventory(400.0, [a, a])


def test_prune(store: Store) -> None:
    store.write([window(10.0), window(20.0)], [EndpointWindow(10.0, "checkout", "p", "v", 1, 0)])
    store.write_events([Event("restart", 5.0), Event("restart", 25.0)])
    store.write_inventory(1.0, [])
    store.write_inventory(12.0, [])
    store.prune(before=15.0)
    assert [w.start for w in store.read_windows()] == [20.0]
    assert store.read_endpoint_windows() == []
    assert [e.at for e in store.read_events()] == [25.0]
    assert [s.at for s in store.read_inventory()] == [12.0]


def test_new_store_is_wal_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()
    assert meta == {"application": "skewprobe", "schema_version": str(probes.store.SCHEMA_VERSION)}


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text
    return text


def test_refuses_newer_or_unknown_schema_and_foreign_databases(tmp_path: Path) -> None:
    for version, says in (("99", "newer"), ("0", "unknown store schema v0")):
        other = tmp_path / f"v{version}.db"
        Store.open(other).close()
        conn = sqlite3.connect(other)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
        conn.commit()
        conn.close()
        with pytest.raises(StoreError, match=says) as err:
            Store.open(other)
        assert not isinstance(err.value, StoreCorrupt) and str(other) in _one_line(err.value)

    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a skewprobe store"):
        Store.open(foreign)


def test_not_sqlite_and_corrupted_files(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database " * 200)
    with pytest.raises(StoreCorrupt, match="not a SQLite database") as err:
        Store.open(garbage)
    _one_line(err.value)

    damaged = tmp_path / "damaged.db"
    with Store.open(damaged) as s:
        s.write([window(10.0 * k, f"p{k % 7}") for k in range(3000)])
    with damaged.open("r+b") as f:  # overwrite table pages, keep the header and schema page
        f.seek(4096 * 3)
        f.write(np.random.default_rng(0).bytes(4096 * 20))
    with pytest.raises(StoreCorrupt) as err, Store.open(damaged) as s:
        s.read_windows()
    assert "corrupted" in _one_line(err.value)


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store"):
        Store.open(tmp_path / "missing.db", readonly=True)
    with pytest.raises(StoreError, match="directory"):
        Store.open(tmp_path)
    with pytest.raises(StoreError):
        Store.open(tmp_path / "no" / "such" / "dir.db")
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(StoreError, match="empty"):
        Store.open(tmp_path / "empty.db", readonly=True)


def test_readonly_reader_beside_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path) as writer:
        writer.write([window(10.0)])
        with Store.open(path, readonly=True) as reader:
            assert len(reader.read_windows()) == 1
            writer.write([window(20.0)])
            assert len(reader.read_windows()) == 2  # sees each commit
            with pytest.raises(StoreError, match="read-only"):
                reader.write([window(30.0)])


_CHILD_WRITER = textwrap.dedent("""
    import sys
    from probes.types import PathWindow
    from probes.measure.histogram import Histogram
    from probes.store import Store

    latency = Histogram.from_values([0.001 * (1 + i / 100) for i in range(300)]).to_window()
    store = Store.open(sys.argv[1])
    for k in range(1_000_000):
        store.write([PathWindow(start=10.0 * k, length=10.0, path=f"p{j}", cohort="v1",
                                outcomes={"ok": 300}, latency=latency) for j in range(20)])
        if k == 19:
            print("committed", flush=True)
""")


def test_committed_windows_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD_WRITER, str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
            assert sel.select(timeout=30), "writer never committed"
        assert proc.stdout is not None and proc.stdout.readline().strip() == "committed"
        # It keeps writing; kill it mid-stream, most likely inside a transaction.
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, stderr
    with Store.open(path) as s:
        s.check()
        table = s.read_table()
    starts = np.unique(table.start)
    assert starts.size >= 20
    # Only whole transactions: windows 0..n-1 all present, 20 paths each, nothing else.
    assert np.array_equal(starts, 10.0 * np.arange(starts.size))
    assert len(table) == 20 * starts.size and np.all(table.requests == 300)


_CHILD_FILLER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from probes.errors import StoreError
    from probes.types import PathWindow
    from probes.measure.histogram import Histogram
    from probes.store import Store

    rng = np.random.default_rng(1)
    store = Store.open(sys.argv[1])
    limit = sys.argv[2:]
    if limit:  # no tmpfs: cap the file instead; SQLite reports the same SQLITE_FULL
        store._conn.execute(f"PRAGMA max_page_count = {int(limit[0])}")
    written, error = 0, None
    for k in range(10_000):
        w = [PathWindow(start=10.0 * k, length=10.0, path=f"p{j}", cohort="v1",
                        outcomes={"ok": 500}, latency=Histogram.from_values(
                            rng.lognormal(-5, 1, 500)).to_window()) for j in range(10)]
        try:
            store.write(w)
        except StoreError as exc:
            error = (type(exc).__name__, str(exc))
            break
        written += 1
    readable = len({w.start for w in store.read_windows()})
    print(json.dumps({"written": written, "error": error, "readable": readable}))
""")


def _check_full(out: str) -> None:
    result = json.loads(out)
    assert result["error"] is not None, "the disk never filled"
    kind, message = result["error"]
    assert kind == "StoreError" and "disk full" in message and "\n" not in message
    assert result["written"] > 0 and result["readable"] == result["written"]


def test_full_disk_raises_store_error_on_a_tiny_tmpfs(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    proc = on_tiny_disk(mnt, 512, [sys.executable, "-c", _CHILD_FILLER, str(mnt / "s.db")],
                        timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    _check_full(proc.stdout)


def test_full_database_raises_store_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD_FILLER, str(tmp_path / "s.db"), "60"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    _check_full(proc.stdout)


def test_exports() -> None:
    for name in probes.store.__all__:
        assert hasattr(probes.store, name)
    assert probes.store.DEFAULT_PATH == "skewprobe.db"


def test_write_is_all_or_nothing(store: Store) -> None:
    bad = PathWindow(start=20.0, length=10.0, path="x", cohort="v", outcomes={}, latency=(1, 2))
    with pytest.raises(ValueError):
        store.write([window(10.0), bad])
    assert store.read_windows() == []
    store.write([window(10.0, "y")])  # names interned by the failed write are not reused
    assert store.paths() == ["y"] and store.read_windows()[0].path == "y"
    assert os.path.exists(store.path)
    assert len(store.read_windows()[0].latency) == BUCKET_COUNT


def test_endpoint_windows_are_written_as_they_are_made(store: Store) -> None:
    # The runner hands the store a generator (`Taken.endpoint_windows`): a write that made
    # a list of every row first would hold thousands of objects at once, which is what
    # set off a young collection at every window (BENCHMARKS.md).
    agg = WindowAggregator(length_s=10.0, grace_s=1.0)
    for i in range(4_800):
        labels = MappingProxyType({"pod": f"pod-{i}"})  # as every Endpoint's are
        agg.add(CallResult("checkout", f"pod-{i}", "1.20.3", 1.0, 0.002, 0.0,
                           CallOutcome(Outcome.OK)), labels)
    taken = agg.take(now=11.0)
    store.write(taken.path_windows(), taken.endpoint_windows())  # names and ids interned
    young: list[int] = []

    def watched():
        for n, e in enumerate(taken.endpoint_windows()):
            if n % 100 == 0:
                young.append(gc.get_count()[0])
            yield e

    gc.disable()
    try:
        store.write([], watched())
    finally:
        gc.enable()
    assert len(young) == 48
    assert max(young) - min(young) < 100  # a list of rows would be ~4,800 (or 9,600)
    assert len(store.read_endpoint_windows()) == 4_800


def test_endpoint_columns_in_strata_sum_what_the_windows_hold(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    t0 = 1_790_000_000.0
    rows = [EndpointWindow(start=t0 + 10 * k, path=p, endpoint=e, cohort=c,
                           requests=int(rng.integers(1, 50)), errors=int(rng.integers(0, 3)))
            for k in range(30) for p in ("a", "b") for e, c in (("pod-0", "v1"), ("pod-1", "v2"))]
    with Store.open(str(tmp_path / "s.db")) as store:
        store.write([], rows)
        fine = store.read_endpoint_columns(since=t0 + 5)
        coarse = store.read_endpoint_columns(since=t0 + 5, stratum_s=60.0)
    assert len(coarse) < len(fine)
    # Strata start at multiples of 60 s from the epoch, whatever `since` (the first one
    # before it: only its rows from `since` are read), and each (path, endpoint, cohort)
    # keeps its totals.
    assert not np.any(np.fmod(coarse.start, 60.0)) and coarse.start[0] == t0 - 20.0
    for cols in (fine, coarse):
        assert np.all(np.diff(cols.start) >= 0)
    def totals(cols):  # type: ignore[no-untyped-def]
        out = {}
        for i in range(len(cols)):
            key = (cols.paths[cols.path[i]], cols.endpoints[cols.endpoint[i]],
                   cols.cohorts[cols.cohort[i]])
            n, e = out.get(key, (0, 0))
            out[key] = (n + int(cols.requests[i]), e + int(cols.errors[i]))
        return out
    assert totals(coarse) == totals(fine)
    assert sum(r.requests for r in rows if r.start >= t0 + 5) == int(coarse.requests.sum())


def _as_v1(path: Path) -> None:
    """Turn a fresh store into what schema v1 wrote: endpoint windows without attempts and
    latency, version 1 in meta and header."""
    conn = sqlite3.connect(path)
    for column in ("latency", "attempts_count", "attempts_sum"):
        conn.execute(f"ALTER TABLE endpoint_windows DROP COLUMN {column}")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def test_a_v1_store_is_migrated_in_place_and_its_old_rows_read_as_unrecorded(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    Store.open(db).close()
    _as_v1(db)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO names (id, kind, name) VALUES (1, 'path', 'checkout'),"
                 " (2, 'cohort', 'v1')")
    conn.execute("INSERT INTO endpoints (id, name, labels) VALUES (1, 'pod-0', '{}')")
    conn.execute("INSERT INTO endpoint_windows VALUES (10.0, 1, 1, 2, 5, 1)")
    conn.commit()
    conn.close()

    # Read-only: read as it is (nothing can be written), the old row without per-pod data.
    with Store.open(db, readonly=True) as old:
        cols = old.read_endpoint_columns(latency=True)
        assert cols.unrecorded.tolist() == [1] and cols.attempts_count.tolist() == [0]
        assert len(cols.latency) == 0
        [e] = old.read_endpoint_windows()
        assert (e.requests, e.errors, e.attempts_count, dict(e.latency)) == (5, 1, 0, {})

    with Store.open(db) as store:  # writable: migrated, then written as v6
        store.write([], [EndpointWindow(20.0, "checkout", "pod-0", "v1", 2, 0, {},
                                        attempts_sum=3, attempts_count=2,
                                        latency={600: 1, 610: 1})])
        cols = store.read_endpoint_columns(latency=True)
        coarse = store.read_endpoint_columns(since=0.0, stratum_s=60.0, latency=True)
    assert cols.unrecorded.tolist() == [1, 0]
    assert cols.attempts_sum.tolist() == [0, 3] and cols.attempts_count.tolist() == [0, 2]
    assert sorted(zip(cols.latency.bucket.tolist(), cols.latency.count.tolist(),
                      strict=True)) == [(600, 1), (610, 1)]
    assert cols.latency.start.tolist() == [20.0, 20.0]
    # In strata, the stratum says how many of its windows were unrecorded.
    assert (coarse.unrecorded.tolist(), coarse.requests.tolist()) == ([1], [7])
    assert coarse.latency.start.tolist() == [0.0, 0.0]
    conn = sqlite3.connect(db)
    try:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version[0] == str(probes.store.SCHEMA_VERSION) == "6"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
    finally:
        conn.close()
    Store.open(db).close()  # opening a migrated store again changes nothing

