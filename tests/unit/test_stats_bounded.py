"""probes.stats.bounded: mixture confidence sequences and the two-sample composite test.

Statistical checks use fixed seeds and bounds derived from the method: a level-α anytime test
false-fails a rollout with probability ≤ α however often it looks, so over R independent
rollouts the count of false fails is ≤ the 99.9 % quantile of Binomial(R, α) except with
probability 0.1 %. A naive repeated fixed-horizon test must break that same bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, norm

from probes.stats import bounded


def _bound(rollouts: int, alpha: float) -> int:
    return int(binom.ppf(0.999, rollouts, alpha))


def test_log_mixture_is_a_proper_mixture() -> None:
    # Summed over every outcome sequence, the mixture is a probability: Σ C(n,S) m(S) = 1.
    n = 12
    s = np.arange(n + 1)
    log_c = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in s])
    total = np.exp(log_c + bounded.log_mixture(s, n)).sum()
    assert total == pytest.approx(1.0, rel=1e-9)


def test_mixture_never_exceeds_maximum_likelihood() -> None:
    s, n = np.array([0.0, 3, 50, 999]), np.array([1000.0, 1000, 1000, 1000])
    assert np.all(bounded.log_mixture(s, n) <= bounded.loglik(s / n, s, n) + 1e-9)


def test_mean_cs_contains_estimate_and_shrinks() -> None:
    lo, hi = bounded.mean_cs([10, 100, 1000], [1000, 10000, 100000], math.log(100))
    assert np.all(lo < 0.01) and np.all(hi > 0.01)
    widths = hi - lo
    assert widths[0] > widths[1] > widths[2]
    lo0, hi0 = bounded.mean_cs(0, 0, math.log(100))
    assert (float(lo0), float(hi0)) == (0.0, 1.0)
    lo1, _ = bounded.mean_cs(0, 500, math.log(100))
    assert float(lo1) == 0.0


def test_mean_cs_is_time_uniform() -> None:
    """Coverage of the whole sequence (every window), not of one look."""
    rng = np.random.default_rng(11)
    rollouts, windows, n, p, alpha = 300, 200, 50, 0.02, 0.05
    s = np.cumsum(rng.binomial(n, p, (rollouts, windows)), axis=1)
    t = n * np.arange(1, windows + 1)
    lo, hi = bounded.mean_cs(s, t, math.log(1 / alpha))
    missed = ((lo > p) | (hi < p)).any(axis=1).sum()
    assert missed <= _bound(rollouts, alpha)
    # The fixed-n Wald interval checked after every window misses far more often.
    phat = s / t
    half = norm.isf(alpha / 2) * np.sqrt(np.maximum(phat * (1 - phat), 1e-12) / t)
    naive = ((phat - half > p) | (phat + half < p)).any(axis=1).sum()
    assert naive > _bound(rollouts, alpha)


def test_two_sample_signs() -> None:
    clear = bounded.two_sample(10, 10000, 300, 10000, 1.0, 0.001)
    assert clear.log_e_fail > math.log(1e6) and clear.log_e_pass < 0
    same = bounded.two_sample(30, 30000, 30, 30000, 1.0, 0.001)
    assert same.log_e_fail < 0 < same.log_e_pass
    # Within the tolerance but not provably: neither side has evidence.
    edge = bounded.two_sample(10, 10000, 20, 10000, 1.0, 0.001)
    assert edge.log_e_fail < math.log(20) and edge.log_e_pass < math.log(20)


def test_two_sample_rejects_bad_tolerance() -> None:
    with pytest.raises(ValueError):
        bounded.two_sample(1, 10, 1, 10, 1.0, 1.5)


def test_fractional_sums_for_bounded_values() -> None:
    # Attempts scaled to [0, 1]: sums are not integers and the test still works.
    e = bounded.two_sample(2.5, 1000, 250.25, 1000, 1.1, 0.025)
    assert e.log_e_fail > math.log(1e6)


def test_false_fails_at_the_tolerance_boundary_stay_below_alpha() -> None:
    """Canary exactly 0.1 pp worse (the worst case of the null), asked after every window."""
    rng = np.random.default_rng(2024)
    rollouts, windows, n, alpha = 200, 360, 300, 0.05
    p_b, drop = 0.002, 0.001
    eb = np.cumsum(rng.binomial(n, p_b, (rollouts, windows)), axis=1)
    ec = np.cumsum(rng.binomial(n, p_b + drop, (rollouts, windows)), axis=1)
    t = n * np.arange(1, windows + 1, dtype=float)
    test = bounded.two_sample(eb, t, ec, t, 1.0, drop)
    ours = (test.log_e_fail >= math.log(1 / alpha)).any(axis=1).sum()
    bound = _bound(rollouts, alpha)
    assert ours <= bound
    # Contrast: a one-sided Wald z-test of the same null at the same α, re-run every window.
    pb, pc = eb / t, ec / t
    se = np.sqrt(pb * (1 - pb) / t + pc * (1 - pc) / t)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (pc - pb - drop) / se, 0.0)
    naive = (z > norm.isf(alpha)).any(axis=1).sum()
    assert naive > bound


def test_pass_needs_evidence_and_comes_with_it() -> None:
    rng = np.random.default_rng(5)
    rollouts, windows, n, alpha = 100, 360, 300, 0.01
    p = 0.001
    eb = np.cumsum(rng.binomial(n, p, (rollouts, windows)), axis=1)
    ec = np.cumsum(rng.binomial(n, p, (rollouts, windows)), axis=1)
    t = n * np.arange(1, windows + 1, dtype=float)
    passed = bounded.two_sample(eb, t, ec, t, 1.0, 0.001).log_e_pass >= math.log(1 / alpha)
    assert not passed[:, 0].any()  # one window of 300 calls cannot show a 0.1 pp bound
    assert passed[:, -1].mean() > 0.9  # an hour of equal cohorts can


def test_regression_fails_within_stated_windows() -> None:
    """+1 pp errors (0.1 % → 1.1 %) at 300 calls a window fails within 20 windows."""
    rng = np.random.default_rng(7)
    rollouts, windows, n = 100, 20, 300
    eb = np.cumsum(rng.binomial(n, 0.001, (rollouts, windows)), axis=1)
    ec = np.cumsum(rng.binomial(n, 0.011, (rollouts, windows)), axis=1)
    t = n * np.arange(1, windows + 1, dtype=float)
    failed = bounded.two_sample(eb, t, ec, t, 1.0, 0.001).log_e_fail >= math.log(400)
    assert failed.any(axis=1).mean() >= 0.95
