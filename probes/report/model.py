"""What a report says, computed once and rendered three ways (HTML, Markdown, JSON).

`build_period` reads one range of the store (store → report in the flow): the windows in
one pass (`_collect`), the verdict replayed at every look with each test's first crossing
(`probes.verdict.replay`), each relay path's pair matrix (`_pairs`), the rollout's progress
(`_rollout`), the worst endpoints (`_endpoints`, summed in a second read-only connection
while the windows are read) and the events. `Report`
holds the range asked for and, with `--compare-to`, an earlier one, paired path by path.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from probes._parsing import rfc3339
from probes.errors import BadInput
from probes.measure.histogram import Histogram
from probes.plan import progress
from probes.report._collect import Collected, collect
from probes.report._endpoints import PathErrors, WorstEndpoint, probed_per_bucket, worst
from probes.report._pairs import PairsSection, pair_sections, relay_paths_in
from probes.report._rollout import INVENTORY, PROBED, Rollout, from_endpoints, from_inventory
from probes.report.summary import CohortFigures
from probes.spec import JudgingSettings
from probes.stats.cohorts import pick_cohorts, version_key
from probes.stats.pods import read_pod_grids
from probes.store import BOOKKEEPING_EVENTS, Event, Store
from probes.verdict.metrics import concentration_finding
from probes.verdict.replay import PathJudgement, judge_paths
from probes.verdict.rules import STATES

__all__ = [
    "METRIC_LABELS",
    "Divergence",
    "PathSection",
    "Period",
    "Report",
    "WarmupBand",
    "WarmupCohort",
    "build_period",
    "cohort_order",
]

METRIC_LABELS = {
    "success_rate": "success rate",
    "latency_p99_ms": "p99 latency",
    "attempts_per_request": "attempts per request",
    "stream_resets_per_hour": "stream resets per stream-hour",
}


@dataclass(frozen=True, slots=True)
class Divergence:
    """A metric's first crossing, with how far the rollout had got at that moment."""

    metric: str
    at: float
    e_value: float
    baseline: float | None
    canary: float | None
    canary_share: float | None
    share_source: str
    share_at: float | None = None  # the time of the snapshot (or bucket) the share is from


@dataclass(frozen=True, slots=True)
class WarmupCohort:
    """One cohort's warm-up on one path: how many pods had one in the range, their calls
    and errors then (each pod's own, `pods` the pod names with theirs)."""

    cohort: str
    calls: int
    errors: int
    pods: tuple[tuple[str, int, int], ...]  # (pod, calls, errors), pods with warm-up calls


@dataclass(frozen=True, slots=True)
class WarmupBand:
    """Each pod's first `seconds` on a path (from the first window the store shows it in,
    a pod restarted onto the new proxy being a new pod), per cohort of the comparison:
    recorded, and kept out of it (`probes.stats.pods.pod_grids`, read as the live verdict
    reads it over the range)."""

    seconds: float
    cohorts: tuple[WarmupCohort, ...]

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.cohorts)

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.cohorts)


@dataclass(frozen=True, slots=True, eq=False)
class PathSection:
    path: str
    cohorts: tuple[str, ...]
    figures: tuple[CohortFigures, ...]
    judgement: PathJudgement
    divergences: tuple[Divergence, ...]
    rollout: Rollout | None
    errors: tuple[PathErrors, ...]
    events: tuple[Event, ...]
    # The live verdict's success rate at the end of the range, the pod as the unit (its
    # JSON: verdict, reason, `pods` with the worst pod and the warm-up); None: not judged.
    pods: Mapping[str, Any] | None = None
    warmup: WarmupBand | None = None  # None: no per-pod counts (or no comparison)
    # A relay path's caller × callee matrix at the end of the range (None: a direct path).
    pairs: PairsSection | None = None

    @property
    def concentration(self) -> str | None:
        """The live verdict's concentration finding at the end of the range, when its rule
        says the canary's errors are concentrated on one pod ("concentrated on shop-0 (71 %
        of the canary's errors)"); None otherwise."""
        found = (self.pods or {}).get("pods") or {}
        if not found.get("concentrated") or not found.get("worst"):
            return None
        return concentration_finding(str(found["worst"]), found.get("worst_share"))

    @property
    def success_unit(self) -> str | None:
        """How the replay judged success rate: "pods" (per pod, as the live verdict) or
        "pooled" (the store has no per-pod counts for the path); None: no comparison."""
        return self.judgement.success_unit

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def verdict(self) -> str:
        """The state at the last look ("no comparison" when the cohorts never overlapped);
        a relay path's is its pair matrix's at the end of the range."""
        if self.pairs is not None:
            return self.pairs.verdict
        tracks = self.judgement.tracks
        if tracks is None or not tracks.state.size:
            return "no comparison"
        return STATES[int(tracks.state[-1])].replace("n/a", "no comparison")

    @property
    def has_calls(self) -> bool:
        return any(f.requests - f.probe_errors > 0 for f in self.figures)

    @property
    def has_latency(self) -> bool:
        return any(f.latency.count for f in self.figures)

    @property
    def has_streams(self) -> bool:
        return any(f.streams_opened or f.stream_seconds for f in self.figures)

    @property
    def has_attempts(self) -> bool:
        return any(f.attempts_count for f in self.figures)


