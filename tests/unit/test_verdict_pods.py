"""The verdict read from a store takes the pod as the unit of evidence for success rate,
p99 latency and attempts per request.

The store is written through its API with per-pod windows (seeded binomial errors, and where
a test asks, lognormal latencies and retries per pod), as a probe writes it; the verdict
comes from `compute_verdict`, as `skewprobe verdict` gets it.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from probes._parsing import rfc3339
from probes.measure.histogram import BUCKET_COUNT, index_of
from probes.measure.overload import OVERLOAD_EVENT
from probes.spec import JudgingSettings
from probes.store import APPEARED_EVENT, PRESENT_EVENT, RESTART_EVENT, Event, Store
from probes.types import EndpointWindow, PathWindow
from probes.verdict.service import compute_verdict, verdict_from_source

T0 = 1_790_000_000.0
WINDOW_S = 10.0
OLD, NEW = "1.20.3", "1.21.0"
CALLS = 60  # per pod per window

# error rate of (pod, cohort) in window w (seconds since T0); also a latency scale, or the
# chance that a call needs one retry
Rates = Callable[[str, str, float], float]


def write_estate(store: Store, pods: dict[str, str], rates: Rates, minutes: float,
                 seed: int, path: str = "checkout", *, scale: Rates | None = None,
                 retries: Rates | None = None, lag_s: float = 0.0) -> None:
    """With `scale` each pod's calls draw lognormal latencies (median 20 ms × scale, σ 0.3)
    and with `retries` attempts (1, or 2 with that chance), both kept per pod as schema v2
    does; without them the pods' windows carry neither, as a v1 store's rows. `lag_s`: how
    late the probe's sends were, at most, in every window."""
    rng = np.random.default_rng(seed)
    fixed = np.bincount(index_of(np.full(CALLS, 0.02)), minlength=BUCKET_COUNT)
    for k in range(int(minutes * 60 / WINDOW_S)):
        t = T0 + k * WINDOW_S
        cells, dense = [], {}
        for pod, cohort in pods.items():
            e = int(rng.binomial(CALLS, rates(pod, cohort, t - T0)))
            hist = fixed
            if scale is not None:
                x = 0.02 * scale(pod, cohort, t - T0) * rng.lognormal(0.0, 0.3, CALLS)
                hist = np.bincount(index_of(x), minlength=BUCKET_COUNT)
            extra = (0 if retries is None
                     else int(rng.binomial(CALLS, retries(pod, cohort, t - T0))))
            dense[pod] = (hist, CALLS + extra if retries is not None else 0)
            cells.append(EndpointWindow(
                start=t, path=path, endpoint=pod, cohort=cohort, requests=CALLS, errors=e,
                attempts_sum=dense[pod][1], attempts_count=CALLS if retries is not None else 0,
                latency=({int(b): int(hist[b]) for b in np.flatnonzero(hist)}
                         if scale is not None else {})))
        windows = []
        for cohort in sorted(set(pods.values())):
            mine = [c for c in cells if c.cohort == cohort]
            n, e = CALLS * len(mine), sum(c.errors for c in mine)
            windows.append(PathWindow(
                start=t, length=WINDOW_S, path=path, cohort=cohort,
                outcomes={"ok": n - e, "http_5xx": e},
                latency=tuple(int(x) for x in sum(dense[c.endpoint][0] for c in mine)),
                attempts_sum=sum(c.attempts_sum for c in mine),
                attempts_count=sum(c.attempts_count for c in mine), lag_max_s=lag_s,
            ))
        store.write(windows, cells)


def verdict(tmp_path: Path, pods: dict[str, str], rates: Rates, minutes: float = 30,
            seed: int = 1, **per_pod: Rates) -> dict:
    db = str(tmp_path / "estate.db")
    with Store.open(db) as store:
        write_estate(store, pods, rates, minutes, seed, **per_pod)
    now = T0 + minutes * 60
    settings = JudgingSettings()
    result = compute_verdict(db, settings, baseline=OLD, canary=NEW, now=now, overload=None)
    return dict(result)


