"""The four verdict metrics, each judged for many paths at once.

Every function takes per-path arrays of cohort totals, runs one anytime-valid two-sample test
(`bounded`, `quantile`, `rates`) and returns one `MetricVerdict` per path:

- fail when the e-value against "canary within tolerance" reaches 1/α_share,
- pass when the e-value against "canary beyond tolerance" reaches 1/α_share,
- inconclusive otherwise.

The per-cohort bounds shown as evidence are each cohort's own confidence sequence at the same
α_share (two-sided); the decision itself comes from the two-sample e-values, which are sharper
than comparing the two bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.stats import bounded, quantile, rates
from probes.stats.pods import (
    ONE_POD_BASELINE,
    PodGrid,
    PodTrack,
    TrackMemo,
    needs_factors,
    pod_states,
    pod_tracks,
)
from probes.verdict import rules
from probes.verdict.rules import (
    ATTEMPTS,
    LATENCY_P99,
    STATES,
    STREAM_RESETS,
    SUCCESS_RATE,
    State,
)
from probes.verdict.rules import TolerancesLike as Tolerances

__all__ = [
    "ATTEMPTS",
    "LATENCY_P99",
    "PODS",
    "POOLED",
    "STREAM_RESETS",
    "SUCCESS_RATE",
    "CohortEvidence",
    "GridSums",
    "MetricVerdict",
    "PodSums",
    "attempts_per_request",
    "cohort_rows",
    "concentration_finding",
    "duration",
    "fails_against_one_pod",
    "grid_sums",
    "json_number",
    "latency_p99",
    "log_clip",
    "missing",
    "needs_more",
    "pod_bounded_verdicts",
    "pod_reason",
    "pod_success_rate",
    "pod_success_rates",
    "set_aside",
    "stream_resets",
    "success_rate",
    "too_few_for_one_pod",
]

PASS, FAIL, INCONCLUSIVE = State.PASS, State.FAIL, State.INCONCLUSIVE
PODS, POOLED = "pods", "pooled"
F64 = npt.NDArray[np.float64]


def log_clip(log_e: npt.ArrayLike, cap: float = 700.0) -> F64:
    """exp() of log e-values, capped so JSON never carries an infinity (e^700 ≈ 1e304)."""
    return np.asarray(np.exp(np.minimum(np.asarray(log_e, dtype=np.float64), cap)),
                      dtype=np.float64)


def _ro(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


def json_number(x: float | None, digits: int = 6) -> float | None:
    """JSON-safe: None for missing or non-finite, else rounded to `digits` significant."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


_num = json_number


@dataclass(frozen=True, slots=True)
class CohortEvidence:
    """One cohort's estimate, anytime-valid bounds and the counts behind them."""

    estimate: float | None = None
    lower: float | None = None
    upper: float | None = None
    counts: Mapping[str, float] = field(default_factory=lambda: _ro(None))

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", _ro(self.counts))


@dataclass(frozen=True, slots=True)
class MetricVerdict:
    """One metric on one path. `e_fail` / `e_pass` are the e-values (None: not computed)."""

    name: str
    verdict: str
    unit: str
    baseline: CohortEvidence
    canary: CohortEvidence
    tolerance: Mapping[str, float]
    alpha: float
    e_fail: float | None
    e_pass: float | None
    reason: str
    # Pod-level evidence (`pod_success_rate`): pods per cohort, the spread between pods,
    # the canary's worst pod and its share; `needs`: calls and seconds more to pass.
    pods: Mapping[str, Any] | None = None
    needs: Mapping[str, Any] | None = None
    # How it was judged: "pods" (the pod as the unit) or "pooled" (cohort totals).
    rule: str = "pooled"

    def __post_init__(self) -> None:
        object.__setattr__(self, "tolerance", _ro(self.tolerance))

    def with_verdict(self, verdict: str) -> MetricVerdict:
        return replace(self, verdict=verdict)

    def to_json(self) -> dict[str, Any]:
        b, c = self.baseline, self.canary

        def p_value(e: float | None) -> float | None:
            return None if e is None else _num(min(1.0, 1.0 / e) if e > 0 else 1.0)

        return {
            "baseline": _num(b.estimate),
            "canary": _num(c.estimate),
            "verdict": self.verdict,
            "unit": self.unit,
            "lower": {"baseline": _num(b.lower), "canary": _num(c.lower)},
            "upper": {"baseline": _num(b.upper), "canary": _num(c.upper)},
            "counts": {"baseline": dict(b.counts), "canary": dict(c.counts)},
            "tolerance": dict(self.tolerance),
            "alpha": _num(self.alpha),
            "e_value": {"fail": _num(self.e_fail), "pass": _num(self.e_pass)},
            "p_value": {"fail": p_value(self.e_fail), "pass": p_value(self.e_pass)},
            "reason": self.reason,
            **({} if self.pods is None else {"pods": dict(self.pods)}),
            **({} if self.needs is None else {"needs": dict(self.needs)}),
            "rule": self.rule,
        }


