"""The report on a store made by a real run: a fleet on loopback whose new version
regresses one path, probed by the real runner; the fleet's restarts are recorded as store
events. The report must find the regressed path, not the other one, and say how far the
rollout had got (from the probed endpoints: a local fleet has no inventory)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from probes._timeparse import parse_time
from probes.config import parse_config
from probes.report.cli import write_report
from probes.runner import ProbeRunner, RunOptions
from probes.store import Event, Store
from targets.fleet import EventKind, Fleet
from targets.profile import load_profiles

PROFILES = Path(__file__).parent.parent / "targets" / "examples" / "profiles.yaml"
CONFIG = """\
targets: {{file: {{path: {endpoints}}}}}
window: 1s
verdict: {{min_samples: 100}}
paths:
  - name: checkout
    http: {{path: /api/checkout}}
    rate: 40/s
    timeout: 500ms
  - name: catalog
    http: {{path: /api/catalog}}
    rate: 40/s
    timeout: 500ms
"""


@pytest.mark.slow
async def test_report_from_a_real_run(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.json"
    fleet = Fleet(pods=4, version="1.20.3", profiles=load_profiles(PROFILES),
                  base_host="127.0.0.90", endpoints_file=endpoints, seed=9, grpc_port=None,
                  drain_s=0.2, notice_s=0.3, namespace="shop")
    await fleet.start()
    store = str(tmp_path / "run.db")
    config = parse_config(CONFIG.format(endpoints=endpoints))
    runner = ProbeRunner(config, RunOptions(store_path=store, listen=None, duration_s=9.0))
    try:
        run = asyncio.create_task(runner.run())
        await asyncio.sleep(2.5)  # the baseline alone first
        await fleet.rollout("1.21.0", interval_s=0.5, limit=2)
        await asyncio.wait_for(run, 20)
    finally:
        await fleet.stop(0.0)
    restarts = [Event("restart", e.at, endpoint=e.pod or "", detail={"to": e.to_version})
                for e in fleet.history() if e.kind == EventKind.RESTART_FINISHED]
    assert len(restarts) == 2
    with Store.open(store) as s:
        s.write_events(restarts)
        first, last = s.time_range()  # type: ignore[misc]

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
    assert doc["period"]["events"] == {"restart": 2}
    html = files.html.read_text()
    assert html.count("<svg") == sum(len(p["charts"]) for p in doc["paths"])
    md = files.markdown.read_text()
    assert "| checkout | attempts per request |" in md
