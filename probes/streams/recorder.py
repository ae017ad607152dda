"""The StreamSink the prober reports to: one place that turns stream reports into windows,
metrics, storm events and the lifetime log.

What goes where, and why:

* a stream *established*: `streams_opened` of its window (and a request of its endpoint),
  `skewprobe_streams_open` +1, and its (path, cohort) starts being watched for storms;
* held time: `stream_seconds` of each window it spans (`skewprobe_stream_seconds_total`), the
  exposure that turns resets into resets per stream-hour;
* each message after the first: its gap in `skewprobe_stream_message_gap_seconds`;
* an end: `skewprobe_streams_open` -1 and the lifetime histogram; if it is a reset
  (`EndReason.is_reset`), `stream_resets[reason]` of its window (an error of its endpoint),
  `skewprobe_stream_resets_total{reason}` and the storm detector; every end whose lifetime
  says something about the server joins the lifetime log;
* a stream that never opened: counted in `open_failures` by reason (`refused` and others),
  never as a reset: no stream existed to be reset.

Not thread-safe: the prober calls it from the event loop.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from probes.clients import EndReason, OpenStream, StreamEnd
from probes.measure.window import WindowAggregator
from probes.metrics import ProbeMetrics
from probes.store.records import Event
from probes.streams.lifetime import Lifetime, LifetimeReport, lifetime_report
from probes.streams.storm import ResetMark, Storm, StormDetector
from probes.types import Endpoint

__all__ = ["LIFETIME_EVENT", "StreamRecorder"]

# The store event that keeps the lifetime check per (path, cohort): `skewprobe plan` reads it
# to tell a stream tier with a lifetime cap from one without.
LIFETIME_EVENT = "lifetime"


class StreamRecorder:
    """Feeds a `WindowAggregator`, `ProbeMetrics` and a `StormDetector` from held streams."""

    def __init__(
        self,
        aggregator: WindowAggregator,
        metrics: ProbeMetrics,
        *,
        storms: StormDetector | None = None,
        lifetimes_kept: int = 4096,
    ) -> None:
        self.aggregator = aggregator
        self.metrics = metrics
        self.storms = storms if storms is not None else StormDetector()
        self._kept = lifetimes_kept
        self.lifetimes: dict[tuple[str, str], deque[Lifetime]] = {}
        self.opened: Counter[tuple[str, str]] = Counter()
        self.ends: Counter[tuple[str, str, str]] = Counter()
        self.open_failures: Counter[tuple[str, str, str]] = Counter()
        self.late = 0

    # -- StreamSink ------------------------------------------------------------------------

    def stream_opened(self, stream: OpenStream, endpoint: Endpoint) -> None:
        path, cohort = stream.path, stream.cohort
        if not self.aggregator.add_stream_open(
            path, cohort, endpoint.name, stream.opened_at, endpoint.labels
        ):
            self._late(path)
        self.metrics.stream_opened(path, cohort)
        self.storms.watch(path, cohort, stream.opened_at)
        self.opened[(path, cohort)] += 1

    def stream_held(
        self, path: str, cohort: str, endpoint: str, start: float, end: float
    ) -> None:
        del endpoint  # stream time is kept per path and cohort, not per endpoint
        self.streams_held(path, cohort, start, end, 1)

    def streams_held(self, path: str, cohort: str, start: float, end: float, count: int) -> None:
        if not self.aggregator.add_stream_time(path, cohort, "", start, end, streams=count):
            self._late(path)
        self.metrics.stream_time(path, cohort, (end - start) * count)

    def stream_message(self, path: str, cohort: str, gap_s: float) -> None:
        self.metrics.stream_message_gap(path, cohort, gap_s)

    def stream_ended(self, end: StreamEnd, endpoint: Endpoint) -> None:
        path, cohort, reason = end.path, end.cohort, end.reason
        if not end.established:
            if reason not in EndReason.CLIENT_SIDE:
                self.open_failures[(path, cohort, reason)] += 1
            return
        self.ends[(path, cohort, reason)] += 1
        reset = end.is_reset
        self.metrics.stream_closed(path, cohort, end.lifetime_s, reason if reset else None)
        if reset:
            if not self.aggregator.add_stream_reset(
                path, cohort, endpoint.name, reason, end.ended_at, endpoint.labels
            ):
                self._late(path)
            self.storms.add(path, cohort, ResetMark(end.ended_at, endpoint.name, reason))
        if reason not in EndReason.CLIENT_SIDE:
            log = self.lifetimes.get((path, cohort))
            if log is None:
                log = self.lifetimes[(path, cohort)] = deque(maxlen=self._kept)
            log.append(Lifetime(end.lifetime_s, end.ended_at, reason))

    # -- what the runner asks for ----------------------------------------------------------

    def poll_storms(self, now: float) -> list[Storm]:
        """Storms that ended by `now` (each reported once)."""
        return self.storms.poll(now)

    def storm_events(self, now: float) -> list[Event]:
        """The same storms as store Events (`Store.write_events`)."""
        return [storm.to_event() for storm in self.poll_storms(now)]

    def lifetime_report(
        self, open_streams: Iterable[OpenStream], threshold_s: float = 3600.0
    ) -> list[LifetimeReport]:
        """The lifetime check per (path, cohort), with `StreamProber.open_streams()`."""
        return lifetime_report(self.lifetimes, open_streams, threshold_s=threshold_s)

    def lifetime_events(
        self, open_streams: Iterable[OpenStream], now: float, threshold_s: float = 3600.0
    ) -> list[Event]:
        """The lifetime check as store Events, one per (path, cohort): individual lifetimes
        stay in memory, so this is what a reader of the store learns of them."""
        return [
            Event(LIFETIME_EVENT, now, path=r.path, cohort=r.cohort, detail={
                "capped": r.cap.capped, "cap_s": r.cap.cap_s, "why": r.cap.why,
                "ended": r.cap.ended, "open_streams": r.open_streams, "aged": r.aged,
                "threshold_s": r.threshold_s, "oldest_s": round(r.oldest_s, 1),
            })
            for r in self.lifetime_report(open_streams, threshold_s)
        ]

    def resets(self, path: str | None = None) -> Counter[str]:
        """Resets by reason so far (all paths, or one)."""
        out: Counter[str] = Counter()
        for (p, _cohort, reason), n in self.ends.items():
            if (path is None or p == path) and EndReason.is_reset(reason):
                out[reason] += n
        return out

    def _late(self, path: str) -> None:
        # Its window was written and forgotten: count it, never lose it silently.
        self.late += 1
        self.metrics.drop(path, "late_stream")