@dataclass(frozen=True, slots=True, eq=False)
class Period:
    """One range of the store; `since`/`until` are the part of the range asked (`asked`)
    that the store has data for."""

    label: str
    since: float
    until: float
    asked: tuple[float, float]
    data: Collected
    baseline: str | None
    canary: str | None
    notes: tuple[str, ...]
    sections: tuple[PathSection, ...]
    rollout: Rollout  # from inventory snapshots, else from the probed endpoints
    rollout_source: str
    events: tuple[Event, ...]
    worst: tuple[WorstEndpoint, ...]
    alpha_share: float
    # The upgrade's progress from the inventory snapshots (`probes.plan.progress`): share on
    # the newest version, namespaces done, the long tail, the projected date; None without.
    upgrade: Mapping[str, Any] | None = None

    def section(self, path: str) -> PathSection | None:
        return next((s for s in self.sections if s.path == path), None)

    @property
    def look_s(self) -> float:
        return self.data.grid.step * self.data.grid.per_look

    @property
    def event_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(e.kind for e in self.events).items()))


@dataclass(frozen=True, slots=True, eq=False)
class Report:
    store: str
    generated_at: float
    settings: JudgingSettings
    settings_from: str  # where they came from: "config", "store" or "defaults"
    current: Period
    compared: Period | None

    @property
    def periods(self) -> tuple[Period, ...]:
        return (self.current,) if self.compared is None else (self.current, self.compared)

    @property
    def cohorts(self) -> tuple[str, ...]:
        """Every cohort of both periods, oldest version first: the colour order."""
        names = {c for p in self.periods for s in p.sections for c in s.cohorts}
        names |= {v for p in self.periods for r in _rollouts(p) for v in r.versions}
        return cohort_order(names)

    def compared_note(self, path: str) -> str | None:
        """How the path fared in the compared period, in words (None: no compared period)."""
        if self.compared is None:
            return None
        before = self.compared.section(path)
        now = self.current.section(path)
        if before is None:
            return "no data in the compared period"
        was, isnow = before.first is not None, now is not None and now.first is not None
        if was and isnow:
            return "regressed in the compared period too: the same path regressed last time"
        if was:
            return "regressed in the compared period, not in this one"
        if isnow:
            return "a new regression: it did not diverge in the compared period"
        return f"no divergence in either period (compared period: {before.verdict})"


def _rollouts(period: Period) -> list[Rollout]:
    return [period.rollout]


def cohort_order(names: set[str] | Sequence[str]) -> tuple[str, ...]:
    def key(v: str) -> tuple[int, object, str]:
        k = version_key(v)
        return (0, k, v) if k is not None else (1, (), v)

    return tuple(sorted(set(names), key=key))


def _figures(data: Collected, p: int, c: int) -> CohortFigures:
    n_c = len(data.cohorts)
    i = p * n_c + c
    outcomes = {name: int(np.rint(v[i])) for name, v in data.outcomes.items() if v[i] > 0}
    t = data.pooled
    return CohortFigures(
        path=data.paths[p], cohort=data.cohorts[c],
        requests=sum(outcomes.values()), successes=outcomes.get("ok", 0),
        attempts_sum=int(t.attempts_sum[i]), attempts_count=int(t.attempts_count[i]),
        streams_opened=int(t.streams_opened[i]), stream_seconds=float(t.stream_seconds[i]),
        stream_resets=int(t.stream_resets[i]), outcomes=outcomes,
        latency=Histogram(np.rint(t.latency[i]).astype(np.int64)),
    )


