"""The spread between pods for `probes.stats.pods`' test: DerSimonian–Laird τ² per cohort,
its allowance when few pods estimate it, a cohort's sick pod, and the canary's worst pod
capped at what the others show."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import chdtri, stdtrit

from probes.stats._num import F64, I64, Acc, Bool, first_max

__all__ = [
    "capped",
    "dl_tau2",
    "few_pods_factor",
    "outlier",
    "pick",
    "spread_term",
    "tau2_at",
    "tau2_upper",
]


# Where τ² comes from few pods, it is taken as at least this many standard errors of its
# estimate were the pods alike: pods that agree say "spread at most about the noise", not
# "no spread" (the calibration is in BENCHMARKS.md D19).
_SE_FLOOR = 0.5
# How many standard errors above the other canary pods' pooled excess per call the worst
# may plausibly be: it is capped there (`capped`).
_CAP_Z = 2.0
# The confidence of the upper bound on τ² the pass takes (`tau2_upper`): lower let a canary
# at the tolerance pass in over 1 % of rollouts with pods that differ, higher slows a
# healthy canary's pass (BENCHMARKS.md D21).
_UPPER_LEVEL = 0.7
# A cohort's worst pod this many standard errors beyond what the other pods' spread allows
# is set aside as sick (`outlier`): about 3e-7 one-sided per pod and look for a normal pod.
_ASIDE_Z = 5.0


def pick(a: F64, pod: I64) -> F64:
    """a[g, pod[g, t], t] where pod ≥ 0, else 0: `a` (groups, pods, looks)."""
    got = np.take_along_axis(a, np.maximum(pod, 0)[:, None, :], axis=1)[:, 0]
    return np.where(pod >= 0, got, 0.0)


def outlier(resid: F64, calls: F64, tau2: F64, v_pool: F64) -> Bool:
    """Whether a cohort's dropped pod (its residual against the other pods' window means
    and its calls, from `dl_tau2`) is worse than sampling and the others' spread τ² account
    for by more than `_ASIDE_Z` standard errors: a sick pod, not one end of the spread."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(calls > 0, resid / np.sqrt(calls * v_pool + tau2 * calls * calls), 0.0)
    return np.asarray(z > _ASIDE_Z)


def capped(excess: F64, calls: F64, sd2: F64, tau2: F64, pod: I64 | None = None
           ) -> tuple[F64, I64]:
    """Σ of the canary pods' excesses with the worst pod's (by excess per call, or `pod`
    (groups, looks) where it is ≥ 0: the pod set aside as sick) capped at
    the most the other canary pods plausibly have (their pooled excess per call plus
    `_CAP_Z` standard errors, sampling and spread), and that pod; (groups, pods, looks) in,
    (groups, looks) out. A sick pod among healthy ones is set aside this way, while a
    regression on every pod keeps (nearly) all its evidence. Pooled, the others' bound is
    not set by a pod that has just joined with a handful of calls. The sum is never above
    the uncapped one."""
    has = calls > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(has, excess / np.where(has, calls, 1.0), -np.inf)
    worst = first_max(rate, axis=1)
    if pod is not None:
        worst = np.where(pod >= 0, pod, worst)
    r_w = np.take_along_axis(rate, worst[:, None, :], axis=1)[:, 0]
    n_w = np.take_along_axis(calls, worst[:, None, :], axis=1)[:, 0]
    e_w = np.take_along_axis(excess, worst[:, None, :], axis=1)[:, 0]
    n_o = calls.sum(axis=1) - n_w
    with np.errstate(divide="ignore", invalid="ignore"):
        cap = np.where(n_o > 0, (excess.sum(axis=1) - e_w) / np.where(n_o > 0, n_o, 1.0)
                       + _CAP_Z * np.sqrt(sd2 / np.where(n_o > 0, n_o, 1.0) + tau2), np.inf)
        over = np.where(np.isfinite(cap) & np.isfinite(r_w), np.maximum(r_w - cap, 0.0), 0.0)
    return excess.sum(axis=1) - n_w * over, worst


