"""Reconnect storms: stream resets that cluster in time, told apart from a steady reset rate.

The unit is an *endpoint* resetting, not a stream: the K streams a probe holds on one pod
share a connection and end together, so counting streams would make a single pod restart
look like K independent events (and the verdict would depend on K). Resets of one endpoint
within one bucket are one event.

The test, per (path, cohort): for each bucket of `bucket_s` seconds that starts at a reset,
count the distinct endpoints k that reset in it, and compare k with what the recent steady
rate predicts. The steady rate is estimated from the endpoint events of the last
`baseline_s` seconds *before* the bucket, storms excluded (a storm must not raise the bar
for the next one), as an upper confidence bound (`confidence`) of a Poisson rate:

    λ_up = gammaincinv(n + 1, confidence) / T        n events observed over T seconds
    μ    = λ_up · bucket_s                          expected events in the bucket
    storm  ⇔  k ≥ min_endpoints  and  P(X ≥ k | Poisson(μ)) = gammainc(k, μ) ≤ alpha

The upper bound makes a short history conservative: right after the probe starts (T small)
a cluster must be large to count, and the bar falls to `min_endpoints` as quiet hours
accumulate. `alpha` is small (1e-6) because a bucket is tested at every reset: a steady
Poisson stream of thousands of resets an hour still gives a false storm only once in years.

A storm keeps growing while the buckets that follow it (starting within `bucket_s` of its
last reset) are storms too, measured against the rate frozen when it began, up to
`max_span_s` from its first reset; it is reported when it ends. A bucket is judged only
once complete (its `bucket_s` has passed), so the result does not depend on how often
`poll` runs, and the pure `find_storms` gives exactly what the online `StormDetector`
reports.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from scipy.special import gammainc, gammaincinv

from probes.store.records import Event

__all__ = ["STORM_EVENT", "ResetMark", "Storm", "StormDetector", "StormParams", "find_storms"]

STORM_EVENT: Final = "storm"
# Endpoint names kept in a storm event; the count is always exact.
_MAX_NAMES: Final = 200


@dataclass(frozen=True, slots=True, order=True)
class ResetMark:
    """One stream reset: when (wall-clock seconds), on which endpoint, why."""

    at: float
    endpoint: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StormParams:
    bucket_s: float = 5.0
    baseline_s: float = 3600.0
    min_endpoints: int = 3
    alpha: float = 1e-6
    confidence: float = 0.99
    max_span_s: float = 60.0

    def __post_init__(self) -> None:
        if not (self.bucket_s > 0 and self.baseline_s > 0 and self.max_span_s > 0):
            raise ValueError("storm bucket, baseline and span must be positive")
        if self.min_endpoints < 1 or not 0 < self.alpha < 1 or not 0 < self.confidence < 1:
            raise ValueError("need min_endpoints >= 1 and alpha, confidence in (0, 1)")


@dataclass(frozen=True, slots=True)
class Storm:
    """A cluster of resets: `endpoints` distinct endpoints (`resets` streams) in [start, end].

    `expected` is μ, the endpoint events the steady rate predicted for one bucket, and
    `p_value` the Poisson tail of the bucket that started the storm.
    """

    path: str
    cohort: str
    start: float
    end: float
    resets: int
    endpoints: tuple[str, ...]
    reasons: Mapping[str, int]
    expected: float
    p_value: float
    baseline_events: int
    baseline_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "reasons", MappingProxyType(dict(self.reasons)))

    @property
    def span_s(self) -> float:
        return self.end - self.start

    def to_event(self) -> Event:
        """The storm as a store Event (kind "storm", at its first reset)."""
        return Event(
            kind=STORM_EVENT,
            at=self.start,
            path=self.path,
            cohort=self.cohort,
            detail={
                "resets": self.resets,
                "endpoints_count": len(self.endpoints),
                "endpoints": list(self.endpoints[:_MAX_NAMES]),
                "start": self.start,
                "end": self.end,
                "span_s": round(self.span_s, 3),
                "reasons": dict(self.reasons),
                "expected_per_bucket": self.expected,
                "p_value": self.p_value,
                "baseline_events": self.baseline_events,
                "baseline_s": round(self.baseline_s, 3),
            },
        )


@dataclass
class _Open:
    """A storm still growing."""

    start: float
    last: float
    marks: list[ResetMark]
    expected: float
    p_value: float
    baseline_events: int
    baseline_s: float


@dataclass
class _Key:
    since: float
    history: deque[float] = field(default_factory=deque)  # non-storm endpoint events
    last_event: OrderedDict[str, float] = field(default_factory=OrderedDict)
    pending: list[ResetMark] = field(default_factory=list)  # sorted, not yet judged
    storm: _Open | None = None


class StormDetector:
    """Online storm detection per (path, cohort); `poll(now)` returns storms that ended."""

    def __init__(self, params: StormParams = StormParams()) -> None:
        self.params = params
        self._keys: dict[tuple[str, str], _Key] = {}

    def watch(self, path: str, cohort: str, since: float) -> None:
        """Streams of (path, cohort) are observed from `since` (the baseline's start)."""
        key = self._keys.get((path, cohort))
        if key is None:
            self._keys[(path, cohort)] = _Key(since=since)
        elif since < key.since:
            key.since = since

    def add(self, path: str, cohort: str, mark: ResetMark) -> None:
        """One reset. A key never watched is observed from its first reset (conservative)."""
        self.watch(path, cohort, mark.at)
        bisect.insort(self._keys[(path, cohort)].pending, mark)

    def poll(self, now: float) -> list[Storm]:
        """Judge every bucket complete at `now`; the storms that ended, oldest first."""
        storms: list[Storm] = []
        for (path, cohort), key in self._keys.items():
            storms.extend(self._judge(path, cohort, key, now))
        storms.sort(key=lambda s: (s.start, s.path, s.cohort))
        return storms

    # -- the test ---------------------------------------------------------------------------

    def _judge(self, path: str, cohort: str, key: _Key, now: float) -> list[Storm]:
        p = self.params
        w = p.bucket_s
        out: list[Storm] = []
        while True:
            storm = key.storm
            if storm is not None:
                nxt = key.pending[0] if key.pending else None
                ends = (
                    nxt is None
                    or nxt.at >= storm.last + w
                    or nxt.at - storm.start >= p.max_span_s
                )
                if ends:
                    if nxt is None and now < storm.last + w:
                        return out  # a reset may still extend it
                    out.append(_storm(path, cohort, storm))
                    key.storm = None
                    continue
                assert nxt is not None
                if nxt.at + w > now:
                    return out
                bucket = self._bucket(key)
                k = len({m.endpoint for m in bucket})
                if k >= p.min_endpoints and _tail(k, storm.expected) <= p.alpha:
                    del key.pending[: len(bucket)]
                    storm.marks.extend(bucket)
                    storm.last = bucket[-1].at
                else:
                    out.append(_storm(path, cohort, storm))
                    key.storm = None
                continue
            if not key.pending or key.pending[0].at + w > now:
                return out
            first = key.pending[0]
            bucket = self._bucket(key)
            k = len({m.endpoint for m in bucket})
            n, span = self._baseline(key, first.at)
            expected = _expected(n, span, p.confidence) * w
            tail = _tail(k, expected)
            if k >= p.min_endpoints and tail <= p.alpha:
                del key.pending[: len(bucket)]
                key.storm = _Open(first.at, bucket[-1].at, list(bucket), expected, tail, n, span)
            else:
                key.pending.pop(0)
                self._remember(key, first)

    def _bucket(self, key: _Key) -> list[ResetMark]:
        first = key.pending[0]
        end = bisect.bisect_left(key.pending, first.at + self.params.bucket_s,
                                 key=lambda m: m.at)
        return key.pending[:end]

    def _baseline(self, key: _Key, at: float) -> tuple[int, float]:
        """Endpoint events in [at - baseline_s, at), and the observed time they cover."""
        start = max(key.since, at - self.params.baseline_s)
        history = key.history
        while history and history[0] < at - self.params.baseline_s:
            history.popleft()
        n = len(history) - bisect.bisect_left(history, start)
        return n, at - start

    def _remember(self, key: _Key, mark: ResetMark) -> None:
        """A reset judged steady joins the baseline, once per endpoint per bucket."""
        w = self.params.bucket_s
        last = key.last_event
        while last and next(iter(last.values())) < mark.at - w:
            last.popitem(last=False)
        previous = last.get(mark.endpoint)
        if previous is not None and mark.at - previous < w:
            return
        last[mark.endpoint] = mark.at
        last.move_to_end(mark.endpoint)
        key.history.append(mark.at)


def _expected(events: int, span_s: float, confidence: float) -> float:
    """Upper confidence bound of a Poisson rate (events per second)."""
    if span_s <= 1e-9:
        return math.inf
    return float(gammaincinv(events + 1, confidence)) / span_s


def _tail(k: int, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(mu)."""
    if k <= 0:
        return 1.0
    if math.isinf(mu):
        return 1.0
    return float(gammainc(k, mu))


def _storm(path: str, cohort: str, storm: _Open) -> Storm:
    endpoints = tuple(dict.fromkeys(m.endpoint for m in storm.marks))
    return Storm(
        path=path,
        cohort=cohort,
        start=storm.start,
        end=storm.last,
        resets=len(storm.marks),
        endpoints=endpoints,
        reasons=Counter(m.reason for m in storm.marks),
        expected=storm.expected,
        p_value=storm.p_value,
        baseline_events=storm.baseline_events,
        baseline_s=storm.baseline_s,
    )


def find_storms(
    resets: Iterable[ResetMark],
    *,
    observed_from: float,
    until: float,
    params: StormParams = StormParams(),
    path: str = "",
    cohort: str = "",
) -> list[Storm]:
    """The storms among `resets` of one (path, cohort), streams observed from
    `observed_from`, judged at `until` (pure: the same as the online detector)."""
    detector = StormDetector(params)
    detector.watch(path, cohort, observed_from)
    for mark in resets:
        detector.add(path, cohort, mark)
    return detector.poll(until)