def _divergences(j: PathJudgement, canary: str, rollout: Rollout | None,
                 source: str) -> tuple[Divergence, ...]:
    out = []
    for c in sorted(j.crossings.values(), key=lambda c: (c.at, c.metric)):
        near = rollout.share_near(canary, c.at) if rollout is not None else None
        out.append(Divergence(
            c.metric, c.at, math.exp(min(c.log_e_fail, 700.0)), c.baseline, c.canary,
            None if near is None else near[0], source if near is not None else "",
            None if near is None else near[1]))
    return tuple(out)


def _check_paths(store: Store, paths: Sequence[str] | None) -> list[str] | None:
    if not paths:
        return None
    known = set(store.paths())
    unknown = [p for p in paths if p not in known]
    if unknown:
        have = ", ".join(sorted(known)) or "none"
        raise BadInput(f"no data for path(s) {', '.join(unknown)} in {store.path} "
                       f"(paths in the store: {have})")
    return sorted(set(paths))


def build_period(store: Store, since: float, until: float, *, paths: Sequence[str] | None,
                 settings: JudgingSettings, baseline: str | None = None, canary: str | None = None,
                 label: str = "this period") -> Period:
    """Everything the report shows for [since, until). BadInput when the range has no data."""
    wanted = _check_paths(store, paths)
    asked = (since, until)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The endpoint sums run in their own read-only connection while the windows load.
        side = pool.submit(_worst, store.path, since, until, wanted)
        data = collect(store, since, until, wanted, **_late_sends(store, since, until, wanted,
                                                                  settings))
        worst_pods, per_path = side.result()
    if not data.present.any():
        span = store.time_range()
        held = f"; the store holds {rfc3339(span[0])} to {rfc3339(span[1])}" if span else ""
        raise BadInput(f"no windows from {rfc3339(since)} to {rfc3339(until)} "
                       f"in {store.path}{held}")
    with_data = [p for p in range(len(data.paths)) if data.present[p].any()]
    # Relay paths are judged as caller × callee matrices; their pair cohorts are not
    # versions to pick a baseline or canary from.
    relay = relay_paths_in(data, with_data)
    direct = [p for p in with_data if data.paths[p] not in relay]
    present = [c for i, c in enumerate(data.cohorts) if data.present[direct, i].any()]
    choice = pick_cohorts(present, baseline, canary)
    b, c = choice.baseline, choice.canary
    notes = list(choice.reasons) if direct else []
    if (data.since, data.until) != (since, until):
        notes.append(f"the store has data from {rfc3339(data.since)} to {rfc3339(data.until)} "
                     f"of the range asked ({rfc3339(since)} to {rfc3339(until)}); the report "
                     "covers that part")
    comparable = b is not None and c is not None and b != c and b in present and c in present
    quiet = [data.paths[p] for p in range(len(data.paths)) if p not in with_data]
    if wanted and quiet:
        notes.append(f"no data in this range for path(s) {', '.join(quiet)}")
    replayed: dict[str, PathJudgement] = {}
    if comparable:
        assert b is not None and c is not None
        replayed = {j.path: j for j in judge_paths(store, data, b, c, settings, skip=relay)}
    elif direct:
        notes.append("no baseline and canary to compare, so no verdict is replayed")
    judgements = [replayed.get(data.paths[p]) or PathJudgement(data.paths[p], None, None, {}, {})
                  for p in with_data]
    since, until = data.since, data.until
    snapshots = store.read_inventory(since, until)
    # The upgrade runs for days: its progress over the whole range asked, not only where the
    # probe has windows.
    upgrade = progress(store.read_inventory(*asked))
    if snapshots:
        fleet = from_inventory(snapshots)
        source = INVENTORY
        if c is not None and c not in fleet.versions:
            notes.append(f"the inventory has no pods on {c}: the canary cohort's share is "
                         "unknown (is the cohort label the proxy version?)")
    else:
        names = [data.paths[p] for p in direct]
        fleet = from_endpoints(
            probed_per_bucket(store, data.grid, since, until, data.window_s, names), data.grid)
        source = PROBED
        notes.append("the store has no inventory snapshots: the rollout's progress is the "
                     "share of probed endpoints (all paths) on each version, sampled at the "
                     "start of each bucket, not of the fleet's pods")
    events = tuple(e for e in store.read_events(since, until)
                   if e.kind not in BOOKKEEPING_EVENTS)
    order = cohort_order(data.cohorts)
    names = [data.paths[p] for p in direct]
    per_pod = _per_pod(store, data, b, c, settings, names) if comparable else {}
    bands = (_warmup(store, data, (b, c), settings.warmup_s, names)
             if comparable and b is not None and c is not None else {})
    figures = {}
    for p in with_data:
        cohort_ids = [i for i in range(len(data.cohorts)) if data.present[p, i]]
        figures[data.paths[p]] = tuple(sorted((_figures(data, p, i) for i in cohort_ids),
                                              key=lambda f: order.index(f.cohort)))
    matrices = pair_sections(store.path, data, relay, settings, figures)
    sections = []
    for p, j in zip(with_data, judgements, strict=True):
        name = data.paths[p]
        rollout = fleet
        sections.append(PathSection(
            path=name,
            cohorts=tuple(f.cohort for f in figures[name]),
            figures=figures[name],
            judgement=j,
            divergences=_divergences(j, c or "", rollout, source) if c else (),
            rollout=rollout,
            errors=tuple(per_path.get(name, [])),
            events=tuple(e for e in events if e.path in ("", name)),
            pods=per_pod.get(name),
            warmup=bands.get(name),
            pairs=matrices.get(name),
        ))
    # The paths that diverged first, earliest first: a long report leads with them.
    sections.sort(key=lambda s: (s.first is None, s.first.at if s.first else 0.0, s.path))
    return Period(
        label=label, since=since, until=until, asked=asked, data=data, baseline=b, canary=c,
        notes=tuple(notes), sections=tuple(sections), rollout=fleet, rollout_source=source,
        events=events, worst=tuple(worst_pods),
        alpha_share=settings.alpha / (4 * max(1, len(direct))),
        upgrade=upgrade,
    )


