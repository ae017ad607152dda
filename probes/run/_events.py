"""The events `skewprobe run` writes with its next window: the overload state's changes (made
on the loop), pods back on another proxy version (`restart`), stream storms, and the stream
lifetimes `skewprobe plan` reads, checked every 5 minutes and at the end."""

from __future__ import annotations

import time

from probes.clients import OpenStream, StreamProber
from probes.discovery.changes import RestartTracker
from probes.measure.overload import OVERLOAD_EVENT, OverloadWatch
from probes.metrics import ProbeMetrics
from probes.run._recorder import Recorder
from probes.store import Event
from probes.streams import StreamRecorder

__all__ = ["RunEvents"]

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
