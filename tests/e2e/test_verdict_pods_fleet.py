"""Sick pods on a real fleet: a bad node under one pod of each cohort fails no path, and the
verdict names the sick canary pod; a regression on every canary pod still fails. The same
for p99: a slow node under one canary pod fails no path and is named; a slowdown on every
canary pod fails p99.

The fleet (emulated sidecars on loopback) runs one version that changes nothing, with two
pods on bad nodes (+10 % errors on every route, whatever the version): one in the canary,
one in the baseline, as the issue that asked for the pod as the unit measured on main; or
with one canary pod on a slow node (+150 ms on every call).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from probes.config import parse_rate
from probes.spec import JudgingSettings
from probes.store import Store
from probes.verdict.judge import judge
from probes.verdict.service import verdict_from_source
from targets.fleet import Fleet
from targets.profile import parse_profiles
from tests.servers.probe_run import (
    SETTLE_WINDOWS,
    Windows,
    http_config,
    probe_runner,
    running,
)

BASELINE, CANARY = "1.20.3", "1.21.0"
PROFILES = f"""\
versions:
  "{BASELINE}":
    attempt_count_header: true
  "{CANARY}":
    attempt_count_header: true
  "{CANARY}-bad":
    attempt_count_header: true
    routes:
      /api/checkout: {{error_rate: 0.05}}
  "{CANARY}-slow":
    attempt_count_header: true
    routes:
      /api/checkout: {{latency: {{fixed: 100ms}}}}
"""
PODS = 8
CANARY_PODS = 3  # a rollout in ordinal order: pods 0, 1, 2
SICK = {0: 0.10, 7: 0.10}  # one canary pod, one baseline pod
SLOW = {0: 0.150}  # one canary pod on a slow node: +150 ms, far beyond ×1.2 + 5 ms
# p99 decides on a few hundred calls per cohort: the p99 tests call each pod at a quarter of
# the rate, so a loaded machine's schedule lag does not drown the slow node's delay.
P99_RATE, P99_GIVE_UP_CANARY_CALLS = "5/s", 5_000
# A hang guard in calls, not seconds: the pooled test blames the version within a few
# hundred canary calls (+1.3 pp against a 0.1 pp tolerance), the pod test fails a 5 pp
# regression within about as many. (On a machine at load 10 the sick pods' test ran to
# 20,000 without a decision once, and decided within 125 s another time.)
GIVE_UP_CANARY_CALLS = 20_000
# The fleet's pods start warm: one window of warm-up, as the probe's config says.
JUDGING = JudgingSettings(window_s=1.0, warmup_s=1.0)


def _success(verdict: Any, path: str, metric: str = "success_rate") -> dict[str, Any]:
    found = {p["path"]: p for p in verdict["paths"]}.get(path, {})
    return dict(found.get("metrics", {}).get(metric, {}))


def _p99(verdict: Any, path: str) -> dict[str, Any]:
    return _success(verdict, path, "latency_p99_ms")


def _both(store: str, canary: str, now: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod-level verdict (`verdict_from_source`, as a gate gets it, on every window the
    probe wrote: this test is about pods, not about the loaded machine's overload rule,
    which tests/integration/test_runner.py covers) and the pooled one, on the same windows."""
    with Store.open(store, readonly=True) as s:
        pods = dict(verdict_from_source(s, JUDGING, baseline=BASELINE, canary=canary, now=now))
        origin = s.first_window(canary)
        pooled = judge(s.read_table(since=origin), window_s=1.0, now=now, baseline=BASELINE,
                       canary=canary, since=origin).to_json()
    return pods, pooled


def assert_pod_counts(metric: dict[str, Any]) -> None:
    """The canary's pods are the rolled ones; the baseline's the rest, and a pod the rollout
    moved after the canary's first window (the moves are 0.2 s apart, later on a loaded
    machine), which served the baseline in that window too: never a canary pod more."""
    assert metric["pods"]["canary"] == CANARY_PODS, metric
    assert PODS - CANARY_PODS <= metric["pods"]["baseline"] <= PODS - 1, metric


async def _fleet_run(tmp_path: Path, canary: str, until: Any, *, nodes: Any = None,
                     rate: str = "20/s", give_up: int = GIVE_UP_CANARY_CALLS) -> dict[str, Any]:
    """Run the fleet and a probe, roll `canary` onto 3 pods, and judge from the store after
    every window until `until(pod_verdict, pooled_verdict)` holds; return both. `nodes`:
    the fleet's sick nodes (default: `bad_nodes=SICK`); `rate` per pod and path; `give_up`
    after that many canary calls on checkout."""
    endpoints = tmp_path / "endpoints.json"
    store = str(tmp_path / "pods.db")
    written = Windows()
    # A generous timeout: on a loaded machine a slow answer must stay a slow answer, not an
    # error on every pod that buries the sick pods' +10 % (or a slow node's latency).
    runner = probe_runner(http_config(endpoints, rate=rate, timeout="5s"), store,
                          on_window=written.on_window)
    fleet = Fleet(pods=PODS, version=BASELINE, profiles=parse_profiles(PROFILES),
                  base_host="127.0.0.70", endpoints_file=endpoints, seed=11, drain_s=0.2,
                  **(nodes if nodes is not None else {"bad_nodes": SICK}))
    async with fleet, running(runner, stop_within_s=10):
        await fleet.rollout(canary, interval_s=0.2, limit=CANARY_PODS)
        name = {BASELINE: BASELINE, canary: canary}
        # And in windows: as many as the give-up count takes at the configured rate, so the
        # guard ends the test however few calls a loaded machine makes.
        most = math.ceil(give_up / (CANARY_PODS * parse_rate(rate))) + SETTLE_WINDOWS
        wait = written.budget(most, f"a decision on the canary {canary}")
        while True:
            await wait.next()
            # Judged in a thread (the fleet and the probe share this loop), as of the newest
            # window written: a loaded machine writes windows late, and this test is about
            # pods, not about the staleness rule (tests/unit/test_verdict.py covers that).
            pods, pooled = await asyncio.to_thread(_both, store, name[canary],
                                                   written.latest_end)
            if until(pods, pooled):
                return {"pods": pods, "pooled": pooled,
                        "names": [p.pod for p in fleet.pods]}
            if (calls := written.requests["checkout", name[canary]]) > give_up:
                pytest.fail(f"no decision after {calls} canary calls: {pods}; pooled: {pooled}")


