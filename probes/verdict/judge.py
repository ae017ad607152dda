"""The verdict: is the canary cohort worse than the baseline on any path? pass/fail/inconclusive.

`judge()` is pure: windows in, a frozen `Verdict` out, the clock passed in as `now`.

What the verdict guarantees
---------------------------
For each path and metric (success rate, p99 latency, attempts per request, stream resets per
stream-hour) an anytime-valid two-sample test (`probes.stats`) yields two e-values over the
span since the origin (the first window at or after `since` where both cohorts have data):

- E_fail, against "the canary is within tolerance of the baseline";
- E_pass, against "the canary is beyond tolerance".

A metric fails when E_fail ≥ 1/α_share and passes when E_pass ≥ 1/α_share, with
α_share = α / (4 × number of paths judged): four metric slots per path whether or not the
metric applies, so the share does not move when a metric appears mid-rollout. By Ville's
inequality and a union bound:

    P(some verdict, at any of the times it is asked for, says fail although on every path and
      metric the canary is within tolerance) ≤ α,

and the same bound holds for a pass on a path where the canary is beyond tolerance. No state
is kept between calls and asking after every window costs nothing in error rate.

Success rate, given the pods × windows grids (`pods`), takes the pod as the unit of
evidence (`probes.stats.pods`): compared within each window, the spread between pods part
of the noise, and a fail that no single canary pod makes. Attempts per
request does the same where the grids hold per-pod attempts (store schema v2), and p99
fails only on what no single pod of either cohort makes (`probes.verdict.pod_metrics`). Stream
resets (and every metric without grids, as from Prometheus, or over a span a v1 store
wrote) assume, stated plainly, that within each cohort the calls are independent with a
common distribution over the span: a drift while the split between cohorts changes, bursts
shared by both cohorts, or one sick pod can move that pooled comparison. Each metric's
`rule` says which it was: "pods" or "pooled". `since` must be fixed (the rollout's start): a sliding
`since` starts a new sequence at every call and the "at any time" guarantee then holds per
call only.

The JSON (`Verdict.to_json`) is the verdict JSON of docs/design.md. Each metric carries,
besides `baseline`, `canary` (estimates) and `verdict`: `unit`; `lower` / `upper` (each
cohort's own anytime-valid bounds at α_share); `counts`; `tolerance`; `alpha` (α_share);
`e_value` {fail, pass} and the matching always-valid `p_value` = min(1, 1/e); `reason`.
p99 e-values are exact up to 10^6/α_share and reported as that beyond it.

Never a pass without evidence: no data, only one cohort, fewer than `min_samples` requests
in a cohort, data older than two windows, or an overloaded probe (`overloaded`, where no
spans of late sends are known: a Prometheus source) make the path inconclusive
with a reason. A path fails if any metric fails and passes only if every metric that applies
passes; the verdict fails if any path fails and passes only if every path passes. These
rules (states, gates, combine, each metric's test) are `probes.verdict.rules`, which the
report's replay (`probes.verdict.replay`) applies at every look.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from probes._parsing import rfc3339
from probes.errors import BadInput
from probes.measure.histogram import LOWER, UPPER
from probes.spec import (
    DEFAULT_ALPHA,
    DEFAULT_ATTEMPTS_MAX,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_WINDOW_S,
    Tolerances,
)
from probes.stats.cohorts import pick_cohorts
from probes.stats.pods import PodGrid, TrackMemo
from probes.stats.quantile import Layout
from probes.stats.series import PathSeries, columns, path_series, without_latency
from probes.types import PathWindow, split_pair
from probes.verdict import metrics as M
from probes.verdict import rules
from probes.verdict.metrics import CohortEvidence, MetricVerdict
from probes.verdict.pod_metrics import (
    attempts_recorded,
    latency_recorded,
    pod_attempts,
    pod_attempts_many,
    pod_latency_p99,
    pod_latency_p99s,
)
from probes.verdict.rules import STATES, State

__all__ = [
    "FAIL",
    "INCONCLUSIVE",
    "METRIC_SLOTS",
    "PASS",
    "CohortEvidence",
    "MetricVerdict",
    "PathVerdict",
    "Verdict",
    "judge",
]

PASS, FAIL, INCONCLUSIVE = State.PASS, State.FAIL, State.INCONCLUSIVE
METRIC_SLOTS = len(rules.METRICS)
_LAYOUT = Layout.from_edges(LOWER, UPPER)
_DEFAULT_TOLERANCES = Tolerances()


@dataclass(frozen=True, slots=True)
class PathVerdict:
    path: str
    verdict: State
    samples_baseline: int
    samples_canary: int
    metrics: tuple[MetricVerdict, ...]
    reasons: tuple[str, ...]

    def metric(self, name: str) -> MetricVerdict | None:
        return next((m for m in self.metrics if m.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "verdict": self.verdict,
            "samples": {"baseline": self.samples_baseline, "canary": self.samples_canary},
            "metrics": {m.name: m.to_json() for m in self.metrics},
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: State
    baseline: str | None
    canary: str | None
    window_from: float | None
    window_to: float | None
    paths: tuple[PathVerdict, ...]
    reasons: tuple[str, ...]

    def path(self, name: str) -> PathVerdict | None:
        return next((p for p in self.paths if p.path == name), None)

    def to_json(self) -> dict[str, Any]:
        """The verdict JSON of docs/design.md (window bounds are null when nothing was compared)."""
        return {
            "verdict": self.verdict,
            "baseline": self.baseline,
            "canary": self.canary,
            "window": {
                "from": None if self.window_from is None else rfc3339(self.window_from),
                "to": None if self.window_to is None else rfc3339(self.window_to),
            },
            "paths": [p.to_json() for p in self.paths],
            "reasons": list(self.reasons),
        }


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _gate(
    s: PathSeries, baseline: str | None, canary: str | None, *, now: float, window_s: float,
    min_samples: int, overloaded: bool,
) -> tuple[list[str], list[str]]:
    """Why this path cannot decide, whatever its statistics say, and why it cannot pass
    (stale data: a fail stands, `rules.hold`); both empty: nothing stops it."""
    if not s.cohorts:
        return ["no data for this path"], []
    if baseline is None or canary is None or baseline == canary:
        return ["no baseline and canary cohorts to compare"], []
    have = ", ".join(s.cohorts)
    if baseline not in s.newest_end:
        return [f"no data from the baseline cohort {baseline} (cohorts with data: {have})"], []
    if canary not in s.newest_end:
        return [f"no data from the canary cohort {canary} (cohorts with data: {have})"], []
    if s.span is None:
        return ["the baseline and canary cohorts have no window in common"], []
    assert s.baseline is not None and s.canary is not None
    ages = {name: now - s.newest_end[name] for name in (baseline, canary)}
    g = rules.gates([s.baseline.requests], [s.canary.requests], both=True,
                    min_samples=min_samples, window_s=window_s, age_b=[ages[baseline]],
                    age_c=[ages[canary]], overloaded=overloaded)
    stale = []
    for role, name, old in (("baseline", baseline, g.stale_baseline),
                            ("canary", canary, g.stale_canary)):
        if old[0]:
            stale.append(
                f"data is stale: the newest {role} window ended {_ago(ages[name])} ago "
                f"(more than two {window_s:g} s windows); if its probe has stopped, "
                f"`skewprobe verdict --at {rfc3339(s.newest_end[name])}` gives the verdict "
                "as it stood then"
            )
    reasons = []
    for role, t, few in (("baseline", s.baseline, g.few_baseline),
                         ("canary", s.canary, g.few_canary)):
        if few[0]:
            reasons.append(
                f"the {role} cohort has {t.requests} requests, fewer than "
                f"min_samples {min_samples}"
            )
    if g.overloaded[0]:
        reasons.append("the probe is overloaded, so its measurements are not trusted")
    return reasons, stale


def _layout(windows: Any) -> Layout:
    """The bucket edges of the windows' latency counts: the store's layout, unless the input
    says otherwise (`latency_edges` = (lower, upper), as a table read from Prometheus)."""
    edges = getattr(windows, "latency_edges", None)
    return _LAYOUT if edges is None else Layout.from_edges(*edges)


def _metrics(
    series: Sequence[PathSeries], tol: Tolerances, alpha_share: float, attempts_max: int,
    layout: Any = None, *, pods: Mapping[str, PodGrid] | None = None,
    cohorts: tuple[str, str] | None = None, window_s: float = DEFAULT_WINDOW_S,
    memo: Callable[[str], TrackMemo] | None = None, latency_left_out: Iterable[str] = (),
) -> dict[str, dict[str, MetricVerdict]]:
    """Per path, per metric name, for every path with a comparison span. `layout` is a
    callable giving the latency bucket `Layout` (read only when latency is judged). With
    `pods` (per path) and `cohorts` (baseline, canary), success rate is judged per pod, and
    p99 and attempts too where the grid holds per-pod latency and attempts; `memo(metric)`
    keeps a metric's pod-level sums between verdicts (`pods.TrackMemo`);
    `latency_left_out`: paths whose every latency record was left out (late sends), whose
    p99 is then undecided, not absent."""
    out: dict[str, dict[str, MetricVerdict]] = {s.path: {} for s in series}
    judged = [s for s in series if s.baseline is not None and s.canary is not None]
    too_many = _check_attempts(judged, attempts_max)
    a = alpha_share

    def cols(pick: Any, rows: Sequence[PathSeries]) -> tuple[np.ndarray, np.ndarray]:
        b = np.array([float(pick(s.baseline)) for s in rows])
        c = np.array([float(pick(s.canary)) for s in rows])
        return b, c

    def run(name: str, unit: str, tolerance: dict[str, float], compute: Any,
            skip: set[str] | None = None) -> None:
        def applies(t: Any) -> bool:
            return bool(rules.applies(name, t))

        def has(t: Any) -> bool:
            return bool(rules.measured(name, t))

        rows = [s for s in judged if applies(s.baseline) or applies(s.canary)]
        full = [s for s in rows if has(s.baseline) and has(s.canary)]
        for s in rows:
            if skip and s.path in skip:
                full.remove(s)
                out[s.path][name] = M.missing(
                    name, unit, tolerance, a,
                    f"attempts per request: some calls made more than attempts_max "
                    f"{attempts_max} attempts, so the bound behind the test does not hold",
                )
            elif s not in full:
                role = "baseline" if not has(s.baseline) else "canary"
                out[s.path][name] = M.missing(
                    name, unit, tolerance, a, f"{name.replace('_', ' ')}: the {role} cohort "
                    "has no data for this metric"
                )
        if full:
            for s, mv in zip(full, compute(full), strict=True):
                out[s.path][name] = mv

    def by_pod(out: list[MetricVerdict], rows: Sequence[PathSeries],
               per_pod: Any, pairs: bool = True) -> list[MetricVerdict]:
        """Each path's pooled verdict judged again per pod where its grid has both cohorts:
        `per_pod(grid, baseline, canary, pooled)`; without `pairs`, not for pair cohorts."""
        if cohorts is not None and not pairs and split_pair(cohorts[1]) is not None:
            return out
        if pods is not None and cohorts is not None:
            for i, s in enumerate(rows):
                grid = pods.get(s.path)
                if grid is not None and {*cohorts} <= {*grid.cohorts}:
                    out[i] = per_pod(grid, *cohorts, out[i])
        return out

    def success(rows: Sequence[PathSeries]) -> list[MetricVerdict]:
        by_pod: dict[int, PodGrid] = {}
        if pods is not None and cohorts is not None:
            by_pod = {i: pods[s.path] for i, s in enumerate(rows)
                      if s.path in pods and {*cohorts} <= {*pods[s.path].cohorts}}
        pooled = [s for i, s in enumerate(rows) if i not in by_pod]
        out: list[MetricVerdict | None] = [None] * len(rows)
        if pooled:
            req_b, req_c = cols(lambda t: t.requests, pooled)
            err_b, err_c = cols(lambda t: t.errors, pooled)
            at = [i for i in range(len(rows)) if i not in by_pod]
            for i, mv in zip(at, M.success_rate(req_b, err_b, req_c, err_c, tol, a),
                             strict=True):
                out[i] = mv
        if by_pod and cohorts is not None:
            # Every path's pod-level test in one call: their pooled figures are vectorised.
            for i, mv in zip(by_pod, M.pod_success_rates(
                    list(by_pod.values()), *cohorts, tol, a, window_s,
                    memo(M.SUCCESS_RATE) if memo else None), strict=True):
                out[i] = mv
        return [mv for mv in out if mv is not None]


    def per_pod_or_pooled(rows: Sequence[PathSeries], recorded: Any, pooled: Any, one: Any,
                          many: Any) -> list[MetricVerdict]:
        """Paths whose grid holds the metric per pod (`recorded(grid)`) judged per pod, all
        at once (`many(grids, baseline, canary)`); the rest on pooled calls (`pooled(rows)`),
        through `one` where a grid lacks it (a v1 span: its reason says so). A relay path's
        pods are its callers' relay pods, whose proxies make the retries: the pair matrix
        (`probes.verdict.pairs`) keeps judging p99 and attempts on pooled calls, so a retrying
        caller version fails its cell with one relay pod per version."""
        at: dict[int, PodGrid] = {}
        if pods is not None and cohorts is not None and split_pair(cohorts[1]) is None:
            for i, s in enumerate(rows):
                g = pods.get(s.path)
                if g is not None and {*cohorts} <= {*g.cohorts} and recorded(g):
                    at[i] = g
        out: list[MetricVerdict | None] = [None] * len(rows)
        rest = [i for i in range(len(rows)) if i not in at]
        if rest:
            sub = [rows[i] for i in rest]
            for i, mv in zip(rest, by_pod(pooled(sub), sub, one, pairs=False), strict=True):
                out[i] = mv
        if at and cohorts is not None:
            for i, mv in zip(at, many(list(at.values()), *cohorts), strict=True):
                out[i] = mv
        return [mv for mv in out if mv is not None]

    def latency(rows: Sequence[PathSeries]) -> list[MetricVerdict]:
        def pooled(sub: Sequence[PathSeries]) -> list[MetricVerdict]:
            cum_b = np.cumsum(np.stack([s.baseline.latency for s in sub]), axis=1)  # type: ignore[union-attr]
            cum_c = np.cumsum(np.stack([s.canary.latency for s in sub]), axis=1)  # type: ignore[union-attr]
            edges = _LAYOUT if layout is None else layout()
            return M.latency_p99(cum_b.astype(float), cum_c.astype(float), edges, tol, a)

        return per_pod_or_pooled(
            rows, latency_recorded, pooled,
            lambda g, b, c, m: pod_latency_p99(g, b, c, tol, a, window_s, m),
            lambda grids, b, c: pod_latency_p99s(grids, b, c, tol, a, window_s))

    def attempts(rows: Sequence[PathSeries]) -> list[MetricVerdict]:
        def pooled(sub: Sequence[PathSeries]) -> list[MetricVerdict]:
            sum_b, sum_c = cols(lambda t: t.attempts_sum, sub)
            cnt_b, cnt_c = cols(lambda t: t.attempts_count, sub)
            return M.attempts_per_request(sum_b, cnt_b, sum_c, cnt_c, tol, a, attempts_max)

        return per_pod_or_pooled(
            rows, attempts_recorded, pooled,
            lambda g, b, c, m: pod_attempts(g, b, c, tol, a, window_s, attempts_max, m),
            lambda grids, b, c: pod_attempts_many(grids, b, c, tol, a, window_s, attempts_max,
                                                  memo(M.ATTEMPTS) if memo else None))

    def streams(rows: Sequence[PathSeries]) -> list[MetricVerdict]:
        k_b, k_c = cols(lambda t: t.stream_resets, rows)
        e_b, e_c = cols(lambda t: t.stream_seconds, rows)
        return M.stream_resets(k_b, e_b, k_c, e_c, tol, a)

    run(M.SUCCESS_RATE, "ratio", {"max_drop_pp": tol.success_rate_drop_pp}, success)
    run(M.LATENCY_P99, "ms",
        {"max_ratio": tol.latency_p99_ratio, "margin_ms": tol.latency_p99_margin_ms}, latency)
    for name in latency_left_out:
        if name in out and M.LATENCY_P99 not in out[name]:
            out[name][M.LATENCY_P99] = M.missing(
                M.LATENCY_P99, "ms",
                {"max_ratio": tol.latency_p99_ratio, "margin_ms": tol.latency_p99_margin_ms},
                a, "p99 latency: every window was left out of it")
    run(M.ATTEMPTS, "attempts", {"max_ratio": tol.attempts_ratio, "attempts_max": attempts_max},
        attempts, too_many)
    run(M.STREAM_RESETS, "per_hour",
        {"max_ratio": tol.stream_resets_ratio,
         "margin_per_hour": tol.stream_resets_margin_per_hour}, streams)
    return out


def _check_attempts(series: Sequence[PathSeries], attempts_max: int) -> set[str]:
    """Paths whose attempt counts cannot come from calls of at most attempts_max attempts."""
    return {s.path for s in series for t in (s.baseline, s.canary)
            if t is not None and rules.attempts_out_of_range(t.attempts_sum, t.attempts_count,
                                                             attempts_max)}


def judge(
    windows: Sequence[PathWindow] | Any,
    *,
    tolerances: Tolerances = _DEFAULT_TOLERANCES,
    alpha: float = DEFAULT_ALPHA,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    window_s: float = DEFAULT_WINDOW_S,
    now: float,
    baseline: str | None = None,
    canary: str | None = None,
    since: float | None = None,
    paths: Iterable[str] | None = None,
    overloaded: bool = False,
    attempts_max: int = DEFAULT_ATTEMPTS_MAX,
    pods: Mapping[str, PodGrid] | None = None,
    exclude: Sequence[tuple[float, float]] = (),
    memos: Callable[[Hashable], TrackMemo] | None = None,
) -> Verdict:
    """Judge the canary cohort against the baseline on every path (module docstring).

    `windows`: `PathWindow`s, a store `WindowTable`, or a table with its own latency bucket
    edges (`latency_edges`, e.g. `probes.store.prometheus`). `since` (epoch seconds) fixes the
    sequential origin; `paths` limits the verdict to those paths (a named path without data
    is inconclusive). `overloaded` marks the probe's own measurements untrusted.
    `attempts_max` bounds the upstream attempts of one call (the proxies' retries + 1).
    `pods`: per path, the pods × windows grid (`probes.stats.pods.pod_grids`); with it,
    success rate takes the pod as the unit of evidence, without it calls are pooled.
    `exclude`: time spans [from, to) whose windows are left out of the p99 comparison for
    both cohorts (the probe's sends were late then); every other metric counts them.
    `memos`: the running probe's kept pod-level sums, one `pods.TrackMemo` per key (the
    query and the metric), so that a verdict after a new window sums that window alone.
    Raises BadInput for parameters out of range.
    """
    if not 0.0 < alpha < 1.0:
        raise BadInput(f"alpha must lie in (0, 1), got {alpha}")
    if min_samples < 0 or window_s <= 0 or attempts_max < 2:
        raise BadInput("min_samples must be >= 0, window_s > 0 and attempts_max >= 2")
    if tolerances.latency_p99_ratio <= 0 or not 0 <= tolerances.success_rate_drop_pp < 100:
        raise BadInput("tolerances out of range")

    cols = columns(windows)
    wanted = None if paths is None else sorted(set(paths))
    keep = cols.has_data
    if since is not None:
        keep = keep & (cols.start >= since)
    if wanted is not None:
        keep = keep & np.isin(cols.path, [i for i, p in enumerate(cols.paths) if p in wanted])
    seen = np.bincount(cols.cohort[keep], minlength=len(cols.cohorts)) > 0
    present = [cols.cohorts[i] for i in np.flatnonzero(seen)]
    choice = pick_cohorts(present, baseline, canary)
    b, c = choice.baseline, choice.canary
    series = path_series(without_latency(cols, exclude), b, c, since=since, paths=wanted)
    left_out: set[str] = set()
    if exclude:
        # Paths whose latency was all left out: p99 undecided, never silently gone.
        def timed(rows: Sequence[PathSeries]) -> set[str]:
            return {s.path for s in rows if any(t is not None and t.latency.sum() > 0
                                                for t in (s.baseline, s.canary))}
        left_out = timed(path_series(cols, b, c, since=since, paths=wanted)) - timed(series)

    alpha_share = alpha / (METRIC_SLOTS * max(1, len(series)))
    query = (since, tuple(wanted or ()), b, c)
    by_path = _metrics(series, tolerances, alpha_share, attempts_max,
                       lambda: _layout(windows), pods=pods,
                       cohorts=(b, c) if b is not None and c is not None else None,
                       window_s=window_s,
                       memo=None if memos is None else (lambda m: memos((m, *query))),
                       latency_left_out=left_out)

    path_verdicts = []
    for s in series:
        blocking, stale = _gate(s, b, c, now=now, window_s=window_s,
                                min_samples=min_samples, overloaded=overloaded)
        gates = stale + blocking
        found = by_path[s.path]
        mvs = tuple(found[name] for name in rules.METRICS if name in found)
        codes, held = rules.path_states(
            rules.codes_of([m.verdict for m in mvs]).reshape(-1, 1), [bool(blocking)],
            [bool(stale)])
        verdict = STATES[int(codes[0])]
        mvs = tuple(m.with_verdict(STATES[int(c)]) for m, c in zip(mvs, held[:, 0], strict=True))
        if gates:
            reasons = tuple(gates) + tuple(m.reason for m in mvs)
        else:
            # Failing metrics first, then the undecided ones; a pass lists every metric.
            reasons = tuple(
                m.reason for v in (FAIL, INCONCLUSIVE) for m in mvs if m.verdict == v
            ) or tuple(m.reason for m in mvs) or ("no metric applies to this path",)
        path_verdicts.append(PathVerdict(
            s.path, verdict,
            s.baseline.requests if s.baseline else 0, s.canary.requests if s.canary else 0,
            mvs, reasons,
        ))

    overall = rules.combine(p.verdict for p in path_verdicts)
    notes = list(choice.reasons)
    if not path_verdicts:
        notes.append("no data" + (f" at or after {rfc3339(since)}" if since is not None else ""))
    for p in path_verdicts:
        if p.verdict != PASS:
            notes.append(f"{p.path}: {p.verdict}: {p.reasons[0]}")
    spans = [s.span for s in series if s.span is not None]
    return Verdict(
        verdict=overall,
        baseline=b,
        canary=c,
        window_from=min(sp[0] for sp in spans) if spans else None,
        window_to=max(sp[1] for sp in spans) if spans else None,
        paths=tuple(path_verdicts),
        reasons=tuple(notes),
    )

