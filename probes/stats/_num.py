"""Small vectorised numerics shared by the statistics modules.

Everything works on numpy arrays of any (broadcastable) shape so one call evaluates a test for
every path, or for every window of every simulated rollout, at once. Bisection is used instead
of scipy's scalar root finders because it vectorises, never fails on flat or infinite ends,
and 64 halvings of a double interval reach its resolution. `Acc` takes sums over a pods ×
windows grid's windows, at every look or at the last one only (the arithmetic under
`probes.stats.pods`' test).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

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


def crossing_int(
    value: Callable[[F64], F64],
    limit: ArrayLike,
    lo: ArrayLike,
    hi: ArrayLike,
    *,
    rising: bool,
    near: tuple[ArrayLike, ArrayLike],
) -> F64:
    """The smallest integer k in [lo, hi] where `value(k)` has crossed `limit` (value ≥ limit
    for a rising value, value < limit for a falling one), hi + 1 where it crosses nowhere in
    the range: a bisection's integer wherever that predicate is monotone in k, in a few
    evaluations instead of one per halving of the range. Each step probes
    two integers at once (`value` takes (2, rows)): first `near`, the caller's estimate of
    a bracket around the crossing; then the pair around where the line through the
    bracket's two known values crosses `limit`, or, where a step did not halve the bracket,
    its thirds."""
    lo_, hi_ = (a.copy() for a in np.broadcast_arrays(np.floor(f64(lo)), np.floor(f64(hi)) + 1.0))
    top = hi_ - 1.0
    lim = np.broadcast_to(f64(limit), lo_.shape)
    # The value at lo − 1 (not crossed) and at hi (crossed): NaN while unknown.
    v_lo, v_hi = np.full(lo_.shape, np.nan), np.full(lo_.shape, np.nan)
    a, b = (np.broadcast_to(np.floor(f64(x)), lo_.shape) for x in near)
    # Which end the last step moved (+1 lo, −1 hi): an end kept twice counts half as far
    # from `limit` on the line (the Illinois rule), so a curved value still converges fast.
    moved = np.zeros(lo_.shape)
    while True:
        active = lo_ < hi_
        if not active.any():
            return lo_
        last = np.minimum(hi_ - 1.0, top)
        a, b = np.clip(a, lo_, last), np.clip(b, lo_, last)
        before = hi_ - lo_
        v = np.asarray(value(np.stack([a, b])), dtype=np.float64)
        crossed = v >= lim if rising else v < lim
        ca, cb = crossed[0] & active, crossed[1] & active
        at_b = cb & ~ca
        neither = active & ~ca & ~cb
        hi_ = np.where(ca, a, np.where(at_b, b, hi_))
        v_hi = np.where(ca, v[0], np.where(at_b, v[1], v_hi))
        lo_ = np.where(at_b, a + 1.0, np.where(neither, b + 1.0, lo_))
        v_lo = np.where(at_b, v[0], np.where(neither, v[1], v_lo))
        slow = (hi_ - lo_) * 2.0 > before
        now = np.where(neither, 1.0, np.where(ca, -1.0, 0.0))
        g_lo = np.where((now == -1.0) & (moved == -1.0), 0.5, 1.0) * (v_lo - lim)
        g_hi = np.where((now == 1.0) & (moved == 1.0), 0.5, 1.0) * (v_hi - lim)
        moved = now
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            root = (lo_ - 1.0) + (hi_ - lo_ + 1.0) * g_lo / (g_lo - g_hi)
        line = ~slow & np.isfinite(root)
        last = np.minimum(hi_ - 1.0, top)
        width = np.maximum(last - lo_, 0.0)
        b_line = np.clip(np.ceil(np.where(line, root, 0.0)), lo_, last)
        a = np.where(line, b_line - 1.0, lo_ + np.floor(width / 3.0))
        b = np.where(line, b_line, lo_ + np.floor(2.0 * width / 3.0))


def first_max(a: F64, axis: int) -> I64:
    """The pod with the largest value, the first of those tied: values are rounded first,
    so that sums taken in another order (the last look alone, a full track, a batch) pick
    the same pod."""
    return np.argmax(np.round(a, 6), axis=axis)


def _cum(a: F64) -> F64:
    return np.cumsum(a, axis=-1)


class Acc:
    """How sums over windows are taken: at every look (running sums), or at the last only.
    `dot` weighs each window by a per-group factor first: at the last look alone that is a
    matrix product, one pass over the cells instead of a product and a sum.

    With `kept` (a `TrackMemo`'s, last look only), the windows are those after the ones
    already summed: each sum, named by its `key`, adds the kept sum of the windows before
    them, and the sums through each group's first `fold` windows of these are kept for the
    next call (`kept_now`). Every drop of a pod is then summed (`drops`), the next call
    may drop another: a drop's sums are named (name, pod), −1 for none."""

    def __init__(self, last_only: bool, kept: Mapping[Hashable, F64] | None = None,
                 fold: I64 | None = None) -> None:
        self.last_only = last_only or kept is not None
        self.kept = kept
        self.fold = fold
        self.kept_now: dict[Hashable, F64] = {}
        self._split: F64 | None = None

    @property
    def every_drop(self) -> bool:
        return self.kept is not None

    def drops(self, drop: I64, may: npt.ArrayLike) -> list[int]:
        """The pods to leave out one at a time (−1: none): those `drop` names, or with
        `kept`, every pod `may` (pods, any group) allows."""
        if self.kept is None:
            return [int(k) for k in np.unique(drop)]
        return [-1, *np.flatnonzero(may).tolist()]

    def __call__(self, a: F64, key: Hashable = None) -> F64:
        if self.kept is not None:
            return self._kept(a, None, key)
        return np.sum(a, axis=-1, keepdims=True) if self.last_only else _cum(a)

    def dot(self, a: F64, w: F64, key: Hashable = None) -> F64:
        """Σ over windows of a[g, i, t]·w[g, t]: `a` (groups, pods, windows), `w` (groups,
        windows); (groups, pods, looks)."""
        if self.kept is not None:
            return self._kept(a, w, key)
        if self.last_only:
            return np.matmul(a, w[:, :, None])
        return _cum(a * w[:, None, :])

    def running(self, x: F64, key: Hashable) -> F64:
        """Running sums of `x` (groups, windows) at every window, from the kept sum `key`
        of the windows before."""
        out = _cum(x)
        return out if self.kept is None else out + self._before(key)

    def _before(self, key: Hashable) -> F64 | float:
        # A fresh memo has kept nothing; a kept one has every key its last call summed.
        return self.kept[key] if self.kept else 0.0

    def _kept(self, a: F64, w: F64 | None, key: Hashable) -> F64:
        assert self.fold is not None and self.kept is not None
        if self._split is None or self._split.shape[1] != a.shape[-1]:
            cols = np.arange(a.shape[-1])[None, :] < self.fold[:, None]
            self._split = np.stack([cols, ~cols], axis=-1).astype(np.float64)
        m = self._split if w is None else self._split * w[:, :, None]
        parts = np.matmul(a[:, None, :], m)[:, 0] if a.ndim == 2 else np.matmul(a, m)
        folded = self._before(key) + parts[..., :1]
        self.kept_now[key] = folded
        return folded + parts[..., 1:]


def overlapping(start: npt.NDArray[np.float64], length: npt.NDArray[np.float64] | float,
                spans: Sequence[tuple[float, float]]) -> npt.NDArray[np.bool_]:
    """Which windows [start, start + length) share any time with a span [lo, hi): the rule
    every reader applies to an overloaded probe's spans (a window touched by one counts for
    nothing, whatever its length)."""
    out = np.zeros(np.shape(start), dtype=bool)
    end = start + length
    for lo, hi in spans:
        out |= (end > lo) & (start < hi)
    return out