@pytest.mark.slow
async def test_sick_pods_in_both_cohorts_fail_no_path_and_the_sick_canary_pod_is_named(
    tmp_path: Path,
) -> None:
    # Judge until the pooled test (calls independent, the method before) blames the version
    # on some path and the pod test names the sick canary pod as the canary's worst. (On a
    # loaded machine timeouts add errors on every pod, so the errors may not be concentrated
    # enough to say so; the worst pod is still the sick one.)
    sick_canary = f"target-{min(SICK)}"

    def decided(pods: Any, pooled: Any) -> bool:
        blamed = any(_success(pooled, p)["verdict"] == "fail" for p in ("checkout", "catalog")
                     if _success(pooled, p))
        worst = _success(pods, "checkout").get("pods", {}).get("worst")
        return blamed and worst == sick_canary

    got = await _fleet_run(tmp_path, CANARY, decided)
    pods, names = got["pods"], got["names"]
    assert names[min(SICK)] == sick_canary
    assert all(p["verdict"] != "fail" for p in pods["paths"]), pods
    for path in ("checkout", "catalog"):
        m = _success(pods, path)
        if m.get("pods", {}).get("concentrated"):
            assert m["pods"]["worst"] == sick_canary, m
            assert f"concentrated on {sick_canary}" in m["reason"]
        assert_pod_counts(m)


@pytest.mark.slow
async def test_a_regression_on_every_canary_pod_fails_on_success_rate(tmp_path: Path) -> None:
    # The same sick nodes, and a version that adds 5 % errors on checkout on every pod.
    def failed(pods: Any, _pooled: Any) -> bool:
        return bool(_success(pods, "checkout").get("verdict") == "fail")

    got = await _fleet_run(tmp_path, f"{CANARY}-bad", failed)
    pods = got["pods"]
    checkout = _success(pods, "checkout")
    assert "not on one pod alone" in checkout["reason"]
    assert _success(pods, "catalog")["verdict"] != "fail"
    assert pods["verdict"] == "fail"


@pytest.mark.slow
async def test_a_slow_canary_pod_fails_no_path_on_p99_and_is_named(tmp_path: Path) -> None:
    # Judge until the pooled p99 (each cohort's calls pooled, the method before schema v2)
    # blames the version on some path and the pod-level p99 names the slow canary pod.
    slow_canary = f"target-{min(SLOW)}"

    def decided(pods: Any, pooled: Any) -> bool:
        blamed = any(_p99(pooled, p).get("verdict") == "fail" for p in ("checkout", "catalog"))
        return blamed and _p99(pods, "checkout").get("pods", {}).get("worst") == slow_canary

    got = await _fleet_run(tmp_path, CANARY, decided, nodes={"slow_nodes": SLOW},
                           rate=P99_RATE, give_up=P99_GIVE_UP_CANARY_CALLS)
    pods, names = got["pods"], got["names"]
    assert names[min(SLOW)] == slow_canary
    for path in ("checkout", "catalog"):
        m = _p99(pods, path)
        assert m["rule"] == "pods" and m["verdict"] != "fail", m
        assert_pod_counts(m)
        if m["pods"]["concentrated"]:
            assert m["pods"]["worst"] == slow_canary
            assert f"concentrated on {slow_canary}" in m["reason"]
    assert all(p["verdict"] != "fail" for p in pods["paths"]), pods


@pytest.mark.slow
async def test_a_slowdown_on_every_canary_pod_fails_on_p99(tmp_path: Path) -> None:
    # The same slow node, and a version that adds 100 ms on checkout on every pod.
    def failed(pods: Any, _pooled: Any) -> bool:
        return bool(_p99(pods, "checkout").get("verdict") == "fail")

    got = await _fleet_run(tmp_path, f"{CANARY}-slow", failed, nodes={"slow_nodes": SLOW},
                           rate=P99_RATE, give_up=P99_GIVE_UP_CANARY_CALLS)
    pods = got["pods"]
    checkout = _p99(pods, "checkout")
    assert checkout["rule"] == "pods" and "not on one pod alone" in checkout["reason"]
    assert _p99(pods, "catalog")["verdict"] != "fail"
    assert pods["verdict"] == "fail"
