"""The window writer counts what it could not write: windows still pending at the end, and
windows pushed out of its full retry queue; `raise_if_lost` says how many (exit 4)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from probes.errors import EXIT_UNAVAILABLE, StoreError
from probes.measure.window import WindowAggregator
from probes.metrics import ProbeMetrics
from probes.run._window_writer import PENDING_WINDOWS, WindowWriter
from probes.store import Store
from probes.types import CallOutcome, CallResult, Outcome


async def test_windows_the_store_refuses_are_counted_and_raised(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store.open(path).close()
    aggregator = WindowAggregator(length_s=1.0, grace_s=0.0)
    writer = WindowWriter(aggregator, ProbeMetrics(CollectorRegistry()))
    # Opened read-only, every write is refused as a full disk's would be.
    with Store.open(path, readonly=True) as store:
        writer.store = store
        flushes = PENDING_WINDOWS + 5  # five more than the queue holds: pushed out, lost
        for k in range(flushes):
            aggregator.add(CallResult("checkout", "pod-0", "1.20.3", 1000.0 + k, 0.01, 0.0,
                                      CallOutcome(Outcome.OK, 200)))
            await writer.write(1001.0 + k, [], force=False)
        assert writer.windows_written == 0 and writer.error is not None
        assert writer.windows_unwritten == flushes
        with pytest.raises(StoreError) as err:
            writer.raise_if_lost()
    assert err.value.exit_code == EXIT_UNAVAILABLE
    assert str(err.value).startswith(f"{path}: {flushes:,} windows could not be written and "
                                     "are lost (")


async def test_nothing_lost_raises_nothing(tmp_path: Path) -> None:
    aggregator = WindowAggregator(length_s=1.0, grace_s=0.0)
    writer = WindowWriter(aggregator, ProbeMetrics(CollectorRegistry()))
    with Store.open(tmp_path / "s.db") as store:
        writer.store = store
        aggregator.add(CallResult("checkout", "pod-0", "1.20.3", 1000.0, 0.01, 0.0,
                                  CallOutcome(Outcome.OK, 200)))
        await asyncio.wait_for(writer.write(1001.0, [], force=True), 30)
    assert writer.windows_written == 1 and writer.windows_unwritten == 0
    writer.raise_if_lost()


async def test_each_write_rolls_up_the_minutes_past_the_rewrite_horizon(tmp_path: Path) -> None:
    import math
    import sqlite3

    aggregator = WindowAggregator(length_s=1.0, grace_s=0.0, retain_s=5.0)
    writer = WindowWriter(aggregator, ProbeMetrics(CollectorRegistry()))
    t0 = 1_000_040.0  # 20 s past a minute
    with Store.open(tmp_path / "s.db") as store:
        writer.store = store
        for k in range(200):
            for pod in ("pod-0", "pod-1"):
                aggregator.add(CallResult("checkout", pod, "1.20.3", t0 + k, 0.01, 0.0,
                                          CallOutcome(Outcome.OK, 200)))
            await asyncio.wait_for(writer.write(t0 + k + 1, [], force=False), 30)
        coarse = store.read_endpoint_columns(since=t0, stratum_s=60.0)
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        rolled = float(conn.execute("SELECT value FROM meta WHERE key = 'rolled_until'"
                                    ).fetchone()[0])
        rows = conn.execute("SELECT start, SUM(requests) FROM endpoint_rollups GROUP BY start"
                            ).fetchall()
    finally:
        conn.close()
    # The newest window written started at t0 + 199: a window is written again for 5 s
    # after it ends, so the minutes before 199 - 5 - 2 windows are rolled up.
    assert rolled == math.floor((t0 + 199 - 7) / 60) * 60 == t0 + 160
    assert rows == [(t0 - 20, 80), (t0 + 40, 120), (t0 + 100, 120)]
    assert coarse.requests.sum() == 400
