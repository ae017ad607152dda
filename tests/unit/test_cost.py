"""The start-up cost estimate (`probes.measure.cost`): its arithmetic, the warning's
threshold, the cgroup quota it reads, and that its table is the one BENCHMARKS.md holds."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from probes.measure.cost import (
    CPU_S_PER_CALL,
    CPU_S_PER_STREAM_HOUR,
    SHARD_CORES,
    cpu_limit_cores,
    estimate,
    protocol_of,
)
from probes.spec import GrpcSpec, HttpSpec, PathSpec, RelaySpec, StreamSpec

ROOT = Path(__file__).resolve().parents[2]


def _paths() -> list[PathSpec]:
    return [
        PathSpec("h1", 1.0, 1.0, http=HttpSpec()),
        PathSpec("h1-post", 1.0, 1.0, http=HttpSpec(method="POST")),
        PathSpec("h2", 1.0, 1.0, http=HttpSpec(version="2")),
        PathSpec("echo", 1.0, 1.0, grpc=GrpcSpec(method="/pkg.S/Echo")),
        PathSpec("health", 1.0, 1.0, grpc=GrpcSpec(health_service="")),
        PathSpec("feed", 1.0, 1.0, stream=StreamSpec(per_endpoint=2)),
        PathSpec("relay", 1.0, 1.0, relay=RelaySpec("catalog")),
        PathSpec("relay-h2", 1.0, 1.0, relay=RelaySpec("catalog", version="2")),
    ]


def test_each_kind_of_path_has_its_protocol_row() -> None:
    assert [protocol_of(p) for p in _paths()] == [
        "HTTP/1.1", "HTTP/1.1", "HTTP/2", "gRPC unary", "gRPC health", "held streams",
        "relay HTTP/1.1", "relay HTTP/2"]
    assert set(CPU_S_PER_CALL) == {protocol_of(p) for p in _paths()} - {"held streams"}


def test_calls_per_protocol_times_cpu_per_call_is_the_core_share() -> None:
    rates = {"h1": 1200.0, "h1-post": 300.0, "h2": 300.0, "echo": 100.0, "health": 50.0}
    cost = estimate(_paths(), rates, {"feed": 1200}, cpus=2)
    assert dict(cost.calls_per_s) == {"HTTP/1.1": 1500.0, "HTTP/2": 300.0, "gRPC unary": 100.0,
                                      "gRPC health": 50.0}
    assert cost.streams == 1200
    for protocol, rate in cost.calls_per_s.items():
        assert cost.cores[protocol] == pytest.approx(rate * CPU_S_PER_CALL[protocol])
    assert cost.cores["held streams"] == pytest.approx(1200 * CPU_S_PER_STREAM_HOUR / 3600)
    want = (1500 * 0.265 + 300 * 0.358 + 100 * 0.349 + 50 * 0.349) / 1000 + 1200 * 0.276 / 3600
    assert cost.total_cores == pytest.approx(want)  # 0.63: under one core
    assert not cost.over and cost.warning() is None
    line = cost.line()
    assert "HTTP/1.1 1,500 calls/s × 0.265 ms = 0.40 core" in line
    assert "HTTP/2 300 calls/s × 0.358 ms = 0.11 core" in line
    assert "1,200 held streams = 0.09 core" in line
    assert f"total {want:.2f} of the 1 core one probe can use (2 CPUs here" in line
    # Paths without endpoints cost nothing and are not listed.
    assert dict(estimate(_paths(), {"h1": 10.0}, {}, cpus=1).calls_per_s) == {"HTTP/1.1": 10.0}


def test_relay_calls_are_counted_by_the_version_the_relay_pods_are_asked_in() -> None:
    # A config of relay paths only said "no calls" (issue 33).
    relay = [p for p in _paths() if p.relay is not None]
    cost = estimate(relay, {"relay": 800.0, "relay-h2": 200.0}, {}, cpus=2)
    assert dict(cost.calls_per_s) == {"relay HTTP/1.1": 800.0, "relay HTTP/2": 200.0}
    want = 800 * CPU_S_PER_CALL["relay HTTP/1.1"] + 200 * CPU_S_PER_CALL["relay HTTP/2"]
    assert cost.total_cores == pytest.approx(want)
    line = cost.line()
    assert "no calls" not in line
    assert f"relay HTTP/1.1 800 calls/s × {CPU_S_PER_CALL['relay HTTP/1.1'] * 1e3:.3f} ms" in line


def test_above_one_core_warns_and_says_how_many_shards() -> None:
    # 7,200 HTTP/2 endpoints × 1/s: 2.58 cores by the 600-endpoint figure.
    cost = estimate(_paths(), {"h2": 7200.0}, {}, cpus=2)
    assert cost.total_cores == pytest.approx(7200 * 0.358e-3)
    assert cost.over and cost.shards == math.ceil(2.5776 / SHARD_CORES) == 5
    warning = cost.warning()
    assert warning is not None and warning.startswith("expected 2.58 cores, above the 1 one")
    assert "--shard i/5" in warning and "shards: 5" in warning
    # Exactly one core is not above it; a hair more is.
    at_one = {"h1": 1 / CPU_S_PER_CALL["HTTP/1.1"]}
    assert not estimate(_paths(), at_one, {}, cpus=2).over
    assert estimate(_paths(), {"h1": at_one["h1"] * 1.001}, {}, cpus=2).over


def test_a_cgroup_quota_below_one_core_is_the_ceiling() -> None:
    rates = {"h1": 1000.0}  # 0.265 core
    assert not estimate(_paths(), rates, {}, cpus=8, cgroup_cores=4.0).over
    limited = estimate(_paths(), rates, {}, cpus=8, cgroup_cores=0.25)
    assert limited.usable_cores == 0.25 and limited.over
    assert limited.shards == 2  # 0.265 / 0.25
    assert "cgroup limit 0.25 cores" in limited.line()
    assert "above the 0.25 one probe can use" in (limited.warning() or "")


def test_cgroup_quota_from_v2_and_v1_files(tmp_path: Path) -> None:
    assert cpu_limit_cores(tmp_path) is None  # neither file
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_limit_cores(tmp_path) is None
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert cpu_limit_cores(tmp_path) == 0.5
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_limit_cores(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("250000\n")
    assert cpu_limit_cores(v1) == 2.5


def test_the_table_is_the_one_benchmarks_md_holds() -> None:
    """Each default is a figure of BENCHMARKS.md's "CPU per call by protocol" section, in
    CPU-s per 1,000 calls (and the stream's ms per stream-hour is in D11)."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = text.split("#### CPU per call by protocol", 1)[1].split("\n#", 1)[0]
    rows = dict(re.findall(r"^\| ([^|]+?) \| ([0-9.]+) \|", section, re.M))
    assert rows == {p: f"{v * 1e3:.3f}" for p, v in CPU_S_PER_CALL.items()}, rows
    assert f"({CPU_S_PER_STREAM_HOUR * 1e3:.0f} ms per stream-hour)" in text
