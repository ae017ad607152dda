"""p99 latency and attempts per request with the pod as the unit of evidence.

The success rate's pod-level verdict (`probes.verdict.metrics.pod_success_rate`) has two
siblings here, each fed from the pods × windows grid's per-pod attempts and latency
(`probes.stats.pod_cells`, store schema v2):

- attempts per request: the scaled retry volume (A − 1)/(A_max − 1) of each call, a
  [0, 1]-bounded value, through the same pod-clustered, time-stratified test and decision
  rule as the success rate (`metrics.pod_bounded_verdict`, `probes.stats.pods`);
- p99 latency: each call an exceedance of a cut near the baseline's p99, per pod, through
  the same test, so the spread between pods is noise on both sides: a fail from the profile
  e-value over candidate baseline p99s, each cohort's worst pod capped or left out
  (`probes.stats.pod_profile`), a pass that holds across the canary's pods
  (`probes.stats.pod_exceed`); the worst pod's finding from the pods' histograms
  (`probes.stats.pod_quantile`).

A grid without per-pod attempts and latency for its whole span (a store written before
schema v2) keeps the pooled verdict, and its reason says so; `rule` tells which was used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.measure.histogram import LOWER, UPPER
from probes.spec import Tolerances
from probes.stats.pod_exceed import ExceedanceCuts, Exceedances, exceedance_cuts, pass_tracks
from probes.stats.pod_profile import (
    CS_SHARE,
    ProfileCuts,
    ProfileInput,
    profile_cuts,
    profile_fails,
    profile_input,
    profile_threshold,
)
from probes.stats.pod_quantile import WorstPods, worst_pods
from probes.stats.pods import PodGrid, PodTrack, TrackMemo, batches, needs_factor
from probes.stats.quantile import Layout
from probes.verdict import metrics as M
from probes.verdict.metrics import MetricVerdict, json_number, log_clip

__all__ = [
    "P99_SLOW",
    "attempts_recorded",
    "latency_recorded",
    "pod_attempts",
    "pod_attempts_many",
    "pod_latency_p99",
    "pod_latency_p99s",
]

F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]

_LOG2 = math.log(2.0)
_LAYOUT = Layout.from_edges(LOWER, UPPER)
_P = 0.99  # the quantile judged
# What the p99 finding counts, in the words of the reason and the report.
P99_SLOW = "calls above the baseline's p99"


def _unrecorded(pooled: MetricVerdict, what: str) -> MetricVerdict:
    return replace(pooled, reason=f"{pooled.reason} (judged on pooled calls: no per-pod "
                                  f"{what} in the store for all of this span, as in windows "
                                  "written before store schema v2)")


def _rows(grid: PodGrid, baseline: str, canary: str) -> tuple[np.ndarray, np.ndarray]:
    rows = np.array([c in (baseline, canary) for c in grid.cohorts], dtype=bool)
    return rows, grid.of(canary)[rows]


def attempts_recorded(grid: PodGrid) -> bool:
    """Whether `grid` carries per-pod attempts for its whole span (store schema v2)."""
    return (grid.per_pod_metrics and grid.attempts_calls is not None
            and grid.attempts_sum is not None)


def pod_attempts_many(grids: Sequence[PodGrid], baseline: str, canary: str, tol: Tolerances,
                      alpha: float, window_s: float, attempts_max: int,
                      memo: TrackMemo | None = None) -> list[MetricVerdict]:
    """Attempts per request with the pod as the unit (module docstring), one per grid (each
    `attempts_recorded`); the pooled figures that head each reason computed at once.
    `memo`: the running probe's sums kept between verdicts (`pods.TrackMemo`)."""
    span = float(attempts_max - 1)
    judged, sums, decided = [], [], []
    for i, g in enumerate(grids):
        rows, is_canary = _rows(g, baseline, canary)
        n, total = M.cohort_rows(g.attempts_calls, rows), M.cohort_rows(g.attempts_sum, rows)
        # Attempts and calls are whole numbers: summed in any order, the same sums.
        head = M.grid_sums(g, n, total, is_canary, memo, (("head", i),))
        decided.append(bool(head.both.any()))
        if decided[-1]:
            n_b, t_b, n_c, t_c = head.totals.tolist()
            sums.append([t_b, n_b, t_c, n_c])
            # The retry volume in place of `total`, which is not kept past its grid.
            judged.append((g, rows, is_canary, n, (total - n) / span))
    cols = np.array(sums).T
    heads = iter(M.attempts_per_request(cols[0], cols[1], cols[2], cols[3], tol, alpha,
                                        attempts_max) if sums else [])
    r = tol.attempts_ratio
    tolerance = {"max_ratio": r, "attempts_max": attempts_max}
    verdicts = iter(M.pod_bounded_verdicts(
        [next(heads) for _ in judged], judged, r, min((r - 1.0) / span, 1 - 1e-12), window_s,
        what="retries", spread=("spread_attempts", span, "attempts per request"), memo=memo))
    return [
        next(verdicts) if d
        else M.missing(M.ATTEMPTS, "attempts", tolerance, alpha,
                       "attempts per request: the cohorts have no warm window with "
                       "attempts in common yet (each pod's warm-up is left out)")
        for d in decided
    ]


