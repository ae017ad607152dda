"""From the store to a verdict: what `skewprobe verdict`, `GET /verdict` and `POST /gate` share.

`probes.verdict` is pure statistics over windows; this module reads the windows (store →
verdict in the flow: the SQLite store of one probe, or Prometheus over many), resolves the
query (paths, cohorts, the comparison's start), and turns the result into the verdict JSON
(docs/design.md) or a table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from probes._parsing import parse_time, rfc3339
from probes.errors import BadInput
from probes.measure.overload import OVERLOAD_EVENT, OVERLOAD_WINDOWS
from probes.spec import JudgingSettings, Tolerances
from probes.stats.cohorts import pick_cohorts
from probes.stats.pods import PodGrid, read_pod_grids
from probes.store import Store
from probes.store.columns import concat
from probes.store.table import WindowTable
from probes.verdict.judge import judge
from probes.verdict.pooling import pooled_windows
from probes.verdict.rules import State

if TYPE_CHECKING:
    from probes.store.prometheus import PrometheusSource
    from probes.verdict.cache import VerdictCache

__all__ = [
    "FROM_STORE",
    "SourceJudge",
    "WindowSource",
    "compute_verdict",
    "format_table",
    "late_spans",
    "overload_spans",
    "prometheus_judge",
    "stored_overload",
    "verdict_from_source",
    "verdict_time",
    "with_doubts",
]


class WindowSource(Protocol):
    """What a verdict reads: the SQLite `Store`, or `PrometheusSource` over many probes."""

    @property
    def path(self) -> str: ...

    def paths(self) -> list[str]: ...

    def read_table(
        self, since: float | None = None, until: float | None = None,
        paths: Iterable[str] | None = None, cohorts: Iterable[str] | None = None,
    ) -> Any: ...

    def first_window(self, cohort: str, since: float | None = None) -> float | None: ...


class _Overload(Enum):
    FROM_STORE = "from store"


# `compute_verdict(overload=...)` default: read the probe's overload state from the store.
FROM_STORE = _Overload.FROM_STORE


def verdict_time(at: str | None, *, now: float) -> float:
    """When to judge: `now`, or `at` (`--at`, `?at=`) for the verdict as it stood then.
    BadInput (exit 2, HTTP 400) for a time that does not parse or lies in the future."""
    if at is None:
        return now
    t = parse_time(at, now=now)
    if t > now:
        raise BadInput(f"at {at!r} is in the future")
    return t


def compute_verdict(
    store_path: str,
    settings: JudgingSettings,
    *,
    path: str | Sequence[str] | None = None,
    baseline: str | None = None,
    canary: str | None = None,
    since: str | None = None,
    now: float,
    overload: str | _Overload | None = FROM_STORE,
    cache: VerdictCache | None = None,
) -> Mapping[str, Any]:
    """Read the store and judge. Raises StoreError (exit 4) or BadInput (exit 2).

    Without `since`, the comparison starts where the canary cohort's first window is: that
    origin stays fixed for the whole rollout, so the sequential tests' guarantee covers
    every look a gate takes. A relative `since` (-30m) moves with each call and restarts the
    sequence each time; an absolute one (RFC 3339) is as good as the default.

    `overload` is why the probe is overloaded now (None: it is not). The running probe
    knows; `skewprobe verdict`, reading the store after the fact, leaves the default and the
    state is read from the probe's last overload event at or before `now`, if the probe was
    still writing then. Either way, the probe's overload spans whose sends were late by a
    meaningful share of the p99 margin (`late_spans`) are left out of the p99 comparison
    for both cohorts, and said so in the p99 reason; every other metric is judged from
    every window (a skipped call was never made, so it is neither success nor failure).
    """
    query = dict(path=path, baseline=baseline, canary=canary, since=since)
    if cache is not None and since is None:
        with cache.open() as store:
            def cached(exclude: Sequence[tuple[float, float]]) -> WindowSource:
                return cache.source(exclude, warmup_s=settings.warmup_s)

            return _store_verdict(store, cached, settings, query, now, overload)
    store = Store.open(store_path, readonly=True)
    try:
        return _store_verdict(store, lambda exclude: _PooledStore(store, exclude), settings,
                              query, now, overload)
    finally:
        store.close()


class _PooledStore:
    """The store as a cold verdict reads it: the path windows pooled a range at a time to
    what the verdict needs (`pooling.pooled_windows`, the cuts `exclude` asks for),
    not a day's table held whole; everything else read from the store as it is."""

    def __init__(self, store: Store, exclude: Sequence[tuple[float, float]]) -> None:
        self._store, self._exclude = store, exclude
        # The last table read and its stored windows' median length, kept together: the
        # verdict asks for the median of the table it was given.
        self._last: tuple[WindowTable, float] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_table(self, since: float | None = None, until: float | None = None,
                   paths: Iterable[str] | None = None,
                   cohorts: Iterable[str] | None = None) -> WindowTable:
        sealed, _, empty, lengths = pooled_windows(self._store, since, math.inf, self._exclude,
                                                   until=until, paths=paths, cohorts=cohorts)
        table: WindowTable = concat(sealed, empty)
        self._last = (table, float(np.median(lengths))) if len(lengths) else None
        return table

    def median_length(self, table: WindowTable) -> float:
        """The median length of the stored windows `table` pooled (a pooled row carries its
        newest window's)."""
        if self._last is not None and self._last[0] is table:
            return self._last[1]
        return float(np.median(table.length))


