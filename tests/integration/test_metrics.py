"""The Prometheus surface: names pass promtool's lint, values follow what was observed."""

from __future__ import annotations

import platform
import shutil
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString

import probes
from probes.metrics import (
    DURATION_BUCKETS,
    OVERALL,
    PROMETHEUS_DURATION_BUCKETS,
    ProbeMetrics,
)
from probes.store import InventoryRow
from probes.types import CallOutcome, CallResult, Outcome


def result(
    outcome: CallOutcome,
    *,
    path: str = "checkout",
    cohort: str = "1.20.3",
    latency: float = 0.004,
    lag: float = 0.0005,
) -> CallResult:
    return CallResult(path, "pod-0", cohort, 1000.0, latency, lag, outcome)


@pytest.fixture
def reg() -> CollectorRegistry:
    return CollectorRegistry()


def exercised(reg: CollectorRegistry) -> ProbeMetrics:
    m = ProbeMetrics(reg)
    m.observe(result(CallOutcome(Outcome.OK, 200, attempts=1)))
    m.observe(result(CallOutcome(Outcome.OK, 200, attempts=3, churn=1), cohort="1.21.0"))
    m.observe(result(CallOutcome(Outcome.HTTP_5XX, 503), cohort="1.21.0", latency=2.5))
    m.observe(result(CallOutcome(Outcome.grpc("unavailable")), path="echo"))
    m.set_in_flight(7)
    m.drop("checkout", "overloaded", 3)
    m.set_verdict("checkout", "fail")
    m.set_verdict(OVERALL, "fail")
    m.set_inventory([InventoryRow("shop", "checkout", "1.20.3", 10, 86400.0)])
    m.stream_opened("watch", "1.21.0")
    m.stream_opened("watch", "1.21.0")
    m.stream_closed("watch", "1.21.0", 3600.0, reset_reason="goaway")
    m.stream_time("watch", "1.21.0", 42.0)
    m.stream_message_gap("watch", "1.21.0", 0.2)
    m.store_error()
    m.windows_written(100)
    m.gc_paused(0, 0.0002)
    m.gc_paused(0, 0.0003)
    m.gc_paused(2, 0.3)
    return m