def missing(name: str, unit: str, tolerance: Mapping[str, float], alpha: float,
            reason: str) -> MetricVerdict:
    """An inconclusive metric that could not be computed (one cohort lacks the data)."""
    return MetricVerdict(name, INCONCLUSIVE, unit, CohortEvidence(), CohortEvidence(),
                         tolerance, alpha, None, None, reason)


def _decide(test: bounded.TwoSample, log_thr: float) -> list[State]:
    return [STATES[c] for c in rules.decide(test.log_e_fail, test.log_e_pass, log_thr).ravel()]


# One pooled metric's row i: the cohorts' evidence and the reason's head (before its tail).
_Row = Callable[[int], tuple[CohortEvidence, CohortEvidence, str]]


def _verdicts(name: str, unit: str, test: bounded.TwoSample, tolerance: Mapping[str, float],
              alpha: float, row: _Row) -> list[MetricVerdict]:
    """A pooled metric's verdict per row of `test`, each from its evidence and reason."""
    out = []
    for i, verdict in enumerate(_decide(test, math.log(1.0 / alpha))):
        baseline, canary, head = row(i)
        out.append(MetricVerdict(
            name, verdict, unit, baseline, canary, tolerance, alpha,
            float(log_clip(test.log_e_fail[i])), float(log_clip(test.log_e_pass[i])),
            head + _TAIL[verdict],
        ))
    return out


_TAIL = {
    FAIL: "",
    PASS: ": within tolerance",
    INCONCLUSIVE: ": not enough evidence yet to pass or fail",
}


def _fmt(x: float, decimals: int = 2) -> str:
    text = f"{x:.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _sig(x: float) -> str:
    """Three significant digits, without exponent for the ranges seen here."""
    if not math.isfinite(x):
        return "n/a"
    return _fmt(x, max(0, 2 - math.floor(math.log10(abs(x))))) if x else "0"


def success_rate(
    req_b: F64, err_b: F64, req_c: F64, err_c: F64, tol: Tolerances, alpha: float
) -> list[MetricVerdict]:
    """Fail when the canary's success rate is lower by more than `success_rate_drop_pp`."""
    log_thr = math.log(1.0 / alpha)
    test = rules.success_test(req_b, err_b, req_c, err_c, tol)
    lo_b, hi_b = bounded.mean_cs(err_b, req_b, log_thr)
    lo_c, hi_c = bounded.mean_cs(err_c, req_c, log_thr)

    def row(i: int) -> tuple[CohortEvidence, CohortEvidence, str]:
        sb = 1.0 - err_b[i] / req_b[i]
        sc = 1.0 - err_c[i] / req_c[i]
        return (
            CohortEvidence(sb, 1.0 - hi_b[i], 1.0 - lo_b[i],
                           {"requests": int(req_b[i]), "errors": int(err_b[i])}),
            CohortEvidence(sc, 1.0 - hi_c[i], 1.0 - lo_c[i],
                           {"requests": int(req_c[i]), "errors": int(err_c[i])}),
            f"success rate {_fmt(100 * sc)}% vs {_fmt(100 * sb)}% "
            f"({_fmt(100 * (sc - sb))} pp; allowed -{_fmt(tol.success_rate_drop_pp)} pp)")

    return _verdicts(SUCCESS_RATE, "ratio", test, {"max_drop_pp": tol.success_rate_drop_pp},
                     alpha, row)


