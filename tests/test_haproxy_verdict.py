"""Retry amplification through a real proxy, judged end to end: HAProxy sidecars whose new
version retries, probed by a real `ProbeRunner`, fail the path on attempts per request while
the success rate stays equal.

Why the success rates are equal by construction (targets/examples/haproxy-profiles.yaml, used
as shipped): the app fails 10 % of /api/checkout request ids *persistently* (`error_rate`:
every attempt of that id fails, whoever retries it). The old version (1.20.3, `retries 0`)
answers those 503s after one attempt; the new one (1.21.0, `retries 2` on
all-retryable-errors) tries each of them three times and still answers 503. So both cohorts
fail the same 10 % of calls, and the only difference is 1 + 2 × 0.1 = 1.2 attempts per
request against 1.0, beyond the default allowance of ×1.1. A *transient* failure (the first
attempt fails, a retry succeeds) would not do: the retrying version would turn it into a
success, and the canary would look better on success rate as well as worse on attempts.

How long it takes: the attempts test (`probes.stats.bounded`, Y = (A − 1)/4 per call, null
μ_c ≤ 1.1 μ_b + 0.025) reaches 1/α_share = 400 at about 1,200 canary calls when μ_c = 0.05;
two canary pods at 100 calls/s each get there in about 6 s of 1 s windows.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from probes.api import VerdictQuery
from probes.store import Store
from targets.haproxy import default_versions_file
from targets.haproxy_config import load_haproxy_versions
from tests.servers.fleet_cli import fleet_process, read_until
from tests.servers.haproxy_procs import kill_leftovers, needs_haproxy
from tests.servers.probe_run import http_config, probe_runner, running

pytestmark = [needs_haproxy, pytest.mark.slow]

BASELINE, CANARY = "1.20.3", "1.21.0"


async def test_retrying_version_fails_on_attempts_with_equal_success_rate(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.json"
    versions_file = default_versions_file()
    versions = load_haproxy_versions(versions_file)
    assert versions.app_routes["/api/checkout"].error_rate == 0.1  # the docstring's premise
    assert versions.app_routes["/api/checkout"].transient_error_rate == 0.0
    haproxy_dir = tmp_path / "haproxy"
    config = http_config(endpoints, rate="100/s", timeout="1s",
                         paths={"checkout": "/api/checkout"})
    store = str(tmp_path / "probe.db")
    window_done = asyncio.Event()
    runner = probe_runner(config, store, on_window=lambda _windows: window_done.set())
    verdict: dict[str, Any] = {}
    # The fleet (its apps; each pod's HAProxy is a process anyway) runs in a process of its
    # own, so this test's event loop carries only the probe, as `skewprobe run`'s does: the
    # apps' work would otherwise make the probe's sends late. It rolls two pods out at once.
    # A notice longer than the file source's 1 s refresh: the probe drops a restarting pod
    # before its HAProxy stops listening, so no baseline call is refused.
    fleet_args = (
        "--sidecar", "haproxy", "--haproxy-profiles", str(versions_file),
        "--haproxy-dir", str(haproxy_dir), "--pods", "4",
        "--from", BASELINE, "--to", CANARY, "--rollout-after", "0s", "--interval", "0s",
        "--batch", "2", "--restarts", "2", "--endpoints-file", str(endpoints),
        "--base-host", f"127.{random.randint(64, 250)}.7.1", "--http-port", "0", "--no-grpc",
        "--drain", "1s", "--drain-notice", "1.5s",
    )
    try:
        async with fleet_process(*fleet_args, log=tmp_path / "fleet.err") as fleet, running(
            runner, stop_within_s=15,
        ):
            await read_until(fleet, "rollout_finished", timeout_s=30)
            published = json.loads(endpoints.read_text())["endpoints"]
            assert Counter(e["labels"]["proxy_version"] for e in published) == {
                BASELINE: 2, CANARY: 2}
            # Judge after every window the probe writes (no polling), for at most 45 s
            # (about 6 s on a quiet machine; the margin is for a loaded CI runner).
            try:
                async with asyncio.timeout(45):
                    while True:
                        await window_done.wait()
                        window_done.clear()
                        verdict = dict(await runner.verdict_json(VerdictQuery()))
                        paths = {p["path"]: p for p in verdict["paths"]}
                        attempts = paths.get("checkout", {}).get("metrics", {}).get(
                            "attempts_per_request", {})
                        if attempts.get("verdict") == "fail":
                            break
            except TimeoutError:
                pytest.fail(f"no fail on attempts per request within 45 s: {verdict}")
    finally:
        leftover = kill_leftovers(haproxy_dir)
    assert not leftover, "HAProxy processes outlived the fleet"

    assert verdict["verdict"] == "fail", verdict
    assert (verdict["baseline"], verdict["canary"]) == (BASELINE, CANARY)
    (checkout,) = verdict["paths"]
    assert checkout["path"] == "checkout" and checkout["verdict"] == "fail"
    metrics = checkout["metrics"]
    attempts = metrics["attempts_per_request"]
    # The new cohort: > 1 attempt per request on average (≈ 1.2); the old one exactly 1
    # (no retries; measured from the app's echo, since 1.20.3 sends no attempt count).
    assert attempts["verdict"] == "fail", attempts
    assert attempts["baseline"] == 1.0
    assert 1.1 < attempts["canary"] < 1.35, attempts
    assert checkout["reasons"][0].startswith("attempts per request")
    # Success rate: equal (the same persistent 10 %), so it never fails. With ~1,000+ calls
    # per cohort each rate is 0.9 ± 0.01 (one sd), and their difference within ±0.06.
    success = metrics["success_rate"]
    assert success["verdict"] != "fail", success
    assert 0.85 <= success["baseline"] <= 0.95 and 0.85 <= success["canary"] <= 0.95, success
    assert abs(success["canary"] - success["baseline"]) < 0.06, success
    assert min(success["counts"][side]["requests"] for side in ("baseline", "canary")) >= 1000

    # The store agrees: the canary's 503s were each tried 3 times, the baseline's once.
    with Store.open(store, readonly=True) as s:
        windows = [w for w in s.read_windows() if w.path == "checkout"]
    by_cohort = {c: [w for w in windows if w.cohort == c] for c in (BASELINE, CANARY)}
    base_sum = sum(w.attempts_sum for w in by_cohort[BASELINE])
    base_count = sum(w.attempts_count for w in by_cohort[BASELINE])
    assert base_count > 0 and base_sum == base_count
    canary_sum = sum(w.attempts_sum for w in by_cohort[CANARY])
    canary_count = sum(w.attempts_count for w in by_cohort[CANARY])
    canary_errors = sum(w.requests - w.successes for w in by_cohort[CANARY])
    assert canary_count == sum(w.requests for w in by_cohort[CANARY])  # every call measured
    # Each 503 took 3 attempts and each success 1: exactly, unless a success needed a
    # connection retry (none expected on loopback).
    assert canary_sum == canary_count + 2 * canary_errors
