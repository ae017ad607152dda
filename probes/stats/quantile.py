"""Anytime-valid comparison of two quantiles (p99 latency) from pooled bucket histograms.

Why counts, not percentiles. For a fixed threshold x the number of samples ≤ x is
Binomial(n, F(x)), and "q_p ≤ x" is the statement F(x) ≥ p with p KNOWN. So a quantile test
is a binomial test at a known rate (Howard & Ramdas 2022, "Sequential estimation of quantiles
with applications to A/B testing and best-arm identification"), computed from each cohort's
pooled histogram over the same windows. Per-window percentiles are not used: they are biased
for the smaller cohort and their average is not a percentile of anything.

One-sided e-processes at a threshold x, from the count N of n samples on one side of x:

    below(N) = ∫_{f<p} (f/p)^N ((1−f)/(1−p))^(n−N) dπ₋(f)   against F(x) ≥ p  (q_p ≤ x)
    above(N) = ∫_{f>p} (f/p)^N ((1−f)/(1−p))^(n−N) dπ₊(f)   against F(x−) ≤ p (q_p ≥ x)

π± is a Beta(k·p, k·(1−p)) prior truncated to the alternative side (closed form with the
regularised incomplete beta). Each integrand is a supermartingale under every null rate (its
mean per sample is ≤ 1 for F(x) ≥ p, resp. ≤ p), so each mixture is an e-process for the
composite one-sided null, and it is monotone in N (below falls, above rises), which is what
makes bucketed counts usable: a histogram only brackets the count at x, and plugging in the
end of the bracket that gives the smaller e-value keeps validity.

Two cohorts. H0 "canary within tolerance" is q_c ≤ r·q_b + m. For a candidate baseline
quantile q, q_b = q implies F_b(q) ≥ p and F_b(q−) ≤ p, so ½·(below_b(q) + above_b(q)) is an
e-process under it, and below_c(r·q + m) is one for the canary; their product is one for the
null slice {q_b = q} (independent cohorts). The infimum over q is an e-process for H0:

    E_fail = min over q of ½(below_b(#b ≤ q) + above_b(#b < q)) · below_c(#c ≤ r·q + m).

With bucket edges, q runs over buckets [L_j, U_j): the baseline counts are bracketed by the
cumulative counts C_b(j−1) ≤ · ≤ C_b(j) and the canary count at r·q + m < r·U_j + m by the
samples in buckets whose lower edge lies below r·U_j + m (conservative by one bucket, < 1.6 %).
E_pass mirrors it with above_c(#c < r·q + m), counting only buckets wholly below r·L_j + m.
Compared with two separate quantile CSs, evidence from both cohorts multiplies and α is
spent once.

Only buckets near the baseline's p-quantile can attain the minimum: the canary factor is
bounded below by its value at the extreme count, so buckets whose baseline factor alone
exceeds (threshold + cap) minus that bound are skipped. Results are exact below the cap and
reported as "at least threshold + cap" above it.

Prior concentration k: the default 200 puts the prior's standard deviation at 0.007 around
p = 0.99, the scale of tail shifts a ×1.2 tolerance is about; benchmarks/detection.py has the
comparison of other values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import betainc

from probes.stats._num import F64, ArrayLike, betaln, crossing_int, f64
from probes.stats.bounded import TwoSample

__all__ = [
    "CONCENTRATION",
    "LOG_CAP",
    "Layout",
    "log_above",
    "log_below",
    "quantile_cs",
    "quantile_estimate",
    "two_sample",
]

CONCENTRATION = 200.0
# e-values are computed exactly up to e^LOG_CAP times the decision threshold.
LOG_CAP = math.log(1e6)
_LOG2 = math.log(2.0)


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """Bucket edges in seconds: bucket j holds values in [lower[j], upper[j]).

    The first bucket also holds everything below its edge (so its effective lower edge is 0)
    and the last everything above (effective upper edge +inf).
    """

    lower: F64
    upper: F64
    midpoint: F64

    @classmethod
    def from_edges(cls, lower: ArrayLike, upper: ArrayLike) -> Layout:
        lo, hi = f64(lower).copy(), f64(upper).copy()
        if lo.shape != hi.shape or lo.ndim != 1 or lo.size < 2:
            raise ValueError("bucket edges must be two 1-D arrays of the same length")
        mid = (lo + hi) / 2.0
        lo[0] = 0.0
        hi[-1] = np.inf
        for a in (lo, hi, mid):
            a.setflags(write=False)
        return cls(lo, hi, mid)

    @property
    def size(self) -> int:
        return int(self.lower.size)


def _log_betainc(a: F64, b: F64, x: float) -> F64:
    """log I_x(a, b), accurate where `betainc` underflows.

    I_x(a, b) = x^a (1−x)^b / (a·B(a, b)) · ₂F₁(a+b, 1; a+1; x) and the series ₂F₁ has
    positive terms starting at 1, so its first term is a lower bound; the e-values built on
    it stay valid (never larger than the exact ones) and are tight where betainc underflows
    (x far below the bulk of Beta(a, b), where the series is ≈ 1/(1 − x)).
    """
    with np.errstate(divide="ignore"):
        direct = np.log(betainc(a, b, x))
    bound = a * math.log(x) + b * math.log1p(-x) - np.log(a) - betaln(a, b)
    return np.asarray(np.maximum(direct, bound), dtype=np.float64)


def _log_tail(n_side: F64, n: F64, p: float, k: float, above: bool) -> F64:
    a0, b0 = k * p, k * (1.0 - p)
    a, b = a0 + n_side, b0 + n - n_side
    if above:
        log_i = _log_betainc(b, a, 1.0 - p) - math.log(float(betainc(b0, a0, 1.0 - p)))
    else:
        log_i = _log_betainc(a, b, p) - math.log(float(betainc(a0, b0, p)))
    out = (
        betaln(a, b) - betaln(a0, b0) + log_i
        - n_side * math.log(p) - (n - n_side) * math.log1p(-p)
    )
    return np.asarray(np.where(n > 0, out, 0.0), dtype=np.float64)


def log_below(count_le: ArrayLike, n: ArrayLike, p: float, k: float = CONCENTRATION) -> F64:
    """log e-value against q_p ≤ x (F(x) ≥ p), from the count of samples ≤ x; falls in it."""
    return _log_tail(f64(count_le), f64(n), p, k, above=False)


def log_above(count_lt: ArrayLike, n: ArrayLike, p: float, k: float = CONCENTRATION) -> F64:
    """log e-value against q_p ≥ x (F(x−) ≤ p), from the count of samples < x; rises in it."""
    return _log_tail(f64(count_lt), f64(n), p, k, above=True)


def _band(
    cum: F64, n: F64, p: float, k: float, limit: F64
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Per row, the bucket range outside which ½(below + above) ≥ e^limit for sure."""
    # Smallest count whose `below` drops under the limit, largest whose `above` stays under,
    # searched first where the normal approximation of the mixture puts them: its log is
    # about z²·n/(2(n + k)) − ½·log((n + k)/k) at z standard errors from p·n.
    with np.errstate(divide="ignore", invalid="ignore"):
        z2 = 2.0 * (n + k) / n * np.maximum(limit + 0.5 * np.log((n + k) / k), 0.0)
        off = np.nan_to_num(np.sqrt(z2 * n * p * (1.0 - p)))
    step = 0.01 * off + 2.0
    n_lo = crossing_int(lambda c: log_below(c, n, p, k) - _LOG2, limit, 0.0, n, rising=False,
                        near=(p * n - off - step, p * n - off + step))
    n_hi = crossing_int(lambda c: log_above(c, n, p, k) - _LOG2, limit, 0.0, n, rising=True,
                        near=(p * n + off - step, p * n + off + step)) - 1.0
    # Row-wise searchsorted: first j with C(j) ≥ n_lo; and C(j−1) ≤ n_hi ⇔ j ≤ #{C ≤ n_hi}
    # (C(−1) = 0, so no bucket qualifies when n_hi < 0).
    j_lo = np.sum(cum < n_lo[:, None], axis=1)
    j_hi = np.where(n_hi < 0, -1, np.sum(cum <= n_hi[:, None], axis=1))
    last = cum.shape[1] - 1
    return np.minimum(j_lo, last).astype(np.intp), np.minimum(j_hi, last).astype(np.intp)


