"""p99 from the pods' pooled histograms: which canary pod is the worst, and the evidence with
every call counted as independent.

The p99 verdict with the pod as the unit (`probes.verdict.pod_metrics`) decides on
exceedances per pod (`probes.stats.pod_exceed`: the spread between pods is noise on both
sides). This module gives it the rest, from each cohort's pooled histogram over its pods:

- the canary's worst pod: its excess of calls above the baseline's p99 estimate,
  `above_i − (1 − p)·n_i` (its calls slower than the estimate beyond the share a pod at the
  baseline's p99 would have), and its share of the canary's calls above that estimate:
  "concentrated on shop-0 (80 % of the canary's calls above the baseline's p99)";
- `log_e_fail_all` / `log_e_pass`: the pooled quantile test (`probes.stats.quantile.
  two_sample`) with every pod in, which the reason quotes when only the worst pod makes the
  canary look slow (what a test that counts every call as independent would conclude);
- `log_e_fail`: the same with each cohort's worst pod's calls left out (the baseline's chosen
  against the whole baseline's estimate, the canary's against the estimate without it). It
  still counts no spread between pods, so the verdict does not decide on it (BENCHMARKS.md
  D18); `benchmarks/p99_pods_sim.py` measures it beside the live rule.

Input: per-pod histograms (pods, looks, buckets), each look's counts cumulative over time,
so the simulation replays every look and the live verdict asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from probes.stats import quantile
from probes.stats.bounded import TwoSample

__all__ = ["PodQuantile", "WorstPods", "pod_quantile_track", "worst_pods"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class PodQuantile:
    """`pod_quantile_track`'s result, one entry per look. `log_e_fail` leaves both cohorts'
    worst pods out (−inf while the canary has fewer than two pods with calls);
    `log_e_fail_all` and `log_e_pass` keep every pod. `worst` is the canary's worst pod (an
    index into the canary's pods), `worst_share` its share of the canary's calls above the
    baseline's p99 estimate, `worst_call_share` its share of the canary's calls."""

    log_e_fail: F64
    log_e_fail_all: F64
    log_e_pass: F64
    pods_baseline: I64
    pods_canary: I64
    worst: I64
    worst_share: F64
    worst_call_share: F64


def _rank_bucket(cum: F64, p: float) -> I64:
    """Per row of cumulative counts, the bucket holding rank ⌈p·n⌉ (as `quantile_estimate`)."""
    n = cum[:, -1]
    rank = np.maximum(1.0, np.ceil(np.round(p * n, 9)))
    return np.minimum(np.sum(cum < rank[:, None], axis=1), cum.shape[1] - 1).astype(np.int64)


def _excess(cum: F64, cut: I64, p: float) -> tuple[F64, F64, F64]:
    """Per pod and look, from cumulative bucket counts (pods, looks, buckets): calls, calls
    in buckets above `cut[look]`, and the excess of those over the share (1 − p) of the
    pod's calls."""
    n = cum[..., -1]
    at = np.take_along_axis(cum, np.broadcast_to(cut[None, :, None], (*cum.shape[:2], 1)),
                            axis=-1)[..., 0]
    above = n - at
    return n, above, above - (1.0 - p) * n


def _drop(cum: F64, who: I64) -> F64:
    """The cohort's cumulative bucket counts per look with pod `who[look]` (−1: none) out."""
    total = cum.sum(axis=0)
    if not cum.shape[0]:
        return total
    looks = np.arange(cum.shape[1])
    out = cum[np.maximum(who, 0), looks]
    return np.asarray(total - np.where((who >= 0)[:, None], out, 0.0), dtype=np.float64)


