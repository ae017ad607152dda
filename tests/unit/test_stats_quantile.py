"""probes.stats.quantile: quantile e-values, CSs and the two-sample p99 test on histograms.

Fixed seeds; bounds from the method (see tests/unit/test_stats_bounded.py for the reasoning).
Latencies are lognormal (median 50 ms, σ 0.5: p99 ≈ 160 ms), bucketed in the probe's layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from scipy.special import betainc, logsumexp
from scipy.stats import binom, norm

from probes.measure.histogram import BUCKET_COUNT, LOWER, UPPER, index_of
from probes.stats import quantile
from probes.stats._num import F64, ArrayLike, f64

P = 0.99
LAYOUT = quantile.Layout.from_edges(LOWER, UPPER)
Q99 = 0.05 * math.exp(0.5 * norm.ppf(P))


def _cum_windows(rng: np.random.Generator, windows: int, n: int, scale: float = 1.0):
    """Cumulative (over windows and buckets) histograms, cropped to the buckets in use with
    an empty bucket either side (the open ends then change nothing), and the cropped layout."""
    x = rng.lognormal(math.log(0.05), 0.5, (2, windows, n))
    x[1] *= scale
    idx = index_of(x.ravel()).reshape(x.shape)
    lo, hi = max(0, int(idx.min()) - 1), min(BUCKET_COUNT, int(idx.max()) + 2)
    width = hi - lo
    flat = (idx - lo) + np.arange(windows)[None, :, None] * width
    h = np.stack([np.bincount(f.ravel(), minlength=windows * width) for f in flat])
    h = h.reshape(2, windows, width)
    cum = np.cumsum(np.cumsum(h, axis=1), axis=2).astype(float)
    return cum[0], cum[1], quantile.Layout.from_edges(LOWER[lo:hi], UPPER[lo:hi])


def test_log_betainc_matches_scipy_and_bounds_underflow() -> None:
    a = np.array([5.0, 50.0, 3000.0, 3e5])
    b = np.array([3.0, 20.0, 2.0, 200.0])
    direct = betainc(a, b, 0.5)
    got = quantile._log_betainc(a, b, 0.5)
    finite = direct > 1e-250
    assert np.allclose(got[finite], np.log(direct[finite]), rtol=1e-9)
    assert np.isfinite(got).all()  # scipy underflows to 0 on the last one


@pytest.mark.parametrize("n", [100.0, 1000.0, 50000.0])
def test_one_sided_e_values_are_monotone(n: float) -> None:
    counts = np.arange(0.0, n + 1, max(1.0, n // 200))
    below = quantile.log_below(counts, n, P)
    above = quantile.log_above(counts, n, P)
    assert np.all(np.diff(below) <= 1e-9) and np.all(np.diff(above) >= -1e-9)
    assert np.isfinite(below).all() and np.isfinite(above).all()


def test_one_sided_e_values_are_supermartingales() -> None:
    """E[e] ≤ 1 at a fixed n under the null boundary F(x) = p (exact binomial sum)."""
    n = 400
    k = np.arange(n + 1)
    log_w = binom.logpmf(k, n, P)
    assert logsumexp(log_w + quantile.log_below(k, n, P)) <= 1e-9
    assert logsumexp(log_w + quantile.log_above(k, n, P)) <= 1e-9


def test_quantile_cs_is_time_uniform_and_brackets_the_estimate() -> None:
    rng = np.random.default_rng(3)
    rollouts, missed, alpha = 60, 0, 0.05
    for _ in range(rollouts):
        cum, _, layout = _cum_windows(rng, 120, 300)
        lo, hi = quantile.quantile_cs(cum, layout, P, math.log(1 / alpha))
        missed += bool(((lo > Q99) | (hi < Q99)).any())
        est = quantile.quantile_estimate(cum[-1], layout, P)
        assert lo[-1] <= est <= hi[-1]
    assert missed <= binom.ppf(0.999, rollouts, alpha)


def test_estimate_matches_histogram_rule() -> None:
    from probes.measure.histogram import Histogram

    values = np.random.default_rng(1).lognormal(math.log(0.05), 0.5, 5000)
    h = Histogram.from_values(values)
    cum = np.cumsum(h.counts).astype(float)
    assert float(quantile.quantile_estimate(cum, LAYOUT, P)) == pytest.approx(h.quantile(P))


def test_two_sample_on_the_full_layout() -> None:
    rng = np.random.default_rng(8)
    x = rng.lognormal(math.log(0.05), 0.5, (2, 20000))
    cb = np.cumsum(np.bincount(index_of(x[0]), minlength=BUCKET_COUNT)).astype(float)
    slow = np.cumsum(np.bincount(index_of(2 * x[1]), minlength=BUCKET_COUNT)).astype(float)
    same = np.cumsum(np.bincount(index_of(x[1]), minlength=BUCKET_COUNT)).astype(float)
    thr = math.log(400)
    worse = quantile.two_sample(cb, slow, LAYOUT, P, 1.2, 0.005, thr)
    fine = quantile.two_sample(cb, same, LAYOUT, P, 1.2, 0.005, thr)
    assert worse.log_e_fail >= thr > worse.log_e_pass
    assert fine.log_e_pass >= thr > fine.log_e_fail
    # e-values are exact up to the cap and clipped there
    assert worse.log_e_fail <= thr + quantile.LOG_CAP + 1e-9


def test_false_fails_at_the_tolerance_boundary_stay_below_alpha() -> None:
    """Canary p99 exactly at 1.2 × baseline p99 + 5 ms, asked after every window; beside it a
    naive repeated test that plugs in the baseline's p99 as if it were known."""
    rng = np.random.default_rng(99)
    rollouts, windows, n, alpha = 100, 120, 300, 0.05
    edge = (1.2 * Q99 + 0.005) / Q99
    thr = math.log(1 / alpha)
    ours = naive = 0
    for _ in range(rollouts):
        cb, cc, layout = _cum_windows(rng, windows, n, edge)
        t = quantile.two_sample(cb, cc, layout, P, 1.2, 0.005, thr)
        ours += bool((t.log_e_fail >= thr).any())
        # naive: binomial z-test that > 1 % of the canary lies above 1.2·p̂99_b + 5 ms
        q_b = quantile.quantile_estimate(cb, layout, P)
        x = 1.2 * q_b + 0.005
        k = np.clip(np.searchsorted(layout.lower, x, side="left") - 1, 0, None)
        nc = cc[:, -1]
        above = nc - cc[np.arange(windows), k]
        z = (above / nc - (1 - P)) / np.sqrt(P * (1 - P) / nc)
        naive += bool((z > norm.isf(alpha)).any())
    bound = binom.ppf(0.999, rollouts, alpha)
    assert ours <= bound
    assert naive > bound