def _store_verdict(
    store: Store, source: Callable[[Sequence[tuple[float, float]]], WindowSource],
    settings: JudgingSettings, query: Mapping[str, Any], now: float,
    overload: str | _Overload | None,
) -> Mapping[str, Any]:
    spans = overload_spans(store, now, settings.window_s)
    if overload is FROM_STORE:
        overload = stored_overload(store, now)
        # Read only when it matters: finding the newest end scans every window.
        newest = None if overload is None else store.newest_window_end(until=now)
        if overload is not None and (newest is None
                                     or now - newest > 2 * settings.window_s):
            overload = None  # the probe has stopped: no longer overloaded
    late = late_spans(store, spans, settings.tolerances, now=now)
    exclude = [(lo, hi) for lo, hi, _ in late]
    # An overloaded probe no longer vetoes the verdict: its late sends touch latency alone
    # (left out above), and the calls it skipped were never made, so never counted.
    result = verdict_from_source(source(exclude), settings, **query, now=now, exclude=exclude,
                                 starts_from=store)
    notes = []
    if isinstance(overload, str):
        notes.append(f"{overload}: success rate, attempts and stream resets are judged from "
                     "every window whose calls were made")
    left = _left_out(store, late, result, now)
    if left:
        notes.append(left)
        result = _with_latency_reason(result, left)
    if notes:
        result = {**result, "reasons": [*notes, *result.get("reasons", [])]}
    return result


# A window is left out of p99 when the probe's sends were later than this share of the p99
# margin then: a lateness of half the margin, added to one cohort's tail more than the
# other's by chance, could pass for a difference of that size.
LATE_SHARE_OF_MARGIN = 0.5


def late_spans(store: Store, spans: Sequence[tuple[float, float, str]],
               tolerances: Tolerances, *, now: float = math.inf
               ) -> list[tuple[float, float, float]]:
    """The overload `spans` whose windows are left out of the p99 comparison, as (from, to,
    largest lateness in s): those in which some send, before `now`, left more than
    `LATE_SHARE_OF_MARGIN` of the p99 margin late. Only p99: a late send still succeeds or
    fails as it would have."""
    limit = LATE_SHARE_OF_MARGIN * tolerances.latency_p99_margin_ms / 1000.0
    out = []
    for lo, hi, _ in spans:
        lag, _n = store.lateness(lo, min(hi, now))
        if lag > limit:
            out.append((lo, hi, lag))
    return out


