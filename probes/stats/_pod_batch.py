"""One batch of `probes.stats.pods`' test: grids padded to one shape, the comparison within
each window, the fail and pass e-values per look, and the decision rule (`pod_states`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from probes.stats._num import F64, I64, Acc, Bool, first_max
from probes.stats._pod_mixture import POINT_WEIGHT, log_e_one_sided, log_e_pass
from probes.stats._pod_spread import (
    capped,
    dl_tau2,
    outlier,
    pick,
    spread_term,
    tau2_at,
    tau2_upper,
)

__all__ = ["ONE_POD_BASELINE", "PodTrack", "batch_looks", "pod_batch", "pod_states"]


# Pseudo-calls at the running mean that smooth each window's mean for the variance.
_SMOOTH_CALLS = 50.0
# The fewest pods a cohort must have for one of them to be set aside: with fewer, the
# others' spread is too uncertain to call one of them sick.
_ASIDE_MIN_PODS = 3
# The fewest baseline pods that judge a canary of one pod: fewer show too little of the
# spread a new pod is judged against (at σ 0.5 between pods, 3-5 baseline pods failed a
# healthy one-pod canary in 1-4 % of rollouts at α 1 %; BENCHMARKS.md D21).
ONE_POD_BASELINE = 6
# How many of the baseline's pod standard deviations (τ) beyond them a canary of one pod
# must be to fail, on top of the evidence (D21).
_ONE_POD_TAIL = 2.0
# How many standard errors above its estimate τ² is taken for a canary of one pod. The
# bound rests on baseline pods with a tenth of the canary pod's calls each, so it dominates
# the variance; one standard error kept A/A fails within α with 2.5× the fails at 2× tol (D21).
_ONE_POD_SE = 1.0


@dataclass(frozen=True, slots=True, eq=False)
class PodTrack:
    """`pod_track`'s result: one entry per look (after each window of the grid), or only the
    last look's (`pod_track(last_only=True)`, what the live verdict answers for).

    `log_e_fail` caps the canary's worst pod (one canary pod: judged against the
    baseline's pods); `log_e_fail_all` keeps every pod as it is; `log_e_pass` is against
    "canary beyond tolerance".
    `d` (all pods, fail direction, in standard-deviation units) with the pass's variance in
    two parts, `v_sampling` what grows with the calls (sampling, and the few-pods floor) and
    `v_pods` what grows with their square (the spread term), and the fail side's
    capped `d_wo`, `v_sampling_wo`, `v_pods_wo` let `needs_factor` say how far a
    decision is. `excess` is (canary pods, looks): each canary pod's excess over the
    boundary; `worst` the index (into the canary pods) of the largest. `aside_canary`
    (into the canary pods) and `aside_baseline` (into the grid's pods) name the pod each
    cohort set aside as sick at each look (`outlier`), −1 for none: the pass, and a
    canary of one pod, are judged without them.
    """

    calls_baseline: F64
    calls_canary: F64
    sum_baseline: F64
    sum_canary: F64
    tau: F64
    pods_baseline: I64
    pods_canary: I64
    excess: F64
    worst: I64
    aside_canary: I64
    aside_baseline: I64
    log_e_fail: F64
    log_e_fail_all: F64
    log_e_pass: F64
    d: F64
    v_sampling: F64
    v_pods: F64
    d_wo: F64
    v_sampling_wo: F64
    v_pods_wo: F64


def pod_states(track: PodTrack, log_threshold: float) -> npt.NDArray[np.str_]:
    """The pod-level decision at every look of `track`: "fail" when E_fail, with the
    canary's worst pod capped, reaches 1/α (`log_threshold` = log 1/α); else "pass" when
    E_pass reaches it; else "inconclusive" (so too while a cohort has no warm calls: its
    e-values are −inf). The one rule: the live verdict takes its last look
    (`probes.verdict.metrics.pod_success_rate`), the report's replay every look
    (`probes.verdict.replay`)."""
    fail = np.asarray(track.log_e_fail) >= log_threshold
    ok = np.asarray(track.log_e_pass) >= log_threshold
    return np.where(fail, "fail", np.where(ok, "pass", "inconclusive"))


def pod_batch(grids: Sequence[tuple[F64, F64, Bool]], ratio: float, margin: float,
               scales: tuple[float, ...], log_threshold: float, acc: Acc,
               pod_ratio: float | None = None) -> list[PodTrack]:
    """The batch's `PodTrack`s, one per grid."""
    return _per_grid(*batch_looks(grids, ratio, margin, scales, log_threshold, acc, pod_ratio),
                     acc.last_only)


def batch_looks(grids: Sequence[tuple[F64, F64, Bool]], ratio: float, margin: float,
                scales: tuple[float, ...], log_threshold: float, acc: Acc,
                pod_ratio: float | None = None) -> tuple[dict[str, Any], F64, Bool, I64]:
    """The batch's (groups, looks) arrays named as `PodTrack`'s fields, the canary pods'
    excess (groups, pods, looks), the cohort flags and each grid's windows: what
    `pod_batch` cuts into one `PodTrack` per grid, for a caller that reads one field of many
    grids (`pods.pod_fail_values`)."""
    g_n = len(grids)
    shapes = [np.shape(x[0]) for x in grids]
    rows = np.array([sh[0] for sh in shapes], dtype=np.int64)
    cols = np.array([sh[1] if len(sh) > 1 else 0 for sh in shapes], dtype=np.int64)
    p_max, w_max = max(int(rows.max()), 1), max(int(cols.max()), 1)
    n = np.zeros((g_n, p_max, w_max))
    s = np.zeros((g_n, p_max, w_max))
    canary = np.zeros((g_n, p_max), dtype=bool)
    real = np.arange(p_max)[None, :] < rows[:, None]
    for g, (n_g, s_g, c_g) in enumerate(grids):
        r, w = int(rows[g]), int(cols[g])
        n[g, :r, :w] = np.asarray(n_g, dtype=np.float64).reshape(r, w)
        s[g, :r, :w] = np.asarray(s_g, dtype=np.float64).reshape(r, w)
        canary[g, :r] = np.asarray(c_g, dtype=bool)
    base = real & ~canary
    mask_c, mask_b = canary[..., None], base[..., None]

    n_bt, n_ct = (n * mask_b).sum(axis=1), (n * mask_c).sum(axis=1)
    both = ((n_bt > 0) & (n_ct > 0))[:, None, :]
    n = np.where(both, n, 0.0)
    s = np.where(both, s, 0.0)
    nc, sc = n * mask_c, s * mask_c
    nb, sb = n * mask_b, s * mask_b
    n_bt, n_ct = nb.sum(axis=1), nc.sum(axis=1)  # (groups, windows)
    s_bt, s_ct = sb.sum(axis=1), sc.sum(axis=1)
    calls_b, calls_c = acc(n_bt, "calls_b"), acc(n_ct, "calls_c")  # (groups, looks)
    sum_b, sum_c = acc(s_bt, "sum_b"), acc(s_ct, "sum_c")

    def running_mean(calls: F64, sums: F64) -> F64:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(calls > 0, sums / np.where(calls > 0, calls, 1), 0.0)

    with np.errstate(divide="ignore", invalid="ignore"):
        inv_b = np.where(n_bt > 0, 1.0 / np.where(n_bt > 0, n_bt, 1.0), 0.0)
    # Each window's variance smooths towards the baseline's running mean as of that window
    # (so per window even for the last look alone: cheap, one row); the scales use it at
    # the looks.
    p_window_b = running_mean(acc.running(n_bt, "calls_b"), acc.running(s_bt, "sum_b"))
    p_run = running_mean(calls_b + calls_c, sum_b + sum_c)
    p_run_b = running_mean(calls_b, sum_b)
    p_t = s_bt * inv_b
    q_t = np.clip(ratio * p_t + margin, 0.0, 1.0)
    # The variance at H0's boundary, from the baseline alone (module docstring).
    p_smooth = (s_bt + _SMOOTH_CALLS * p_window_b) / (n_bt + _SMOOTH_CALLS)
    q_smooth = np.clip(ratio * p_smooth + margin, 0.0, 1.0)
    v_t = np.maximum(p_smooth * (1.0 - p_smooth), q_smooth * (1.0 - q_smooth))
    v_t = np.maximum(v_t, 1e-9)
    # p_t's own noise is the baseline's calls', p(1−p): the boundary's larger q(1−q) is the
    # canary's at H0 only, and charging it to both cost a third more calls to decide.
    u_t = np.maximum(p_smooth * (1.0 - p_smooth), 1e-9)
    # One scale for the whole track: the boundary's per-call variance at the running mean.
    q_run = np.clip(ratio * p_run_b + margin, 0.0, 1.0)
    sd2 = np.maximum(np.maximum(p_run_b * (1 - p_run_b), q_run * (1 - q_run)), 1e-9)

    sum_sc, sum_sb = acc(sc, "sc"), acc(sb, "sb")
    excess = sum_sc - acc.dot(nc, q_t, "nc.q")  # (groups, pods, looks); 0 off the canary
    pod_calls_c = acc(nc, "nc")
    own = acc.dot(nc, v_t + ratio * ratio * n_ct * inv_b * u_t, "own")
    w_b = acc.dot(nb, n_ct * inv_b, "w_b")  # W_j, 0 off the baseline

    # τ²: each pod against its own cohort's window means, DerSimonian–Laird per look.
    pod_calls_b = acc(nb, "nb")
    # Also picks the baseline pod the fail side drops.
    resid_b = sum_sb - acc.dot(nb, p_t, "nb.p")
    v_pool = np.maximum(p_run * (1.0 - p_run), 1e-12)
    pods_c = (pod_calls_c > 0).sum(axis=1)
    pods_b = (pod_calls_b > 0).sum(axis=1)
    everyone = np.ones(g_n, dtype=bool)
    cohorts = [(nc, sc, pod_calls_c, sum_sc, canary), (nb, sb, pod_calls_b, sum_sb, base)]
    tau2, df, _, _, q_all = dl_tau2([(*cohorts[0], None, everyone),
                                   (*cohorts[1], None, everyone)], v_pool, acc, "all")

    d_all = excess.sum(axis=1)
    vs_all = own.sum(axis=1)
    sq_calls = (pod_calls_c ** 2).sum(axis=1)
    sq_w = (w_b ** 2).sum(axis=1)
    sd = np.sqrt(sd2)
    r_pods = ratio if pod_ratio is None else pod_ratio
    vp_all = tau2 * (sq_calls + r_pods * r_pods * sq_w)

    # The worst canary pod at each look (the one an operator is told about); the first
    # canary pod while none has calls.
    masked = np.where(pod_calls_c > 0, excess, -np.inf)
    worst = first_max(masked, axis=1)
    some = np.isfinite(masked).any(axis=1)

    # Each cohort's worst pod: the canary's by excess, the baseline's by its standardised
    # residual. τ² without either (`tau2_fail`) is the spread the other pods show.
    with np.errstate(divide="ignore", invalid="ignore"):
        z_b = np.where(pod_calls_b > 0, resid_b / np.sqrt(np.where(pod_calls_b > 0,
                                                                   pod_calls_b, 1.0)), -np.inf)
    several_b = base.sum(axis=1) > 1
    # Only where another baseline pod has calls: a cohort whose rows are several but whose
    # calls are one pod's (the others still warming up) has no window means without it.
    drop_b = np.where(several_b[:, None] & (pods_b > 1), first_max(z_b, axis=1), -1)
    ex_pp, own_pp, sq_w_fail, worst_wo = _fail_side(
        nb, sb, nc, sc, pod_calls_c, base, drop_b, ratio, margin, (v_t, u_t), acc)
    some_c = np.asarray(canary.any(axis=1))
    tau2_fail, _, _, dropped, _ = dl_tau2([(*cohorts[0], worst_wo, some_c),
                                          (*cohorts[1], drop_b, several_b)], v_pool, acc, "wo")
    # A worst pod the others' spread cannot account for is sick, not the version's: set
    # aside (out of the window means, τ² and D) and named. The canary keeps its only pod.
    aside_c = np.where(outlier(*dropped[0], tau2_fail, v_pool) & (pods_c >= _ASIDE_MIN_PODS),
                       worst_wo, -1)
    aside_b = np.where(outlier(*dropped[1], tau2_fail, v_pool) & (drop_b >= 0)
                       & (pods_b >= _ASIDE_MIN_PODS), drop_b, -1)
    tau2_p, df_p, se_p, _, q_p = dl_tau2([(*cohorts[0], aside_c, some_c),
                                   (*cohorts[1], aside_b, several_b)], v_pool, acc, "aside")
    out_b = (aside_b >= 0)[:, None, :]
    ex_p = np.where(out_b, ex_pp, excess)
    own_p = np.where(out_b, own_pp, own)
    n_aside = pick(pod_calls_c, aside_c)
    calls_kept = calls_c - n_aside
    with np.errstate(divide="ignore", invalid="ignore"):
        keep_share = np.where(calls_c > 0, calls_kept / np.where(calls_c > 0, calls_c, 1.0), 0.0)
    d_p = ex_p.sum(axis=1) - pick(ex_p, aside_c)
    vs_p = own_p.sum(axis=1) - pick(own_p, aside_c)
    weights_p = (sq_calls - n_aside ** 2
                 + r_pods * r_pods * np.where(aside_b >= 0, sq_w_fail, sq_w) * keep_share ** 2)
    # Both sides allow for τ² from few pods (`spread_term`, BENCHMARKS.md D19).
    # The pass's point alternative (`log_e_pass`) is a canary like the baseline, whose drift
    # per unit of V this is with the cohorts' calls alike (as cohort balance keeps them).
    # Against a constant (ratio 0: p99's pass side) no such canary is known: the mixture
    # alone, with τ² as estimated.
    theta = np.maximum(q_run - p_run_b, 0.0) / sd / (
        1.0 + ratio * ratio * np.maximum(p_run_b * (1.0 - p_run_b), 1e-9) / sd2)
    weight = POINT_WEIGHT if ratio > 0 else 0.0
    vp_pass, vs_floor = spread_term(_pass_tau2(tau2_p, q_p, df_p, v_pool, weight), df_p, se_p,
                                  weights_p, vs_p, sd2, log_threshold, scales)
    v_pass = (vs_p + vs_floor + vp_pass) / sd2
    log_pass = log_e_pass(-d_p / sd, v_pass, theta, scales, weight)

    # The fail side of several canary pods: every canary pod in, the worst capped where
    # the others say it stands apart (`capped`), against window means without the
    # baseline's worst pod (a sick baseline pod would otherwise mask a regression on every
    # canary pod); τ² without either worst pod, trimmed alike so equal cohorts stay alike.
    # Two canary pods leave the worst out instead: the other's bound is too wide a guide
    # (τ² without either cohort's worst pod has next to no degrees of freedom then), and a
    # cap near it failed alike pods ±50 % apart in 3 % of rollouts (BENCHMARKS.md D21).
    # The pod set aside as sick is the one capped: capping the highest rate let it count
    # whole whenever a pod that had just joined, with a handful of calls, showed a higher one.
    # τ² without each cohort's worst pod is never taken below every pod's but the sick
    # ones' (`tau2_p`), for the cap and the variance alike: with few pods a cohort the
    # trimmed τ² has next to no degrees of freedom (with two, none: a per-call test of one
    # pod), and a cap at the trimmed spread made the capped fail exceed the fail with every
    # pod in, whichever pod the look trimmed.
    tau2_wo = np.maximum(tau2_fail, tau2_p)
    d_cap, _ = capped(ex_pp, pod_calls_c, sd2, tau2_wo, aside_c)
    n_w = pick(pod_calls_c, worst_wo)
    with np.errstate(divide="ignore", invalid="ignore"):
        share_wo = np.where(calls_c > 0, (calls_c - n_w) / np.where(calls_c > 0, calls_c, 1.0),
                            0.0)
    two = pods_c == 2
    d_wo = np.where(two, ex_pp.sum(axis=1) - pick(ex_pp, worst_wo), d_cap)
    vs_wo = own_pp.sum(axis=1) - np.where(two, pick(own_pp, worst_wo), 0.0)
    weights_wo = np.where(two, sq_calls - n_w ** 2 + ratio * ratio * sq_w_fail * share_wo ** 2,
                          sq_calls + ratio * ratio * sq_w_fail)
    # With few pods the fail is allowed for as the pass is (D19).
    vp_wo, vs_floor_wo = spread_term(tau2_wo, df_p, se_p, weights_wo, vs_wo, sd2,
                                     log_threshold, scales)
    vs_wo = vs_wo + vs_floor_wo
    # A canary of one pod (`_one_pod`) needs `ONE_POD_BASELINE` baseline pods on either side
    # to measure the spread a new pod is judged against.
    one_pod = pods_b >= ONE_POD_BASELINE
    log_one, log_pass_one = _one_pod(d_all, vs_all, sq_calls + r_pods * r_pods * sq_w, calls_c,
                                     q_all, df, p_run_b, sd2, log_threshold, scales,
                                     (theta, weight))
    log_pass = np.where(pods_c >= 2, log_pass, log_pass_one)
    log_fail = np.where(pods_c >= 2, log_e_one_sided(d_wo / sd, (vs_wo + vp_wo) / sd2, scales),
                        np.where(one_pod, log_one, -np.inf))
    log_pass = np.where((pods_c >= 2) | one_pod, log_pass, -np.inf)
    log_fail_all = log_e_one_sided(d_all / sd, (vs_all + vp_all) / sd2, scales)
    empty = (calls_b <= 0) | (calls_c <= 0)
    neg = np.full_like(d_all, -np.inf)
    log_fail, log_fail_all, log_pass = (np.where(empty, neg, x)
                                        for x in (log_fail, log_fail_all, log_pass))
    # Back to each grid: its own looks, its canary pods in their order, `worst` among them.
    rank = np.cumsum(canary, axis=1) - 1
    worst_c = np.where(some, np.take_along_axis(rank, worst, axis=1), 0)
    aside_rank = np.where(aside_c >= 0, np.take_along_axis(rank, np.maximum(aside_c, 0), axis=1),
                          -1)
    looks = {
        "calls_baseline": calls_b, "calls_canary": calls_c, "sum_baseline": sum_b,
        "sum_canary": sum_c, "tau": np.sqrt(tau2), "pods_baseline": pods_b,
        "pods_canary": pods_c, "worst": worst_c, "aside_canary": aside_rank,
        "aside_baseline": aside_b, "log_e_fail": log_fail, "log_e_fail_all": log_fail_all,
        "log_e_pass": log_pass, "d": d_p / sd, "v_sampling": (vs_p + vs_floor) / sd2,
        "v_pods": vp_pass / sd2, "d_wo": d_wo / sd, "v_sampling_wo": vs_wo / sd2,
        "v_pods_wo": vp_wo / sd2,
    }
    return looks, excess, canary, cols


def _pass_tau2(tau2: F64, q: tuple[F64, F64], df: F64, v: F64, weight: float) -> F64:
    """The τ² a pass takes: with a point alternative (`weight` > 0), the upper bound
    (`tau2_upper`) from Q's sum of squares and denominator `q` at the per-call variance `v`,
    else the estimate `tau2`. The point, and the baseline charged its own p(1−p), make the
    pass sharp enough that τ²'s underestimates from 6-12 pods let a canary at the tolerance
    through in more than 1 % of rollouts with pods that differ; the bound charges for them
    where τ² is poorly known, little where many calls on pods alike pin it down."""
    return tau2_upper(*q, df, v) if weight > 0 else tau2


def _one_pod(d_all: F64, vs: F64, weights_all: F64, calls_c: F64, q_all: tuple[F64, F64],
             df: F64, p_run_b: F64, sd2: F64, log_threshold: float, scales: tuple[float, ...],
             point: tuple[F64, float]) -> tuple[F64, F64]:
    """The fail and pass log e-values of a canary of one pod (its excess `d_all`, sampling
    variance `vs`, spread weights `weights_all`, calls `calls_c`; Q's sum of squares and
    denominator `q_all` and τ²'s degrees of freedom `df` from `dl_tau2`; the pass's point
    alternative and its weight `point`, as `log_e_pass` takes them).

    It is judged as a new pod drawn from the baseline's: its excess against the spread the
    baseline's pods show (τ² from them alone, as the one canary pod adds no degrees of
    freedom), with the few-pods allowance: a prediction interval for a new pod (Higgins,
    Thompson & Spiegelhalter 2009, with a t-type factor for τ²'s few degrees of freedom as
    Hartung-Knapp intervals have), the same as its pass's. It fails only beyond
    `_ONE_POD_TAIL` τ of the baseline's pods besides: pods' rates have long upper tails
    (lognormal), which a spread estimated as a variance understates, and a new pod at the
    top of the baseline's spread is not a sick version. Its spread is every baseline
    pod's, none set aside: a pod at the top of a long tail is what a new pod may be too.
    While the pods' calls are few, τ² cannot be told from 0: the fail takes it at an upper
    bound (`_ONE_POD_SE` standard errors above it), so that a pod is never judged against a
    spread the baseline has not yet had the calls to show. (The pass takes τ² at its own,
    milder bound, `_pass_tau2`: one standard error above would cost it several times the
    calls.)"""
    # τ² from the baseline's pods alone, at their per-call variance: the pooled one counts
    # the canary's errors, and a sick canary pod must not widen the yardstick it is judged by.
    v_b = np.maximum(p_run_b * (1.0 - p_run_b), 1e-12)
    tau2_b, se_b = tau2_at(*q_all, df, v_b)

    def variance(tau2_one: F64, v_sampling: F64) -> F64:
        vp, floor = spread_term(tau2_one, df, se_b, weights_all, v_sampling, sd2,
                                log_threshold, scales)
        return (v_sampling + floor + vp) / sd2

    sd = np.sqrt(sd2)
    log_fail = log_e_one_sided((d_all - _ONE_POD_TAIL * np.sqrt(tau2_b) * calls_c) / sd,
                               variance(tau2_b + _ONE_POD_SE * se_b, vs), scales)
    theta, weight = point
    v_pass = variance(_pass_tau2(tau2_b, q_all, df, v_b, weight), vs)
    return log_fail, log_e_pass(-d_all / sd, v_pass, theta, scales, weight)


# `PodTrack`'s fields that count something: integers, where the batch's arrays are floats.
_COUNTS = frozenset({"pods_baseline", "pods_canary", "worst", "aside_canary", "aside_baseline"})


def _per_grid(looks: dict[str, Any], excess: F64, canary: Bool, cols: I64,
              last_only: bool) -> list[PodTrack]:
    """One `PodTrack` per grid from the batch's (groups, looks) arrays `looks`, named as its
    fields, and `excess` (groups, pods, looks): each grid's own looks, its canary pods."""
    out = []
    for g in range(canary.shape[0]):
        k = slice(None) if last_only else slice(0, max(int(cols[g]), 0))
        fields = {name: (a[g, k].astype(np.int64) if name in _COUNTS else a[g, k])
                  for name, a in looks.items()}
        out.append(PodTrack(excess=excess[g][canary[g]][:, k], **fields))
    return out


def _fail_side(nb: F64, sb: F64, nc: F64, sc: F64, pod_calls_c: F64, base: Bool, drop_b: I64,
               ratio: float, margin: float, v: tuple[F64, F64], acc: Acc
               ) -> tuple[F64, F64, F64, I64]:
    """The fail direction's sums with the baseline pod `drop_b[group, look]` (−1: none) out
    of the window means: each canary pod's excess and sampling variance (groups, pods,
    looks), the baseline pods' weights Σ W_j² (groups, looks), and the canary pod with the
    largest excess (its τ² leaves it out); `pod_calls_c` the canary pods' calls summed over
    the windows; `v` the canary's and the baseline's per-call variance per window. One pass
    per distinct dropped pod, over the groups that drop it."""
    g_n, looks = drop_b.shape
    ex_pp = np.zeros(pod_calls_c.shape)
    own_pp = np.zeros(pod_calls_c.shape)
    sq_w = np.zeros((g_n, looks))
    worst = np.zeros((g_n, looks), dtype=np.int64)
    n_ct = nc.sum(axis=1)
    for k in acc.drops(drop_b, base.any(axis=0)):
        at = drop_b == k
        g: Any = slice(None) if acc.every_drop else np.flatnonzero(at.any(axis=1))
        at = at[g]
        nb_g, sb_g, nc_g, sc_g = nb[g], sb[g], nc[g], sc[g]
        n_ct_g, pc_g = n_ct[g], pod_calls_c[g]
        keep = base[g].copy()
        if k >= 0:
            keep[:, k] = False
        n_bt = nb_g.sum(axis=1) - (nb_g[:, k] if k >= 0 else 0.0)
        s_bt = sb_g.sum(axis=1) - (sb_g[:, k] if k >= 0 else 0.0)
        both = ((n_bt > 0) & (n_ct_g > 0)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv_b = np.where(n_bt > 0, 1.0 / np.where(n_bt > 0, n_bt, 1.0), 0.0)
        q_t = np.clip(ratio * s_bt * inv_b + margin, 0.0, 1.0)
        excess = acc.dot(sc_g, both, ("fail.sc", k)) - acc.dot(nc_g, both * q_t, ("fail.nc.q", k))
        own = acc.dot(nc_g, both * (v[0][g] + ratio * ratio * n_ct_g * inv_b * v[1][g]),
                      ("fail.own", k))
        w = acc.dot(nb_g, n_ct_g * inv_b, ("fail.w", k)) * keep[..., None]
        wc = first_max(np.where(pc_g > 0, excess, -np.inf), axis=1)
        ex_pp[g] = np.where(at[:, None, :], excess, ex_pp[g])
        own_pp[g] = np.where(at[:, None, :], own, own_pp[g])
        sq_w[g] = np.where(at, (w ** 2).sum(axis=1), sq_w[g])
        worst[g] = np.where(at, wc, worst[g])
    return ex_pp, own_pp, sq_w, worst