FLEET = {**{f"shop-{i}": OLD for i in range(6)}, **{f"shop-{i}-new": NEW for i in range(6, 9)}}


def success(result: dict) -> dict:
    return result["paths"][0]["metrics"]["success_rate"]


def test_sick_pods_in_both_cohorts_fail_nothing_and_the_sick_canary_pod_is_named(
    tmp_path: Path,
) -> None:
    # One bad node under one pod of each cohort: +10 % errors there, 0.1 % elsewhere.
    sick = {"shop-2", "shop-7-new"}
    m = success(verdict(tmp_path, FLEET,
                        lambda pod, _c, _t: 0.10 if pod in sick else 0.001))
    assert m["verdict"] != "fail", m["reason"]
    assert m["canary"] < m["baseline"] - 0.001 / 100  # pooled, the canary does look worse
    assert m["pods"]["worst"] == "shop-7-new"
    assert m["pods"]["concentrated"] is True
    assert "concentrated on shop-7-new" in m["reason"]
    assert m["pods"]["canary"] == 3 and m["pods"]["baseline"] == 6


def test_a_regression_on_every_canary_pod_fails(tmp_path: Path) -> None:
    m = success(verdict(tmp_path, FLEET,
                        lambda _p, cohort, _t: 0.03 if cohort == NEW else 0.001))
    assert m["verdict"] == "fail", m["reason"]
    assert "across the canary's pods, not on one pod alone" in m["reason"]
    assert m["pods"]["concentrated"] is False


def test_an_outage_shared_by_both_cohorts_does_not_fail(tmp_path: Path) -> None:
    # Three canary pods start in the outage's minute (cold too), baseline calls all along.
    def rates(_p: str, _c: str, t: float) -> float:
        return 0.5 if 600 <= t < 660 else 0.001

    m = success(verdict(tmp_path, FLEET, rates))
    assert m["verdict"] != "fail", m["reason"]


def test_warm_up_is_kept_out_of_the_comparison(tmp_path: Path) -> None:
    # Canary pods fail 20 % of calls in their first minute (cold start), then are healthy.
    m = success(verdict(tmp_path, FLEET,
                        lambda _p, cohort, t: 0.2 if cohort == NEW and t < 60 else 0.001))
    assert m["verdict"] != "fail", m["reason"]
    warm = m["pods"]["warmup"]
    assert warm["calls"] == 9 * CALLS * 120 / WINDOW_S  # every pod's first 2 min
    assert warm["errors"] > 0.1 * 3 * CALLS * 60 / WINDOW_S  # the cold errors are there
    assert m["counts"]["canary"]["errors"] < 0.01 * m["counts"]["canary"]["requests"]


def test_a_canary_of_one_pod_far_outside_the_baseline_fails_and_names_the_pod(
        tmp_path: Path) -> None:
    # The first pod a rollout restarts: 5 % errors against baseline pods at 0.1 % is far
    # outside what any baseline pod does, so the gate stops; the reason names the pod and
    # what would tell a sick pod from a sick version.
    pods = {**{f"shop-{i}": OLD for i in range(6)}, "shop-9-new": NEW}
    m = success(verdict(tmp_path, pods, lambda _p, cohort, _t: 0.05 if cohort == NEW else 0.001))
    assert m["verdict"] == "fail", m["reason"]
    assert "one pod shop-9-new" in m["reason"]
    assert "restart shop-9-new, or add a canary pod, to tell" in m["reason"]
    # The same pod like the baseline's: judged against their spread, it passes.
    (tmp_path / "healthy").mkdir()
    ok = success(verdict(tmp_path / "healthy", pods, lambda _p, _c, _t: 0.001))
    assert ok["verdict"] != "fail", ok["reason"]