def pod_attempts(grid: PodGrid, baseline: str, canary: str, tol: Tolerances, alpha: float,
                 window_s: float, attempts_max: int, pooled: MetricVerdict) -> MetricVerdict:
    """`pod_attempts_many` for one grid; `pooled` (the verdict on cohort totals) is kept
    when the grid has no per-pod attempts."""
    if not attempts_recorded(grid):
        return _unrecorded(pooled, "attempts")
    return pod_attempts_many([grid], baseline, canary, tol, alpha, window_s, attempts_max)[0]


def _stacked(parts: Sequence[_P99Part], used: slice) -> tuple[F64, Bool, Bool]:
    """The parts' pods' histograms, buckets `used`, as one (parts, pods, buckets) array,
    pods padded with empty ones (`real` False), and which are the canary's."""
    width = max(len(p.is_canary) for p in parts)
    hist = np.zeros((len(parts), width, used.stop - used.start))
    canary = np.zeros((len(parts), width), dtype=bool)
    real = np.zeros((len(parts), width), dtype=bool)
    for i, p in enumerate(parts):
        k = len(p.is_canary)
        hist[i, :k], canary[i, :k], real[i, :k] = (p.latency()[p.rows, used], p.is_canary,
                                                   True)
    return hist, canary, real


def _used(parts: Sequence[_P99Part]) -> slice:
    """The buckets from the first any of the parts' compared pods has a call in to the
    last: outside them every pod's counts are 0 (counts, never below 0), so each pod's
    calls below a bucket are 0 before them and all its calls after."""
    some = np.flatnonzero(np.any([p.tot_b + p.tot_c > 0 for p in parts], axis=0))
    return slice(int(some[0]), int(some[-1]) + 1) if len(some) else slice(0, 0)


def _by_pod(parts: Sequence[_P99Part], cuts: ExceedanceCuts, profile: ProfileCuts) -> _ByPod:
    """Each part's exceedances (part i at row i), each pod's warm calls pooled over time:
    the fail side's at every candidate of the profile (`probes.stats.pod_profile`), the pass
    side's at `cuts` (`probes.stats.pod_exceed`), and its worst canary pod (`worst_pods`).
    The pods' histograms are stacked a batch of parts at a time (`pods.batches`) and dropped
    before the next, so the peak is a batch's copies of them, not every path's; each
    batch's numbers are what all parts at once give (sums of counts, exact in any order)."""
    out: _ByPod = ([], [], [])
    buckets = parts[0].latency().shape[1]
    for lo, hi in batches([(len(p.is_canary), buckets + 1) for p in parts]):
        used = _used(parts[lo:hi])
        hist, canary_pods, real = _stacked(parts[lo:hi], used)
        # Each pod's calls below each bucket, then all of them (a cut past the last counts
        # none): its calls from a cut on are all less those below, exact (sums of counts).
        # Summed over the buckets used alone: the same sums, each of the same counts.
        below = np.zeros((*hist.shape[:2], buckets + 1))
        np.cumsum(hist, axis=-1, out=below[..., used.start + 1:used.stop + 1])
        below[..., used.stop + 1:] = below[..., used.stop:used.stop + 1]
        del hist
        found = worst_pods(below[..., 1:], canary_pods, real, _P, cumulative=True)
        calls = below[..., -1].copy()  # not a view: `below` is dropped with the batch
        rows = np.arange(hi - lo)
        b_level, c_pass = (calls - below[rows, :, np.asarray(cut)[lo:hi]]
                           for cut in (cuts.baseline_level, cuts.canary_pass))
        for row, part in enumerate(parts[lo:hi]):
            k = len(part.is_canary)
            out[0].append(profile_input(below[row, :k], part.is_canary, profile, lo + row))
            out[1].append((calls[row, :k, None], b_level[row, :k, None], c_pass[row, :k, None],
                           part.is_canary))
            out[2].append((found, row))
        del below
    return out