def few_pods_factor(df: npt.ArrayLike, v: npt.ArrayLike, log_threshold: float,
                    scales: tuple[float, ...]) -> F64:
    """By how much the spread term's variance grows because τ² comes from few pods:
    (t_df(1 − α) / z)², at least 1, with α = exp(−`log_threshold`), `df` τ²'s degrees of
    freedom and z a lower bound of the standardised sum at which the e-process reaches 1/α
    given the variance `v` (standard-deviation units).

    Why. Once the calls are many the spread term dominates, the statistic stops growing
    and is a t statistic with τ²'s degrees of freedom (the pods counted, less one per
    cohort), not a normal one: with three baseline pods against one canary pod (df 2),
    pods that happen to agree make τ² small, and a canary pod that happens to be fast
    passed a version beyond the tolerance in 2–3 % of rollouts whatever α. The e-process
    decides there at a threshold z that barely moves, so scaling the spread term by (t/z)²
    aims its error at α. It does not get there everywhere (BENCHMARKS.md D19): a balanced
    canary pod has several times a baseline pod's calls, so τ² rests on pods whose own
    variance is mostly sampling and has fewer effective degrees of freedom than counted;
    with one or two canary pods on 4–8 pods a canary at the boundary still passed in
    2–5 % of rollouts at α = 1 %. With many pods t is below z and nothing changes (twelve pods:
    df 10, t_10(0.99) = 2.8 against z ≥ 3.3 at α = 1 %); with none to count (df 0) there is
    nothing to scale (and with one canary pod `pod_tracks` gives no pass)."""
    df_ = np.asarray(df, dtype=np.float64)
    v_ = np.maximum(np.asarray(v, dtype=np.float64), 0.0)[..., None]
    rho2v = np.asarray(scales, dtype=np.float64) ** 2 * v_
    # One scale's e-value is at most 2(1 + ρ²V)^(−½) exp(ρ²D²/(2(1 + ρ²V))); the mixture,
    # their mean, reaches 1/α only where some scale does.
    with np.errstate(divide="ignore", invalid="ignore"):
        z2 = (2.0 * (1.0 + rho2v) / rho2v
              * np.maximum(log_threshold - math.log(2.0) + 0.5 * np.log1p(rho2v), 0.0))
        z = np.sqrt(np.min(np.where(rho2v > 0, z2, np.inf), axis=-1))
        t = stdtrit(np.maximum(df_, 1.0), -math.expm1(-log_threshold))
        factor = np.where((df_ >= 1) & np.isfinite(z) & (z > 0), (t / z) ** 2, 1.0)
    return np.asarray(np.maximum(factor, 1.0), dtype=np.float64)


def spread_term(tau2: F64, df: F64, tau2_se: F64, weights: F64, v_sampling: F64, sd2: F64,
              log_threshold: float, scales: tuple[float, ...]) -> tuple[F64, F64]:
    """The spread term τ²·`weights` with τ² from few pods allowed for (`few_pods_factor`):
    scaled by the factor, and τ² taken as at least part of its standard error as the
    factor rises above 1 (all of `_SE_FLOOR` from 2 on), so that a few pods that happen
    to agree do not claim no spread at all. Returned in two parts, by how they grow with
    the calls: with their square (τ² estimated), and with the calls (the floor: a standard
    error shrinks as they grow)."""
    factor = few_pods_factor(df, (v_sampling + tau2 * weights) / sd2, log_threshold, scales)
    floor = _SE_FLOOR * np.minimum(factor - 1.0, 1.0) * tau2_se
    floored = floor > tau2
    return (factor * np.where(floored, 0.0, tau2) * weights,
            factor * np.where(floored, floor, 0.0) * weights)