def _left_out(store: Store, late: Sequence[tuple[float, float, float]],
              result: Mapping[str, Any], now: float) -> str | None:
    """What the comparison in `result` (at `now`) left out of p99 for late sends, as a
    reason."""
    origin = (result.get("window") or {}).get("from")
    if not late or origin is None:
        return None
    since = parse_time(origin, now=math.inf)
    windows, worst = 0, 0.0
    for lo, hi, _ in late:
        if hi > since:
            lag, n = store.lateness(max(lo, since), min(hi, now))
            windows, worst = windows + n, max(worst, lag)
    if not windows:
        return None
    return (f"{windows} window{'s' if windows != 1 else ''} left out of p99: the probe's sends "
            f"were up to {worst * 1000:.0f} ms late then")


def _with_latency_reason(result: Mapping[str, Any], reason: str) -> Mapping[str, Any]:
    """`result` with `reason` added to each path's p99 metric."""
    def path(p: Mapping[str, Any]) -> Mapping[str, Any]:
        metrics = dict(p.get("metrics", {}))
        m = metrics.get("latency_p99_ms")
        if m is None:
            return p
        metrics["latency_p99_ms"] = {**m, "reason": f"{m.get('reason', '')}; {reason}"}
        return {**p, "metrics": metrics}

    return {**result, "paths": [path(p) for p in result.get("paths", [])]}


def overload_spans(store: Store, now: float, window_s: float) -> list[tuple[float, float, str]]:
    """When the probe was overloaded, from its overload events up to `now`: (from, to, why)
    spans, `to` infinite while it still was at its last event. A span starts the rule's
    horizon (its last `OVERLOAD_WINDOWS` windows) before the event that declared it."""
    spans: list[tuple[float, float, str]] = []
    began: tuple[float, str] | None = None
    for e in store.read_events(until=now, kinds=[OVERLOAD_EVENT]):
        reason = e.detail.get("reason")
        if reason and began is None:
            began = (e.at - OVERLOAD_WINDOWS * window_s, str(reason))
        elif not reason and began is not None:
            spans.append((began[0], e.at, began[1]))
            began = None
    if began is not None:
        spans.append((began[0], math.inf, began[1]))
    return spans


def stored_overload(store: Store, now: float) -> str | None:
    """The probe's overload state as of `now`, from the last overload event it wrote."""
    events = store.read_events(until=now, kinds=[OVERLOAD_EVENT])
    if not events:
        return None
    reason = events[-1].detail.get("reason")
    return str(reason) if reason else None


SourceJudge = Callable[..., Mapping[str, Any]]


def prometheus_judge(source: PrometheusSource) -> SourceJudge:
    """`verdict_from_source` over `source` at the instant it answers for (`source.now()`,
    a step before its clock: what every scrape before it has been stored by), settings then
    the query's keywords, with the probes' health read once: an overloaded probe vetoes
    every verdict, and one that stopped answering scrapes turns a pass into inconclusive."""
    now = source.now()
    asked = now + source.step_s
    health = source.health(now)
    overload = health.overload_reason()
    doubts = [*health.doubts(), *([overload] if overload else [])]

    def judge(settings: JudgingSettings, **query: Any) -> Mapping[str, Any]:
        result = verdict_from_source(source, settings, now=now, asked=asked,
                                     overloaded=overload is not None, **query)
        return with_doubts(result, doubts)

    return judge


