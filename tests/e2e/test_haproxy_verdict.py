"""Retry amplification through a real proxy, judged end to end: HAProxy sidecars whose new
version retries, probed by a real `ProbeRunner`, fail the path on attempts per request while
the success rate stays equal.

Why the success rates are equal by construction (targets/examples/haproxy-profiles.yaml,
its versions as shipped, its app's error rate raised to 30 %): the app fails 30 % of
/api/checkout request ids *persistently* (`error_rate`: every attempt of that id fails,
whoever retries it). The old version (1.20.3, `retries 0`) answers those 503s after one
attempt; the new one (1.21.0, `retries 2` on all-retryable-errors) tries each of them three
times and still answers 503. So both cohorts fail the same 30 % of calls, and the only
difference is 1 + 2 × 0.3 = 1.6 attempts per request against 1.0, beyond the default
allowance of ×1.1. A *transient* failure (the first
attempt fails, a retry succeeds) would not do: the retrying version would turn it into a
success, and the canary would look better on success rate as well as worse on attempts.

How long it takes: the attempts test (`probes.stats.bounded`, Y = (A − 1)/4 per call, null
μ_c ≤ 1.1 μ_b + 0.025) is judged with the pod as the unit, its worst canary pod left out, so
on one of the two canary pods, and with two pods a side the spread between pods rests on two
degrees of freedom, which the fail allows for (a t-type factor and a floor on τ², BENCHMARKS.md
D19): at μ_c = 0.15 it reaches 1/α_share = 400 after about 2,400 canary calls (2,200-2,600 in
a simulation of this estate with `probes.stats.pods.pod_track`; at 10 % errors, μ_c = 0.05,
it took 22,500), some 24 s at 50 calls/s per pod.
The fleet's apps answer from one process: at 100 calls/s each, on a machine busy with other
work (load 10 on two cores), 87 % of calls timed out after 1 s, in both cohorts alike. At
50/s, under a 5 s timeout, a slow answer stays a slow answer.

Every bound below follows from the calls actually made, never from a fixed count or a time
budget (a loaded machine makes fewer calls per second, and the test then simply judges
later): the test waits, window by window, until the attempts test fails *and* the cohorts
hold enough calls to tell a 70 % success rate from 100 % (the transient-failure mistake
above), and it fails if the canary has made `GIVE_UP_FACTOR` times the calls the attempts
test needs on average without failing, or after the windows those calls take
(`windows_for`). Each estimate is then checked against its true value within `Z` standard
errors of the counts it was computed from.

It judges as a gate does (`verdict_from_source`), on every window the probe wrote: this test
is about retries through a real proxy, not about the overload rule (its own tests are in
tests/integration/test_runner.py). On a machine busy with other work the probe marks most
windows overloaded, and a verdict that leaves them out never got the calls it needs: the
test ended "this machine cannot run the test" after 48,000 canary calls, 2,000 of them in
windows the probe trusted.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from probes.config import parse_config
from probes.spec import JudgingSettings
from probes.store import Store
from probes.verdict.service import verdict_from_source
from targets.haproxy import default_versions_file
from targets.haproxy_config import load_haproxy_versions
from tests.servers.fleet_cli import fleet_process, read_until
from tests.servers.haproxy_procs import kill_leftovers, needs_haproxy
from tests.servers.probe_run import Windows, http_config, probe_runner, running, windows_for

pytestmark = [needs_haproxy, pytest.mark.slow]

BASELINE, CANARY = "1.20.3", "1.21.0"
# The profile's truth: 30 % of calls fail persistently; the canary tries each of them 3 times.
ERROR_RATE, CANARY_TRIES = 0.3, 3
# Standard errors allowed between an estimate and its true value (two-sided 7e-6 each).
Z = 4.5
# The attempts test needs ~2,400 canary calls on average (docstring); not failing after this
# many times as many is a broken test, not a slow machine.
EXPECTED_CANARY_CALLS, GIVE_UP_FACTOR = 2_400, 5
RATE, CANARY_PODS = 50.0, 2  # calls/s per pod; the pods rolled out (`--batch 2`)


def _judged(store: str, settings: JudgingSettings, now: float) -> dict[str, Any]:
    """The verdict on checkout as of `now`, on every window in the store."""
    with Store.open(store, readonly=True) as s:
        return dict(verdict_from_source(s, settings, baseline=BASELINE, canary=CANARY,
                                        now=now))


def _se_rate(n: int) -> float:
    """The standard error of a success-rate estimate of `n` calls at the profile's rate."""
    return math.sqrt(ERROR_RATE * (1 - ERROR_RATE) / n)


