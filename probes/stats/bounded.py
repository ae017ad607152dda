"""Anytime-valid comparison of two [0, 1]-bounded means (error rates, scaled retry volume).

Model. Within a cohort, observations X_1, X_2, ... take values in [0, 1] and are independent
with a common mean μ (Bernoulli for error indicators). Only the cohort totals (S = ΣX, n)
are needed, so everything is computed from per-window sums.

One cohort: the conjugate beta-binomial mixture (Robbins 1970; Howard, Ramdas, McAuliffe &
Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences", §3)

    M_n(μ) = B(a + S, b + n − S) / B(a, b)  /  (μ^S (1 − μ)^(n − S))

is a nonnegative martingale with M_0 = 1 when the X_i are Bernoulli(μ), and a supermartingale
for any [0, 1]-valued X_i with mean μ, because x ↦ (f/μ)^x ((1−f)/(1−μ))^(1−x) is convex, so
its mean is largest for the two-point (Bernoulli) law. By Ville's inequality
P(∃n: M_n(μ) ≥ 1/α) ≤ α, and {μ : M_n(μ) < 1/α} is a confidence sequence (CS): it covers μ
at every n simultaneously, however often it is looked at and whenever one stops.

Two cohorts. The hypothesis "the canary is within tolerance" is the half-plane
H0: μ_c ≤ r·μ_b + m (a ratio r ≥ 0 and margin m in [0, 1), e.g. r = 1, m = 0.001 for a 0.1 pp
error-rate allowance). For every null pair θ = (μ_b, μ_c) the mixture likelihood ratio
m_b·m_c / L_b(μ_b)·L_c(μ_c) is a test supermartingale, so its infimum over H0,

    E_fail = m_b·m_c / sup_{θ ∈ H0} L_b(μ_b)·L_c(μ_c),

is an e-process for the composite H0 (it is below the true θ's martingale at every time), and
"fail when E_fail ≥ 1/α" false-fails with probability ≤ α over the whole sequence. The
mirror-image E_pass (sup over μ_c ≥ r·μ_b + m) gives "pass" the same guarantee. The sup of the
concave log-likelihood over a half-plane is the unconstrained maximum when it lies inside,
else the maximum along the boundary line (found by bisection on the derivative).

Compared with checking two separate per-cohort CSs against each other, this spends α once,
not twice, and adds the evidence of both cohorts under one square root instead of adding two
widths: about 1.7× fewer samples for the same decision (see benchmarks/detection.py).

Prior. Both cohorts use an equal-weight mixture of Beta(½, b) for b in 0.5 (Jeffreys, the
Krichevsky–Trofimov mixture), 30, 300 and 3000: a discretised scale mixture. Error rates and
retry volumes of healthy services sit at 0.01–1 %, where Jeffreys alone pays ~5 nats of
regret per cohort at 10^4 calls; the mixture pays ~2–3.7 there and at most ~1.4 nats
(log 4) more than Jeffreys anywhere else, which is the difference between failing a +0.5 pp
regression in about 3 minutes instead of 5 (benchmarks/detection.py).

Caveats, stated where they are used: the guarantee needs independent observations with a mean
that does not drift *differently* in the two cohorts. A drift that hits both cohorts alike
(time of day, a shared dependency) with a steady traffic split only adds noise around equal
means; a split that changes over time while the rate drifts weights the two cohorts' means
over different hours and can show a difference that is not the canary's doing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import xlog1py, xlogy

from probes.stats._num import F64, ArrayLike, betaln, bisect, f64, logsumexp

__all__ = ["JEFFREYS", "PRIOR", "Prior", "TwoSample", "log_mixture", "loglik", "mean_cs",
           "two_sample"]

# A prior is an equal-weight mixture of Beta(a, b) components.
Prior = tuple[tuple[float, float], ...]
JEFFREYS: Prior = ((0.5, 0.5),)
PRIOR: Prior = ((0.5, 0.5), (0.5, 30.0), (0.5, 300.0), (0.5, 3000.0))


@dataclass(frozen=True, slots=True)
class TwoSample:
    """log e-values against "canary within tolerance" (fail) and "canary beyond" (pass)."""

    log_e_fail: F64
    log_e_pass: F64


def log_mixture(s: ArrayLike, n: ArrayLike, prior: Prior = PRIOR) -> F64:
    """log of the mixture over the prior of μ^S (1 − μ)^(n − S)."""
    s_, n_ = f64(s), f64(n)
    parts = [betaln(a + s_, b + n_ - s_) - betaln(a, b) for a, b in prior]
    return np.asarray(logsumexp(parts, axis=0) - math.log(len(prior)), dtype=np.float64)


def loglik(mu: ArrayLike, s: ArrayLike, n: ArrayLike) -> F64:
    """log μ^S (1 − μ)^(n − S), with 0·log 0 = 0."""
    mu_, s_, n_ = f64(mu), f64(s), f64(n)
    return np.asarray(xlogy(s_, mu_) + xlog1py(n_ - s_, -mu_), dtype=np.float64)


def mean_cs(
    s: ArrayLike, n: ArrayLike, log_threshold: ArrayLike, prior: Prior = PRIOR
) -> tuple[F64, F64]:
    """The CS {μ : M_n(μ) < e^log_threshold} as (lower, upper) arrays.

    With log_threshold = log(1/α) it covers the mean at all n simultaneously with probability
    ≥ 1 − α (two-sided). Where n = 0 the interval is [0, 1].
    """
    s_, n_, thr = np.broadcast_arrays(f64(s), f64(n), f64(log_threshold))
    lm = log_mixture(s_, n_, prior)
    with np.errstate(divide="ignore", invalid="ignore"):
        hat = np.where(n_ > 0, s_ / np.where(n_ > 0, n_, 1.0), 0.5)
    level = lm - thr  # μ is inside the CS where loglik(μ) > level

    def inside(mu: F64) -> np.ndarray:
        return loglik(mu, s_, n_) > level

    # loglik is concave with its maximum at hat: increasing on [0, hat], decreasing after.
    lower = bisect(lambda mu: ~inside(mu), 0.0, hat)
    upper = bisect(inside, hat, 1.0)
    empty = n_ <= 0
    return np.where(empty, 0.0, lower), np.where(empty, 1.0, upper)


def _line_max(
    s_b: F64, n_b: F64, s_c: F64, n_c: F64, r: F64, m: F64
) -> F64:
    """max over μ of loglik_b(μ) + loglik_c(r·μ + m), on the part of the line in [0, 1]²."""
    f_b, f_c = n_b - s_b, n_c - s_c
    u_max = np.minimum(1.0, (1.0 - m) / np.where(r > 0, r, 1.0))
    u_max = np.where(r > 0, u_max, 1.0)

    def rising(mu: F64) -> np.ndarray:
        nu = r * mu + m
        with np.errstate(divide="ignore", invalid="ignore"):
            d = (
                np.where(s_b > 0, s_b / mu, 0.0)
                - np.where(f_b > 0, f_b / (1.0 - mu), 0.0)
                + r * (np.where(s_c > 0, s_c / nu, 0.0) - np.where(f_c > 0, f_c / (1.0 - nu), 0.0))
            )
        return np.asarray(d > 0)

    def h(mu: F64) -> F64:
        return loglik(mu, s_b, n_b) + loglik(r * mu + m, s_c, n_c)

    root = bisect(rising, 0.0, u_max)
    zero = np.zeros_like(root)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.maximum(np.maximum(h(root), h(zero)), h(u_max)), dtype=np.float64)


def two_sample(
    s_b: ArrayLike,
    n_b: ArrayLike,
    s_c: ArrayLike,
    n_c: ArrayLike,
    ratio: ArrayLike,
    margin: ArrayLike,
    prior: Prior = PRIOR,
) -> TwoSample:
    """log E_fail and log E_pass for H0: μ_c ≤ ratio·μ_b + margin (see the module docstring).

    Fail when log_e_fail ≥ log(1/α); pass when log_e_pass ≥ log(1/α). Needs n_b, n_c > 0.
    """
    s_b_, n_b_, s_c_, n_c_, r, m = np.broadcast_arrays(
        f64(s_b), f64(n_b), f64(s_c), f64(n_c), f64(ratio), f64(margin)
    )
    if np.any(m < 0) or np.any(m >= 1) or np.any(r < 0):
        raise ValueError("tolerance needs ratio >= 0 and 0 <= margin < 1")
    lm = log_mixture(s_b_, n_b_, prior) + log_mixture(s_c_, n_c_, prior)
    hat_b = s_b_ / np.maximum(n_b_, 1e-300)
    hat_c = s_c_ / np.maximum(n_c_, 1e-300)
    free = loglik(hat_b, s_b_, n_b_) + loglik(hat_c, s_c_, n_c_)
    line = _line_max(s_b_, n_b_, s_c_, n_c_, r, m)
    above = hat_c > r * hat_b + m
    return TwoSample(
        log_e_fail=np.where(above, lm - line, lm - free),
        log_e_pass=np.where(above, lm - free, lm - line),
    )