def concentration_finding(pod: str, share: float | None, what: str = "errors") -> str:
    """The finding when the canary's errors are concentrated on one pod, in the words the
    verdict's reason and the report both use: "concentrated on shop-0 (71 % of the canary's
    errors)". `share` as the verdict's JSON carries it (`worst_share`); `what` names
    what was counted ("retries", "calls above the baseline's p99")."""
    shown = _num(share, 3)
    return (f"concentrated on {pod} "
            f"({'?' if shown is None else f'{100 * shown:.0f}'} % of the canary's {what})")


@dataclass(frozen=True, slots=True, eq=False)
class GridSums:
    """A grid's columns (some of them) as its reason reads them: which both cohorts have
    calls in, and over those, the cohorts' calls and sums (baseline then canary) and each
    canary pod's."""

    both: npt.NDArray[np.bool_]
    totals: F64
    canary_n: F64
    canary_s: F64

    def then(self, later: GridSums) -> GridSums:
        """These columns' sums with those of the `later` columns after them."""
        return GridSums(np.concatenate([self.both, later.both]), self.totals + later.totals,
                     self.canary_n + later.canary_n, self.canary_s + later.canary_s)


def _sums(n: F64, s: F64, is_canary: npt.NDArray[np.bool_], cols: slice) -> GridSums:
    nn, ss = n[:, cols], s[:, cols]
    # Each cohort's calls and sums per window, then over the windows both cohorts have,
    # as products with the cohorts' flags: a few calls a grid, not one per cohort and
    # figure (calls, and attempts beyond the first per attempts_max − 1, are whole
    # numbers and quarters by default: exact in any order).
    by = np.stack([~is_canary, is_canary]).astype(np.float64)
    calls, sums = by @ nn, by @ ss
    both = (calls[0] > 0) & (calls[1] > 0)
    on = both.astype(np.float64)
    totals = np.stack([calls @ on, sums @ on], axis=1).ravel()
    return GridSums(both, totals, nn[is_canary] @ on, ss[is_canary] @ on)


@dataclass(frozen=True, slots=True, eq=False)
class _PodEvidence:
    """One path's pod-level test (its last look) before the pooled figures heading its reason."""

    grid: PodGrid
    rows: npt.NDArray[np.bool_]
    is_canary: npt.NDArray[np.bool_]
    canary_names: list[str]
    track: PodTrack
    sums: GridSums

    @property
    def totals(self) -> tuple[float, float, float, float]:
        """Calls and sums over the windows both cohorts have, baseline then canary."""
        b_n, b_s, c_n, c_s = self.sums.totals.tolist()
        return b_n, b_s, c_n, c_s


# What a pod-level test reads of one grid: the grid, its `rows` of the two cohorts,
# `is_canary` among them, and the calls `n` and sums `s` of those rows (pods × windows).
PodSums = tuple[PodGrid, npt.NDArray[np.bool_], npt.NDArray[np.bool_], F64, F64]


def _pod_evidences(items: Sequence[PodSums], ratio: float, margin: float, alpha: float,
                   memo: TrackMemo | None = None, salt: Hashable = None
                   ) -> list[_PodEvidence]:
    """Every grid's pod-level test at its last look, in one batch (`pod_tracks`;
    `memo`, its sums kept from the last verdict, and the reason's sums over the grid's
    settled columns, for the same `salt`: what else its `s` was made from)."""
    tracks = pod_tracks([(n, s, c) for _g, _r, c, n, s in items], ratio, margin,
                        log_threshold=math.log(1.0 / alpha), last_only=True, memo=memo,
                        settled=[g.settled for g, *_ in items])
    return [_pod_evidence(*item, track, memo, (i, ratio, margin, salt))
            for i, (item, track) in enumerate(zip(items, tracks, strict=True))]