def pod_quantile_track(hist: F64, canary: Bool, layout: quantile.Layout, p: float,
                       ratio: float, margin_s: float, log_threshold: float, *,
                       tests: bool = True) -> PodQuantile:
    """The test of H0: q_c ≤ ratio·q_b + margin_s at every look, with the pod as the unit
    (module docstring). `hist`: (pods, looks, buckets of `layout`), each look cumulative
    over time; `canary`: (pods,) cohort flags. Without `tests`, only the pods and the worst
    pod are found (the e-values are −inf): what the live verdict needs from here."""
    # Every count below is read from one cumulative sum over the buckets.
    cum = np.cumsum(np.asarray(hist, dtype=np.float64), axis=-1)
    canary = np.asarray(canary, dtype=bool)
    cb, cc = cum[~canary], cum[canary]
    looks = cum.shape[1]
    tot_b, tot_c = cb.sum(axis=0), cc.sum(axis=0)

    def test(b: F64, c: F64) -> TwoSample:
        return quantile.two_sample(b, c, layout, p, ratio, margin_s, log_threshold)

    neg = np.full(looks, -np.inf)
    no_test = TwoSample(neg, neg)
    every = test(tot_b, tot_c) if tests else no_test
    n_b, _, ex_b = _excess(cb, _rank_bucket(tot_b, p), p)
    pods_b = (n_b > 0).sum(axis=0)
    drop_b = np.where(pods_b >= 2, np.argmax(np.where(n_b > 0, ex_b, -np.inf), axis=0)
                      if cb.shape[0] else 0, -1)
    base_wo = _drop(cb, drop_b)
    n_c, above_c, ex_c = _excess(cc, _rank_bucket(base_wo, p), p)
    pods_c = (n_c > 0).sum(axis=0)
    worst = (np.argmax(np.where(n_c > 0, ex_c, -np.inf), axis=0) if cc.shape[0]
             else np.zeros(looks, dtype=np.int64))
    trimmed = test(base_wo, _drop(cc, np.where(pods_c >= 1, worst, -1))) if tests else no_test
    cols = np.arange(looks)
    with np.errstate(divide="ignore", invalid="ignore"):
        total_above, total_c = above_c.sum(axis=0), n_c.sum(axis=0)
        share = (np.where(total_above > 0, above_c[worst, cols] / total_above, 0.0)
                 if cc.shape[0] else np.zeros(looks))
        call_share = (np.where(total_c > 0, n_c[worst, cols] / total_c, 0.0)
                      if cc.shape[0] else np.zeros(looks))
    empty = (tot_b[:, -1] <= 0) | (tot_c[:, -1] <= 0)
    return PodQuantile(
        log_e_fail=np.where(empty | (pods_c < 2), neg, trimmed.log_e_fail),
        log_e_fail_all=np.where(empty, neg, every.log_e_fail),
        log_e_pass=np.where(empty, neg, every.log_e_pass),
        pods_baseline=pods_b.astype(np.int64), pods_canary=pods_c.astype(np.int64),
        worst=np.asarray(worst, dtype=np.int64), worst_share=np.asarray(share, np.float64),
        worst_call_share=np.asarray(call_share, np.float64),
    )


@dataclass(frozen=True, slots=True, eq=False)
class WorstPods:
    """`worst_pods`' result, per group: `pod_quantile_track(tests=False)`'s pods, worst
    canary pod (an index into the group's canary pods) and its shares, at one look."""

    pods_baseline: I64
    pods_canary: I64
    worst: I64
    worst_share: F64
    worst_call_share: F64


def worst_pods(hist: F64, canary: Bool, real: Bool, p: float, *,
               cumulative: bool = False) -> WorstPods:
    """`pod_quantile_track(tests=False)` at one look for many groups at once (one per path):
    `hist` (groups, pods, buckets), pods padded with `real` False; `canary` (groups, pods);
    `cumulative`: `hist` summed over its buckets already (the caller has that sum too).
    The same numbers: every sum is of counts, exact in any order, and ties go to the first
    pod as in the group's own pods."""
    cum = (np.asarray(hist, dtype=np.float64) if cumulative
           else np.cumsum(np.asarray(hist, dtype=np.float64), axis=-1))
    g_n = cum.shape[0]
    groups = np.arange(g_n)
    cm = canary & real
    base = real & ~canary
    n = cum[..., -1]

    def above_cut(cut: I64) -> F64:
        at = np.take_along_axis(cum, np.broadcast_to(cut[:, None, None], (*cum.shape[:2], 1)),
                                axis=-1)[..., 0]
        return np.asarray(n - at, dtype=np.float64)

    tot_b = np.matmul(base[:, None, :].astype(np.float64), cum)[:, 0]
    above_b = above_cut(_rank_bucket(tot_b, p))
    ex_b = above_b - (1.0 - p) * n
    pods_b = (base & (n > 0)).sum(axis=1)
    drop = np.argmax(np.where(base & (n > 0), ex_b, -np.inf), axis=1)
    base_wo = tot_b - np.where((pods_b >= 2)[:, None], cum[groups, drop], 0.0)
    above_c = above_cut(_rank_bucket(base_wo, p))
    ex_c = above_c - (1.0 - p) * n
    live = cm & (n > 0)
    pods_c = live.sum(axis=1)
    # With no canary pod that has calls, the first canary pod (as an argmax of all -inf).
    at = np.where(pods_c > 0, np.argmax(np.where(live, ex_c, -np.inf), axis=1),
                  np.argmax(cm, axis=1))
    worst = np.where(cm.any(axis=1), (np.cumsum(cm, axis=1) - 1)[groups, at], 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        total_above = np.where(cm, above_c, 0.0).sum(axis=1)
        total_c = np.where(cm, n, 0.0).sum(axis=1)
        share = np.where(total_above > 0, above_c[groups, at] / total_above, 0.0)
        call_share = np.where(total_c > 0, n[groups, at] / total_c, 0.0)
    return WorstPods(pods_b.astype(np.int64), pods_c.astype(np.int64),
                     worst.astype(np.int64), np.asarray(share, dtype=np.float64),
                     np.asarray(call_share, dtype=np.float64))
