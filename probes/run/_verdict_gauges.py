"""The skewprobe_verdict gauges of `skewprobe run`, refreshed once per window."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from probes.api import VerdictQuery
from probes.errors import SkewprobeError
from probes.metrics import OVERALL, ProbeMetrics

__all__ = ["VerdictGauges"]

log = logging.getLogger("skewprobe.run")


class VerdictGauges:
    """`publish()` once per window; `last` is the verdict last published."""

    def __init__(self, metrics: ProbeMetrics,
                 judge: Callable[[VerdictQuery], Awaitable[Mapping[str, Any]]]) -> None:
        self.metrics = metrics
        self.judge = judge
        self.last: Mapping[str, Any] | None = None

    async def publish(self) -> None:
        """Set the gauges from the verdict now. One that cannot be computed leaves every
        gauge inconclusive, never the last pass: the MetricTemplate gates on the gauge, and a
        sharded probe judging from a Prometheus it cannot reach would otherwise keep
        exporting an old pass."""
        try:
            result = await self.judge(VerdictQuery())
        except SkewprobeError as exc:
            log.warning("verdict not computed: %s", exc)
            if self.last is not None:
                for path in [*self.last.get("paths", []), *self.last.get("pairs", [])]:
                    self.metrics.set_verdict(path["path"], "inconclusive")
                self.metrics.set_verdict(OVERALL, "inconclusive")
            return
        self.last = result
        for path in [*result.get("paths", []), *result.get("pairs", [])]:
            self.metrics.set_verdict(path["path"], path["verdict"])
        self.metrics.set_verdict(OVERALL, result["verdict"])
