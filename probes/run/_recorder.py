"""The engine's sink in `skewprobe run`: each result to its window and to /metrics, with the
running totals the overload rule and the progress lines read."""

from __future__ import annotations

from probes.measure.overload import OverloadWatch
from probes.measure.window import WindowAggregator
from probes.metrics import ProbeMetrics
from probes.run._progress import NO_ANSWER
from probes.types import CallResult, Endpoint

__all__ = ["Recorder"]


class Recorder:
    """The engine's sink: each result goes to the window aggregator and to /metrics."""

    def __init__(
        self, aggregator: WindowAggregator, metrics: ProbeMetrics, overload: OverloadWatch
    ) -> None:
        self.aggregator = aggregator
        self.metrics = metrics
        # Read at every call, so a budget changed on the watch counts from then on.
        self.overload = overload
        self.calls = 0
        self.errors_by_cohort: dict[str, int] = {}
        self.calls_by_cohort: dict[str, int] = {}
        self.dropped_total = 0
        # Sends later than the overload watch's budget (the rule reads it).
        self.lagged = 0
        # Endpoints that answered a call since the progress reporter last took the set.
        self.answered: set[str] = set()

    def record(self, result: CallResult, endpoint: Endpoint) -> None:
        if not self.aggregator.add(result, endpoint.labels):
            # Its window was written and forgotten long ago: count it, never lose it silently.
            self.dropped(result.path, "late")
        self.metrics.observe(result)
        self.calls += 1
        if result.lag_s > self.overload.budget_s:
            self.lagged += 1
        self.calls_by_cohort[result.cohort] = self.calls_by_cohort.get(result.cohort, 0) + 1
        if not result.ok:
            self.errors_by_cohort[result.cohort] = self.errors_by_cohort.get(result.cohort, 0) + 1
            if result.outcome.outcome in NO_ANSWER:
                return
        self.answered.add(endpoint.name)

    def dropped(self, path: str, reason: str, count: int = 1) -> None:
        self.dropped_total += count
        self.metrics.drop(path, reason, count)
