"""Window flush cost: what the runner's worker thread spends per 10 s window at N endpoints.

Each window the runner takes the finished windows on the event loop (`take()`: counters
copied into columns) and writes them to SQLite in a worker thread, the endpoint windows
made one at a time as `Store.write()` binds them (`Taken.endpoint_windows()`). The thread
holds the GIL while it runs Python, so every millisecond of the write is a millisecond the
event loop may wait for it at the switch interval, and every millisecond of `take()` is
the loop's own.

Real code, no probe process: a `WindowAggregator` fed one ok call per endpoint and path per
window; `take()`, then the path windows' build and the write, timed with
`time.thread_time()` (CPU of this thread). The first window is reported apart (it interns
every endpoint's labels). Each write rolls up the minutes past the rewrite horizon into the
per-minute rollups (schema v3) as the runner's writer does, and the hours whose minutes are
rolled into the hour rollups (schema v5 and v6: endpoint and path hours, once an hour);
the writes that rolled a minute, and those that rolled an hour (from 370 windows on:
`--windows 400`), are reported apart too (`--no-roll`: never, for the write's cost without
them). Then,
apart from the timing, the memory one window's counters hold
in the aggregator (`tracemalloc`, one window of calls with per-endpoint attempts and
latency, as schema v2 keeps them): the aggregator holds a window until it is `retain_s`
past its flush.

    .venv/bin/python benchmarks/window_write.py                 # 2,400 endpoints, 2 paths
    .venv/bin/python benchmarks/window_write.py --endpoints 600 --windows 20
    .venv/bin/python benchmarks/window_write.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.measure.window import WindowAggregator
from probes.store import Store
from probes.types import CallOutcome, CallResult, Endpoint, Outcome


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoints", type=int, default=2400)
    ap.add_argument("--paths", type=int, default=2, help="paths per endpoint (2)")
    ap.add_argument("--windows", type=int, default=36)
    ap.add_argument("--quick", action="store_true", help="24 windows (for run_all.py)")
    ap.add_argument("--no-roll", action="store_true", help="write without rolling minutes up")
    args = ap.parse_args(argv)
    if args.endpoints < 1 or args.paths < 1 or args.windows < 2:
        print("window_write: need endpoints >= 1, paths >= 1, windows >= 2", file=sys.stderr)
        return 2
    windows = 24 if args.quick else args.windows
    endpoints = [
        Endpoint(f"pod-{i}", f"127.77.{i // 250}.{i % 250 + 1}", 8080, {
            "pod": f"pod-{i}", "namespace": "shop", "service": "checkout",
            "proxy_version": "1.21.0" if i % 2 else "1.20.3",
        })
        for i in range(args.endpoints)
    ]
    paths = [f"path-{p}" for p in range(args.paths)]
    take_ms: list[float] = []
    write_ms: list[float] = []
    rolled: list[bool] = []
    rolled_rows: list[int] = []  # rollup rows each write added
    hour_rows: list[int] = [0]  # hour rollup rows after each write
    rows = 0
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        store = Store.open(db)
        agg = WindowAggregator(length_s=10.0, grace_s=1.0)
        start = 1_800_000_000.0
        for w in range(windows):
            t = start + 10.0 * w
            for e in endpoints:
                cohort = e.labels["proxy_version"]
                for path in paths:
                    agg.add(CallResult(path, e.name, cohort, t + 1.0, 0.001, 0.0,
                                       CallOutcome(Outcome.OK)), e.labels)
            c0 = time.thread_time()
            taken = agg.take(t + 12.0)
            c1 = time.thread_time()
            horizon = None if args.no_roll else agg.settled_before(t)
            store.write(taken.path_windows(), taken.endpoint_windows(), roll_before=horizon)
            c2 = time.thread_time()
            rolled.append(_rollups(db) > sum(rolled_rows))
            rolled_rows.append(_rollups(db) - sum(rolled_rows))
            hour_rows.append(_rollups(db, "endpoint_hours"))
            rows = sum(len(c.keys) for c in taken.endpoint_columns)
            take_ms.append(1000 * (c1 - c0))
            write_ms.append(1000 * (c2 - c1))
        store.close()
    held = _window_memory(endpoints, paths)
    cmd = "benchmarks/window_write.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"## window flush: {cmd.strip()}\n")
    hour = [b > a for a, b in itertools.pairwise(hour_rows)]
    plain = [ms for ms, r in zip(write_ms[1:], rolled[1:], strict=True) if not r]
    rolling = [ms for ms, r, h in zip(write_ms[1:], rolled[1:], hour[1:], strict=True)
               if r and not h]
    hourly = [ms for ms, h in zip(write_ms[1:], hour[1:], strict=True) if h]
    roll_cell, hour_cell = (f"{statistics.median(x):.1f} / {max(x):.1f} ({len(x)})"
                            if x else "–" for x in (rolling, hourly))
    print("| endpoint rows per window | windows | first: take / write ms | "
          "later, median: take / write ms | later, max: take / write ms | "
          "writes that rolled a minute: median / max ms (how many) | writes that rolled an"
          " hour, ms | one window held, KiB |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {rows:,} | {windows} | {take_ms[0]:.1f} / {write_ms[0]:.1f} | "
          f"{statistics.median(take_ms[1:]):.1f} / {statistics.median(plain):.1f} | "
          f"{max(take_ms[1:]):.1f} / {max(plain):.1f} | {roll_cell} | {hour_cell} |"
          f" {held / 1024:,.0f} |")
    return 0


def _rollups(db: Path, table: str = "endpoint_rollups") -> int:
    """Rows in the store's per-minute (or hour) rollups (read apart from the writer, untimed)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def _window_memory(endpoints: list[Endpoint], paths: list[str]) -> int:
    """Bytes one window's counters hold in a fresh aggregator: one call per endpoint and
    path with an attempt count, as the timed loop makes (after a first window, so the
    endpoint keys, kept across windows, are not counted)."""
    agg = WindowAggregator(length_s=10.0, grace_s=1.0)
    outcome = CallOutcome(Outcome.OK, 200, attempts=1)

    def one_window(t: float) -> None:
        for e in endpoints:
            cohort = e.labels["proxy_version"]
            for path in paths:
                agg.add(CallResult(path, e.name, cohort, t + 1.0, 0.001, 0.0, outcome), e.labels)

    one_window(1_800_000_000.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        one_window(1_800_000_010.0)
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


if __name__ == "__main__":
    sys.exit(main())