def verdict_from_source(
    source: WindowSource,
    settings: JudgingSettings,
    *,
    path: str | Sequence[str] | None = None,
    baseline: str | None = None,
    canary: str | None = None,
    since: str | None = None,
    now: float,
    asked: float | None = None,
    overloaded: bool = False,
    exclude: Sequence[tuple[float, float]] = (),
    starts_from: WindowSource | None = None,
) -> Mapping[str, Any]:
    """Resolve the query against `source` and judge (`compute_verdict` for the origin).
    `asked`: when the query was asked, if later than `now` (a Prometheus source answers a
    step before it): a `since` between the two is not in the future, it has no window yet.
    `exclude`: spans whose windows are left out of the p99 comparison (late sends).
    `starts_from`: where a path still in warm-up reads its pods' starts, to say when its
    first warm window ends (default `source`; the store under a cache, so as not to read
    through the cache a span it does not keep)."""
    paths = [path] if isinstance(path, str) else (list(path) if path else None)
    since_t = parse_time(since, now=now) if since else None
    if since_t is not None and since_t > max(now, asked or now):
        raise BadInput(f"since {since!r} is in the future")
    baseline = baseline or settings.cohort.baseline
    canary = canary or settings.cohort.canary
    # A source with its own window length (Prometheus' step) judges staleness in it.
    step = getattr(source, "step_s", None)
    if paths:
        known = set(source.paths())
        unknown = [p for p in paths if p not in known]
        if unknown:
            raise BadInput(f"no data for path(s) {', '.join(unknown)} in {source.path}")
    # Only windows that had ended by `now`: `--at` asks for the verdict as it stood then.
    until = now - (settings.window_s if step is None else float(step)) + 1e-6
    if since_t is None:
        since_t = _origin(source, settings.window_s if step is None else float(step), until,
                          paths, baseline, canary, now, starts_from or source)
    table = source.read_table(since=since_t, until=until, paths=paths)
    # Staleness is judged in the windows the probe actually wrote, whatever the settings say.
    if step is not None:
        window_s = float(step)
    elif len(table):
        stored = getattr(source, "median_length", None)
        window_s = float(np.median(table.length)) if stored is None else stored(table)
    else:
        window_s = settings.window_s
    # One cohort (before a rollout): nothing to compare pod by pod, and no origin to read
    # the pods from, so their windows are not read (every verdict would read them all).
    # The strata follow the windows judged, not the time asked: a verdict asked after the
    # probe stopped judges its data in the strata the verdict at the data's end used.
    end = min(until, float(table.start.max()) + 1e-6) if len(table) else until
    pods = _pod_grids(source, since_t, until, paths, settings.warmup_s, exclude,
                      window_s=window_s, end=end) if len(np.unique(table.cohort)) > 1 else None
    verdict = judge(
        table,
        tolerances=settings.tolerances,
        alpha=settings.alpha,
        min_samples=settings.min_samples,
        attempts_max=settings.attempts_max,
        window_s=window_s,
        now=now,
        baseline=baseline,
        canary=canary,
        since=since_t,
        paths=paths,
        overloaded=overloaded,
        pods=pods,
        exclude=exclude,
        # The running probe's cache keeps the pod-level sums between its verdicts.
        memos=getattr(source, "track_memo", None),
    )
    out = verdict.to_json()
    if pods and verdict.baseline is not None and verdict.canary is not None:
        warming = _warming(starts_from or source, pods, (verdict.baseline, verdict.canary),
                           since=since_t, until=until, now=now, warmup_s=settings.warmup_s,
                           window_s=window_s)
        if warming:
            out = _with_warming(out, warming)
    return out


def _has_calls(grid: PodGrid, cohort: str) -> bool:
    """Whether `cohort`'s pods have a warm call in `grid`: the newest column first, where
    a rollout under way has them, before the whole grid (calls are counts, never below 0)."""
    calls = np.asarray(grid.calls)
    rows = grid.of(cohort)
    return bool(calls.shape[1] and calls[rows, -1].any()) or bool(calls[rows].any())