def test_promtool_accepts_the_exposition(reg: CollectorRegistry) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`); .ci/run installs it")
    exercised(reg)
    text = generate_latest(reg)
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    # promtool prints lint problems (naming, units, missing HELP) and exits 1 on any.
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout.decode() + proc.stderr.decode()
    )
    for family in (
        "skewprobe_requests_total", "skewprobe_request_duration_seconds",
        "skewprobe_upstream_attempts_total", "skewprobe_upstream_attempts_measured_total",
        "skewprobe_connection_churn_total", "skewprobe_streams_open",
        "skewprobe_stream_resets_total", "skewprobe_stream_lifetime_seconds",
        "skewprobe_stream_message_gap_seconds", "skewprobe_inventory_pods",
        "skewprobe_verdict", "skewprobe_schedule_lag_seconds", "skewprobe_calls_in_flight",
        "skewprobe_calls_dropped_total", "skewprobe_store_errors_total",
        "skewprobe_windows_written_total", "skewprobe_probe_overloaded",
        "skewprobe_gc_pause_seconds", "skewprobe_build_info",
    ):
        assert f"# HELP {family} ".encode() in text


def test_values_after_observing_results(reg: CollectorRegistry) -> None:
    exercised(reg)
    v = reg.get_sample_value
    new = {"path": "checkout", "cohort": "1.21.0"}
    old = {"path": "checkout", "cohort": "1.20.3"}
    assert v("skewprobe_requests_total", {**new, "outcome": "ok"}) == 1
    assert v("skewprobe_requests_total", {**new, "outcome": "http_5xx"}) == 1
    assert v("skewprobe_requests_total", {"path": "echo", "cohort": "1.20.3",
                                          "outcome": "grpc_UNAVAILABLE"}) == 1
    # Attempts only from calls that measured them: 3 over 1 on the new cohort.
    assert v("skewprobe_upstream_attempts_total", new) == 3
    assert v("skewprobe_upstream_attempts_measured_total", new) == 1
    assert v("skewprobe_upstream_attempts_total", old) == 1
    assert v("skewprobe_connection_churn_total", new) == 1
    assert v("skewprobe_connection_churn_total", old) == 0  # present at 0 for rate()
    assert v("skewprobe_request_duration_seconds_count", new) == 2
    assert v("skewprobe_request_duration_seconds_bucket", {**new, "le": "0.005"}) == 1
    assert v("skewprobe_request_duration_seconds_bucket", {**new, "le": "5.0"}) == 2
    assert v("skewprobe_schedule_lag_seconds_count") == 4
    assert v("skewprobe_calls_in_flight") == 7
    assert v("skewprobe_calls_dropped_total", {"path": "checkout", "reason": "overloaded"}) == 3
    assert v("skewprobe_store_errors_total") == 1
    assert v("skewprobe_gc_pause_seconds_count", {"generation": "0"}) == 2
    assert v("skewprobe_gc_pause_seconds_bucket", {"generation": "0", "le": "0.00025"}) == 1
    assert v("skewprobe_gc_pause_seconds_bucket", {"generation": "2", "le": "0.25"}) == 0
    assert v("skewprobe_gc_pause_seconds_bucket", {"generation": "2", "le": "0.5"}) == 1
    assert v("skewprobe_gc_pause_seconds_sum", {"generation": "2"}) == pytest.approx(0.3)
    assert v("skewprobe_gc_pause_seconds_count", {"generation": "1"}) == 0  # present at 0
    assert v("skewprobe_windows_written_total") == 100
    watch = {"path": "watch", "cohort": "1.21.0"}
    assert v("skewprobe_streams_open", watch) == 1
    assert v("skewprobe_stream_resets_total", {**watch, "reason": "goaway"}) == 1
    assert v("skewprobe_stream_lifetime_seconds_count", watch) == 1
    assert v("skewprobe_stream_lifetime_seconds_bucket", {**watch, "le": "1800.0"}) == 0
    assert v("skewprobe_stream_seconds_total", watch) == 42
    assert v("skewprobe_stream_message_gap_seconds_count", watch) == 1


def _les(reg: CollectorRegistry) -> list[str]:
    return [
        s.labels["le"]
        for fam in reg.collect() if fam.name == "skewprobe_request_duration_seconds"
        for s in fam.samples
        if s.name.endswith("_bucket") and s.labels["cohort"] == "1.20.3"
        and s.labels["path"] == "checkout"
    ]


def test_duration_buckets_span_2ms_to_30s_within_the_p99_tolerance(
        reg: CollectorRegistry) -> None:
    exercised(reg)
    les = _les(reg)
    assert les[0] == "0.002" and les[-3:] == ["10.0", "30.0", "+Inf"]
    edges = [float(x) for x in les[:-2]]  # up to 10 s: every bucket inside x1.2
    assert max(b / a for a, b in pairwise(edges)) < 1.202
    for le in ("0.005", "0.01", "0.1", "0.5", "1.0"):  # the usual SLO thresholds exist
        assert le in les


def test_metrics_are_about_5_kb_per_path_and_cohort() -> None:
    """4 paths × 2 cohorts, every per-call series present: at most 5.2 KB each by default,
    (22 KB with the buckets a probe judging from Prometheus exports)."""
    sizes = {}
    for name, buckets in (("default", DURATION_BUCKETS), ("fine", PROMETHEUS_DURATION_BUCKETS)):
        reg = CollectorRegistry()
        m = ProbeMetrics(reg, duration_buckets=buckets)
        empty = len(generate_latest(reg))
        for path in ("checkout", "catalog", "echo", "health"):
            for cohort in ("1.20.3", "1.21.0"):
                m.observe(result(CallOutcome(Outcome.OK, 200, attempts=1), path=path,
                                 cohort=cohort))
                m.observe(result(CallOutcome(Outcome.HTTP_5XX, 503), path=path, cohort=cohort))
                m.set_verdict(path, "pass")
        sizes[name] = (len(generate_latest(reg)) - empty) / 8
    assert sizes["default"] <= 5200 < 20_000 < sizes["fine"], sizes


def test_a_probe_judging_from_prometheus_exports_16_buckets_per_doubling(
        tmp_path: Path) -> None:
    from probes.config import parse_config
    from probes.run.runner import ProbeRunner, RunOptions
    from tests.servers.probe_run import discard_config

    text = discard_config() + "source: prometheus\nprometheus: {url: http://127.0.0.1:9}\n"
    for config, buckets in ((discard_config(), DURATION_BUCKETS),
                            (text, PROMETHEUS_DURATION_BUCKETS)):
        runner = ProbeRunner(parse_config(config), RunOptions(str(tmp_path / "p.db")))
        runner.metrics.observe(result(CallOutcome(Outcome.OK, 200)))
        assert _les(runner.registry) == [*map(floatToGoString, buckets), "+Inf"]


def test_verdict_is_one_hot(reg: CollectorRegistry) -> None:
    m = exercised(reg)
    v = reg.get_sample_value
    assert [v("skewprobe_verdict", {"path": OVERALL, "verdict": s})
            for s in ("pass", "fail", "inconclusive")] == [0, 1, 0]
    m.set_verdict("checkout", "inconclusive")
    assert [v("skewprobe_verdict", {"path": "checkout", "verdict": s})
            for s in ("pass", "fail", "inconclusive")] == [0, 0, 1]
    m.remove_verdict("checkout")
    assert v("skewprobe_verdict", {"path": "checkout", "verdict": "inconclusive"}) is None
    m.remove_verdict("never-set")
    with pytest.raises(ValueError):
        m.set_verdict("checkout", "ok")


def test_inventory_is_replaced_whole(reg: CollectorRegistry) -> None:
    m = ProbeMetrics(reg)
    m.set_inventory([
        InventoryRow("shop", "checkout", "1.20.3", 10, 86400.0),
        InventoryRow("shop", "cart", "1.20.3", 4, 100.0),
        InventoryRow("shop", "cart", "1.21.0", 1, 30.0),
    ])
    v = reg.get_sample_value
    old = {"namespace": "shop", "proxy_version": "1.20.3"}
    assert v("skewprobe_inventory_pods", old) == 14
    assert v("skewprobe_inventory_pod_age_seconds", old) == 86400
    m.set_inventory([InventoryRow("shop", "checkout", "1.21.0", 15, 10.0)])
    assert v("skewprobe_inventory_pods", old) is None  # the old version is gone from the fleet
    assert v("skewprobe_inventory_pods", {"namespace": "shop", "proxy_version": "1.21.0"}) == 15


def test_no_global_registry() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    ProbeMetrics(a)
    ProbeMetrics(b)  # a second instance would clash on a shared registry
    assert REGISTRY.get_sample_value("skewprobe_calls_in_flight") is None


def test_build_info_says_which_probe_version_is_running(reg: CollectorRegistry) -> None:
    ProbeMetrics(reg)
    assert reg.get_sample_value("skewprobe_build_info", {
        "version": probes.__version__, "python": platform.python_version(),
    }) == 1
    build = next(f for f in reg.collect() if f.name == "skewprobe_build_info")
    assert build.type == "gauge" and len(build.samples) == 1


def test_probe_health_series(reg: CollectorRegistry) -> None:
    m = ProbeMetrics(reg)
    v = reg.get_sample_value
    assert v("skewprobe_probe_overloaded") == 0
    m.set_overloaded(True)
    assert v("skewprobe_probe_overloaded") == 1
    in_flight = [3]
    m.track_in_flight(lambda: in_flight[0])
    in_flight[0] = 11  # read at scrape time, not when set
    assert v("skewprobe_calls_in_flight") == 11
    # Schedule lag: negative lags count as 0; buckets are cumulative.
    m.observe(result(CallOutcome(Outcome.OK, 200), lag=-0.001))
    m.observe(result(CallOutcome(Outcome.OK, 200), lag=0.02))
    assert v("skewprobe_schedule_lag_seconds_bucket", {"le": "0.0001"}) == 1
    assert v("skewprobe_schedule_lag_seconds_bucket", {"le": "0.025"}) == 2
    assert v("skewprobe_schedule_lag_seconds_sum") == 0.02


def test_intended_rates_are_read_from_the_schedule_at_each_scrape() -> None:
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    rates = {("checkout", "1.20.3"): 10.0}
    metrics.track_intended_rates(lambda: dict(rates))
    rates[("checkout", "1.21.0")] = 6.0
    text = generate_latest(registry).decode()
    assert 'skewprobe_intended_calls_per_second{cohort="1.20.3",path="checkout"} 10.0' in text
    assert 'skewprobe_intended_calls_per_second{cohort="1.21.0",path="checkout"} 6.0' in text