def _rows(x: ArrayLike, bsize: int) -> tuple[F64, tuple[int, ...]]:
    arr = f64(x)
    if arr.shape[-1] != bsize:
        raise ValueError(f"histograms must have {bsize} buckets, got {arr.shape[-1]}")
    lead = arr.shape[:-1]
    return arr.reshape(-1, bsize), lead


def _gather(cum: F64, idx: npt.NDArray[np.intp]) -> F64:
    """cum[row, idx] with idx = −1 meaning 0 (nothing below the first bucket)."""
    safe = np.maximum(idx, 0)
    got = np.take_along_axis(cum, safe, axis=1)
    return np.where(idx >= 0, got, 0.0)


def two_sample(
    cum_b: ArrayLike,
    cum_c: ArrayLike,
    layout: Layout,
    p: float,
    ratio: float,
    margin_s: float,
    log_threshold: float,
    *,
    k: float = CONCENTRATION,
) -> TwoSample:
    """log E_fail and log E_pass for H0: q_c ≤ ratio·q_b + margin_s (module docstring).

    `cum_b`, `cum_c`: cumulative bucket counts (..., B) of each cohort's pooled histogram.
    Values are exact below log_threshold + LOG_CAP and clipped to it above.
    """
    cb, lead = _rows(cum_b, layout.size)
    cc, lead_c = _rows(cum_c, layout.size)
    if lead != lead_c:
        raise ValueError("baseline and canary histograms must have the same shape")
    n_b, n_c = cb[:, -1], cc[:, -1]
    ceiling = log_threshold + LOG_CAP
    floor_fail = log_below(n_c, n_c, p, k)
    floor_pass = log_above(np.zeros_like(n_c), n_c, p, k)
    limit = ceiling - np.minimum(floor_fail, floor_pass)
    j_lo, j_hi = _band(cb, n_b, p, k, limit)
    width = max(1, int(np.max(j_hi - j_lo)) + 1) if j_lo.size else 1
    j = j_lo[:, None] + np.arange(width)[None, :]
    valid = j <= j_hi[:, None]
    j = np.minimum(j, layout.size - 1)

    nb = n_b[:, None]
    base = np.logaddexp(
        log_below(_gather(cb, j), nb, p, k), log_above(_gather(cb, j - 1), nb, p, k)
    ) - _LOG2
    x_hi = ratio * layout.upper[j] + margin_s
    x_lo = ratio * layout.lower[j] + margin_s
    k_fail = np.searchsorted(layout.lower, x_hi, side="left") - 1
    k_pass = np.searchsorted(layout.upper, x_lo, side="right") - 1
    nc = n_c[:, None]
    fail = base + log_below(_gather(cc, k_fail), nc, p, k)
    pas = base + log_above(_gather(cc, k_pass), nc, p, k)
    fail = np.where(valid, fail, np.inf).min(axis=1)
    pas = np.where(valid, pas, np.inf).min(axis=1)
    return TwoSample(
        log_e_fail=np.minimum(fail, ceiling).reshape(lead),
        log_e_pass=np.minimum(pas, ceiling).reshape(lead),
    )