def test_p99_doubling_fails_within_stated_windows() -> None:
    """p99 ×2 at 300 calls a window fails within 6 windows (α share 0.0025)."""
    rng = np.random.default_rng(12)
    thr = math.log(400)
    hits = 0
    for _ in range(40):
        cb, cc, layout = _cum_windows(rng, 6, 300, 2.0)
        t = quantile.two_sample(cb, cc, layout, P, 1.2, 0.005, thr)
        hits += bool((t.log_e_fail >= thr).any())
    assert hits >= 38


@pytest.mark.parametrize("seed", [1, 2])
def test_the_band_is_the_one_a_bisection_finds(seed: int) -> None:
    """`_band` finds its counts by `crossing_int` (a few probes near where the normal
    approximation puts them): the counts bisecting the whole range finds, for counts from
    0 to 10^7, the quantiles the verdict and the tests use, limits per row or shared. Each
    row's cumulative counts step through the bisection's counts ± 1, so a count one off
    lands in another bucket."""
    rng = np.random.default_rng(seed)
    k = quantile.CONCENTRATION
    for trial in range(40):
        n = np.floor(10 ** rng.uniform(0, 7, 50))
        n[rng.random(50) < 0.1] = 0.0
        p = float(rng.choice([0.5, 0.9, 0.99, 0.999]))
        limit = (rng.uniform(-2.0, 30.0, 50) if trial % 2
                 else np.full(50, float(rng.uniform(2.0, 25.0))))
        lo, hi = _bisected(n, p, limit)
        cum = np.sort(np.stack([lo - 1, lo, hi, hi + 1, n], axis=1), axis=1)
        j_lo, j_hi = quantile._band(cum, n, p, k, limit)
        last = cum.shape[1] - 1
        np.testing.assert_array_equal(j_lo, np.minimum(np.sum(cum < lo[:, None], axis=1), last))
        np.testing.assert_array_equal(
            j_hi, np.minimum(np.where(hi < 0, -1, np.sum(cum <= hi[:, None], axis=1)), last))


def _bisected(n: np.ndarray, p: float, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The counts `_band` cuts at, by bisecting the whole range of counts."""
    k, log2 = quantile.CONCENTRATION, math.log(2)
    lo = bisect_int(lambda c: quantile.log_below(c, n, p, k) - log2 < limit, 0.0, n)
    hi = bisect_int(lambda c: quantile.log_above(c, n, p, k) - log2 >= limit, 0.0, n)
    return lo, hi - 1.0


def bisect_int(
    holds: Callable[[F64], npt.NDArray[np.bool_]],
    lo: ArrayLike,
    hi: ArrayLike,
) -> F64:
    """The reference `_band`'s search is checked against: the smallest integer k in [lo, hi]
    with `holds(k)`, for a predicate monotone in k (False ... False True ... True); hi + 1
    where it holds nowhere in the range, by halving the range."""
    lo_, hi_ = np.broadcast_arrays(np.floor(f64(lo)), np.floor(f64(hi)) + 1.0)
    lo_, hi_ = lo_.copy(), hi_.copy()
    top = hi_ - 1.0  # the predicate is only ever evaluated inside [lo, hi]
    # Invariant: holds(k) is False below lo and True at hi (hi may be one past the range).
    while True:
        active = lo_ < hi_
        if not active.any():
            return lo_
        mid = np.minimum(np.floor(0.5 * (lo_ + hi_)), top)
        ok = holds(mid) & active
        hi_ = np.where(ok, mid, hi_)
        lo_ = np.where(active & ~ok, mid + 1.0, lo_)