def dl_tau2(cohorts: list[tuple[F64, F64, F64, F64, Bool, I64 | None, Bool]], v_pool: F64,
          acc: Acc, tag: str
          ) -> tuple[F64, F64, F64, list[tuple[F64, F64]], tuple[F64, F64]]:
    """DerSimonian–Laird τ² per group and look from each cohort's pods (calls `n`, sums
    `s`: groups × pods × windows, 0 off the cohort; `calls`, `sums` theirs summed over the
    windows, as `acc` sums them; the cohort's pods `members`), each pod measured against its
    cohort's window means, leaving out the pod `drop[group, look]` (−1: none; None: none ever), in
    the groups where the cohort `counts`: out of the sum of squares and out of the window
    means, so one sick pod neither counts itself nor makes every healthy pod look off.
    Each distinct dropped pod costs one pass over the cells of the groups that drop it (the
    worst pod rarely changes once data accrues; with a memo every pod of the cohort,
    `members`, is dropped in turn). `tag` names the kept sums. With τ², its degrees of
    freedom (pods counted, less one per cohort) and its standard error were the pods alike
    (Q's is √(2 df) then), per cohort the dropped pod's residual against the others'
    window means and its calls (0 where none is dropped), for `outlier`, and Q's sum of
    squares with its denominator, for a τ² at another per-call variance (`tau2_at`)."""
    q, df, denom = (np.zeros(v_pool.shape) for _ in range(3))
    dropped: list[tuple[F64, F64]] = []
    for i, (n, s, calls, sums, members, drop, counts) in enumerate(cohorts):
        out_resid, out_calls = np.zeros(v_pool.shape), np.zeros(v_pool.shape)
        dropped.append((out_resid, out_calls))
        n_t, s_t = n.sum(axis=1), s.sum(axis=1)
        if drop is None:
            drop = np.full(v_pool.shape, -1, dtype=np.int64)
            ks = [-1]
        else:
            ks = acc.drops(drop, members.any(axis=0))
        for k in ks:
            at = (drop == k) & counts[:, None]
            g: Any = slice(None) if acc.every_drop else np.flatnonzero(at.any(axis=1))
            if not acc.every_drop and not g.size:
                continue
            at = at[g]
            n_g, s_g = n[g], s[g]
            n_o = n_t[g] - (n_g[:, k] if k >= 0 else 0.0)
            s_o = s_t[g] - (s_g[:, k] if k >= 0 else 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                mean = np.where(n_o > 0, s_o / np.where(n_o > 0, n_o, 1.0), 0.0)
            resid = sums[g] - acc.dot(n_g, mean, (f"{tag}{i}.n.mean", k))
            calls_g = calls[g]
            keep = calls_g > 0
            if k >= 0:
                keep[:, k] = False
            c = np.where(keep, calls_g, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                q_k = np.where(keep, resid ** 2 / np.where(keep, calls_g, 1.0), 0.0).sum(axis=1)
            kept = keep.sum(axis=1)
            total = c.sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                denom_k = np.where(kept > 1, total - (c ** 2).sum(axis=1)
                                   / np.where(total > 0, total, 1.0), 0.0)
            q[g] += np.where(at, q_k, 0.0)
            df[g] += np.where(at, np.maximum(kept - 1, 0), 0)
            denom[g] += np.where(at, denom_k, 0.0)
            if k >= 0:
                out_resid[g] += np.where(at, resid[:, k], 0.0)
                out_calls[g] += np.where(at, calls_g[:, k], 0.0)
    tau2, se = tau2_at(q, denom, df, v_pool)
    return tau2, df, se, dropped, (q, denom)


def tau2_upper(q: F64, denom: F64, df: F64, v: F64, level: float = _UPPER_LEVEL) -> F64:
    """An upper confidence bound, at `level`, for τ² from Q's sum of squares `q`, its
    denominator and degrees of freedom (`dl_tau2`) at the per-call variance `v`.

    Q is about (df·v + τ²·denom)·χ²_df / df, so E[Q] is at most Q·df / χ²_df(1 − level) with
    that confidence, and τ² at most what leaves that above df·v. How many pods count enters
    through df, how many calls each has through denom and v: where the pods agree and have
    many calls the bound is a few v/denom, small beside the sampling; where few calls or few
    pods leave τ² uncertain it is several times the estimate. Where the estimate is 0 by
    chance (it is truncated there), the bound is not."""
    ok = (df > 0) & (denom > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        top = q * df / chdtri(np.maximum(df, 1.0), level)
        up = np.where(ok, (top - df * v) / np.where(denom > 0, denom, 1.0), 0.0)
    return np.asarray(np.maximum(up, 0.0), dtype=np.float64)


def tau2_at(q: F64, denom: F64, df: F64, v: F64) -> tuple[F64, F64]:
    """DerSimonian–Laird τ² and its standard error from Q's sum of squares `q` and its
    denominator (`dl_tau2`) at the per-call variance `v`."""
    ok = (df > 0) & (denom > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(ok, 1.0 / np.where(denom > 0, denom, 1.0), 0.0)
    return (np.where(ok, np.maximum(0.0, (q - df * v) * inv), 0.0),
            np.where(ok, np.sqrt(2.0 * df) * v * inv, 0.0))
