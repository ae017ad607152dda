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

Flushing is split for the event loop's sake: `take(now)` runs where `add` runs and only copies
the changed counters out (2–3 ms for 4,800 endpoint rows), and the `Taken` it returns is
turned into `PathWindow`s (`path_windows()`) and `EndpointWindow`s (`endpoint_windows()`,
one at a time, as the store writes them), which touches nothing the aggregator still owns
and so may run in a worker thread. `flush(now)` is both in one call, as lists.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from probes.measure.histogram import (
    MAX_VALUE,
    MIN_EXPONENT,
    MIN_VALUE,
    SUB_BUCKETS,
    index_of,
    tuple_from_sparse,
)
from probes.types import CallResult, EndpointWindow, Outcome, PathWindow

__all__ = ["Taken", "WindowAggregator"]

# `index_of` for the one scalar case `add` has, without its type dispatch (2.5 % of the
# probe's CPU at 1,800 endpoints went to the general function).
_FIRST_OCTAVE = (-1 - MIN_EXPONENT) * SUB_BUCKETS
_SUB2 = 2 * SUB_BUCKETS
_frexp = math.frexp

_NO_LABELS: Mapping[str, str] = MappingProxyType({})
# One call of an endpoint window: its latency bucket and attempts (0: not reported).
_CALL = struct.Struct("<HH")
_pack_call = _CALL.pack


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


class _Window:
    """One window's counters.

    Per-endpoint counts live in plain dicts of ints keyed by (path, endpoint, cohort), not
    in an object per endpoint: windows are kept `retain` seconds after their flush, and at
    2,400 endpoints an object per endpoint per window was tens of thousands of objects for
    every full garbage collection to walk. Dicts holding only strings, tuples of strings and
    ints are untracked by the collector, so these cost it nothing.
    """

    __slots__ = ("calls", "dirty", "dirty_endpoints", "errors", "labels", "paths", "requests")

    def __init__(self) -> None:
        self.paths: dict[tuple[str, str], _PathAcc] = {}
        self.requests: dict[tuple[str, str, str], int] = {}
        self.errors: dict[tuple[str, str, str], int] = {}
        # Each call's latency bucket and attempts (`_CALL` records) per endpoint, for the
        # endpoint window's histogram and attempts: immutable bytes, untracked by the
        # collector and taken without a copy. A dict per endpoint cost 5× the memory and
        # its copy tripled `take()` (BENCHMARKS.md D14).
        self.calls: dict[tuple[str, str, str], bytes] = {}
        self.labels: dict[tuple[str, str, str], Mapping[str, str] | None] = {}
        # Endpoint keys counted since this window was last emitted.
        self.dirty_endpoints: set[tuple[str, str, str]] = set()
        self.dirty = True

    def endpoint(
        self, key: tuple[str, str, str], labels: Mapping[str, str] | None
    ) -> None:
        """Note that `key` changed; keep the first labels given for it."""
        self.dirty_endpoints.add(key)
        if self.labels.get(key) is None:
            self.labels[key] = labels


# (start, length, path, cohort, outcomes, latency {bucket: count}, attempts_sum,
#  attempts_count, churn, lag_max, streams_opened, stream_seconds, stream_resets)
_PathRow = tuple[
    float, float, str, str, dict[str, int], dict[int, int], int, int, int, float, int, float,
    dict[str, int],
]
_EndpointKey = tuple[str, str, str]  # (path, endpoint, cohort)


@dataclass(slots=True)
class _EndpointColumns:
    """One window's changed endpoints, as parallel columns.

    Columns, not a tuple per endpoint: the key tuples already exist (the aggregator's),
    and ints are not tracked by the garbage collector, so taking 4,800 endpoints allocates
    a handful of lists instead of 4,800 tracked objects that would push the young
    generation over its threshold at every window (a ~36 ms collection with 2,400 streams
    held, BENCHMARKS.md).
    """

    start: float
    keys: list[_EndpointKey]
    requests: list[int]
    errors: list[int]
    labels: list[Mapping[str, str] | None]
    calls: list[bytes | None]