def _precise_enough(counts: dict[str, Any]) -> bool:
    """Whether both cohorts' success rates are within Z standard errors of half the gap
    between 70 % and 100 %: enough calls to tell the two apart."""
    # A metric with no warm window in common yet has no counts.
    n = min(counts.get(side, {}).get("requests", 0) for side in ("baseline", "canary"))
    return n > 0 and Z * _se_rate(n) <= ERROR_RATE / 2


async def test_retrying_version_fails_on_attempts_with_equal_success_rate(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.json"
    shipped = default_versions_file().read_text()
    assert shipped.count("/api/checkout: {error_rate: 0.1}") == 1
    versions_file = tmp_path / "haproxy-profiles.yaml"
    versions_file.write_text(shipped.replace("/api/checkout: {error_rate: 0.1}",
                                             f"/api/checkout: {{error_rate: {ERROR_RATE}}}"))
    versions = load_haproxy_versions(versions_file)
    assert versions.app_routes["/api/checkout"].error_rate == ERROR_RATE  # the premise
    assert versions.app_routes["/api/checkout"].transient_error_rate == 0.0
    haproxy_dir = tmp_path / "haproxy"
    config = http_config(endpoints, rate=f"{RATE:g}/s", timeout="5s",
                         paths={"checkout": "/api/checkout"})
    store = str(tmp_path / "probe.db")
    written = Windows()
    runner = probe_runner(config, store, on_window=written.on_window)
    judging = parse_config(config).judging
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
            # Judge after every window the probe writes (no polling), until the attempts
            # test fails and both cohorts hold enough calls to check the success rates.
            wait = written.budget(windows_for(EXPECTED_CANARY_CALLS, CANARY_PODS * RATE),
                                  "checkout to fail on attempts per request")
            while True:
                await wait.next()
                verdict = await asyncio.to_thread(_judged, store, judging, written.latest_end)
                paths = {p["path"]: p for p in verdict["paths"]}
                checkout = paths.get("checkout", {})
                metrics = checkout.get("metrics", {})
                attempts = metrics.get("attempts_per_request", {})
                canary_calls = written.requests["checkout", CANARY]
                if attempts.get("verdict") == "fail" and _precise_enough(
                        metrics["success_rate"]["counts"]):
                    break
                if canary_calls > GIVE_UP_FACTOR * EXPECTED_CANARY_CALLS:
                    pytest.fail(f"no fail on attempts per request after {canary_calls} canary "
                                f"calls: {verdict}")
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
    # ≈ 1 + 2 × 10 %: per call 1 or 3 attempts, so a standard deviation of 2 × √(p(1 − p)).
    n_attempts = attempts["counts"]["canary"].get("samples") or checkout["samples"]["canary"]
    expected = 1 + (CANARY_TRIES - 1) * ERROR_RATE
    assert abs(attempts["canary"] - expected) <= Z * (CANARY_TRIES - 1) * _se_rate(
        n_attempts), attempts
    assert checkout["reasons"][0].startswith("attempts per request")
    # Success rate: equal (the same persistent 10 %), so it never fails. Each rate is within
    # Z standard errors of 70 % for its own count of calls, and so is their difference.
    success = metrics["success_rate"]
    assert success["verdict"] != "fail", success
    n = {side: success["counts"][side]["requests"] for side in ("baseline", "canary")}
    for side in ("baseline", "canary"):
        assert abs(success[side] - (1 - ERROR_RATE)) <= Z * _se_rate(n[side]), (side, success)
    se_diff = math.hypot(_se_rate(n["baseline"]), _se_rate(n["canary"]))
    assert abs(success["canary"] - success["baseline"]) <= Z * se_diff, success

    # The store agrees: the canary's 503s were each tried 3 times, the baseline's once.
    with Store.open(store, readonly=True) as s:
        windows = [w for w in s.read_windows() if w.path == "checkout"]
    by_cohort = {c: [w for w in windows if w.cohort == c] for c in (BASELINE, CANARY)}
    base_sum = sum(w.attempts_sum for w in by_cohort[BASELINE])
    base_count = sum(w.attempts_count for w in by_cohort[BASELINE])
    assert base_count > 0 and base_sum == base_count
    canary_sum = sum(w.attempts_sum for w in by_cohort[CANARY])
    canary_count = sum(w.attempts_count for w in by_cohort[CANARY])
    # Every call that got an answer is measured; one cut by a pod's restart (refused, reset,
    # timed out: the canary's pods restart during the run) has no attempt count to report.
    answered = sum(n for w in by_cohort[CANARY] for o, n in w.outcomes.items()
                   if o in ("ok", "http_5xx", "http_4xx", "unexpected_status"))
    canary_5xx = sum(w.outcomes.get("http_5xx", 0) for w in by_cohort[CANARY])
    assert canary_count == answered
    # Each 503 took 3 attempts and each success 1: exactly, unless a success needed a
    # connection retry (none expected on loopback).
    assert canary_sum == canary_count + 2 * canary_5xx