def test_an_undecided_healthy_canary_says_how_many_calls_a_pass_needs(tmp_path: Path) -> None:
    # No errors at all: the canary heads for a pass whatever the draw.
    m = success(verdict(tmp_path, FLEET, lambda *_: 0.0, minutes=4))
    assert m["verdict"] == "inconclusive", m["reason"]
    needs = m["needs"]
    canary_calls = m["counts"]["canary"]["requests"]
    assert needs["calls"] > 0 and needs["seconds"] > 0
    # At the rate so far: the canary made its calls in (4 min − warm-up) of windows.
    rate = canary_calls / (4 * 60 - 120)
    assert math.isclose(needs["seconds"], needs["calls"] / rate, rel_tol=0.05)
    assert "more canary calls" in m["reason"]


def test_a_late_send_span_leaves_out_latency_alone_for_the_pods_as_for_the_path(
    tmp_path: Path,
) -> None:
    # Every canary pod fails every call, and answers 10x slower, in the minute from minute
    # 10; the probe's sends were late then (the span starts 5 s into its first window).
    # Left out (`exclude`): that minute's latency, for the path and every pod alike; its
    # calls and errors still count.
    bad = (T0 + 600, T0 + 660)

    def rates(_pod: str, cohort: str, t: float) -> float:
        return 1.0 if cohort == NEW and bad[0] <= T0 + t < bad[1] else 0.001

    def scale(_pod: str, cohort: str, t: float) -> float:
        return 10.0 if cohort == NEW and bad[0] <= T0 + t < bad[1] else 1.0

    db = str(tmp_path / "estate.db")
    with Store.open(db) as store:
        write_estate(store, FLEET, rates, 30, seed=3, scale=scale)
    now = T0 + 30 * 60
    with Store.open(db, readonly=True) as store:
        judged = {
            name: dict(verdict_from_source(
                store, JudgingSettings(), baseline=OLD, canary=NEW, now=now, exclude=spans))
            for name, spans in (("kept", ()), ("excluded", [(bad[0] + 5, bad[1])]))
        }
    kept, excluded = (judged[k]["paths"][0]["metrics"] for k in ("kept", "excluded"))
    assert kept["success_rate"] == excluded["success_rate"]
    assert excluded["success_rate"]["verdict"] == "fail"
    assert kept["latency_p99_ms"]["verdict"] == "fail"  # the slow minute is 3 % of calls
    assert excluded["latency_p99_ms"]["verdict"] != "fail", excluded["latency_p99_ms"]
    # Per pod too: each pod's p99 is judged without that minute.
    assert excluded["latency_p99_ms"]["rule"] == kept["latency_p99_ms"]["rule"] == "pods"


@pytest.mark.parametrize("lag_s", [0.04, 0.002])
def test_a_busy_probe_still_judges_errors_and_leaves_p99_out_only_for_meaningful_lateness(
    tmp_path: Path, lag_s: float,
) -> None:
    # The probe was overloaded from minute 5 to its last window (more than 1 % of sends over
    # 10 ms late), with every canary pod 3 pp worse. Errors are judged all the same; p99
    # leaves those windows out only if sends were late by more than half its 5 ms margin.
    db = str(tmp_path / "estate.db")
    with Store.open(db) as store:
        write_estate(store, FLEET, lambda _p, c, _t: 0.03 if c == NEW else 0.001, 20, seed=4,
                     scale=lambda _p, _c, _t: 1.0, lag_s=lag_s)
        store.write_events([Event(OVERLOAD_EVENT, T0 + 330, detail={
            "reason": "probe overloaded: 1.4% of 900 calls sent more than 10 ms late"})])
    now = T0 + 20 * 60 + 1
    result = dict(compute_verdict(db, JudgingSettings(), baseline=OLD, canary=NEW, now=now))
    metrics = result["paths"][0]["metrics"]
    assert metrics["success_rate"]["verdict"] == "fail", metrics["success_rate"]["reason"]
    assert result["verdict"] == "fail"
    assert any(r.startswith("probe overloaded") and "judged from every window" in r
               for r in result["reasons"]), result["reasons"]
    # The span starts three windows before the event that declared it: minute 5 on.
    left = "90 windows left out of p99: the probe's sends were up to 40 ms late then"
    if lag_s > 0.0025:
        assert left in metrics["latency_p99_ms"]["reason"]
        assert left in result["reasons"]
    else:
        assert "left out of p99" not in metrics["latency_p99_ms"]["reason"]
        assert not any("left out of p99" in r for r in result["reasons"])


