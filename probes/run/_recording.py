"""What `skewprobe run` records besides its windows' calls.

`Recorder` is the engine's sink: each result to its window and to /metrics, with the running
totals the overload rule and the progress lines read. `RunEvents` are the events written with
the next window: the overload state's changes (made on the loop), pods back on another proxy
version (`restart`), stream storms, and the stream lifetimes `skewprobe plan` reads, checked
every 5 minutes and at the end.
"""

from __future__ import annotations

import time

from probes.clients import OpenStream, StreamProber
from probes.discovery.changes import RestartTracker
from probes.measure.overload import OVERLOAD_EVENT, OverloadWatch
from probes.measure.window import WindowAggregator
from probes.metrics import ProbeMetrics
from probes.run._status import NO_ANSWER
from probes.store import Event
from probes.streams import StreamRecorder
from probes.types import CallResult, Endpoint

__all__ = ["Recorder", "RunEvents"]


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


# How often the stream-lifetime check runs while streams are held.
LIFETIME_EVERY_S = 300.0


class RunEvents:
    """`overload_checked()` after each window boundary; `take()` at each write."""

    def __init__(self, overload: OverloadWatch, metrics: ProbeMetrics,
                 restarts: RestartTracker, streams: StreamRecorder) -> None:
        self.overload = overload
        self.metrics = metrics
        self.restarts = restarts
        self.streams = streams
        # Made on the loop (overload changes), written with the next window.
        self.pending: list[Event] = []
        # The streams still open when the run stopped, captured before the prober closes them.
        self.open_at_stop: tuple[OpenStream, ...] = ()
        self._lifetime_at = 0.0

    def overload_checked(self, recorder: Recorder) -> None:
        """The overload rule on the recorder's totals; a change becomes an event, so
        `skewprobe verdict` on the store knows."""
        r = recorder
        reason = self.overload.update(r.calls, r.lagged, r.dropped_total)
        self.metrics.set_overloaded(reason is not None)
        if self.overload.changed:
            self.pending.append(Event(OVERLOAD_EVENT, time.time(), detail={"reason": reason}))

    def take(self, now: float, stream_prober: StreamProber | None, *, force: bool
             ) -> list[Event]:
        """The events made since the last write (`force`: the last write, at shutdown)."""
        events = [*self.pending, *self.restarts.drain(), *self.streams.storm_events(now)]
        self.pending.clear()
        if stream_prober is not None and (force or now - self._lifetime_at >= LIFETIME_EVERY_S):
            held = self.open_at_stop if force else stream_prober.open_streams()
            events += self.streams.lifetime_events(held, now)
            self._lifetime_at = now
        return events