def quantile_cs(
    cum: ArrayLike, layout: Layout, p: float, log_threshold: float, *, k: float = CONCENTRATION
) -> tuple[F64, F64]:
    """A CS for one cohort's p-quantile, in seconds, as bucket edges (lower, upper).

    Bucket j is in the CS unless ½(below + above) ≥ e^log_threshold there; the bounds are the
    outer edges of the first and last buckets kept (0 and +inf when nothing is excluded).
    """
    c, lead = _rows(cum, layout.size)
    n = c[:, -1]
    j_lo, j_hi = _band(c, n, p, k, np.full(n.shape, float(log_threshold)))
    width = max(1, int(np.max(j_hi - j_lo)) + 1) if j_lo.size else 1
    j = np.minimum(j_lo[:, None] + np.arange(width)[None, :], layout.size - 1)
    valid = j_lo[:, None] + np.arange(width)[None, :] <= j_hi[:, None]
    nn = n[:, None]
    e = np.logaddexp(log_below(_gather(c, j), nn, p, k), log_above(_gather(c, j - 1), nn, p, k))
    keep = valid & (e - _LOG2 < log_threshold)
    any_kept = keep.any(axis=1)
    first = np.argmax(keep, axis=1)
    last = width - 1 - np.argmax(keep[:, ::-1], axis=1)
    rows = np.arange(c.shape[0])
    lo = np.where(any_kept, layout.lower[j[rows, first]], 0.0)
    hi = np.where(any_kept, layout.upper[j[rows, last]], np.inf)
    empty = n <= 0
    return (
        np.where(empty, 0.0, lo).reshape(lead),
        np.where(empty, np.inf, hi).reshape(lead),
    )


def quantile_estimate(cum: ArrayLike, layout: Layout, p: float) -> F64:
    """The pooled p-quantile in seconds: the midpoint of the bucket holding rank ⌈p·n⌉
    (numpy's inverted-CDF rule, as `probes.measure.histogram`); NaN where n = 0."""
    c, lead = _rows(cum, layout.size)
    n = c[:, -1]
    rank = np.maximum(1.0, np.ceil(np.round(p * n, 9)))
    idx = np.minimum(np.sum(c < rank[:, None], axis=1), layout.size - 1)
    return np.where(n > 0, layout.midpoint[idx], np.nan).reshape(lead)