def test_p99_with_every_window_left_out_is_undecided_not_gone(tmp_path: Path) -> None:
    # Overloaded before the rollout and all along, sends 40 ms late: no window is left for
    # p99, which stays in the verdict, undecided, saying why; errors still fail the canary.
    db = str(tmp_path / "estate.db")
    with Store.open(db) as store:
        write_estate(store, FLEET, lambda _p, c, _t: 0.03 if c == NEW else 0.001, 10, seed=6,
                     scale=lambda _p, _c, _t: 1.0, lag_s=0.04)
        store.write_events([Event(OVERLOAD_EVENT, T0 - 60, detail={"reason": "probe overloaded"})])
    result = dict(compute_verdict(db, JudgingSettings(), baseline=OLD, canary=NEW,
                                  now=T0 + 600 + 1))
    p99 = result["paths"][0]["metrics"]["latency_p99_ms"]
    assert p99["verdict"] == "inconclusive"
    assert "every window was left out" in p99["reason"]
    assert "60 windows left out of p99" in p99["reason"], p99["reason"]
    assert result["verdict"] == "fail"


def _warmup_calls(tmp_path: Path, name: str, started: Callable[[str, float], str | None],
                  minutes: float = 10) -> dict:
    """The verdict's warm-up band over an estate whose pods carry `started(pod, t)` as
    their start_time label (None: no label) in the window at T0 + t."""
    db = str(tmp_path / f"{name}.db")
    latency = np.bincount(index_of(np.full(CALLS, 0.02)), minlength=BUCKET_COUNT)
    with Store.open(db) as store:
        for k in range(int(minutes * 60 / WINDOW_S)):
            t = T0 + k * WINDOW_S
            cells = []
            for pod, cohort in FLEET.items():
                label = started(pod, t - T0)
                cells.append(EndpointWindow(
                    start=t, path="checkout", endpoint=pod, cohort=cohort, requests=CALLS,
                    errors=0, labels={"start_time": label} if label else {}))
            windows = [PathWindow(start=t, length=WINDOW_S, path="checkout", cohort=cohort,
                                  outcomes={"ok": CALLS * n}, latency=tuple(latency * n))
                       for cohort, n in ((OLD, 6), (NEW, 3))]
            store.write(windows, cells)
    result = compute_verdict(db, JudgingSettings(), baseline=OLD, canary=NEW,
                             now=T0 + minutes * 60, since=rfc3339(T0), overload=None)
    return success(dict(result))["pods"]["warmup"]


def test_warm_up_counts_from_the_pods_start_time_where_its_endpoint_carries_one(
    tmp_path: Path,
) -> None:
    # Without a start time each pod's first 2 min in the store is its warm-up: 12 windows
    # of every pod. Pods that started an hour before the probe first saw them are warm.
    unlabelled = _warmup_calls(tmp_path, "unlabelled", lambda _p, _t: None)
    assert unlabelled["calls"] == len(FLEET) * 12 * CALLS
    old = rfc3339(T0 - 3600)
    assert _warmup_calls(tmp_path, "old", lambda _p, _t: old)["calls"] == 0
    # shop-7-new restarts under its own name at minute 5 (as a StatefulSet's pod does), on
    # the same version: first seen long ago, yet cold again for 2 min.
    restart = T0 + 300

    def restarted(pod: str, t: float) -> str:
        return rfc3339(restart) if pod == "shop-7-new" and T0 + t >= restart else old

    assert _warmup_calls(tmp_path, "restarted", restarted)["calls"] == 12 * CALLS


def _warm_up_with(tmp_path: Path, name: str, events: list[Event],
                  warmup_s: float = 120.0) -> dict:
    """The success rate's warm-up band over 30 min of the estate, with `events` stored (what
    the probe saw of its pods' starts) and no start_time labels."""
    db = str(tmp_path / f"{name}.db")
    with Store.open(db) as store:
        write_estate(store, FLEET, healthy, 30, seed=5)
        store.write_events(events)
    result = compute_verdict(db, JudgingSettings(warmup_s=warmup_s), baseline=OLD, canary=NEW,
                             now=T0 + 1800, since=rfc3339(T0), overload=None)
    return success(dict(result))["pods"]["warmup"]


