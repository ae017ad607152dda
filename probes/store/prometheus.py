"""Prometheus as a read source: the path windows of many probes, rebuilt from their series.

Where one probe is not enough (several clusters, or `skewprobe run --shard i/n` over one
estate), every probe exports its counters (`probes.metrics`), Prometheus (or Thanos or Mimir
above it: only the HTTP API is used) scrapes them all, and `PrometheusSource` turns the
series back into what `probes.verdict.judge` reads: per-window, per path x cohort
aggregates, summed over the probes. It answers the same questions as the SQLite `Store`
(`paths`, `read_table`, `first_window`), so `probes.verdict.service` judges either.

Windows are query steps: [t, t + step) aligned to multiples of `step` since the epoch, as
the store's. A window holds each counter's increase from its last sample at or before t to
its last sample at or before t + step, computed from the raw samples (`_prom_table`), not
with PromQL's increase(), which extrapolates to the window edges: its counts are not
integers and do not add up over windows; differences of samples are exact and add up to
the counter's total. Resets (a probe restarted) and gaps are handled per probe.

How the windows differ from the store's, and by how much:

- Attribution. The store files a call under its *intended* send time; Prometheus sees it at
  the first scrape after it ended (stamped with the scrape's start): later by up to one
  scrape interval + the call's latency + the probe's lag. Over a span [a, b) the counts
  differ from the store's only by calls intended that long before a and before b.
- Latency buckets are the exported histogram's, not the store's 64 per doubling: 16 per
  doubling (`PROMETHEUS_DURATION_BUCKETS`) from a probe configured `source: prometheus`,
  4 (`DURATION_BUCKETS`, BENCHMARKS.md D20) from any other; the table carries them
  (`latency_edges`) and the p99 test runs on them, conservatively. In a simulation
  (lognormal latencies, medians 10-500 ms, 20,000 calls per cohort) the former 21 buckets
  agreed with the store's p99 verdict on 0 of 40 equal cohorts and 4 of 40 x1.6
  regressions; 16 per doubling on 40 of 40 in both; 4 per doubling passes about half the
  equal cohorts and fails almost no x1.6 regression (inconclusive instead).
- `step` must be at least the scrape interval, or windows without a scrape are empty and a
  fresh verdict looks stale (the staleness rule counts in steps).
- `lag_max_s` is 0 (not exported per path): `health` reads `skewprobe_probe_overloaded`,
  and which probes stopped answering scrapes, so a verdict over part of the estate is never
  a pass. `streams_opened` is streams ended + the change of `skewprobe_streams_open`.

Cost does not grow with the rollout's length: a long range is read as windows at both ends
and at most `coarse_rows` longer rows between, and latency (239 series per path x cohort
per probe) only when the verdict pools it, as the histogram's values at the two ends of each
span.

Failures never read as "no data": a refused connection, a timeout, an answer that is not
the Prometheus API's, an HTTP 5xx or an error status, and partial answers (warnings, as
Thanos gives when a store is down) raise `SourceUnavailable` (exit 4, HTTP 503). A query
Prometheus rejects as malformed (HTTP 400, e.g. a bad `selector`) raises `BadInput`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import httpx
import numpy as np

from probes.errors import BadInput, SourceUnavailable
from probes.spec import DEFAULT_WINDOW_S, PrometheusSettings
from probes.store._prom_table import (
    I64,
    LatencySpan,
    PrometheusTable,
    Samples,
    assemble,
    bucket_counts,
    common_edges,
    increases,
)
from probes.types import PAIR_SEPARATOR

__all__ = ["PrometheusHealth", "PrometheusSettings", "PrometheusSource", "PrometheusTable"]

# Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS: Final = 10_000
# first_window looks at the lookback in about this many coarse steps, then in windows.
COARSE_POINTS: Final = 500
# How far back a series' last value is looked for at the start of a range.
CARRY_S: Final = 3600.0

# (start of the first row, row length, rows): equal rows; see `PrometheusSource._grid`.
Segment = tuple[float, float, int]

_REQUESTS = "skewprobe_requests_total"
_STREAM_SECONDS = "skewprobe_stream_seconds_total"
_BUCKETS = "skewprobe_request_duration_seconds_bucket"
# Counts once per probe process from its start: resets() of it says which probes restarted.
_PROCESS_COUNTER = "skewprobe_schedule_lag_seconds_count"
_METRICS: Final = {
    "requests": _REQUESTS,
    "attempts": "skewprobe_upstream_attempts_total",
    "measured": "skewprobe_upstream_attempts_measured_total",
    "churn": "skewprobe_connection_churn_total",
    "stream_seconds": _STREAM_SECONDS,
    "stream_resets": "skewprobe_stream_resets_total",
    "streams_ended": "skewprobe_stream_lifetime_seconds_count",
    "streams_open": "skewprobe_streams_open",
}


@dataclass(frozen=True, slots=True)
class PrometheusHealth:
    """Probes that cannot be trusted now: not answering scrapes, or overloaded."""

    down: tuple[str, ...] = ()
    overloaded: tuple[str, ...] = ()

    def doubts(self) -> list[str]:
        """Why a pass cannot be given: part of the estate is not measured."""
        if not self.down:
            return []
        return [f"probe(s) {', '.join(self.down)} not answering Prometheus' scrapes: their "
                "endpoints are not measured, so the verdict cannot pass"]

    def overload_reason(self) -> str | None:
        if not self.overloaded:
            return None
        return f"probe overloaded: {', '.join(self.overloaded)} (skewprobe_probe_overloaded)"


def _quote(value: str) -> str:
    """A PromQL string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _one_of(label: str, values: Iterable[str]) -> str:
    """A matcher for any of `values` (RE2 metacharacters escaped)."""
    vals = sorted(set(values))
    if len(vals) == 1:
        return f"{label}={_quote(vals[0])}"
    meta = set("\\.+*?()|[]{}^$")
    alts = ["".join("\\" + c if c in meta else c for c in v) for v in vals]
    return f"{label}=~{_quote('|'.join(alts))}"


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _label(metric: Mapping[str, str]) -> str:
    return metric.get("instance") or ",".join(f"{k}={v}" for k, v in sorted(metric.items()))