@dataclass(slots=True)
class Taken:
    """Window contents copied out of the aggregator by `take`, not yet built.

    Owns its data (the counters were copied), so `build()` or `endpoint_windows()` may run
    in another thread while the aggregator keeps counting, and as often as needed (a
    failed store write is retried from the same `Taken`).
    """

    path_rows: list[_PathRow] = field(default_factory=list)
    endpoint_columns: list[_EndpointColumns] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.path_rows or self.endpoint_columns)

    def path_windows(self) -> list[PathWindow]:
        """The path windows, ordered by start, path and cohort."""
        return [
            PathWindow(
                start=r[0], length=r[1], path=r[2], cohort=r[3], outcomes=r[4],
                latency=tuple_from_sparse(r[5]), attempts_sum=r[6], attempts_count=r[7],
                churn=r[8], lag_max_s=r[9], streams_opened=r[10], stream_seconds=r[11],
                stream_resets=r[12],
            )
            for r in sorted(self.path_rows, key=lambda r: (r[0], r[2], r[3]))
        ]

    def endpoint_windows(self) -> Iterator[EndpointWindow]:
        """The endpoint windows, ordered by start, path, endpoint and cohort, made one at a
        time: a consumer that drops each (the store's write) never holds them all."""
        for cols in sorted(self.endpoint_columns, key=lambda c: c.start):
            keys = cols.keys
            for i in sorted(range(len(keys)), key=keys.__getitem__):
                path, endpoint, cohort = keys[i]
                labels = cols.labels[i]
                latency: dict[int, int] = {}
                attempts_sum = attempts_count = 0
                for bucket, attempts in _CALL.iter_unpack(cols.calls[i] or b""):
                    latency[bucket] = latency.get(bucket, 0) + 1
                    if attempts:
                        attempts_sum += attempts
                        attempts_count += 1
                yield EndpointWindow(
                    start=cols.start, path=path, endpoint=endpoint, cohort=cohort,
                    requests=cols.requests[i], errors=cols.errors[i],
                    labels=labels if labels is not None else _NO_LABELS,
                    attempts_sum=attempts_sum, attempts_count=attempts_count, latency=latency,
                )

    def build(self) -> tuple[list[PathWindow], list[EndpointWindow]]:
        """Both kinds of windows, in order, as lists."""
        return self.path_windows(), list(self.endpoint_windows())


