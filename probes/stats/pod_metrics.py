"""p99 latency and attempts per request with the pod as the unit of evidence.

The success rate's pod-level verdict (`probes.stats.metrics.pod_success_rate`) has two
siblings here, each fed from the pods × windows grid's per-pod attempts and latency
(`probes.stats.pod_cells`, store schema v2):

- attempts per request: the scaled retry volume (A − 1)/(A_max − 1) of each call, a
  [0, 1]-bounded value, through the same pod-clustered, time-stratified test and decision
  rule as the success rate (`metrics.pod_bounded_verdict`, `probes.stats.pods`);
- p99 latency: the pooled quantile test with the worst pod of each cohort left out for a
  fail (`probes.stats.pod_quantile`).

A grid without per-pod attempts and latency for its whole span (a store written before
schema v2) keeps the pooled verdict, and its reason says so; `rule` tells which was used.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from probes._spec import Tolerances
from probes.measure.histogram import LOWER, UPPER
from probes.stats import metrics as M
from probes.stats._num import log_clip
from probes.stats.metrics import MetricVerdict, json_number
from probes.stats.pod_quantile import pod_quantile_track
from probes.stats.pods import PodGrid
from probes.stats.quantile import Layout

__all__ = ["P99_SLOW", "pod_attempts", "pod_latency_p99"]

_LAYOUT = Layout.from_edges(LOWER, UPPER)
# What the p99 finding counts, in the words of the reason and the report.
P99_SLOW = "calls above the baseline's p99"


def _unrecorded(pooled: MetricVerdict, what: str) -> MetricVerdict:
    return replace(pooled, reason=f"{pooled.reason} (judged on pooled calls: no per-pod "
                                  f"{what} in the store for all of this span, as in windows "
                                  "written before store schema v2)")


def _rows(grid: PodGrid, baseline: str, canary: str) -> tuple[np.ndarray, np.ndarray]:
    rows = np.array([c in (baseline, canary) for c in grid.cohorts], dtype=bool)
    return rows, grid.of(canary)[rows]


def pod_attempts(grid: PodGrid, baseline: str, canary: str, tol: Tolerances, alpha: float,
                 window_s: float, attempts_max: int, pooled: MetricVerdict) -> MetricVerdict:
    """Attempts per request with the pod as the unit (module docstring); `pooled` is the
    verdict on cohort totals, kept when the grid has no per-pod attempts."""
    if not grid.per_pod_metrics or grid.attempts_calls is None or grid.attempts_sum is None:
        return _unrecorded(pooled, "attempts")
    rows, is_canary = _rows(grid, baseline, canary)
    n, total = grid.attempts_calls[rows], grid.attempts_sum[rows]
    both = (n[~is_canary].sum(axis=0) > 0) & (n[is_canary].sum(axis=0) > 0)
    if not both.any():
        return M.missing(M.ATTEMPTS, "attempts", pooled.tolerance, alpha,
                         "attempts per request: the cohorts have no warm window with attempts "
                         "in common yet (each pod's warm-up is left out)")
    span = float(attempts_max - 1)
    sum_b, cnt_b, sum_c, cnt_c = (np.array([x[:, both].sum()]) for x in (
        total[~is_canary], n[~is_canary], total[is_canary], n[is_canary]))
    warm = M.attempts_per_request(sum_b, cnt_b, sum_c, cnt_c, tol, alpha, attempts_max)[0]
    r = tol.attempts_ratio
    return M.pod_bounded_verdict(
        warm, grid, rows, is_canary, n, (total - n) / span, r, min((r - 1.0) / span, 1 - 1e-12),
        window_s, what="retries", spread=("spread_attempts", span, "attempts per request"))


def pod_latency_p99(grid: PodGrid, baseline: str, canary: str, tol: Tolerances,
                    alpha: float, pooled: MetricVerdict) -> MetricVerdict:
    """p99 latency with the pod as the unit (module docstring): a fail only with each
    cohort's worst pod left out; `pooled` is kept when the grid has no per-pod latency."""
    if not grid.per_pod_metrics or grid.latency is None:
        return _unrecorded(pooled, "latency")
    rows, is_canary = _rows(grid, baseline, canary)
    hist = grid.latency[rows]
    tot_b, tot_c = hist[~is_canary].sum(axis=0), hist[is_canary].sum(axis=0)
    if not (tot_b.sum() > 0 and tot_c.sum() > 0):
        return M.missing(M.LATENCY_P99, "ms", pooled.tolerance, alpha,
                         "p99 latency: the cohorts have no warm calls yet (each pod's warm-up "
                         "is left out)")
    warm = M.latency_p99(np.cumsum(tot_b)[None, :], np.cumsum(tot_c)[None, :], _LAYOUT, tol,
                         alpha)[0]
    log_thr = math.log(1.0 / alpha)
    track = pod_quantile_track(hist[:, None, :], is_canary, _LAYOUT, 0.99,
                               tol.latency_p99_ratio, tol.latency_p99_margin_ms / 1000.0,
                               log_thr)
    lf, lfa, lp = (float(x[-1]) for x in (track.log_e_fail, track.log_e_fail_all,
                                          track.log_e_pass))
    canary_names = [p for p, keep, c in zip(grid.pods, rows, grid.of(canary), strict=True)
                    if keep and c]
    pods_c, pods_b = int(track.pods_canary[-1]), int(track.pods_baseline[-1])
    worst = canary_names[int(track.worst[-1])] if canary_names else None
    share, call_share = float(track.worst_share[-1]), float(track.worst_call_share[-1])
    concentrated = pods_c >= 2 and share >= 0.5 and share >= 2 * call_share
    verdict = M.FAIL if lf >= log_thr else M.PASS if lp >= log_thr else M.INCONCLUSIVE
    pod_word = "pod" if pods_c == 1 else "pods"
    head = warm.reason.split(")")[0] + f"; {pods_c} canary {pod_word} vs {pods_b})"
    reason = M.pod_reason(head, verdict, lfa >= log_thr, pods_c, worst, share, concentrated,
                          P99_SLOW, ("slower", "slow"))
    if reason is None:
        found = ("; " + M.concentration_finding(str(worst), share, P99_SLOW)
                 if concentrated else "")
        reason = head + ": not enough evidence yet to pass or fail" + found
    return replace(
        warm, verdict=verdict, reason=reason,
        e_fail=float(log_clip(np.array(lf))), e_pass=float(log_clip(np.array(lp))),
        pods={"baseline": pods_b, "canary": pods_c, "worst": worst,
              "worst_share": json_number(share, 3), "concentrated": concentrated,
              "e_fail_all_pods": json_number(float(log_clip(np.array(lfa))))},
        rule=M.PODS,
    )