def _pod_evidence(grid: PodGrid, rows: npt.NDArray[np.bool_],
                  is_canary: npt.NDArray[np.bool_], n: F64, s: F64,
                  track: PodTrack, memo: TrackMemo | None, key: tuple[Any, ...]
                  ) -> _PodEvidence:
    names = [p for p, keep in zip(grid.pods, rows, strict=True) if keep]
    canary_names = [p for p, c in zip(names, is_canary, strict=True) if c]
    return _PodEvidence(grid, rows, is_canary, canary_names, track,
                        grid_sums(grid, n, s, is_canary, memo, key))


def grid_sums(grid: PodGrid, n: F64, s: F64, is_canary: npt.NDArray[np.bool_],
              memo: TrackMemo | None, key: tuple[Hashable, ...]) -> GridSums:
    """`GridSums` of calls `n` and sums `s` (the grid's compared rows, `is_canary` among
    them). With a `memo`, those of the columns its source vouches for (`PodGrid.settled`)
    are kept (`TrackMemo.kept_for`: `key`, where to keep them, then what else `s` was made
    from), each newly settled column added once: a verdict sums its newer columns alone."""
    if memo is None or grid.settled is None or not grid.settled[1]:
        return _sums(n, s, is_canary, slice(None))
    fixed = grid.settled[1]

    def settled(k: int, kept: GridSums | None) -> GridSums:
        more = _sums(n, s, is_canary, slice(k, fixed))
        return more if kept is None else kept.then(more)

    return memo.kept_for(key[0], key[1:], grid.settled, settled).then(
        _sums(n, s, is_canary, slice(fixed, None)))


def cohort_rows(cells: F64 | None, rows: npt.NDArray[np.bool_]) -> F64:
    """A grid's (pods, windows) array, the compared cohorts' rows: the array itself when
    they are all of it (a copy of a day of strata per path is what a cold verdict's peak
    is made of, and a warm verdict's work; nothing writes the cells in place)."""
    a = np.asarray(cells, dtype=np.float64)
    return a if rows.all() else a[rows]


def pod_success_rates(
    grids: Sequence[PodGrid], baseline: str, canary: str, tol: Tolerances, alpha: float,
    window_s: float, memo: TrackMemo | None = None,
) -> list[MetricVerdict]:
    """Success rate with the pod as the unit of evidence (`probes.stats.pods`), one per
    grid: each canary call compared with the baseline in the same window, the spread between
    pods counted, and a fail that no single canary pod makes (`probes.stats.pods`). The
    pooled figures that head each reason are computed for every grid at once. `memo`: the
    running probe's sums kept between verdicts (`TrackMemo`)."""
    drop = tol.success_rate_drop_pp / 100.0
    items = []
    for g in grids:
        rows = np.array([c in (baseline, canary) for c in g.cohorts], dtype=bool)
        items.append((g, rows, g.of(canary)[rows], cohort_rows(g.calls, rows),
                      cohort_rows(g.errors, rows)))
    parts = _pod_evidences(items, 1.0, drop, alpha, memo, "errors")
    judged = [p for p in parts if p.totals[0] > 0 and p.totals[2] > 0]
    if judged:
        req_b, err_b, req_c, err_c = (np.array(x) for x in zip(*(p.totals for p in judged),
                                                               strict=True))
        heads = iter(success_rate(req_b, err_b, req_c, err_c, tol, alpha))
    factors = _needs_factors(judged, alpha)
    return [
        _pod_verdict(p, next(heads), factors.get(p), window_s, what="errors",
                     spread=("spread_pp", 100.0, "pp"),
                     warmup={"calls": int(p.grid.warmup_calls[p.rows].sum()),
                             "errors": int(p.grid.warmup_errors[p.rows].sum())})
        if p in judged
        else missing(SUCCESS_RATE, "ratio", {"max_drop_pp": tol.success_rate_drop_pp}, alpha,
                     "success rate: the cohorts have no warm window in common yet "
                     "(each pod's warm-up is left out)")
        for p in parts
    ]