def latency_recorded(grid: PodGrid) -> bool:
    """Whether `grid` carries per-pod latency for its whole span (store schema v2)."""
    return grid.per_pod_metrics and grid.latency is not None


def pod_latency_p99s(grids: Sequence[PodGrid], baseline: str, canary: str, tol: Tolerances,
                     alpha: float, window_s: float) -> list[MetricVerdict]:
    """p99 latency with the pod as the unit (module docstring), one per grid (each
    `latency_recorded`): fail and pass on exceedances per pod, the spread between pods as
    noise, a fail that no single pod of either cohort makes. The pooled figures that head each
    reason are computed for every grid at once."""
    parts = []
    for g in grids:
        rows, is_canary = _rows(g, baseline, canary)
        hist, of_canary = np.asarray(g.latency, dtype=np.float64), g.of(canary)
        # The cohorts' rows summed from the grid's own array: no copy of the pods' rows kept.
        parts.append(_P99Part(g, rows, is_canary, hist[rows & ~of_canary].sum(axis=0),
                              hist[rows & of_canary].sum(axis=0)))
    judged = [p for p in parts if p.tot_b.sum() > 0 and p.tot_c.sum() > 0]
    heads: dict[int, tuple[MetricVerdict, tuple[float, PodTrack], _Worst]] = {}
    if judged:
        cum_b = np.cumsum(np.stack([p.tot_b for p in judged]), axis=1)
        cum_c = np.cumsum(np.stack([p.tot_c for p in judged]), axis=1)
        warm = M.latency_p99(cum_b, cum_c, _LAYOUT, tol, alpha)
        r, m = tol.latency_p99_ratio, tol.latency_p99_margin_ms / 1000.0
        # The pass splits α in two: the baseline p99's confidence sequence that places its
        # cuts, and the exceedance track (a pass needs both to hold). The fail is the
        # profile over the baseline's p99 (`pod_profile`).
        log_half = math.log(2.0 / alpha)
        cuts = exceedance_cuts(cum_b, _LAYOUT, _P, r, m, log_half)
        fails, passes, worst = _by_pod(judged, cuts, profile_cuts(cum_b, cum_c, _LAYOUT, _P,
                                                                  r, m, alpha))
        # Every part's tracks in one call per side, as `pod_tracks` batches them.
        tracks = zip(profile_fails(fails, _P, alpha)[0].tolist(),
                     pass_tracks(passes, _P, log_threshold=log_half, last_only=True),
                     strict=True)
        heads = {id(p): (h, t, w) for p, h, t, w in zip(judged, warm, tracks, worst,
                                                        strict=True)}
    tolerance = {"max_ratio": tol.latency_p99_ratio, "margin_ms": tol.latency_p99_margin_ms}
    return [
        _pod_p99(p, canary, tol, alpha, window_s, *heads[id(p)]) if id(p) in heads
        else M.missing(M.LATENCY_P99, "ms", tolerance, alpha,
                       "p99 latency: the cohorts have no warm calls yet (each pod's warm-up "
                       "is left out)")
        for p in parts
    ]


def pod_latency_p99(grid: PodGrid, baseline: str, canary: str, tol: Tolerances,
                    alpha: float, window_s: float, pooled: MetricVerdict) -> MetricVerdict:
    """`pod_latency_p99s` for one grid; `pooled` (the verdict on cohort totals) is kept when
    the grid has no per-pod latency."""
    if not latency_recorded(grid):
        return _unrecorded(pooled, "latency")
    return pod_latency_p99s([grid], baseline, canary, tol, alpha, window_s)[0]


# Which canary pod is the worst, and its share of the canary's slow calls: `worst_pods` of
# every judged part, and the part's row in it.
_Worst = tuple[WorstPods, int]
# Per judged part, the fail side's and the pass side's exceedances, and its worst canary pod.
_ByPod = tuple[list[ProfileInput], list[Exceedances], list[_Worst]]


@dataclass(frozen=True, slots=True, eq=False)
class _P99Part:
    grid: PodGrid
    rows: Bool
    is_canary: Bool
    tot_b: F64
    tot_c: F64

    def latency(self) -> F64:
        """The grid's pods' histograms, every row (`rows` picks the cohorts')."""
        return np.asarray(self.grid.latency, dtype=np.float64)


