"""What a probe's paths will cost it: calls per second per protocol and the share of a core
each is expected to take, from the CPU per call measured for that protocol.

`skewprobe run` logs this once, when its first endpoints are scheduled, and warns when the
total is above what one probe can use (one core: everything runs on one event loop; less
when its cgroup allows less), before the overload rule (`probes.measure.overload`) has to
say so from late sends. The CPU per call is one table of defaults, `CPU_S_PER_CALL`, each
figure with the BENCHMARKS.md section it comes from: change them there and here together.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from probes.spec import PathSpec

__all__ = [
    "CPU_S_PER_CALL",
    "CPU_S_PER_STREAM_HOUR",
    "SHARD_CORES",
    "CostEstimate",
    "cpu_limit_cores",
    "estimate",
    "protocol_of",
]

# A relay call's: the HTTP/1.1 figure below times the relay's ratio to a direct call,
# measured side by side (BENCHMARKS.md D22).
RELAY_H1_S: Final = 0.325e-3
RELAY_H2_S: Final = 0.379e-3
# Probe CPU-seconds per call, per protocol: BENCHMARKS.md, "CPU per call by protocol"
# (one sitting, one machine, 600 endpoints × 1 call/s, HAProxy target; cheaper at scale).
CPU_S_PER_CALL: Final[Mapping[str, float]] = MappingProxyType({
    "HTTP/1.1": 0.265e-3,     # the probe's own HTTP/1.1 (0.185e-3 at 2,400: D6)
    "HTTP/2": 0.358e-3,       # h2c on the probe's own HTTP/2 client (D15)
    "gRPC unary": 0.349e-3,   # health Check on the same client: no Echo figure yet
    "gRPC health": 0.349e-3,  # the same calls
    # A relay call: the direct figure times the relay's measured ratio to a direct call to
    # the same pods, at the same rate, in one sitting (D22).
    "relay HTTP/1.1": RELAY_H1_S,
    "relay HTTP/2": RELAY_H2_S,
})
# A held stream's CPU per hour (a message every second): BENCHMARKS.md D11, 276 ms per
# stream-hour with 2,000 streams.
CPU_S_PER_STREAM_HOUR: Final = 0.276
STREAMS: Final = "held streams"
# The share of its core a probe is sized for when saying how many shards to run: the
# capacity goal (2,400 × 1/s HTTP/1.1 and 2,400 held streams) kept its lag budget at
# 0.45–0.54 of a core (BENCHMARKS.md, "Current figures"); no run above ~0.6 has.
SHARD_CORES: Final = 0.6


def protocol_of(path: PathSpec) -> str:
    """The row of `CPU_S_PER_CALL` a path's calls cost (`STREAMS` for a stream path)."""
    if path.relay is not None:
        return "relay HTTP/2" if path.relay.version == "2" else "relay HTTP/1.1"
    if path.http is not None:
        return "HTTP/2" if path.http.version == "2" else "HTTP/1.1"
    if path.grpc is not None:
        return "gRPC health" if path.grpc.health_service is not None else "gRPC unary"
    return STREAMS


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """Calls per second and expected cores per protocol, and what this probe may use."""

    calls_per_s: Mapping[str, float]
    streams: int
    cores: Mapping[str, float]
    # What one probe can use here: one core (one event loop), or its cgroup's quota if less.
    usable_cores: float
    cpus: int
    cgroup_cores: float | None

    @property
    def total_cores(self) -> float:
        return sum(self.cores.values())

    @property
    def over(self) -> bool:
        return self.total_cores > self.usable_cores

    @property
    def shards(self) -> int:
        """Shards that keep each probe at `SHARD_CORES` or less, were the estate split."""
        return max(1, math.ceil(self.total_cores / min(SHARD_CORES, self.usable_cores)))

    def line(self) -> str:
        parts = []
        for protocol, rate in self.calls_per_s.items():
            parts.append(f"{protocol} {rate:,.0f} calls/s × {CPU_S_PER_CALL[protocol] * 1e3:.3f}"
                         f" ms = {self.cores[protocol]:.2f} core")
        if self.streams:
            parts.append(f"{self.streams:,} {STREAMS} = {self.cores[STREAMS]:.2f} core")
        limit = "none" if self.cgroup_cores is None else f"{self.cgroup_cores:g} cores"
        return (f"expected cost on this machine: {'; '.join(parts) or 'no calls'}; total "
                f"{self.total_cores:.2f} of the {self.usable_cores:g} core one probe can use "
                f"({self.cpus} CPUs here, cgroup limit {limit}; CPU per call measured in "
                "BENCHMARKS.md, \"CPU per call by protocol\")")

    def warning(self) -> str | None:
        if not self.over:
            return None
        return (f"expected {self.total_cores:.2f} cores, above the {self.usable_cores:g} one "
                "probe can use: its sends will fall behind and the overload rule will leave "
                f"p99 without evidence; split the endpoints over {self.shards} probes "
                f"(--shard i/{self.shards}, or the chart's shards: {self.shards}; README, "
                "\"When to shard\") or lower the paths' rates")


def estimate(
    paths: Iterable[PathSpec],
    calls_per_s: Mapping[str, float],
    streams: Mapping[str, int],
    *,
    cpus: int | None = None,
    cgroup_cores: float | None = None,
) -> CostEstimate:
    """The cost of `calls_per_s` (intended calls per second per path name) and `streams`
    (streams held per path name) for these paths."""
    rates: dict[str, float] = {}
    held = 0
    for path in paths:
        protocol = protocol_of(path)
        if protocol == STREAMS:
            held += streams.get(path.name, 0)
        elif calls_per_s.get(path.name):
            rates[protocol] = rates.get(protocol, 0.0) + calls_per_s[path.name]
    cores = {p: rate * CPU_S_PER_CALL[p] for p, rate in rates.items()}
    if held:
        cores[STREAMS] = held * CPU_S_PER_STREAM_HOUR / 3600.0
    usable = 1.0 if cgroup_cores is None else min(1.0, cgroup_cores)
    return CostEstimate(
        calls_per_s=MappingProxyType(rates), streams=held, cores=MappingProxyType(cores),
        usable_cores=usable, cpus=cpus if cpus is not None else _cpus(),
        cgroup_cores=cgroup_cores,
    )


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_limit_cores(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (a pod's `limits.cpu`), or None when
    there is none or it cannot be read. cgroup v2 (`cpu.max`: "quota period" or "max
    period"), else v1 (`cpu/cpu.cfs_quota_us`, -1 for none, over `cpu.cfs_period_us`)."""
    try:
        quota, _, period = (root / "cpu.max").read_text().strip().partition(" ")
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