def test_warm_up_applies_only_where_a_start_is_known(tmp_path: Path) -> None:
    # Without events (a store written before them): each pod's first 2 min in the store.
    assert _warm_up_with(tmp_path, "none", [])["calls"] == len(FLEET) * 12 * CALLS
    # Present when the probe started, with no start time: of unknown age, warm at once.
    present = [Event(PRESENT_EVENT, T0 - 1, cohort=c, endpoint=p) for p, c in FLEET.items()]
    assert _warm_up_with(tmp_path, "present", present)["calls"] == 0
    # A restart the probe saw (shop-7-new back on its version at minute 5), and a pod that
    # appeared at minute 10 (shop-8-new): each cold for 2 min from then, whatever came before.
    seen = [Event(RESTART_EVENT, T0 + 300, cohort=NEW, endpoint="shop-7-new"),
            Event(APPEARED_EVENT, T0 + 600, cohort=NEW, endpoint="shop-8-new")]
    assert _warm_up_with(tmp_path, "seen", present + seen)["calls"] == 2 * 12 * CALLS
    # warmup: 0s turns it off.
    assert _warm_up_with(tmp_path, "off", seen, warmup_s=0.0)["calls"] == 0


def test_a_path_in_warm_up_says_when_its_first_warm_window_ends(tmp_path: Path) -> None:
    # The baseline's pods were there when the probe started; the canary's two pods appeared
    # at minute 10. Asked 60 s later, the first window out of their warm-up starts 2 min
    # after they appeared, and ends a window later.
    db = str(tmp_path / "warming.db")
    appeared = T0 + 600
    with Store.open(db) as store:
        store.write_events([Event(PRESENT_EVENT, T0 - 1, cohort=OLD, endpoint=f"shop-{i}")
                            for i in range(3)]
                           + [Event(APPEARED_EVENT, appeared, cohort=NEW, endpoint=f"new-{i}")
                              for i in range(2)])
        for k in range(76):
            t = T0 + k * WINDOW_S
            pods = [(f"shop-{i}", OLD) for i in range(3)]
            pods += [(f"new-{i}", NEW) for i in range(2)] if t >= appeared else []
            cells = [EndpointWindow(start=t, path="checkout", endpoint=p, cohort=c,
                                    requests=CALLS, errors=0) for p, c in pods]
            store.write([PathWindow(start=t, length=WINDOW_S, path="checkout", cohort=c,
                                    outcomes={"ok": CALLS * sum(x == c for _, x in pods)},
                                    latency=(0,) * BUCKET_COUNT)
                         for c in sorted({c for _, c in pods})], cells)
    now = appeared + 60 + 1
    result = dict(compute_verdict(db, JudgingSettings(), now=now, overload=None))
    ends = appeared + 120 + WINDOW_S
    want = f"warming up: the first warm window ends at {rfc3339(ends)[11:19]} UTC (in 69 s)"
    [path] = result["paths"]
    assert path["verdict"] == "inconclusive" and path["reasons"][0] == want, path["reasons"]
    assert f"checkout: inconclusive: {want}" in result["reasons"]
    # Once that window has ended there is a warm window in common: no longer said.
    later = dict(compute_verdict(db, JudgingSettings(), now=ends + 1, overload=None))
    assert not any("warming up" in r for r in later["reasons"])


def metric(result: dict, name: str) -> dict:
    return dict(result["paths"][0]["metrics"][name])


def healthy(*_: object) -> float:
    return 0.001


