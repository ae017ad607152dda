"""The probe's Prometheus series, registered on a registry the caller passes in.

Every series starts `skewprobe_` and carries `path` and `cohort` (the callee's proxy
version) where it describes calls. Attempts are exported as two counters so a rate query
gives retry volume without mistaking "not measured" for "no retries":

    rate(skewprobe_upstream_attempts_total[5m])
      / rate(skewprobe_upstream_attempts_measured_total[5m])   # attempts per request

`skewprobe_verdict{path, verdict}` is one-hot over pass / fail / inconclusive (the current
state is 1, the others 0); the verdict over all paths uses `path="_overall"` (`OVERALL`).
The inventory series are swapped as one snapshot, so a scrape never sees half an update and
versions that disappeared from the fleet disappear from the exposition.

Hot path: `observe` runs for every call, so children are looked up once per
(path, cohort[, outcome]) and cached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from probes._types import CallResult

__all__ = ["OVERALL", "VERDICTS", "InventoryLike", "ProbeMetrics"]

OVERALL: Final = "_overall"
VERDICTS: Final = ("pass", "fail", "inconclusive")

# Request latency from loopback (sub-ms lands in the first bucket) to the longest timeout.
DURATION_BUCKETS: Final = (
    0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0,
)
# Stream lifetimes: from a reset on open to streams held for a day.
LIFETIME_BUCKETS: Final = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0,
    28800.0, 86400.0,
)
GAP_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
# The probe's own sending delay: the budget is p99 <= 10 ms.
LAG_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)


class InventoryLike(Protocol):
    """One inventory row (e.g. `probes.store.InventoryRow`)."""

    @property
    def namespace(self) -> str: ...
    @property
    def proxy_version(self) -> str: ...
    @property
    def pods(self) -> int: ...
    @property
    def max_age_s(self) -> float: ...


class _InventoryCollector(Collector):
    """Pods and oldest pod age per namespace x proxy version, from one immutable snapshot."""

    def __init__(self) -> None:
        self._snapshot: dict[tuple[str, str], tuple[int, float]] = {}

    def replace(self, snapshot: dict[tuple[str, str], tuple[int, float]]) -> None:
        self._snapshot = snapshot  # one reference swap: scrapes see old or new, never a mix

    def describe(self) -> Iterator[Metric]:
        return self._families({})

    def collect(self) -> Iterator[Metric]:
        return self._families(self._snapshot)

    @staticmethod
    def _families(snapshot: dict[tuple[str, str], tuple[int, float]]) -> Iterator[Metric]:
        labels = ["namespace", "proxy_version"]
        pods = GaugeMetricFamily(
            "skewprobe_inventory_pods", "Pods per namespace and proxy version.", labels=labels
        )
        age = GaugeMetricFamily(
            "skewprobe_inventory_pod_age_seconds",
            "Age of the oldest pod per namespace and proxy version.",
            labels=labels,
        )
        for (ns, version), (n, oldest) in sorted(snapshot.items()):
            pods.add_metric([ns, version], n)
            age.add_metric([ns, version], oldest)
        yield pods
        yield age


class ProbeMetrics:
    """The probe's series on `registry` (never the global default registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        pc = ["path", "cohort"]
        r = registry
        self._requests = Counter(
            "skewprobe_requests", "Finished probe calls by outcome class.",
            [*pc, "outcome"], registry=r,
        )
        self._duration = Histogram(
            "skewprobe_request_duration_seconds",
            "Call latency from the intended send time (corrected for coordinated omission).",
            pc, buckets=DURATION_BUCKETS, registry=r,
        )
        self._attempts = Counter(
            "skewprobe_upstream_attempts",
            "Upstream attempts the callee's proxy made, summed over calls where measured.",
            pc, registry=r,
        )
        self._measured = Counter(
            "skewprobe_upstream_attempts_measured",
            "Calls whose upstream attempt count was measured (divisor for attempts/request).",
            pc, registry=r,
        )
        self._churn = Counter(
            "skewprobe_connection_churn",
            "Requests retried once on a fresh connection because the server provably did not"
            " process them (GOAWAY, transparent retry).",
            pc, registry=r,
        )
        self._streams_open = Gauge(
            "skewprobe_streams_open", "Long-lived streams held open now.", pc, registry=r
        )
        self._stream_resets = Counter(
            "skewprobe_stream_resets", "Streams that ended abnormally, by reason.",
            [*pc, "reason"], registry=r,
        )
        self._stream_seconds = Counter(
            "skewprobe_stream_seconds",
            "Stream time held (divisor for resets per stream-hour).", pc, registry=r,
        )
        self._lifetime = Histogram(
            "skewprobe_stream_lifetime_seconds", "Lifetime of streams that ended.",
            pc, buckets=LIFETIME_BUCKETS, registry=r,
        )
        self._gap = Histogram(
            "skewprobe_stream_message_gap_seconds",
            "Delay between consecutive messages on a stream.", pc, buckets=GAP_BUCKETS,
            registry=r,
        )
        self._verdict = Gauge(
            "skewprobe_verdict",
            'Current verdict per path, one-hot over pass/fail/inconclusive; path="_overall"'
            " for the verdict over all paths.",
            ["path", "verdict"], registry=r,
        )
        self._lag = Histogram(
            "skewprobe_schedule_lag_seconds",
            "How late the probe sent calls (actual minus intended send time).",
            buckets=LAG_BUCKETS, registry=r,
        )
        self._in_flight = Gauge(
            "skewprobe_calls_in_flight", "Probe calls started and not finished.", registry=r
        )
        self._dropped = Counter(
            "skewprobe_calls_dropped",
            "Calls not made or not counted (probe overloaded, result too late, ...).",
            ["path", "reason"], registry=r,
        )
        self._store_errors = Counter(
            "skewprobe_store_errors", "Failed writes to the store.", registry=r
        )
        self._windows_written = Counter(
            "skewprobe_windows_written", "Path windows written to the store.", registry=r
        )
        self._inventory = _InventoryCollector()
        r.register(self._inventory)
        self._per_pc: dict[tuple[str, str], tuple[Histogram, Counter, Counter, Counter]] = {}
        self._per_outcome: dict[tuple[str, str, str], Counter] = {}

    def _children(self, path: str, cohort: str) -> tuple[Histogram, Counter, Counter, Counter]:
        key = (path, cohort)
        found = self._per_pc.get(key)
        if found is None:
            # Created together so attempts and churn start at 0 next to the first call.
            found = self._per_pc[key] = (
                self._duration.labels(path, cohort),
                self._attempts.labels(path, cohort),
                self._measured.labels(path, cohort),
                self._churn.labels(path, cohort),
            )
        return found

    def observe(self, result: CallResult) -> None:
        """Count one finished call."""
        path, cohort = result.path, result.cohort
        call = result.outcome
        key = (path, cohort, call.outcome)
        counter = self._per_outcome.get(key)
        if counter is None:
            counter = self._per_outcome[key] = self._requests.labels(*key)
        counter.inc()
        duration, attempts, measured, churn = self._children(path, cohort)
        duration.observe(result.latency_s)
        if call.attempts is not None:
            attempts.inc(call.attempts)
            measured.inc()
        if call.churn:
            churn.inc(call.churn)
        self._lag.observe(max(0.0, result.lag_s))

    def set_in_flight(self, n: int) -> None:
        self._in_flight.set(n)

    def drop(self, path: str, reason: str, n: int = 1) -> None:
        """`n` calls of `path` skipped or not counted, e.g. reason "overloaded" or "late"."""
        self._dropped.labels(path, reason).inc(n)

    def set_verdict(self, path: str, verdict: str) -> None:
        """Set the one-hot verdict of `path` (or `OVERALL`)."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {verdict!r}")
        for v in VERDICTS:
            self._verdict.labels(path, v).set(1.0 if v == verdict else 0.0)

    def remove_verdict(self, path: str) -> None:
        """Stop exporting a verdict for a path that is no longer probed."""
        for v in VERDICTS:
            with contextlib.suppress(KeyError):
                self._verdict.remove(path, v)

    def set_inventory(self, rows: Iterable[InventoryLike]) -> None:
        """Replace the inventory: pods summed and oldest age taken per namespace x version."""
        snapshot: dict[tuple[str, str], tuple[int, float]] = {}
        for row in rows:
            key = (row.namespace, row.proxy_version)
            pods, oldest = snapshot.get(key, (0, 0.0))
            snapshot[key] = (pods + row.pods, max(oldest, row.max_age_s))
        self._inventory.replace(snapshot)

    # -- streams -------------------------------------------------------------------------

    def stream_opened(self, path: str, cohort: str) -> None:
        self._streams_open.labels(path, cohort).inc()

    def stream_closed(
        self, path: str, cohort: str, lifetime_s: float, reset_reason: str | None = None
    ) -> None:
        """A held stream ended after `lifetime_s`; `reset_reason` set when it was a reset."""
        self._streams_open.labels(path, cohort).dec()
        self._lifetime.labels(path, cohort).observe(lifetime_s)
        if reset_reason is not None:
            self._stream_resets.labels(path, cohort, reset_reason).inc()

    def stream_time(self, path: str, cohort: str, seconds: float) -> None:
        """Stream-seconds held (report at least once per window per path x cohort)."""
        self._stream_seconds.labels(path, cohort).inc(seconds)

    def stream_message_gap(self, path: str, cohort: str, gap_s: float) -> None:
        self._gap.labels(path, cohort).observe(gap_s)

    # -- the probe's own health ----------------------------------------------------------

    def store_error(self) -> None:
        self._store_errors.inc()

    def windows_written(self, n: int) -> None:
        self._windows_written.inc(n)