def pod_success_rate(
    grid: PodGrid, baseline: str, canary: str, tol: Tolerances, alpha: float,
    window_s: float,
) -> MetricVerdict:
    """`pod_success_rates` for one grid."""
    return pod_success_rates([grid], baseline, canary, tol, alpha, window_s)[0]


def _needs_factors(evidence: Sequence[_PodEvidence], alpha: float
                   ) -> dict[_PodEvidence, float | None]:
    """How far a pass is, for the undecided only (it costs more than the test), all at once."""
    log_thr = math.log(1.0 / alpha)
    undecided = [p for p in evidence
                 if pod_states(p.track, log_thr)[-1] == INCONCLUSIVE]
    return dict(zip(undecided, needs_factors(
        [-float(p.track.d[-1]) for p in undecided],
        [float(p.track.v_sampling[-1]) for p in undecided],
        [float(p.track.v_pods[-1]) for p in undecided], log_thr), strict=True))


def needs_more(grid: PodGrid, both: npt.NDArray[np.bool_], window_s: float,
               factor: float, canary_calls: float) -> dict[str, Any]:
    """`needs` of an undecided pod-level metric: the canary calls for the evidence to grow by
    `factor`, and the seconds they take at the rate they came so far, over the grid's
    columns `both` cohorts have calls in (a column may merge adjacent windows: from its
    first window's start to its last's end)."""
    seconds = None
    if both.any():
        elapsed = float(grid.last_starts[both][-1] - grid.starts[both][0]) + window_s
        seconds = _num((factor - 1.0) * elapsed, 3)
    return {"calls": math.ceil((factor - 1.0) * canary_calls), "seconds": seconds}


def pod_bounded_verdicts(
    pooled: Sequence[MetricVerdict], items: Sequence[PodSums], ratio: float, margin: float,
    window_s: float, *, what: str, spread: tuple[str, float, str],
    memo: TrackMemo | None = None,
) -> list[MetricVerdict]:
    """Each of `pooled` (a metric's verdicts on cohort totals, one per grid, at one α)
    judged again with the pod as the unit: `probes.stats.pods.pod_track` on the per-call
    values' sums `s` over calls `n` of its item (`PodSums`), H0 μ_c ≤ ratio·μ_b + margin,
    all grids in one batch. Each gets its state, reason, e-values, pod evidence and `needs`.
    `what` names what `s` counts ("retries"); `spread` = (JSON key, scale, unit) shows the
    spread between pods τ in the metric's units. `memo` as `pod_success_rates`'."""
    if not pooled:
        return []
    evidence = _pod_evidences(items, ratio, margin, pooled[0].alpha, memo, (what, spread))
    factors = _needs_factors(evidence, pooled[0].alpha)
    return [_pod_verdict(ev, p, factors.get(ev), window_s, what=what, spread=spread,
                         warmup=None) for ev, p in zip(evidence, pooled, strict=True)]