def _pod_p99(part: _P99Part, canary: str, tol: Tolerances, alpha: float, window_s: float,
             warm: MetricVerdict, tracks: tuple[float, PodTrack], worst_of: _Worst
             ) -> MetricVerdict:
    """One grid's p99 verdict; `warm` is the pooled test on its warm calls (the estimates
    that head the reason, and the evidence with every call counted as independent),
    `tracks` its fail side's log profile e-value (`pod_profile.profile_fails`) and its pass
    side's exceedance track (judged at α/2), `worst_of` its worst canary pod (`_Worst`)."""
    grid, rows, is_canary = part.grid, part.rows, part.is_canary
    tot_c = part.tot_c
    log_thr = math.log(1.0 / alpha)
    log_half = math.log(2.0 / alpha)
    lf, ok = tracks
    worst_pods_, row = worst_of
    # With every pod in, the evidence is the pooled test's (every call independent): what
    # the reason quotes when only the worst pod makes the canary look slow.
    lp = float(ok.log_e_pass[-1])
    lfa = math.log(warm.e_fail) if warm.e_fail else -math.inf
    canary_names = [p for p, keep, c in zip(grid.pods, rows, grid.of(canary), strict=True)
                    if keep and c]
    pods_c, pods_b = int(worst_pods_.pods_canary[row]), int(worst_pods_.pods_baseline[row])
    worst = canary_names[int(worst_pods_.worst[row])] if canary_names else None
    share = float(worst_pods_.worst_share[row])
    call_share = float(worst_pods_.worst_call_share[row])
    concentrated = pods_c >= 2 and share >= 0.5 and share >= 2 * call_share
    verdict = (M.FAIL if lf >= profile_threshold(alpha) else M.PASS if lp >= log_half
               else M.INCONCLUSIVE)
    pod_word = "pod" if pods_c == 1 else "pods"
    head = warm.reason.split(")")[0] + f"; {pods_c} canary {pod_word} vs {pods_b})"
    names = [p for p, keep in zip(grid.pods, rows, strict=True) if keep]
    aside, aside_found = M.set_aside(ok, names, is_canary, "calls in the tail")
    reason = M.pod_reason(head, verdict, lfa >= log_thr, pods_c, worst, share, concentrated,
                          P99_SLOW, ("slower", "slow"))
    spread = 100.0 * float(ok.tau[-1])
    needs: dict[str, Any] = {"calls": None, "seconds": None}
    if reason is None and (few := M.too_few_for_one_pod(pods_c, pods_b)) is not None:
        reason = head + few
    if reason is None:
        found = ("; " + M.concentration_finding(str(worst), share, P99_SLOW)
                 if concentrated else "")
        factor = needs_factor(-float(ok.d[-1]), float(ok.v_sampling[-1]),
                              float(ok.v_pods[-1]), log_half)
        if factor is not None:
            # The canary's warm calls came in the windows both cohorts have calls in.
            n = grid.calls[rows]
            both = (n[~is_canary].sum(axis=0) > 0) & (n[is_canary].sum(axis=0) > 0)
            needs = M.needs_more(grid, both, window_s, factor, float(tot_c.sum()))
            reason = (head + f": not enough evidence yet; a pass needs about {needs['calls']} "
                      f"more canary calls (~{M.duration(needs['seconds'])} at the current "
                      "rate)" + found)
        elif float(ok.d[-1]) < 0 and spread > 0:
            reason = (head + ": cannot pass at this spread between pods (their shares of "
                      f"calls in the tail differ by {spread:.2g} pp) with {pods_c} canary "
                      f"{pod_word} and {pods_b} baseline; more pods, in both cohorts, would "
                      "decide" + found)
        else:
            reason = head + ": not enough evidence yet to pass or fail" + found
    if verdict != M.FAIL or pods_c == 1:
        reason += aside_found
    if verdict != M.FAIL and (cannot := M.fails_against_one_pod(pods_c, pods_b)) is not None:
        reason += cannot
    return replace(
        warm, verdict=verdict, reason=reason,
        # Scaled so that what the JSON says is compared with 1/α, as every metric's is: the
        # fail by the share of α its profile has, the pass halved.
        e_fail=float(log_clip(np.array(lf + math.log1p(-CS_SHARE)))),
        e_pass=float(log_clip(np.array(lp - _LOG2))),
        pods={"baseline": pods_b, "canary": pods_c, "spread_pp": json_number(spread, 3),
              "worst": worst, "worst_share": json_number(share, 3),
              "concentrated": concentrated, "set_aside": aside,
              "e_fail_all_pods": json_number(float(log_clip(np.array(lfa))))},
        needs=needs, rule=M.PODS,
    )