class WindowAggregator:
    """Builds `PathWindow`s and `EndpointWindow`s from call results and stream events.

    Not thread-safe: feed it from the event loop that runs the calls.

    Per-endpoint windows count calls for unary paths, with their attempts and latency
    histogram; for stream paths they count stream opens as requests and stream resets as
    errors, so a report can name the pods whose streams reset.
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
        # One key tuple per endpoint for every window, not a new one per window: 4,800 new
        # tuples kept at each window's first calls were a burst of objects for the young
        # generation. Two generations of the map, rotated as windows are forgotten, so
        # the keys of endpoints that went away are dropped in time.
        self._keys: dict[_EndpointKey, _EndpointKey] = {}
        self._keys_before: dict[_EndpointKey, _EndpointKey] = {}

    @property
    def length_s(self) -> float:
        return self._length

    @property
    def grace_s(self) -> float:
        return self._grace

    @property
    def retain_s(self) -> float:
        """How long after its end (and grace) a window is still written again."""
        return self._retain

    def settled_before(self, newest_start: float) -> float:
        """Before when no window is written again once the window starting at `newest_start`
        is: that start less the rewrite horizon (retention and grace) and two windows."""
        return newest_start - (self._retain + self._grace + 2 * self._length)

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

    def _canonical(self, key: _EndpointKey) -> _EndpointKey:
        kept = self._keys.get(key)
        if kept is None:
            kept = self._keys_before.get(key, key)
            self._keys[kept] = kept  # `kept` as the dict's key too, or `key` would be kept
        return kept

    @staticmethod
    def _path_acc(w: _Window, path: str, cohort: str) -> _PathAcc:
        acc = w.paths.get((path, cohort))
        if acc is None:
            acc = w.paths[(path, cohort)] = _PathAcc()
        else:
            acc.dirty = True
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
        v = result.latency_s
        if MIN_VALUE <= v < MAX_VALUE:
            m, e = _frexp(v)
            b = _FIRST_OCTAVE + e * SUB_BUCKETS + int((m - 0.5) * _SUB2)
        else:
            b = index_of(v)
        acc.latency[b] = acc.latency.get(b, 0) + 1
        acc.churn += call.churn
        if result.lag_s > acc.lag_max:
            acc.lag_max = result.lag_s
        key = self._canonical((result.path, result.endpoint, result.cohort))
        w.endpoint(key, labels)
        w.requests[key] = w.requests.get(key, 0) + 1
        if name != Outcome.OK:
            w.errors[key] = w.errors.get(key, 0) + 1
        attempts = call.attempts
        if attempts is not None:
            acc.attempts_sum += attempts
            acc.attempts_count += 1
        w.calls[key] = w.calls.get(key, b"") + _pack_call(
            b, min(attempts, 0xFFFF) if attempts is not None else 0)
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
        key = self._canonical((path, endpoint, cohort))
        w.endpoint(key, labels)
        w.requests[key] = w.requests.get(key, 0) + 1
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
        key = self._canonical((path, endpoint, cohort))
        w.endpoint(key, labels)
        w.errors[key] = w.errors.get(key, 0) + 1
        return True

    def add_stream_time(
        self, path: str, cohort: str, endpoint: str, start: float, end: float,
        *, streams: int = 1,
    ) -> bool:
        """Stream-seconds held over [start, end), split exactly across the windows it spans.

        Resets per stream-hour need the held time per window, so the stream owner should
        report each held stream at least once per window (and at its end), not only when it
        closes hours later: time falling in forgotten windows is dropped (returns False).
        `endpoint` is accepted for symmetry with the other stream calls; per-endpoint stream
        time is not part of `EndpointWindow`. `streams` counts that many streams held over
        the same span.
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
                self._path_acc(w, path, cohort).stream_seconds += (upto - t) * streams
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
        return self.take(now, force).build()

    def take(self, now: float, force: bool = False) -> Taken:
        """What `flush` would emit, copied out unbuilt: call it where `add` is called, and
        `build()` the result anywhere (a worker thread)."""
        length = self._length
        taken = Taken()
        for idx in sorted(self._windows):
            w = self._windows[idx]
            end = (idx + 1) * length
            if not force and end + self._grace > now:
                break
            if w.dirty:
                self._copy_out(idx, w, taken)
            if end + self._grace + self._retain <= now:
                del self._windows[idx]
                self._forgotten_below = max(self._forgotten_below, idx + 1)
                self._keys_before, self._keys = self._keys, {}
        return taken

    def _copy_out(self, idx: int, w: _Window, taken: Taken) -> None:
        # Copies of the mutable counters: a late call may still change this window.
        start = idx * self._length
        rows = taken.path_rows
        for (path, cohort), acc in w.paths.items():
            if not acc.dirty:
                continue
            acc.dirty = False
            rows.append((
                start, self._length, path, cohort, dict(acc.outcomes), dict(acc.latency),
                acc.attempts_sum, acc.attempts_count, acc.churn, acc.lag_max,
                acc.streams_opened, acc.stream_seconds, dict(acc.stream_resets),
            ))
        if w.dirty_endpoints:
            requests, errors, labels = w.requests, w.errors, w.labels
            calls = w.calls
            keys = list(w.dirty_endpoints)
            taken.endpoint_columns.append(_EndpointColumns(
                start, keys, [requests.get(k, 0) for k in keys],
                [errors.get(k, 0) for k in keys], [labels[k] for k in keys],
                [calls.get(k) for k in keys],
            ))
            w.dirty_endpoints = set()
        w.dirty = False

    @property
    def open_windows(self) -> int:
        """Windows held in memory (open, or flushed and kept for late data)."""
        return len(self._windows)