def test_one_slow_canary_pod_does_not_fail_p99_and_is_named(tmp_path: Path) -> None:
    # shop-7-new (one of three canary pods) on a slow node: 3× the latency, and a slow
    # baseline pod (shop-2, 1.5×) besides. The pooled test blames the version.
    slow = {"shop-7-new": 3.0, "shop-2": 1.5}
    result = verdict(tmp_path, FLEET, healthy, scale=lambda pod, _c, _t: slow.get(pod, 1.0))
    m = metric(result, "latency_p99_ms")
    assert m["rule"] == "pods"
    assert m["verdict"] != "fail", m["reason"]
    assert m["pods"]["worst"] == "shop-7-new" and m["pods"]["concentrated"] is True
    assert "concentrated on shop-7-new" in m["reason"]
    assert m["pods"]["canary"] == 3 and m["pods"]["baseline"] == 6
    # With every pod in, the same calls fail: the pooled rule would have blamed the version.
    assert m["pods"]["e_fail_all_pods"] >= 1 / m["alpha"]
    assert success(result)["rule"] == "pods"


def test_a_slowdown_on_every_canary_pod_fails_p99(tmp_path: Path) -> None:
    m = metric(verdict(tmp_path, FLEET, healthy,
                       scale=lambda _p, cohort, _t: 1.5 if cohort == NEW else 1.0),
               "latency_p99_ms")
    assert m["verdict"] == "fail", m["reason"]
    assert "across the canary's pods, not on one pod alone" in m["reason"] and m["rule"] == "pods"


def test_a_slow_canary_of_one_pod_fails_p99_and_names_the_pod(tmp_path: Path) -> None:
    # One canary pod 3x slower than every baseline pod: beyond any spread they show.
    pods = {**{f"shop-{i}": OLD for i in range(6)}, "shop-9-new": NEW}
    m = metric(verdict(tmp_path, pods, healthy,
                       scale=lambda _p, cohort, _t: 3.0 if cohort == NEW else 1.0),
               "latency_p99_ms")
    assert m["verdict"] == "fail", m["reason"]
    assert "one pod shop-9-new" in m["reason"] and "restart shop-9-new" in m["reason"]


def test_attempts_take_the_pod_as_the_unit(tmp_path: Path) -> None:
    # One canary pod retries half its calls (a bad node): not the version's fault, named.
    one = metric(verdict(tmp_path, FLEET, healthy,
                         retries=lambda pod, _c, _t: 0.5 if pod == "shop-7-new" else 0.01),
                 "attempts_per_request")
    assert one["rule"] == "pods" and one["verdict"] != "fail", one["reason"]
    assert one["pods"]["worst"] == "shop-7-new"
    assert "concentrated on shop-7-new" in one["reason"] and "retries" in one["reason"]
    # Every canary pod retrying: attempts ×1.5 against a ×1.5 tolerance would be the
    # boundary, so twice as many retries as calls is clearly beyond it.
    (tmp_path / "every").mkdir()
    every = metric(verdict(tmp_path / "every", FLEET, healthy,
                           retries=lambda _p, cohort, _t: 1.0 if cohort == NEW else 0.01),
                   "attempts_per_request")
    assert every["verdict"] == "fail", every["reason"]
    assert "across the canary's pods, not on one pod alone" in every["reason"]


def test_a_span_written_without_per_pod_latency_and_attempts_is_judged_pooled(
    tmp_path: Path,
) -> None:
    # Rows of a v1 store (migrated): the pods' windows have no attempts and latency, so
    # those metrics keep the pooled test, and say so; success rate is still per pod.
    db = tmp_path / "estate.db"
    with Store.open(db) as store:
        write_estate(store, FLEET, healthy, 30, 1, scale=lambda *_: 1.0,
                     retries=lambda *_: 0.01)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE endpoint_windows SET attempts_sum = NULL, attempts_count = NULL,"
                 " latency = NULL WHERE start < ?", (T0 + 600,))
    conn.commit()
    conn.close()
    result = dict(compute_verdict(str(db), JudgingSettings(), baseline=OLD, canary=NEW,
                                  now=T0 + 1800, overload=None))
    for name, what in (("latency_p99_ms", "latency"), ("attempts_per_request", "attempts")):
        m = metric(result, name)
        assert m["rule"] == "pooled" and "pods" not in m
        assert f"no per-pod {what}" in m["reason"]
    assert success(result)["rule"] == "pods"