class PrometheusSource:
    """The probes' windows from the Prometheus HTTP API (module docstring).

    Synchronous (httpx.Client), like the SQLite store: callers in an event loop run it in a
    thread. `clock` gives "now"; the source answers as of `now()`, one step before it.
    Close it (or use it as a context manager) to release the connection pool.
    """

    def __init__(
        self,
        settings: PrometheusSettings,
        *,
        step_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        try:
            url = httpx.URL(settings.url)
        except httpx.InvalidURL as exc:
            raise BadInput(f"prometheus url {settings.url!r}: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise BadInput(f"prometheus url {settings.url!r} is not an http(s) URL")
        step = settings.step_s if settings.step_s is not None else step_s
        if not step > 0 or not settings.timeout_s > 0 or not settings.lookback_s > step:
            raise BadInput("prometheus: step and timeout must be positive, lookback > step")
        # For messages: without any user:password in the URL.
        self.url = str(url.copy_with(username=None, password=None)).rstrip("/")
        self.step_s = float(step)
        self.lookback_s = float(settings.lookback_s)
        self._selector = settings.selector.strip().removeprefix("{").removesuffix("}").strip()
        self._clock = clock
        self._client = httpx.Client(
            base_url=settings.url.rstrip("/"), timeout=settings.timeout_s,
            headers=dict(settings.headers),
        )

    @property
    def path(self) -> str:
        """Where the data comes from, for messages (as `Store.path`)."""
        return self.url

    def close(self) -> None:
        self._client.close()

    def now(self) -> float:
        """The instant the source answers for: the clock's time less one step, so the last
        window ends at the last step boundary at least a step before the clock. A step is
        at least the scrape interval and Prometheus keeps a scrape's timeout within its
        interval, so every scrape stamped before that boundary has been stored: asked again
        later for the same instant, the source reads the same samples (the boundary just
        before the clock could still wait for a scrape in flight)."""
        return self._clock() - self.step_s

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the Store-like reads --------------------------------------------------------------

    def paths(self) -> list[str]:
        """Every path with request or stream series within the lookback, sorted."""
        return self._path_values([self._sel(_REQUESTS), self._sel(_STREAM_SECONDS)])

    def pair_paths(self) -> list[str]:
        """The relay paths: those whose request series carry pair cohorts
        (`probes.types.pair_cohort`) within the lookback, sorted."""
        pairs = f"cohort=~{_quote('.+' + PAIR_SEPARATOR + '.+')}"
        return self._path_values([self._sel(_REQUESTS, [pairs])])

    def _path_values(self, selectors: Sequence[str]) -> list[str]:
        now = self.now()
        data = self._call("GET", "/api/v1/label/path/values", [
            *(("match[]", s) for s in selectors),
            ("start", _ts(now - self.lookback_s)), ("end", _ts(now)),
        ])
        if not isinstance(data, list):
            raise SourceUnavailable(f"prometheus {self.url}: label values are not a list")
        return sorted(str(p) for p in data)

    def read_table(
        self,
        since: float | None = None,
        until: float | None = None,
        paths: Iterable[str] | None = None,
        cohorts: Iterable[str] | None = None,
    ) -> PrometheusTable:
        """Rows with start in [since, until), ended by now, summed over the probes.

        `since` defaults to now − lookback; rows start on multiples of the step. A range of
        more than `fine_rows` x 2 + `coarse_rows` windows is read as windows for its first
        and last `fine_rows` and as at most `coarse_rows` longer rows between (each a whole
        number of windows): what the verdict needs (where the cohorts start, how fresh the
        newest data is, totals) at a cost that does not grow with the rollout's length.
        A restart of a probe inside one long row can make that row undercount, when its
        counters pass their old values before the row ends.
        """
        now = self.now()
        w = self.step_s
        a = math.ceil((since if since is not None else now - self.lookback_s) / w) * w
        b = math.floor(now / w) * w
        if until is not None:
            b = min(b, math.ceil(until / w) * w)
        segments = self._grid(a, max(0, round((b - a) / w)))
        starts = np.concatenate(
            [s0 + np.arange(rows) * step for s0, step, rows in segments] or [np.zeros(0)])
        lengths = np.concatenate(
            [np.full(rows, step) for _, step, rows in segments] or [np.zeros(0)])
        extra = self._filters(paths, cohorts)
        if not segments:
            empty = Samples((), np.zeros((1, 0)))
            return assemble(starts, lengths, les=(), latency_reader=lambda spans: [],
                            **dict.fromkeys(_METRICS, empty))
        fetched = {role: self._samples(metric, extra, a, segments)
                   for role, metric in _METRICS.items()}
        les = self._edges(extra, a, b)
        return assemble(starts, lengths, les=les,
                        latency_reader=lambda spans: self._latency(les, spans), **fetched)

    def first_window(self, cohort: str, since: float | None = None) -> float | None:
        """Start of the first window at or after `since` (default: now − lookback) in which
        `cohort` has calls or stream time, or None. Coarse steps first, then windows."""
        now = self.now()
        w = self.step_s
        lo = math.ceil((since if since is not None else now - self.lookback_s) / w) * w
        hi = math.floor(now / w) * w
        if hi <= lo:
            return None
        units = max(1, math.ceil((hi - lo) / w / COARSE_POINTS))
        coarse = units * w
        n = math.ceil((hi - lo) / coarse)
        start = hi - n * coarse  # <= lo: coarse windows end exactly at hi
        extra = self._filters(None, [cohort])
        for k in self._active(extra, start, [(start, coarse, n)]):
            lo_k = start + k * coarse
            if units == 1:
                if lo_k >= lo:
                    return lo_k
                continue
            first = max(lo, lo_k)
            rows = round((lo_k + coarse - first) / w)
            fine = self._active(extra, first, [(first, w, rows)])
            if fine:
                return first + fine[0] * w
        return None

    def health(self, now: float | None = None) -> PrometheusHealth:
        """Probes down (their `up` is 0 while they exported skewprobe series within the last
        hour) and probes overloaded within the last three steps."""
        t = self.now() if now is None else now
        up = f"up{{{self._selector}}}" if self._selector else "up"
        lag = self._sel(_PROCESS_COUNTER)
        down = self._instant(
            f"{up} == 0 and on(job, instance) last_over_time({lag}[{_duration(CARRY_S)}])", t
        )
        over = self._instant(
            f"max_over_time({self._sel('skewprobe_probe_overloaded')}"
            f"[{_duration(3 * self.step_s)}]) > 0", t,
        )
        return PrometheusHealth(
            down=tuple(sorted(_label(m) for m, _ in down)),
            overloaded=tuple(sorted(_label(m) for m, _ in over)),
        )

    # -- queries ---------------------------------------------------------------------------

    def _sel(self, metric: str, extra: Sequence[str] = ()) -> str:
        matchers = ", ".join(m for m in (self._selector, *extra) if m)
        return f"{metric}{{{matchers}}}"

    @staticmethod
    def _filters(paths: Iterable[str] | None, cohorts: Iterable[str] | None) -> list[str]:
        out = []
        for label, values in (("path", paths), ("cohort", cohorts)):
            if values is not None:
                wanted = list(values)
                # None of nothing: a label that is never empty on skewprobe's series.
                out.append(_one_of(label, wanted) if wanted else f'{label}=""')
        return out

    # Windows kept at each end of a long range, and the most rows between them.
    fine_rows = 60
    coarse_rows = 200

    def _grid(self, a: float, n: int) -> list[Segment]:
        """n windows from a as segments: all windows, or windows / long rows / windows."""
        w = self.step_s
        if n <= 2 * self.fine_rows + self.coarse_rows:
            return [(a, w, n)] if n else []
        middle = n - 2 * self.fine_rows
        units = math.ceil(middle / self.coarse_rows)
        long_rows = middle // units
        head = n - self.fine_rows - long_rows * units  # takes the remainder
        mid_start = a + head * w
        tail_start = mid_start + long_rows * units * w
        return [(a, w, head), (mid_start, units * w, long_rows),
                (tail_start, w, self.fine_rows)]

    def _active(self, extra: Sequence[str], a: float, segments: list[Segment]) -> list[int]:
        """Indices of the rows in which calls or stream time grew."""
        total = np.zeros(sum(rows for _, _, rows in segments))
        for metric in (_REQUESTS, _STREAM_SECONDS):
            total += increases(self._samples(metric, extra, a, segments)).sum(axis=1)
        return np.flatnonzero(total > 0).tolist()

    def _edges(self, extra: Sequence[str], a: float, b: float) -> tuple[str, ...]:
        """The latency buckets every probe's histogram has in [a, b] (`common_edges`), from
        the series index (no samples read)."""
        found = self._call("GET", "/api/v1/series", [
            ("match[]", self._sel(_BUCKETS, extra)), ("start", _ts(a - CARRY_S)),
            ("end", _ts(b)),
        ])
        try:
            return common_edges([{k: str(v) for k, v in labels.items()} for labels in found])
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise SourceUnavailable(f"prometheus {self.url}: {_BUCKETS}: {exc!r}") from exc

    def _latency(self, les: tuple[str, ...], spans: Sequence[LatencySpan]) -> list[I64]:
        """Calls per bucket over each (path, cohort, from, to) span, summed over probes.

        Spans sharing (from, to) are read together, from two instants: the histogram's value
        at each end (its last within CARRY_S). That is exact unless a probe restarted in
        between (the difference would miss what it counted before) or stopped more than
        CARRY_S before the end; then the span is read in rows as `read_table` reads a range.
        Both are told by one counter per probe process, cheap to read over a long span.
        """
        out = [np.zeros(len(les), dtype=np.int64) for _ in spans]
        by_range: dict[tuple[float, float], list[int]] = {}
        for i, (_, _, lo, hi) in enumerate(spans):
            by_range.setdefault((lo, hi), []).append(i)
        for (lo, hi), members in by_range.items():
            extra = self._filters([spans[i][0] for i in members], [spans[i][1] for i in members])
            process = self._sel(_PROCESS_COUNTER)
            irregular = self._instant(
                f"resets({process}[{_duration(hi - lo + 300.0)}]) > 0 or "
                f"(last_over_time({process}[{_duration(hi - lo)}]) unless "
                f"last_over_time({process}[{_duration(CARRY_S)}]))", hi,
            )
            if irregular:
                grid = self._grid(lo, round((hi - lo) / self.step_s))
                samples = self._samples(_BUCKETS, extra, lo, grid)
            else:
                samples = self._samples(_BUCKETS, extra, lo, [], end=hi)
            counts = bucket_counts(samples, les)
            for i in members:
                found = counts.get((spans[i][0], spans[i][1]))
                if found is not None:
                    out[i] = found
        return out

    def _samples(self, metric: str, extra: Sequence[str], a: float,
                 segments: Sequence[Segment], end: float | None = None) -> Samples:
        """Each series' value at a (its last within CARRY_S), then at the end of each row
        (its last within the row), or at `end` (its last within CARRY_S) instead of rows."""
        sel = self._sel(metric, extra)
        index: dict[tuple[tuple[str, str], ...], int] = {}
        labels: list[Mapping[str, str]] = []
        points: list[tuple[int, int, float]] = []  # (row, series, value)

        def series(metric_labels: Mapping[str, str]) -> int:
            key = tuple(sorted(metric_labels.items()))
            i = index.get(key)
            if i is None:
                i = index[key] = len(labels)
                labels.append(MappingProxyType(dict(metric_labels)))
            return i

        for metric_labels, value in self._instant(f"last_over_time({sel}[{_duration(CARRY_S)}])",
                                                  a):
            points.append((0, series(metric_labels), value))
        offset = 0
        for s0, step, n in segments:
            # The last sample within each row (staleness markers ignored): a row without one
            # keeps the previous value.
            query = f"last_over_time({sel}[{_duration(step)}])"
            for c0 in range(0, n, MAX_POINTS):
                c1 = min(n, c0 + MAX_POINTS)
                for metric_labels, samples in self._range(
                    query, s0 + (c0 + 1) * step, s0 + c1 * step, step
                ):
                    i = series(metric_labels)
                    for t, v in samples:
                        k = round((t - s0) / step)
                        if 1 <= k <= n:
                            points.append((offset + k, i, v))
            offset += n
        if end is not None:
            offset += 1
            for metric_labels, value in self._instant(
                f"last_over_time({sel}[{_duration(CARRY_S)}])", end
            ):
                points.append((offset, series(metric_labels), value))
        values = np.full((offset + 1, len(labels)), np.nan)
        for row, i, v in points:
            values[row, i] = v
        return Samples(tuple(labels), values)

    def _instant(self, query: str, t: float) -> list[tuple[Mapping[str, str], float]]:
        data = self._call("POST", "/api/v1/query", [("query", query), ("time", _ts(t))])
        try:
            if data["resultType"] != "vector":
                raise TypeError(data["resultType"])
            return [(item["metric"], float(item["value"][1])) for item in data["result"]]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SourceUnavailable(
                f"prometheus {self.url}: not an instant vector for {query} ({exc!r})"
            ) from exc

    def _range(
        self, query: str, start: float, end: float, step: float
    ) -> list[tuple[Mapping[str, str], list[tuple[float, float]]]]:
        data = self._call("POST", "/api/v1/query_range", [
            ("query", query), ("start", _ts(start)), ("end", _ts(end)), ("step", _ts(step)),
        ])
        try:
            if data["resultType"] != "matrix":
                raise TypeError(data["resultType"])
            return [
                (item["metric"], [(float(t), float(v)) for t, v in item["values"]])
                for item in data["result"]
            ]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SourceUnavailable(
                f"prometheus {self.url}: not a range matrix for {query} ({exc!r})"
            ) from exc

    def _call(self, method: str, endpoint: str, params: list[tuple[str, str]]) -> Any:
        """One API call; every way of not getting an answer is SourceUnavailable."""
        where = f"prometheus {self.url}"
        try:
            if method == "GET":
                response = self._client.get(endpoint, params=tuple(params))
            else:
                response = self._client.post(endpoint, data=dict(params))
        except httpx.HTTPError as exc:
            raise SourceUnavailable(f"{where}: {type(exc).__name__}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            raise SourceUnavailable(
                f"{where}{endpoint}: HTTP {response.status_code}, not a Prometheus API answer"
            )
        if body["status"] == "error":
            message = f"{where}: {body.get('errorType', 'error')}: {body.get('error', '')}"
            if response.status_code == 400 and body.get("errorType") == "bad_data":
                raise BadInput(message)
            raise SourceUnavailable(message)
        if body.get("warnings"):
            raise SourceUnavailable(
                f"{where}: partial answer, not judged: {'; '.join(map(str, body['warnings']))}"
            )
        try:
            return body["data"]
        except KeyError:
            raise SourceUnavailable(f"{where}{endpoint}: answer without data") from None