def _warming(source: WindowSource, grids: Mapping[str, PodGrid], cohorts: tuple[str, str], *,
             since: float | None, until: float, now: float, warmup_s: float, window_s: float,
             ) -> dict[str, str]:
    """Per path whose baseline or canary has no warm call yet, when its first warm window
    (one where both cohorts have a pod out of its warm-up) ends, as a reason. Read only
    then: early in a rollout, or for a path whose pods all started recently."""
    read = getattr(source, "read_endpoint_columns", None)
    cold = [name for name, g in grids.items() if warmup_s > 0 and {*cohorts} <= {*g.cohorts}
            and any(not _has_calls(g, c) for c in cohorts)]
    if read is None or not cold or since is None:
        return {}
    cols = read(since=since - warmup_s, until=until, paths=cold, cohorts=list(cohorts))
    out: dict[str, str] = {}
    for p_name in cold:
        if p_name not in cols.paths:
            continue
        rows = np.flatnonzero(cols.path == cols.paths.index(p_name))
        soonest = {}
        for c_name in cohorts:
            if c_name not in cols.cohorts:
                continue
            mine = rows[cols.cohort[rows] == cols.cohorts.index(c_name)]
            ends = []
            for e in np.unique(cols.endpoint[mine]):
                pod = mine[cols.endpoint[mine] == e]
                # The pod's start as the grid takes it: its newest row's, else its first row.
                began = cols.started[pod[-1]]
                began = float(cols.start[pod].min()) if np.isnan(began) else float(began)
                warm = (math.ceil((began + warmup_s) / window_s) * window_s
                        if math.isfinite(began) else since)  # -inf: of unknown age, warm
                ends.append(max(warm, since))
            if ends:
                soonest[c_name] = min(ends)
        if len(soonest) == 2:
            end = max(soonest.values()) + window_s
            if end > now:
                out[p_name] = (f"warming up: the first warm window ends at "
                               f"{rfc3339(end)[11:19]} UTC (in {end - now:.0f} s)")
    return out


def _with_warming(result: Mapping[str, Any], warming: Mapping[str, str]) -> dict[str, Any]:
    """`result` with each undecided warming path's reason first (in the overall reasons
    too, where the path's first reason was)."""
    said = {p["path"]: warming[p["path"]] for p in result.get("paths", [])
            if p["path"] in warming and p.get("verdict") == State.INCONCLUSIVE}
    paths = [{**p, "reasons": [said[p["path"]], *p.get("reasons", [])]}
             if p["path"] in said else p for p in result.get("paths", [])]
    reasons = [next((f"{name}: inconclusive: {why}" for name, why in said.items()
                     if r.startswith(f"{name}: inconclusive: ")), r)
               for r in result.get("reasons", [])]
    return {**result, "paths": paths, "reasons": reasons}


# Time strata per pod a verdict reads at most: a day and its warm-up in minutes (a day of
# 10 s windows is 8,640).
MAX_STRATA = 1500
# Strata are this long times a power of two, from the epoch (`Store.read_endpoint_columns`):
# the same strata whatever the comparison's origin, each a union of whole minutes, so a
# stratum of one verdict is one of the next (and could be stored summed).
STRATUM_BASE_S = 60.0


def stratum_length(span_s: float, window_s: float) -> float | None:
    """The strata a comparison `span_s` long is judged in: None (each window) up to
    `MAX_STRATA` windows, else the shortest `STRATUM_BASE_S` × 2^k giving at most
    `MAX_STRATA` strata."""
    if span_s <= window_s * MAX_STRATA:
        return None
    doublings = math.ceil(math.log2(span_s / MAX_STRATA / STRATUM_BASE_S))
    return STRATUM_BASE_S * 2 ** max(doublings, 0)


def _pod_grids(source: WindowSource, since: float | None, until: float | None,
               paths: Sequence[str] | None, warmup_s: float,
               exclude: Sequence[tuple[float, float]] = (), *, window_s: float,
               end: float | None = None) -> Mapping[str, PodGrid] | None:
    """Per path, the pods × windows grid, if the source keeps per-pod counts (the SQLite
    store does; Prometheus series are per path and cohort, so its verdict pools calls).
    `end`: where the windows read end (default `until`), which sets the strata."""
    # Long spans are judged in coarser time strata: at most MAX_STRATA per pod, so a day
    # of windows costs a few times fewer rows (strata of a minute still cancel outages).
    stratum = None
    end = until if end is None else end
    if since is not None and end is not None:
        stratum = stratum_length(end - since + warmup_s, window_s)
    # The running probe's cache keeps the grids between verdicts (`probes.verdict.grids`).
    kept = getattr(source, "pod_grids", None)
    if kept is not None:
        grids: Mapping[str, PodGrid] | None = kept(
            since=since, until=until, paths=paths, warmup_s=warmup_s, window_s=window_s,
            stratum_s=stratum, exclude=exclude)
        if grids is not None:
            return grids
    return read_pod_grids(source, since=since, until=until, paths=paths, warmup_s=warmup_s,
                          window_s=window_s, stratum_s=stratum, exclude=exclude)


