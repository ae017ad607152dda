"""ProbeRunner's own parts: the overload rule reaching the verdict, the recorder's counts,
windows written from a worker thread, and the garbage-collector state it restores."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import random
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from probes.api import VerdictQuery
from probes.config import parse_config
from probes.discovery.changes import RESTART
from probes.measure.overload import LAG_BUDGET_S, OVERLOAD_EVENT, OverloadWatch
from probes.measure.window import WindowAggregator
from probes.metrics import ProbeMetrics
from probes.run.runner import ProbeRunner, Recorder, RunOptions
from probes.spec import PrometheusSettings, Tolerances
from probes.store import Event, Store
from probes.types import CallOutcome, CallResult, Endpoint, Outcome
from probes.verdict.service import compute_verdict, late_spans, overload_spans, stored_overload
from tests.servers.hostile import HostileServer
from tests.servers.ports import refused_port
from tests.servers.probe_run import (
    Windows,
    discard_config,
    example_fleet,
    http_config,
    probe_runner,
    running,
)
from tests.servers.stores import store_with_a_failing_canary

CONFIG = discard_config()


async def test_an_overloaded_probe_still_fails_a_failing_canary_and_says_so(
        tmp_path: Path) -> None:
    # Skipped calls were never made, so they are neither successes nor failures: the calls
    # that were made still judge the canary (issue 31, point 4).
    store = tmp_path / "probe.db"
    store_with_a_failing_canary(store, time.time())
    runner = ProbeRunner(parse_config(CONFIG), RunOptions(store_path=str(store), listen=None))
    judged = await runner.verdict_json(VerdictQuery())
    assert judged["verdict"] == "fail", judged["reasons"]

    runner.overload.update(0, 0, 0)
    runner.overload.update(24_000, 0, 7)  # calls skipped in the last window
    starved = await runner.verdict_json(VerdictQuery())
    assert starved["verdict"] == "fail", starved["reasons"]
    assert starved["reasons"][0].startswith("probe overloaded: 7 calls skipped")
    assert "judged from every window whose calls were made" in starved["reasons"][0]


async def test_a_verdict_that_cannot_be_computed_leaves_the_gauges_inconclusive(
    tmp_path: Path,
) -> None:
    """A shard judging from a Prometheus it cannot reach must not keep exporting its last
    verdict: the MetricTemplate gates on the gauge."""
    store = tmp_path / "probe.db"
    store_with_a_failing_canary(store, time.time())
    runner = ProbeRunner(parse_config(CONFIG), RunOptions(store_path=str(store), listen=None))

    def gauge(path: str, verdict: str) -> float | None:
        return runner.registry.get_sample_value(
            "skewprobe_verdict", {"path": path, "verdict": verdict})

    await runner.gauges.publish()
    assert runner.last_verdict is not None and runner.last_verdict["verdict"] == "fail"
    paths = [p["path"] for p in runner.last_verdict["paths"]] + ["_overall"]
    assert gauge("_overall", "fail") == 1.0
    with refused_port() as port:
        unreachable = PrometheusSettings(url=f"http://127.0.0.1:{port}", timeout_s=2)
        # The verdicts' config (`probes.run._verdict_publish`): judged from Prometheus now on.
        runner.verdicts.config = dataclasses.replace(runner.config, source="prometheus",
                                                     prometheus=unreachable)
        await runner.gauges.publish()
    for path in paths:
        assert gauge(path, "inconclusive") == 1.0, path
        assert gauge(path, "fail") == gauge(path, "pass") == 0.0, path


def test_recorder_counts_late_sends_and_drops_for_the_overload_rule() -> None:
    metrics = ProbeMetrics(CollectorRegistry())
    agg = WindowAggregator(length_s=10.0, grace_s=0.0, retain_s=0.0)
    watch = OverloadWatch()
    recorder = Recorder(agg, metrics, watch)
    ep = Endpoint("pod-0", "127.0.0.1", 1, {"proxy_version": "v"})
    ok = CallOutcome(Outcome.OK, 200)
    for lag in (0.0, LAG_BUDGET_S / 2, LAG_BUDGET_S * 1.5, 0.3):
        recorder.record(CallResult("p", "pod-0", "v", 1000.0, 0.01, lag, ok), ep)
    recorder.dropped("p", "max_in_flight", 2)
    agg.flush(now=2000.0)  # the window is written and forgotten (no retention)
    recorder.record(CallResult("p", "pod-0", "v", 1000.0, 0.01, 0.0, ok), ep)  # too late
    assert (recorder.calls, recorder.lagged, recorder.dropped_total) == (5, 2, 3)
    # Late is judged against the watch's budget, the one its reason names: at 100 ms only
    # the 0.3 s send counts.
    watch.budget_s = 0.1
    for lag in (LAG_BUDGET_S * 1.5, 0.3):
        recorder.record(CallResult("p", "pod-0", "v", 2000.0, 0.01, lag, ok), ep)
    assert recorder.lagged == 3


def test_gc_state_is_restored(tmp_path: Path) -> None:
    before, callbacks = gc.get_threshold(), list(gc.callbacks)
    runner = ProbeRunner(parse_config(CONFIG), RunOptions(store_path=str(tmp_path / "p.db")))
    restore = runner.collector.save()
    assert len(gc.callbacks) == len(callbacks) + 1  # the pause hook, while the run lasts
    gc.freeze()
    gc.set_threshold(700, 10, 100)
    restore()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert gc.callbacks == callbacks


async def test_a_short_run_writes_windows_from_the_worker_thread(tmp_path: Path) -> None:
    # No target answers on port 9: every call is classified, windows are still written,
    # and the run ends on time with the final flush done.
    store = tmp_path / "probe.db"
    config = parse_config(CONFIG.replace("window: 10s", "window: 1s"))
    written: list[int] = []
    runner = ProbeRunner(config, RunOptions(
        store_path=str(store), listen=None, duration_s=2.5,
        on_window=lambda windows: written.append(len(windows)),
    ))
    await asyncio.wait_for(runner.run(), 20)
    assert written and runner.windows_written == sum(written)
    with Store.open(store, readonly=True) as s:
        windows = s.read_windows()
    assert sum(w.requests for w in windows) == runner.recorder.calls > 0


async def test_overload_is_written_to_the_store_for_store_only_verdicts(tmp_path: Path) -> None:
    # One call in flight at most, against a target that never answers: the probe must skip
    # sends, the overload rule trips, and `skewprobe verdict` (the store alone, no live
    # probe) gives the reason, as GET /verdict did while it ran.
    store = tmp_path / "probe.db"
    async with HostileServer() as hang:
        config = parse_config(
            CONFIG.replace("127.0.0.1:9", f"127.0.0.1:{hang.port}")
            .replace("window: 10s", "window: 1s\nprobe: {max_in_flight: 1}")
            .replace("/api/checkout", "/hang").replace("rate: 5/s", "rate: 20/s")
        )
        runner = ProbeRunner(config, RunOptions(store_path=str(store), listen=None,
                                                duration_s=3.5))
        await asyncio.wait_for(runner.run(), 20)
    live = runner.overload.reason
    assert live is not None and "calls skipped" in live
    later = time.time() + 1
    with Store.open(store, readonly=True) as s:
        events = s.read_events(kinds=[OVERLOAD_EVENT])
        # Written when the state changes (the reason's counts move on without a new event).
        stored = events[-1].detail["reason"]
        assert stored.startswith("probe overloaded:") and "calls skipped" in stored
        assert stored_overload(s, later) == stored
        assert stored_overload(s, events[0].at - 1) is None  # before the probe was starved
    # Asked while the probe still writes (its newest window just ended): the stored reason
    # first. (Asked long after, the probe has stopped and no longer is overloaded:
    # test_a_probe_that_stopped_overloaded_is_no_longer_said_to_be.)
    with Store.open(store, readonly=True) as s:
        newest = s.newest_window_end()
    assert newest is not None
    result = compute_verdict(str(store), config.judging, now=max(newest, stored_at(store)) + 1)
    assert result["verdict"] == "inconclusive"  # one cohort, and no call ever answered
    assert result["reasons"][0].startswith(stored)


def stored_at(store: Path) -> float:
    """When the probe wrote its last overload event."""
    with Store.open(store, readonly=True) as s:
        return s.read_events(kinds=[OVERLOAD_EVENT])[-1].at


def test_an_overload_is_said_while_it_lasts_and_judges_all_along(tmp_path: Path) -> None:
    now = time.time()
    store = tmp_path / "probe.db"
    store_with_a_failing_canary(store, now)
    config = parse_config(CONFIG)
    with Store.open(store) as s:
        s.write_events([Event(OVERLOAD_EVENT, now - 60, detail={"reason": "probe overloaded: x"})])
    starved = compute_verdict(str(store), config.judging, now=now)
    assert starved["verdict"] == "fail"
    assert starved["reasons"][0].startswith("probe overloaded: x")
    with Store.open(store) as s:
        s.write_events([Event(OVERLOAD_EVENT, now - 30, detail={"reason": None})])
    cleared = compute_verdict(str(store), config.judging, now=now)
    assert cleared["verdict"] == "fail"
    assert not any(r.startswith("probe overloaded") for r in cleared["reasons"])
    # The live probe's own state wins over the store's: it is newer.
    assert compute_verdict(str(store), config.judging, now=now, overload="probe overloaded: y")[
        "reasons"][0].startswith("probe overloaded: y")


async def test_a_pod_back_on_a_new_version_is_a_restart_event_in_the_store(
    tmp_path: Path,
) -> None:
    endpoints, store = tmp_path / "endpoints.yaml", tmp_path / "probe.db"

    def publish(version: str) -> None:
        endpoints.write_text(
            f"- {{name: pod-0, address: '127.0.0.1:9', labels: {{proxy_version: '{version}'}}}}\n"
        )

    publish("1.20.3")
    config = parse_config(
        CONFIG.replace("  static:\n    - address: 127.0.0.1:9\n"
                       "      labels: {proxy_version: \"1.20.3\"}\n",
                       f"  file: {{path: {endpoints}}}\n").replace("window: 10s", "window: 1s")
    )
    runner = ProbeRunner(config, RunOptions(store_path=str(store), listen=None, duration_s=4.0))
    run = asyncio.create_task(runner.run())
    await asyncio.sleep(1.5)
    publish("1.21.0")
    await asyncio.wait_for(run, 20)
    with Store.open(store, readonly=True) as s:
        restarts = s.read_events(kinds=[RESTART])
    assert [(e.endpoint, dict(e.detail)["from"], e.cohort) for e in restarts] == [
        ("pod-0", "1.20.3", "1.21.0")]


def test_a_probe_that_stopped_overloaded_is_no_longer_said_to_be(tmp_path: Path) -> None:
    # The demo on a busy machine: the probe's last windows were overloaded, then it stopped.
    now = time.time()
    store = tmp_path / "probe.db"
    store_with_a_failing_canary(store, now)
    config = parse_config(CONFIG)
    with Store.open(store) as s:
        newest = s.newest_window_end()
        assert newest is not None
        s.write_events([Event(OVERLOAD_EVENT, newest - 5,
                              detail={"reason": "probe overloaded: x"})])
    # Asked while the probe still writes: overloaded now, and said so; judged all the same.
    now = compute_verdict(str(store), config.judging, now=newest + 1)
    assert now["verdict"] == "fail"
    assert now["reasons"][0].startswith("probe overloaded: x")
    # Asked once it has stopped: stale, and no longer said to be overloaded.
    later = compute_verdict(str(store), config.judging, now=newest + 1 + 30)
    assert any("data is stale" in r for r in later["reasons"]), later["reasons"]
    assert not any(r.startswith("probe overloaded") for r in later["reasons"])


def test_errors_while_the_probe_was_overloaded_still_count(tmp_path: Path) -> None:
    # In one minute of an overloaded probe the canary's calls failed. A late send does not
    # make a call fail on one cohort alone (the schedule interleaves them), so those errors
    # count as any others; only p99 may leave such windows out (issue 31, point 4).
    now = time.time()
    agg = WindowAggregator(length_s=10.0, grace_s=0.0)
    start = (now // 10) * 10 - 600
    stall = (start + 300, start + 360)
    for i in range(6000):
        t = start + i * 0.1
        for cohort in ("1.20.3", "1.21.0"):
            bad = cohort == "1.21.0" and stall[0] <= t < stall[1]
            outcome = CallOutcome(Outcome.TIMEOUT if bad else Outcome.OK, 200)
            agg.add(CallResult("checkout", f"pod-{cohort}-{i % 3}", cohort, t, 0.01, 0.0,
                               outcome))
    store = tmp_path / "probe.db"
    with Store.open(store) as s:
        s.write(*agg.flush(now=now, force=True))
        s.write_events([
            Event(OVERLOAD_EVENT, stall[0] + 10, detail={"reason": "probe overloaded: y"}),
            Event(OVERLOAD_EVENT, stall[1] + 30, detail={"reason": None}),
        ])
    config = parse_config(CONFIG)
    judged = compute_verdict(str(store), config.judging, now=now)
    assert judged["verdict"] == "fail", judged["reasons"]
    success = judged["paths"][0]["metrics"]["success_rate"]
    assert success["counts"]["canary"]["errors"] == 600
    # The same as the store without the overload events (the sends were not late: lag 0).
    with Store.open(tmp_path / "unmarked.db") as s, Store.open(store, readonly=True) as src:
        s.write(src.read_windows(), src.read_endpoint_windows())
    unmarked = compute_verdict(str(tmp_path / "unmarked.db"), config.judging, now=now)
    assert unmarked["paths"] == judged["paths"]


async def test_a_probe_overloaded_all_along_still_fails_a_regression_on_its_calls(
    tmp_path: Path,
) -> None:
    # As on a busy node: every send counts as late (a budget of 1 µs), so the overload rule
    # trips at the first window and never clears. 1.21.0 (two of four pods) makes twice the
    # attempts on checkout and fails 1 pp more of its calls: the calls made still judge it
    # (issue 31, point 4), the probe says it is overloaded, and p99 leaves out the windows
    # only if the sends were late by more than half its margin.
    endpoints, db = tmp_path / "endpoints.json", tmp_path / "probe.db"
    windows = Windows()
    host = f"127.{random.randint(64, 250)}.{random.randint(0, 255)}.1"
    judged: dict[str, Any] = {}
    async with example_fleet(endpoints, base_host=host, seed=31, notice_s=0.1) as fleet:
        await fleet.restart(0, "1.21.0")
        await fleet.restart(1, "1.21.0")
        config = http_config(endpoints, rate="20/s", paths={"checkout": "/api/checkout"})
        runner = probe_runner(config, str(db), on_window=windows.on_window)
        runner.overload.budget_s = 1e-6
        async with running(runner, stop_within_s=30):
            wait = windows.budget(OVERLOADED_WINDOWS_MAX, "the overloaded probe to fail")
            for _ in range(OVERLOADED_WINDOWS_MAX):
                await wait.next()
                if runner.overload.reason is None:
                    continue
                judged = dict(await runner.verdict_json(VerdictQuery()))
                if judged["verdict"] == "fail":
                    break
    assert judged.get("verdict") == "fail", judged.get("reasons")
    assert judged["reasons"][0].startswith("probe overloaded: ")
    [checkout] = judged["paths"]
    assert checkout["metrics"]["attempts_per_request"]["verdict"] == "fail"
    with Store.open(db, readonly=True) as s:
        states = [e.detail["reason"] for e in s.read_events(kinds=[OVERLOAD_EVENT])]
        newest = s.newest_window_end()
        assert newest is not None
        late = late_spans(s, overload_spans(s, newest + 0.5, 1.0), Tolerances())
    assert states and all(states), states  # overloaded from its first windows to its last
    # The store alone judges the same way, and says what p99 left out, if anything.
    stored = compute_verdict(str(db), parse_config(config).judging, now=newest + 0.5)
    assert stored["verdict"] == "fail", stored["reasons"]
    p99 = stored["paths"][0]["metrics"]["latency_p99_ms"]["reason"]
    assert ("left out of p99: the probe's sends were up to" in p99) == bool(late), p99


# A hang guard: the attempts fail within a few windows of 1 s at these rates.
OVERLOADED_WINDOWS_MAX = 90
