"""The report on a store made by a real run: a fleet on loopback whose new version
regresses one path, probed by the real runner, which records each pod it sees come back on
the new version as a `restart` event. The report must find the regressed path, not the
other one, and say how far the rollout had got (from the probed endpoints: a local fleet
has no inventory)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from probes._timeparse import parse_time
from probes.discovery.changes import RESTART
from probes.report.cli import write_report
from probes.store import Store
from targets.fleet import EventKind
from tests.servers.probe_run import example_fleet, http_config, probe_runner, running


@pytest.mark.slow
async def test_report_from_a_real_run(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.json"
    store = str(tmp_path / "run.db")
    runner = probe_runner(http_config(endpoints, rate="40/s"), store, duration_s=9.0)
    async with (
        example_fleet(endpoints, base_host="127.0.0.90", seed=9, notice_s=0.3,
                      namespace="shop") as fleet,
        running(runner, stop_within_s=20) as run,
    ):
        await asyncio.sleep(2.5)  # the baseline alone first
        await fleet.rollout("1.21.0", interval_s=0.5, limit=2)
        await asyncio.wait_for(run, 20)
    fleet_restarts = {e.pod: e.at for e in fleet.history()
                      if e.kind == EventKind.RESTART_FINISHED}
    assert len(fleet_restarts) == 2
    with Store.open(store, readonly=True) as s:
        restarts = s.read_events(kinds=[RESTART])
        first, last = s.time_range()  # type: ignore[misc]
    # The runner saw each restart through discovery (the endpoints file, re-read every
    # second), once, with the versions it moved between.
    assert {e.endpoint for e in restarts} == set(fleet_restarts)
    for e in restarts:
        assert (e.detail["from"], e.detail["to"]) == ("1.20.3", "1.21.0")
        assert fleet_restarts[e.endpoint] - 0.5 <= e.at <= fleet_restarts[e.endpoint] + 3.0

    files = write_report(store, tmp_path / "report", since=first, until=last, now=last)
    doc = json.loads(files.json.read_text())
    paths = {p["path"]: p for p in doc["paths"]}
    assert set(paths) == {"checkout", "catalog"}
    checkout = paths["checkout"]["first_divergence"]
    assert checkout is not None, paths["checkout"]
    # 1.21.0 retries every first attempt on /api/checkout: attempts per request doubles
    # (and the retries may show in p99 too; whichever test crossed first leads).
    assert checkout["metric"] in ("attempts_per_request", "latency_p99_ms")
    attempts = paths["checkout"]["divergences"]["attempts_per_request"]
    assert attempts["canary"] > 1.5 > 1.1 > attempts["baseline"]
    assert attempts["at"] >= checkout["at"]
    assert parse_time(checkout["at"], now=0) > min(e.at for e in restarts)
    # Two of four pods moved; at the crossing, one or two of the probed endpoints had.
    assert checkout["share_source"] == "probed endpoints"
    assert 0.2 <= checkout["canary_share"] <= 0.5
    assert paths["catalog"]["first_divergence"] is None
    assert doc["period"]["events"]["restart"] == 2
    html = files.html.read_text()
    assert html.count("<svg") == sum(len(p["charts"]) for p in doc["paths"])
    md = files.markdown.read_text()
    assert "| checkout | attempts per request |" in md
