"""The report on a store made by a real run: a fleet on loopback whose new version
regresses one path, probed by the real runner, which records each pod it sees come back on
the new version as a `restart` event. The report must find the regressed path, not the
other one, and say how far the rollout had got (from the inventory snapshots the run
records of the fleet's endpoints, one a window at most here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probes._parsing import parse_time
from probes.api import VerdictQuery
from probes.discovery.changes import RESTART
from probes.report.write import write_report
from probes.store import Store
from targets.fleet import EventKind
from tests.servers.probe_run import (
    ATTEMPTS_FAIL_CANARY_CALLS,
    Windows,
    example_fleet,
    http_config,
    probe_runner,
    running,
    windows_for,
)

BASELINE, CANARY = "1.20.3", "1.21.0"


# Not failing after this many canary calls is a broken probe, not a slow machine.
GIVE_UP_CANARY_CALLS = 20 * ATTEMPTS_FAIL_CANARY_CALLS
WINDOW_S = 1.0  # http_config's windows
RATE, PODS, CANARY_PODS = 40.0, 4, 2  # calls/s per pod and path; the example fleet's pods


@pytest.mark.slow
async def test_report_from_a_real_run(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.json"
    store = str(tmp_path / "run.db")
    min_samples = 100
    written = Windows()
    config = (http_config(endpoints, rate=f"{RATE:g}/s", min_samples=min_samples)
              + "inventory: {snapshot_every: 1s}\n")
    runner = probe_runner(config, store, on_window=written.on_window)
    async with (
        example_fleet(endpoints, base_host="127.0.0.90", seed=9, notice_s=0.3,
                      namespace="shop") as fleet,
        running(runner, stop_within_s=20),
    ):
        # The baseline alone first, until each path has the verdict's minimum of samples
        # (counted in the windows written, not waited for by the clock).
        await written.until([("checkout", BASELINE), ("catalog", BASELINE)], min_samples,
                            within=windows_for(min_samples, PODS * RATE))
        await fleet.rollout(CANARY, interval_s=0.5, limit=CANARY_PODS)
        # Then until the probe's own verdict has failed checkout on attempts per request:
        # the report replays the same sequential tests over the same windows.
        wait = written.budget(windows_for(ATTEMPTS_FAIL_CANARY_CALLS, CANARY_PODS * RATE),
                              "checkout to fail on attempts")
        while True:
            await wait.next()
            verdict = await runner.verdict_json(VerdictQuery(path="checkout"))
            judged = {p["path"]: p for p in verdict["paths"]}.get("checkout", {})
            # (no metrics yet while the canary has no windows)
            attempts = judged.get("metrics", {}).get("attempts_per_request", {})
            if attempts.get("verdict") == "fail":
                break
            if (canary_calls := written.requests["checkout", CANARY]) > GIVE_UP_CANARY_CALLS:
                pytest.fail(f"no fail on attempts after {canary_calls} canary calls: {verdict}")
    started = {e.pod: e.at for e in fleet.history() if e.kind == EventKind.RESTART_STARTED}
    fleet_restarts = {e.pod: e.at for e in fleet.history()
                      if e.kind == EventKind.RESTART_FINISHED}
    assert len(fleet_restarts) == 2
    with Store.open(store, readonly=True) as s:
        restarts = s.read_events(kinds=[RESTART])
        first, last = s.time_range()  # type: ignore[misc]
        checkout_windows = s.read_windows(paths=["checkout"])
        endpoint_windows = s.read_endpoint_windows(paths=["checkout"])
    # The runner saw each restart through discovery (the endpoints file, re-read every
    # second), once, with the versions it moved between: after the pod's restart began, and
    # before the first window in which it probed that pod as the new version.
    assert {e.endpoint for e in restarts} == set(fleet_restarts)
    for e in restarts:
        assert (e.detail["from"], e.detail["to"]) == (BASELINE, CANARY)
        first_as_canary = min(w.start for w in endpoint_windows
                              if w.endpoint == e.endpoint and w.cohort == CANARY)
        assert started[e.endpoint] <= e.at <= first_as_canary + WINDOW_S, (e, started)

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
    # The canary: every call took exactly 2 attempts (each first attempt fails, the one
    # retry answers), in the store and so in the report.
    canary = [w for w in checkout_windows if w.cohort == CANARY]
    assert sum(w.attempts_sum for w in canary) == 2 * sum(w.attempts_count for w in canary) > 0
    assert attempts["canary"] == 2.0
    # The baseline: 1 attempt per call, except calls the probe still sent as the old version
    # to a pod already back on the new one (discovery re-reads the file each second). Those
    # can only be calls to a restarted pod from the window its restart began on, so the
    # extra attempts are at most those calls, and the report's baseline figure at the
    # crossing at most 1 + that many over the baseline calls from the origin (the first
    # window with both cohorts) to the crossing.
    baseline = [w for w in checkout_windows if w.cohort == BASELINE]
    extra = sum(w.attempts_sum - w.attempts_count for w in baseline)
    suspect = sum(w.requests for w in endpoint_windows
                  if w.cohort == BASELINE and w.endpoint in started
                  and w.start + WINDOW_S > started[w.endpoint])
    assert 0 <= extra <= suspect, (extra, suspect)
    origin = min(w.start for w in canary)
    crossed = parse_time(attempts["at"], now=0)
    counted = sum(w.attempts_count for w in baseline
                  if w.start >= origin and w.start + WINDOW_S <= crossed)
    assert counted > 0
    rounding = 5e-6  # the JSON gives 6 significant digits
    assert 1.0 <= attempts["baseline"] <= 1.0 + extra / counted + rounding, (
        attempts, extra, counted)
    assert attempts["at"] >= checkout["at"]
    assert parse_time(checkout["at"], now=0) > min(e.at for e in restarts)
    # Two of four pods moved; at the crossing, one or two of the fleet's endpoints had.
    assert checkout["share_source"] == "inventory"
    assert 0.2 <= checkout["canary_share"] <= 0.5
    assert paths["catalog"]["first_divergence"] is None
    assert doc["period"]["events"]["restart"] == 2
    html = files.html.read_text()
    assert html.count("<svg") == sum(len(p["charts"]) for p in doc["paths"])
    md = files.markdown.read_text()
    assert "| checkout | attempts per request |" in md