def _pod_verdict(ev: _PodEvidence, pooled: MetricVerdict, factor: float | None,
                 window_s: float, *, what: str, spread: tuple[str, float, str],
                 warmup: Mapping[str, int] | None) -> MetricVerdict:
    alpha = pooled.alpha
    log_thr = math.log(1.0 / alpha)
    grid, is_canary = ev.grid, ev.is_canary
    canary_names, track, both = ev.canary_names, ev.track, ev.sums.both
    req_c, err_c = ev.totals[2], ev.totals[3]
    lf, lfa, lp = (float(x[-1]) for x in (track.log_e_fail, track.log_e_fail_all,
                                          track.log_e_pass))
    pods_c = int(track.pods_canary[-1])
    worst = int(track.worst[-1]) if canary_names else 0
    worst_name = canary_names[worst] if canary_names else None
    share = call_share = 0.0
    if canary_names:
        if err_c > 0:
            share = float(ev.sums.canary_s[worst] / err_c)
        call_share = float(ev.sums.canary_n[worst] / req_c)
    concentrated = pods_c >= 2 and share >= 0.5 and share >= 2 * call_share
    key, scale, unit = spread
    spread_shown = scale * float(track.tau[-1])

    verdict = State(str(pod_states(track, log_thr)[-1]))
    needs: dict[str, Any] = {"calls": None, "seconds": None}
    if verdict == INCONCLUSIVE and factor is not None:
        needs = needs_more(grid, both, window_s, factor, float(req_c))

    pod_word = "pod" if pods_c == 1 else "pods"
    head = (pooled.reason.split(")")[0]
            + f"; {pods_c} canary {pod_word} vs {int(track.pods_baseline[-1])})")
    found = ("; " + concentration_finding(str(worst_name), share, what)
             if concentrated else "")
    names = [p for p, keep in zip(grid.pods, ev.rows, strict=True) if keep]
    aside, aside_found = set_aside(track, names, is_canary, what)
    found_aside = aside_found if verdict != FAIL or pods_c == 1 else ""
    decided = pod_reason(head, verdict, lfa >= log_thr, pods_c, worst_name, share,
                         concentrated, what)
    pods_b = int(track.pods_baseline[-1])
    if decided is not None:
        reason = decided
    elif (few := too_few_for_one_pod(pods_c, pods_b)) is not None:
        reason = head + few + found
    elif factor is not None:
        reason = (head + f": not enough evidence yet; a pass needs about {needs['calls']} more "
                  f"canary calls (~{duration(needs['seconds'])} at the current rate)" + found)
    elif float(track.d[-1]) >= 0:
        reason = head + ": not enough evidence yet to pass or fail" + found
    else:
        reason = (head + f": cannot pass at this spread between pods ({spread_shown:.2g} "
                  f"{unit}) with {pods_c} canary {pod_word}; more pods would decide" + found)
    return replace(
        pooled, verdict=verdict, reason=reason + found_aside,
        e_fail=float(log_clip(np.array(lf))), e_pass=float(log_clip(np.array(lp))),
        pods={
            "baseline": int(track.pods_baseline[-1]), "canary": pods_c,
            key: _num(spread_shown, 3),
            "worst": worst_name, "worst_share": _num(share, 3), "concentrated": concentrated,
            "e_fail_all_pods": _num(float(log_clip(np.array(lfa)))),
            "set_aside": aside,
            **({} if warmup is None else {"warmup": dict(warmup)}),
        },
        needs=needs, rule=PODS,
    )


def set_aside(track: PodTrack, names: Sequence[str], is_canary: npt.NDArray[np.bool_],
              what: str) -> tuple[list[str], str]:
    """The pods `track`'s last look set aside as sick (`_pod_spread.outlier`), by name, and the
    finding that says so ("" for none); `names` the grid's rows as the track saw them."""
    canary_names = [p for p, c in zip(names, is_canary, strict=True) if c]
    out = []
    if int(track.aside_canary[-1]) >= 0:
        out.append(canary_names[int(track.aside_canary[-1])])
    if int(track.aside_baseline[-1]) >= 0:
        out.append(names[int(track.aside_baseline[-1])])
    if not out:
        return [], ""
    return out, (f"; set aside as sick: {', '.join(out)} (its {what} beyond what the other "
                 "pods' spread allows; the version is judged on the rest)")


def too_few_for_one_pod(pods_canary: int, pods_baseline: int) -> str | None:
    """Why a canary of one pod is not judged, where its baseline has too few pods."""
    if pods_canary != 1 or pods_baseline >= ONE_POD_BASELINE:
        return None
    return (f": a canary of one pod is judged against {ONE_POD_BASELINE} baseline pods "
            f"or more ({pods_baseline} here: too few to show the spread a new pod may have); "
            "a second canary pod would decide")