def with_doubts(result: Mapping[str, Any], doubts: Sequence[str]) -> Mapping[str, Any]:
    """Never a pass while part of the data is missing: each pass (overall and per path)
    becomes inconclusive, with `doubts` first among the reasons. Fail stays fail."""
    if not doubts:
        return result
    paths = [
        {**p, "verdict": State.INCONCLUSIVE, "reasons": [*doubts, *p.get("reasons", [])]}
        if p.get("verdict") == State.PASS else p
        for p in result.get("paths", [])
    ]
    verdict = State.INCONCLUSIVE if result.get("verdict") == State.PASS else result.get("verdict")
    return {**result, "verdict": verdict, "paths": paths,
            "reasons": [*doubts, *result.get("reasons", [])]}


def _origin(
    source: WindowSource,
    window_s: float,
    until: float,
    paths: Sequence[str] | None,
    baseline: str | None,
    canary: str | None,
    now: float,
    spans: WindowSource,
) -> float | None:
    """The canary's first window, the canary picked among the cohorts seen recently.

    Recent means the last three windows, so a version from an earlier rollout that is no
    longer served is not taken for this rollout's baseline or canary; and among the windows
    that had ended by `now` (starting before `until`), as the verdict's own. When none
    had (the probe stopped), the last three it wrote, found by `spans`' `window_span`
    (the store's): the origin the verdict at the data's end had, whose staleness the
    verdict then states (`judge`'s stale-data gate).
    """
    recent_s = _RECENT_WINDOWS * window_s
    present = _cohorts_in(source, now - recent_s, until, paths)
    span = getattr(spans, "window_span", None)
    if not present and span is not None:
        found = span(None, until, paths)
        if found is not None:
            present = _cohorts_in(source, found[1] + window_s - recent_s, until, paths)
    if not present:
        return None  # no window at all: the verdict says there is no data
    chosen = pick_cohorts(present, baseline, canary)
    if chosen.canary is None:
        return None
    return source.first_window(chosen.canary)


# The windows whose cohorts say which rollout the data holds (`_origin`).
_RECENT_WINDOWS = 3


def _cohorts_in(source: WindowSource, since: float, until: float,
                paths: Sequence[str] | None) -> list[str]:
    """The cohorts with windows starting in [since, until), sorted."""
    table = source.read_table(since=since, until=until, paths=paths)
    return sorted({table.cohorts[i] for i in np.unique(table.cohort)})


_METRIC_LABELS = {
    "success_rate": ("success", lambda v: f"{v * 100:.2f}%"),
    "latency_p99_ms": ("p99", lambda v: f"{v:.1f}ms"),
    "attempts_per_request": ("attempts/req", lambda v: f"{v:.2f}"),
    "stream_resets_per_hour": ("resets/h", lambda v: f"{v:.1f}"),
}


def format_table(result: Mapping[str, Any]) -> str:
    """A plain-text table: one row per path and metric, then the reasons."""
    # Each cohort column says its role and version, or that there is none (an empty store).
    cohorts = [f"{role} {result.get(role) or '(none)'}" for role in ("baseline", "canary")]
    rows = [("path", "metric", *cohorts, "verdict")]
    for path in result.get("paths", []):
        rows.append((path["path"], "", "", "", path["verdict"].upper()))
        for name, metric in path.get("metrics", {}).items():
            label, fmt = _METRIC_LABELS.get(name, (name, str))
            cells = [
                fmt(metric[side]) if isinstance(metric.get(side), int | float) else "-"
                for side in ("baseline", "canary")
            ]
            rows.append(("", label, cells[0], cells[1], metric.get("verdict", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.append(f"overall: {result['verdict'].upper()}")
    # The overall reasons already say each path's first reason; a failed path lists all.
    lines.extend(f"  - {reason}" for reason in result.get("reasons", []))
    for path in result.get("paths", []):
        if path["verdict"] == State.FAIL:
            lines.extend(f"    {path['path']}: {reason}" for reason in path.get("reasons", []))
    return "\n".join(lines)
