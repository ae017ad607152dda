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

Hot path: `observe` runs for every call (2,400 a second at the capacity goal), so the
per-call series (requests, duration, attempts, churn, schedule lag) are plain counters in
one collector (`_CallCollector`) that builds their families when scraped: a call costs a few
dict and list increments and one `bisect`, where prometheus_client's own `Histogram.observe`
scans its buckets in Python under a lock (5 % of the probe's CPU in a profile at 1,800
endpoints). The exposition is the same series, minus the `_created` samples.
"""

from __future__ import annotations

import contextlib
import math
import platform
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import pairwise
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from probes import __version__
from probes.types import CallResult

__all__ = ["DURATION_BUCKETS", "OVERALL", "PROMETHEUS_DURATION_BUCKETS", "VERDICTS",
           "InventoryLike", "ProbeMetrics", "duration_buckets"]

OVERALL: Final = "_overall"
VERDICTS: Final = ("pass", "fail", "inconclusive")


def duration_buckets(per_doubling: int, lo: float = 0.002, hi: float = 10.0,
                     top: float = 30.0) -> tuple[float, ...]:
    """Request latency buckets: `per_doubling` per doubling from `lo` to `hi`, anchored at
    1-2-5 per decade so the usual `le` values (0.005, 0.1, 0.5, 1, ...) exist for SLO
    queries, then one bucket to `top`; 4 significant digits."""
    anchors = [float(f"{m}e{e}") for e in range(-4, 3) for m in (1, 2, 5)]
    anchors = [lo, *(a for a in anchors if lo < a < hi), hi]
    edges: list[float] = []
    for a, b in pairwise(anchors):
        n = max(1, round(math.log2(b / a) * per_doubling))
        edges += [float(f"{a * (b / a) ** (k / n):.4g}") for k in range(n)]
    return (*edges, hi, top) if top > hi else (*edges, hi)


# Request latency, 4 per doubling (each ~19 % wide, inside the x1.2 p99 tolerance) from
# 2 ms to 10 s, then 30 s (the longest timeout): 50 buckets, about 5 KB of /metrics per
# path x cohort, enough for dashboards and SLO queries. The probe's own verdict reads its
# store (64 per doubling), never these.
DURATION_BUCKETS: Final = duration_buckets(4)
# A probe whose verdict is read from Prometheus (`source: prometheus`, as sharded probes
# run) exports 16 per doubling from 1 ms (238 buckets, 22 KB per path x cohort): the p99
# test (`probes.stats.quantile`) places a quantile only within its bucket, and on the
# coarse buckets it passed 55 of 100 equal canaries and failed 2 x1.6 regressions where the
# store's layout failed 80 of 100 (the rest inconclusive); on these, the store's verdict
# every time (BENCHMARKS.md D20).
PROMETHEUS_DURATION_BUCKETS: Final = duration_buckets(16, 0.001, 30.0, 30.0)
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
# A collector pause is lag the collector caused: the same edges, so the two line up (a young
# collection is well under a millisecond, a full one at thousands of endpoints hundreds).
GC_PAUSE_BUCKETS: Final = LAG_BUCKETS


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


class _IntendedRateCollector(Collector):
    """Calls per second the schedule intends per path and cohort, read at each scrape from
    the engine (cohort-balanced: a small cohort's endpoints are called faster)."""

    def __init__(self) -> None:
        self.source: Callable[[], dict[tuple[str, str], float]] = dict

    def describe(self) -> Iterator[Metric]:
        return self._family({})

    def collect(self) -> Iterator[Metric]:
        return self._family(self.source())

    @staticmethod
    def _family(rates: dict[tuple[str, str], float]) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "skewprobe_intended_calls_per_second",
            "Calls per second the probe's schedule intends, per path and cohort (a smaller"
            " cohort's endpoints are called up to probe.cohort_balance_max times the path's"
            " rate, so that the cohorts get about as many calls).",
            labels=["path", "cohort"],
        )
        for (path, cohort), rate in sorted(rates.items()):
            family.add_metric([path, cohort], rate)
        yield family