def fails_against_one_pod(pods_canary: int, pods_baseline: int) -> str | None:
    """Why p99 cannot fail where the baseline has one pod with calls: its p99 is tested as
    a pod of the baseline's version against the canary pods' spread, which takes
    `ONE_POD_BASELINE` canary pods to show (as a canary of one pod needs as many baseline
    pods)."""
    if pods_baseline != 1 or pods_canary >= ONE_POD_BASELINE:
        return None
    return (f"; it cannot fail against a baseline of one pod ({pods_canary} canary pods: "
            f"{ONE_POD_BASELINE} or more show the spread one pod is judged against); a second "
            "baseline pod would decide")


def pod_reason(head: str, verdict: str, fails_with_every_pod: bool, pods_canary: int,
               worst: str | None, share: float, concentrated: bool, what: str,
               words: tuple[str, str] = ("worse", "sick")) -> str | None:
    """A pod-level verdict's reason when it is decided, or held back by its worst pod (None
    otherwise: the caller says how far it is). `head` says the estimates; `what` what the
    worst pod's `share` counts; `words` ("worse", "sick") say how a pod differs."""
    finding = concentration_finding(str(worst), share, what)
    found = "; " + finding if concentrated else ""
    worse, sick = words
    if verdict == FAIL and pods_canary == 1:
        return (head + f": the canary's one pod {worst} is {worse} than the baseline's pods "
                f"allow; one pod cannot tell a {sick} pod from a {sick} version: restart "
                f"{worst}, or add a canary pod, to tell")
    if verdict == FAIL:
        return head + f": {worse} across the canary's pods, not on one pod alone" + found
    if verdict == PASS and pods_canary == 1:
        return head + f": within tolerance, the canary's one pod {worst} within the baseline's pods"
    if verdict == PASS:
        return head + ": within tolerance" + found
    if fails_with_every_pod and concentrated:
        return (head + f": {worse} only on its worst pod: {finding}, set aside; "
                "not across the version's pods")
    if fails_with_every_pod and pods_canary > 1:
        return (head + f": {worse} with every pod in, not yet with its worst pod "
                f"({worst}, {100 * share:.0f} % of the canary's {what}) set aside")
    return None


def duration(seconds: float | None) -> str:
    """A wait for a reason: seconds under two minutes, else minutes."""
    if seconds is None:
        return "?"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def latency_p99(
    cum_b: F64, cum_c: F64, layout: quantile.Layout, tol: Tolerances, alpha: float
) -> list[MetricVerdict]:
    """Fail when the canary's p99 exceeds ratio × baseline p99 + margin (pooled histograms)."""
    p = 0.99
    log_thr = math.log(1.0 / alpha)
    test = rules.latency_test(cum_b, cum_c, layout, tol, log_thr)
    est_b = quantile.quantile_estimate(cum_b, layout, p) * 1000.0
    est_c = quantile.quantile_estimate(cum_c, layout, p) * 1000.0
    lo_b, hi_b = (x * 1000.0 for x in quantile.quantile_cs(cum_b, layout, p, log_thr))
    lo_c, hi_c = (x * 1000.0 for x in quantile.quantile_cs(cum_c, layout, p, log_thr))

    def row(i: int) -> tuple[CohortEvidence, CohortEvidence, str]:
        ratio = est_c[i] / est_b[i] if est_b[i] > 0 else math.inf
        return (
            CohortEvidence(est_b[i], lo_b[i], hi_b[i], {"samples": int(cum_b[i, -1])}),
            CohortEvidence(est_c[i], lo_c[i], hi_c[i], {"samples": int(cum_c[i, -1])}),
            f"p99 latency {_sig(est_c[i])} ms vs {_sig(est_b[i])} ms (×{ratio:.2f}; "
            f"allowed ×{_fmt(tol.latency_p99_ratio)} + {_fmt(tol.latency_p99_margin_ms)} ms)")

    tolerance = {"max_ratio": tol.latency_p99_ratio, "margin_ms": tol.latency_p99_margin_ms}
    return _verdicts(LATENCY_P99, "ms", test, tolerance, alpha, row)