def _late_sends(store: Store, since: float, until: float, paths: list[str] | None,
                settings: JudgingSettings) -> dict[str, Any]:
    """`collect`'s window length and the spans whose latency the live verdict leaves out of
    p99 (the probe's sends were late then), so that the replay leaves out the same."""
    from probes.report._collect import window_length
    from probes.verdict.service import late_spans, overload_spans

    length = window_length(store, since, until, paths)
    late = late_spans(store, overload_spans(store, until, length), settings.tolerances,
                      now=until)
    return {"window_s": length, "exclude": [(lo, hi) for lo, hi, _ in late]}


def _per_pod(store: Store, data: Collected, baseline: str | None, canary: str | None,
             settings: JudgingSettings, paths: list[str]) -> dict[str, Mapping[str, Any]]:
    """Per path, the success rate as the live verdict judges it at the end of the range
    (`probes.verdict.service`, the same code a gate asks): the pod as the unit, each pod's
    warm-up apart. Only where the store holds per-pod counts (else the metric has no `pods`)."""
    from probes.verdict.entry import Query, verdict

    query = Query(now=data.until, path=paths, baseline=baseline, canary=canary,
                  since=repr(data.since))
    # The open store as the source: every window judged as it is (no late sends left out).
    result = verdict(query, dataclasses.replace(settings, window_s=data.window_s),
                     store).to_json()
    out: dict[str, Mapping[str, Any]] = {}
    for p in result.get("paths", []):
        metric = p.get("metrics", {}).get("success_rate")
        if metric is not None and "pods" in metric:
            out[p["path"]] = metric
    return out


def _warmup(store: Store, data: Collected, cohorts: tuple[str, str], warmup_s: float,
            paths: list[str]) -> dict[str, WarmupBand]:
    """Per path, the warm-up band of the baseline and canary cohorts over the range: the
    endpoint windows read as the live verdict reads them (from `warmup_s` before the
    range, so a pod seen then is warm at its start; windows ended by its end), each pod's
    first `warmup_s` apart (`pod_grids`). Paths without endpoint windows have no band."""
    grids = read_pod_grids(store, since=data.since, until=data.until - data.window_s + 1e-6,
                           paths=paths, cohorts=list(cohorts), warmup_s=warmup_s,
                           window_s=data.window_s, per_pod=False)
    out = {}
    for path, grid in (grids or {}).items():
        rows = []
        for cohort in cohorts:
            mine = [i for i, c in enumerate(grid.cohorts) if c == cohort]
            pods = tuple((grid.pods[i], int(grid.warmup_calls[i]), int(grid.warmup_errors[i]))
                         for i in mine if grid.warmup_calls[i] > 0)
            rows.append(WarmupCohort(cohort, sum(p[1] for p in pods),
                                     sum(p[2] for p in pods), pods))
        out[path] = WarmupBand(warmup_s, tuple(rows))
    return out


def _worst(path: str, since: float, until: float, paths: list[str] | None
           ) -> tuple[list[WorstEndpoint], dict[str, list[PathErrors]]]:
    store = Store.open(path, readonly=True)
    try:
        return worst(store, since, until, paths)
    finally:
        store.close()
