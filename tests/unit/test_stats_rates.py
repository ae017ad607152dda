"""probes.stats.rates: Poisson rate CSs and the two-sample resets-per-stream-hour test."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom, norm

from probes.stats import rates


def test_rate_cs_brackets_the_estimate_and_is_time_uniform() -> None:
    lo, hi = rates.rate_cs([0, 5, 500], [1.0, 10.0, 100.0], math.log(100))
    assert float(lo[0]) == 0.0 and hi[0] > 0
    assert np.all(lo[1:] < [0.5, 5.0]) and np.all(hi[1:] > [0.5, 5.0])
    rng = np.random.default_rng(4)
    rollouts, windows, lam, exposure, alpha = 300, 300, 2.0, 0.1, 0.05
    k = np.cumsum(rng.poisson(lam * exposure, (rollouts, windows)), axis=1)
    e = exposure * np.arange(1, windows + 1)
    lo, hi = rates.rate_cs(k, e, math.log(1 / alpha))
    missed = ((lo > lam) | (hi < lam)).any(axis=1).sum()
    assert missed <= binom.ppf(0.999, rollouts, alpha)


def test_two_sample_fails_a_reset_storm_and_passes_equal_rates() -> None:
    storm = rates.two_sample(2, 10.0, 60, 10.0, 1.5, 1.0)
    assert storm.log_e_fail > math.log(1e4) and storm.log_e_pass < 0
    calm = rates.two_sample(5, 50.0, 5, 50.0, 1.5, 1.0)
    assert calm.log_e_pass > math.log(1e4) and calm.log_e_fail < 0


def test_false_fails_at_the_tolerance_boundary_stay_below_alpha() -> None:
    rng = np.random.default_rng(21)
    rollouts, windows, alpha = 200, 360, 0.05
    exposure = 6 * 10 / 3600  # six streams for a 10 s window, in stream-hours
    lam_b, ratio, margin = 3.0, 1.5, 1.0
    lam_c = ratio * lam_b + margin
    kb = np.cumsum(rng.poisson(lam_b * exposure, (rollouts, windows)), axis=1)
    kc = np.cumsum(rng.poisson(lam_c * exposure, (rollouts, windows)), axis=1)
    e = exposure * np.arange(1, windows + 1)
    test = rates.two_sample(kb, e, kc, e, ratio, margin)
    ours = (test.log_e_fail >= math.log(1 / alpha)).any(axis=1).sum()
    bound = binom.ppf(0.999, rollouts, alpha)
    assert ours <= bound
    # Contrast: a Wald z-test of the same null, re-run every window.
    rb, rc = kb / e, kc / e
    se = np.sqrt(ratio**2 * rb / e + rc / e)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (rc - ratio * rb - margin) / se, 0.0)
    assert (z > norm.isf(alpha)).any(axis=1).sum() > bound