class _Hist:
    """Counts per bucket (the last one is +Inf) and the sum: one histogram child."""

    __slots__ = ("counts", "total")

    def __init__(self, n_buckets: int) -> None:
        self.counts = [0] * (n_buckets + 1)
        self.total = 0.0

    def add_to(self, family: HistogramMetricFamily, labels: Sequence[str],
               les: Sequence[str]) -> None:
        cumulative, running = [], 0
        for le, n in zip(les, self.counts, strict=True):
            running += n
            cumulative.append((le, float(running)))
        family.add_metric(labels, cumulative, self.total)


class _PathCohort:
    """The per-(path, cohort) series of finished calls."""

    __slots__ = ("attempts", "churn", "duration", "measured")

    def __init__(self, buckets: int) -> None:
        self.duration = _Hist(buckets)
        self.attempts = 0
        self.measured = 0
        self.churn = 0


class _CallCollector(Collector):
    """The series `ProbeMetrics.observe` feeds, kept as plain numbers until scraped.

    Fed and scraped on the event loop's thread (the API shares the loop); `collect` copies
    each dict before iterating, so a scrape from another thread would see a consistent
    enough snapshot (counts only grow) and never a "dict changed size" error.
    """

    def __init__(self, duration_buckets: Sequence[float]) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.per_pc: dict[tuple[str, str], _PathCohort] = {}
        self.lag = _Hist(len(LAG_BUCKETS))
        self._buckets = tuple(duration_buckets)
        self._duration_les = [*map(floatToGoString, self._buckets), "+Inf"]
        self._lag_les = [*map(floatToGoString, LAG_BUCKETS), "+Inf"]

    def observe(self, result: CallResult) -> None:
        path, cohort = result.path, result.cohort
        call = result.outcome
        key = (path, cohort, call.outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        pc = self.per_pc.get((path, cohort))
        if pc is None:
            # Created together so attempts and churn start at 0 next to the first call.
            pc = self.per_pc[(path, cohort)] = _PathCohort(len(self._buckets))
        latency = result.latency_s
        pc.duration.counts[bisect_left(self._buckets, latency)] += 1
        pc.duration.total += latency
        if call.attempts is not None:
            pc.attempts += call.attempts
            pc.measured += 1
        pc.churn += call.churn
        lag = result.lag_s if result.lag_s > 0.0 else 0.0
        self.lag.counts[bisect_left(LAG_BUCKETS, lag)] += 1
        self.lag.total += lag

    def describe(self) -> Iterator[Metric]:
        return self._families({}, {})

    def collect(self) -> Iterator[Metric]:
        return self._families(dict(self.requests), dict(self.per_pc))

    def _families(
        self, requests: dict[tuple[str, str, str], int], per_pc: dict[tuple[str, str], _PathCohort]
    ) -> Iterator[Metric]:
        pc_labels = ["path", "cohort"]
        fam = CounterMetricFamily(
            "skewprobe_requests", "Finished probe calls by outcome class.",
            labels=[*pc_labels, "outcome"],
        )
        for key, n in sorted(requests.items()):
            fam.add_metric(list(key), n)
        yield fam
        duration = HistogramMetricFamily(
            "skewprobe_request_duration_seconds",
            "Call latency from the intended send time (corrected for coordinated omission).",
            labels=pc_labels,
        )
        attempts = CounterMetricFamily(
            "skewprobe_upstream_attempts",
            "Upstream attempts the callee's proxy made, summed over calls where measured.",
            labels=pc_labels,
        )
        measured = CounterMetricFamily(
            "skewprobe_upstream_attempts_measured",
            "Calls whose upstream attempt count was measured (divisor for attempts/request).",
            labels=pc_labels,
        )
        churn = CounterMetricFamily(
            "skewprobe_connection_churn",
            "Requests retried once on a fresh connection because the server provably did not"
            " process them (GOAWAY, transparent retry).",
            labels=pc_labels,
        )
        for (path, cohort), pc in sorted(per_pc.items()):
            labels = [path, cohort]
            pc.duration.add_to(duration, labels, self._duration_les)
            attempts.add_metric(labels, pc.attempts)
            measured.add_metric(labels, pc.measured)
            churn.add_metric(labels, pc.churn)
        yield from (duration, attempts, measured, churn)
        lag = HistogramMetricFamily(
            "skewprobe_schedule_lag_seconds",
            "How late the probe sent calls (actual minus intended send time).",
        )
        self.lag.add_to(lag, [], self._lag_les)
        yield lag


class _GcPauseCollector(Collector):
    """`skewprobe_gc_pause_seconds{generation}`: how long each garbage collection stopped
    the probe (every send due meanwhile goes out late; the schedule lag says how late, this
    says why).

    Fed from a `gc.callbacks` hook (`probes.measure.collector`), which may run inside any
    allocation, including one made while a prometheus_client metric holds its lock: so the
    counts are plain numbers (no lock, no allocation but a float), built into a family only
    when scraped.
    """

    def __init__(self) -> None:
        self.pauses = [_Hist(len(GC_PAUSE_BUCKETS)) for _ in range(3)]
        self._les = [*map(floatToGoString, GC_PAUSE_BUCKETS), "+Inf"]

    def paused(self, generation: int, seconds: float) -> None:
        hist = self.pauses[generation]
        hist.counts[bisect_left(GC_PAUSE_BUCKETS, seconds)] += 1
        hist.total += seconds

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "skewprobe_gc_pause_seconds",
            "Pauses of the probe's garbage collector, by generation (2 = full collection).",
            labels=["generation"],
        )
        for generation, hist in enumerate(self.pauses):
            hist.add_to(family, [str(generation)], self._les)
        yield family