def attempts_per_request(
    sum_b: F64, count_b: F64, sum_c: F64, count_c: F64, tol: Tolerances, alpha: float,
    attempts_max: int,
) -> list[MetricVerdict]:
    """Fail when the canary's mean upstream attempts exceed ratio × the baseline's.

    Each call's attempts A in [1, attempts_max] is scaled to Y = (A − 1)/(attempts_max − 1)
    in [0, 1], and mean attempts 1 + (A_max − 1)·μ_c ≤ r·(1 + (A_max − 1)·μ_b) is the linear
    null μ_c ≤ r·μ_b + (r − 1)/(A_max − 1) of `bounded.two_sample`. Valid only if no call
    made more than attempts_max attempts (the proxies' retry limit + 1).
    """
    log_thr = math.log(1.0 / alpha)
    span = float(attempts_max - 1)
    y_b = rules.attempts_scaled(sum_b, count_b, attempts_max)
    y_c = rules.attempts_scaled(sum_c, count_c, attempts_max)
    r = tol.attempts_ratio
    test = rules.attempts_test(sum_b, count_b, sum_c, count_c, tol, attempts_max)
    lo_b, hi_b = bounded.mean_cs(y_b, count_b, log_thr)
    lo_c, hi_c = bounded.mean_cs(y_c, count_c, log_thr)

    def row(i: int) -> tuple[CohortEvidence, CohortEvidence, str]:
        mb, mc = sum_b[i] / count_b[i], sum_c[i] / count_c[i]
        return (
            CohortEvidence(mb, 1 + span * lo_b[i], 1 + span * hi_b[i],
                           {"calls": int(count_b[i]), "attempts": int(sum_b[i])}),
            CohortEvidence(mc, 1 + span * lo_c[i], 1 + span * hi_c[i],
                           {"calls": int(count_c[i]), "attempts": int(sum_c[i])}),
            f"attempts per request {_fmt(mc)} vs {_fmt(mb)} (×{mc / mb:.2f}; "
            f"allowed ×{_fmt(r)})")

    return _verdicts(ATTEMPTS, "attempts", test, {"max_ratio": r, "attempts_max": attempts_max},
                     alpha, row)


def stream_resets(
    resets_b: F64, seconds_b: F64, resets_c: F64, seconds_c: F64, tol: Tolerances, alpha: float
) -> list[MetricVerdict]:
    """Fail when the canary's resets per stream-hour exceed ratio × baseline + margin."""
    log_thr = math.log(1.0 / alpha)
    hours_b, hours_c = seconds_b / 3600.0, seconds_c / 3600.0
    r, m = tol.stream_resets_ratio, tol.stream_resets_margin_per_hour
    test = rules.resets_test(resets_b, seconds_b, resets_c, seconds_c, tol)
    lo_b, hi_b = rates.rate_cs(resets_b, hours_b, log_thr)
    lo_c, hi_c = rates.rate_cs(resets_c, hours_c, log_thr)

    def row(i: int) -> tuple[CohortEvidence, CohortEvidence, str]:
        rb, rc = resets_b[i] / hours_b[i], resets_c[i] / hours_c[i]
        return (
            CohortEvidence(rb, lo_b[i], hi_b[i],
                           {"resets": int(resets_b[i]), "stream_hours": _num(hours_b[i]) or 0.0}),
            CohortEvidence(rc, lo_c[i], hi_c[i],
                           {"resets": int(resets_c[i]), "stream_hours": _num(hours_c[i]) or 0.0}),
            f"stream resets {_sig(rc)} vs {_sig(rb)} per stream-hour "
            f"(allowed ×{_fmt(r)} + {_fmt(m)} per hour)")

    return _verdicts(STREAM_RESETS, "per_hour", test, {"max_ratio": r, "margin_per_hour": m},
                     alpha, row)
