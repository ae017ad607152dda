"""Per-window aggregates of finished calls and stream events, keyed by path x cohort.

A call belongs to the window of its *intended* send time, floor(intended_at / length)·length,
so a call the probe sent late, or that took long, is still counted where it was scheduled,
and both cohorts (and several probes) share the same epoch-aligned intervals.

A window is emitted by `flush(now)` once `end + grace <= now`: with `grace` at least the
longest call timeout, every call scheduled inside the window has finished by then. Data that
still arrives later (a starved probe) re-opens the window: the next flush emits it again,
*complete* (cumulative counts, not a delta), so the store's replace-on-write keeps exactly one
correct row per (start, path, cohort). Windows are forgotten `retain` seconds after their
first flush; anything older is dropped and counted in `late_dropped` (and `add` returns False
so the caller can count the drop in its metrics).

`add` is the hot path (thousands of calls per second on one core): a few dict operations and
one bucket index computed with `math.frexp`, no numpy and no allocation beyond first use of a
key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from probes._types import CallResult, EndpointWindow, Outcome, PathWindow
from probes.measure.histogram import index_of, tuple_from_sparse

__all__ = ["WindowAggregator"]

_NO_LABELS: Mapping[str, str] = MappingProxyType({})


class _PathAcc:
    __slots__ = (
        "attempts_count",
        "attempts_sum",
        "churn",
        "dirty",
        "lag_max",
        "latency",
        "outcomes",
        "stream_resets",
        "stream_seconds",
        "streams_opened",
    )

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.latency: dict[int, int] = {}
        self.attempts_sum = 0
        self.attempts_count = 0
        self.churn = 0
        self.lag_max = 0.0
        self.streams_opened = 0
        self.stream_seconds = 0.0
        self.stream_resets: dict[str, int] = {}
        self.dirty = True


class _EndpointAcc:
    __slots__ = ("dirty", "errors", "labels", "requests")

    def __init__(self, labels: Mapping[str, str] | None) -> None:
        self.requests = 0
        self.errors = 0
        self.labels = labels
        self.dirty = True


class _Window:
    __slots__ = ("dirty", "endpoints", "paths")

    def __init__(self) -> None:
        self.paths: dict[tuple[str, str], _PathAcc] = {}
        self.endpoints: dict[tuple[str, str, str], _EndpointAcc] = {}
        self.dirty = True


class WindowAggregator:
    """Builds `PathWindow`s and `EndpointWindow`s from call results and stream events.

    Not thread-safe: feed it from the event loop that runs the calls.

    Per-endpoint windows count calls for unary paths; for stream paths they count stream
    opens as requests and stream resets as errors, so a report can name the pods whose
    streams reset.
    """

    def __init__(self, length_s: float = 10.0, grace_s: float = 5.0, retain_s: float = 60.0):
        if not length_s > 0:
            raise ValueError("window length must be positive")
        if not grace_s >= 0 or not retain_s >= 0:
            raise ValueError("grace and retention must not be negative")
        self._length = float(length_s)
        self._grace = float(grace_s)
        self._retain = float(retain_s)
        self._windows: dict[int, _Window] = {}
        # Windows below this index were forgotten; data for them is late and dropped.
        self._forgotten_below = -math.inf
        self.late_dropped = 0

    @property
    def length_s(self) -> float:
        return self._length

    @property
    def grace_s(self) -> float:
        return self._grace

    def window_start(self, t: float) -> float:
        """The start of the window holding time `t`."""
        return (t // self._length) * self._length

    def _window(self, t: float) -> _Window | None:
        idx = int(t // self._length)
        w = self._windows.get(idx)
        if w is None:
            if idx < self._forgotten_below:
                self.late_dropped += 1
                return None
            w = self._windows[idx] = _Window()
        w.dirty = True
        return w

    @staticmethod
    def _path_acc(w: _Window, path: str, cohort: str) -> _PathAcc:
        acc = w.paths.get((path, cohort))
        if acc is None:
            acc = w.paths[(path, cohort)] = _PathAcc()
        else:
            acc.dirty = True
        return acc

    @staticmethod
    def _endpoint_acc(
        w: _Window, path: str, endpoint: str, cohort: str, labels: Mapping[str, str] | None
    ) -> _EndpointAcc:
        acc = w.endpoints.get((path, endpoint, cohort))
        if acc is None:
            acc = w.endpoints[(path, endpoint, cohort)] = _EndpointAcc(labels)
        else:
            acc.dirty = True
            if acc.labels is None:
                acc.labels = labels
        return acc

    def add(self, result: CallResult, labels: Mapping[str, str] | None = None) -> bool:
        """Count one finished call; `labels` are its endpoint's. False if it came too late."""
        w = self._window(result.intended_at)
        if w is None:
            return False
        acc = self._path_acc(w, result.path, result.cohort)
        call = result.outcome
        name = call.outcome
        acc.outcomes[name] = acc.outcomes.get(name, 0) + 1
        b = index_of(result.latency_s)
        acc.latency[b] = acc.latency.get(b, 0) + 1
        if call.attempts is not None:
            acc.attempts_sum += call.attempts
            acc.attempts_count += 1
        acc.churn += call.churn
        if result.lag_s > acc.lag_max:
            acc.lag_max = result.lag_s
        ep = self._endpoint_acc(w, result.path, result.endpoint, result.cohort, labels)
        ep.requests += 1
        if name != Outcome.OK:
            ep.errors += 1
        return True

    def add_stream_open(
        self,
        path: str,
        cohort: str,
        endpoint: str,
        at: float,
        labels: Mapping[str, str],
    ) -> bool:
        """A stream opened at `at` (counts as a request of the endpoint, with its labels)."""
        w = self._window(at)
        if w is None:
            return False
        self._path_acc(w, path, cohort).streams_opened += 1
        self._endpoint_acc(w, path, endpoint, cohort, labels).requests += 1
        return True

    def add_stream_reset(
        self,
        path: str,
        cohort: str,
        endpoint: str,
        reason: str,
        at: float,
        labels: Mapping[str, str],
    ) -> bool:
        """A stream ended abnormally at `at` for `reason` (counts as an error of the endpoint).

        Only resets belong here; streams that end cleanly (server closed OK, the probe's own
        cancel) are not resets.
        """
        w = self._window(at)
        if w is None:
            return False
        acc = self._path_acc(w, path, cohort)
        acc.stream_resets[reason] = acc.stream_resets.get(reason, 0) + 1
        self._endpoint_acc(w, path, endpoint, cohort, labels).errors += 1
        return True

    def add_stream_time(
        self, path: str, cohort: str, endpoint: str, start: float, end: float
    ) -> bool:
        """Stream-seconds held over [start, end), split exactly across the windows it spans.

        Resets per stream-hour need the held time per window, so the stream owner should
        report each held stream at least once per window (and at its end), not only when it
        closes hours later: time falling in forgotten windows is dropped (returns False).
        `endpoint` is accepted for symmetry with the other stream calls; per-endpoint stream
        time is not part of `EndpointWindow`.
        """
        del endpoint
        if not end > start:
            return True
        complete = True
        t = start
        while t < end:
            idx = int(t // self._length)
            upto = min(end, (idx + 1) * self._length)
            w = self._window(t)
            if w is None:
                complete = False
            else:
                self._path_acc(w, path, cohort).stream_seconds += upto - t
            if upto <= t:  # float guard: never loop on a boundary that does not advance
                break
            t = upto
        return complete

    def flush(
        self, now: float, force: bool = False
    ) -> tuple[list[PathWindow], list[EndpointWindow]]:
        """Windows complete at `now` (end + grace <= now) that changed since last emitted.

        `force` emits every window with new data, open ones included (at shutdown). An
        emitted window is always whole, so writing it again replaces the earlier row.
        Output is ordered by start, then path, cohort (and endpoint).
        """
        length = self._length
        paths: list[PathWindow] = []
        endpoints: list[EndpointWindow] = []
        for idx in sorted(self._windows):
            w = self._windows[idx]
            end = (idx + 1) * length
            if not force and end + self._grace > now:
                break
            if w.dirty:
                self._emit(idx, w, paths, endpoints)
            if end + self._grace + self._retain <= now:
                del self._windows[idx]
                self._forgotten_below = max(self._forgotten_below, idx + 1)
        return paths, endpoints

    def _emit(
        self, idx: int, w: _Window, paths: list[PathWindow], endpoints: list[EndpointWindow]
    ) -> None:
        start = idx * self._length
        for (path, cohort), acc in sorted(w.paths.items()):
            if not acc.dirty:
                continue
            acc.dirty = False
            paths.append(
                PathWindow(
                    start=start,
                    length=self._length,
                    path=path,
                    cohort=cohort,
                    outcomes=acc.outcomes,
                    latency=tuple_from_sparse(acc.latency),
                    attempts_sum=acc.attempts_sum,
                    attempts_count=acc.attempts_count,
                    churn=acc.churn,
                    lag_max_s=acc.lag_max,
                    streams_opened=acc.streams_opened,
                    stream_seconds=acc.stream_seconds,
                    stream_resets=acc.stream_resets,
                )
            )
        for (path, endpoint, cohort), ep in sorted(w.endpoints.items()):
            if not ep.dirty:
                continue
            ep.dirty = False
            endpoints.append(
                EndpointWindow(
                    start=start,
                    path=path,
                    endpoint=endpoint,
                    cohort=cohort,
                    requests=ep.requests,
                    errors=ep.errors,
                    labels=ep.labels if ep.labels is not None else _NO_LABELS,
                )
            )
        w.dirty = False

    @property
    def open_windows(self) -> int:
        """Windows held in memory (open, or flushed and kept for late data)."""
        return len(self._windows)