class ProbeMetrics:
    """The probe's series on `registry` (never the global default registry);
    `duration_buckets`: the request duration histogram's finite `le` edges."""

    def __init__(self, registry: CollectorRegistry, *,
                 duration_buckets: Sequence[float] = DURATION_BUCKETS) -> None:
        pc = ["path", "cohort"]
        r = registry
        self._calls = _CallCollector(duration_buckets)
        r.register(self._calls)
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
        self._in_flight = Gauge(
            "skewprobe_calls_in_flight", "Probe calls started and not finished.", registry=r
        )
        self._overloaded = Gauge(
            "skewprobe_probe_overloaded",
            "1 while the probe's own schedule is starved (calls skipped or schedule lag p99"
            " over 10 ms in recent windows): verdicts are then inconclusive.",
            registry=r,
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
        self._gc = _GcPauseCollector()
        r.register(self._gc)
        self._intended = _IntendedRateCollector()
        r.register(self._intended)
        # Which probe a series came from, as Prometheus' own `prometheus_build_info`: join
        # on it (`* on(instance) group_left(version) skewprobe_build_info`) across upgrades.
        Gauge(
            "skewprobe_build_info", "The probe's version and Python's; the value is always 1.",
            ["version", "python"], registry=r,
        ).labels(__version__, platform.python_version()).set(1)

    def observe(self, result: CallResult) -> None:
        """Count one finished call (requests, duration, attempts, churn, schedule lag)."""
        self._calls.observe(result)

    def set_in_flight(self, n: int) -> None:
        self._in_flight.set(n)

    def track_in_flight(self, source: Callable[[], float]) -> None:
        """Read the in-flight gauge from `source` at every scrape (e.g. the engine's count)."""
        self._in_flight.set_function(source)

    def track_intended_rates(self, source: Callable[[], dict[tuple[str, str], float]]) -> None:
        """Read the intended calls per second per (path, cohort) from `source` at every
        scrape (the engine's schedule)."""
        self._intended.source = source

    def set_overloaded(self, overloaded: bool) -> None:
        self._overloaded.set(1.0 if overloaded else 0.0)

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

    def gc_paused(self, generation: int, seconds: float) -> None:
        """One garbage collection of `generation` (0-2) took `seconds`; safe to call from a
        `gc.callbacks` hook (no lock, see `_GcPauseCollector`)."""
        self._gc.paused(generation, seconds)
