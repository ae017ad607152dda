"""Small vectorised numerics shared by the statistics modules.

Everything works on numpy arrays of any (broadcastable) shape so one call evaluates a test for
every path, or for every window of every simulated rollout, at once. Bisection is used instead
of scipy's scalar root finders because it vectorises, never fails on flat or infinite ends,
and 64 halvings of a double interval reach its resolution.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy.special import gammaln

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]
ArrayLike = npt.ArrayLike

BISECT_ITERS = 64


def f64(x: ArrayLike) -> F64:
    return np.asarray(x, dtype=np.float64)


def betaln(a: ArrayLike, b: ArrayLike) -> F64:
    """log B(a, b) from three `gammaln` calls: ~3x faster than `scipy.special.betaln`.

    The absolute error is about eps·n·log n (1e-8 at n = 10^7 samples), far below anything
    a test threshold can notice.
    """
    a_, b_ = f64(a), f64(b)
    return np.asarray(gammaln(a_) + gammaln(b_) - gammaln(a_ + b_), dtype=np.float64)


def logsumexp(a: ArrayLike, axis: int) -> F64:
    """log Σ exp(a) along `axis`, as `scipy.special.logsumexp` gives it for real input (−inf
    where every term is), without its per-call array-API dispatch: ~0.3 ms a call, a third
    of a last-look pod test (`probes.stats.pods`)."""
    x = f64(a)
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", over="ignore"):  # a +inf term: the sum is +inf
        out = np.log(np.sum(np.exp(x - top), axis=axis)) + np.squeeze(top, axis=axis)
    return np.asarray(out, dtype=np.float64)


def bisect(
    left_of_root: Callable[[F64], npt.NDArray[np.bool_]],
    lo: ArrayLike,
    hi: ArrayLike,
    iters: int = BISECT_ITERS,
) -> F64:
    """The point where a monotone predicate flips from True (left) to False (right).

    `left_of_root(x)` must be True for x below the root and False above it. Where it holds on
    the whole of [lo, hi] the result is hi; where it holds nowhere the result is lo.
    """
    lo_, hi_ = np.broadcast_arrays(f64(lo), f64(hi))
    lo_, hi_ = lo_.copy(), hi_.copy()
    for _ in range(iters):
        mid = 0.5 * (lo_ + hi_)
        left = left_of_root(mid)
        lo_ = np.where(left, mid, lo_)
        hi_ = np.where(left, hi_, mid)
    return np.asarray(0.5 * (lo_ + hi_), dtype=np.float64)


def bisect_int(
    holds: Callable[[F64], npt.NDArray[np.bool_]],
    lo: ArrayLike,
    hi: ArrayLike,
) -> F64:
    """The smallest integer k in [lo, hi] with `holds(k)`, for a predicate monotone in k
    (False ... False True ... True); hi + 1 where it holds nowhere in the range."""
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


def log_clip(log_e: ArrayLike, cap: float = 700.0) -> F64:
    """exp() of log e-values, capped so JSON never carries an infinity (e^700 ≈ 1e304)."""
    return np.asarray(np.exp(np.minimum(f64(log_e), cap)), dtype=np.float64)
