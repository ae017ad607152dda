"""Sums over a pods × windows grid's windows, at every look or at the last one only, with
the sums of earlier calls kept (`Acc`): the arithmetic under `probes.stats.pods`' test."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np
import numpy.typing as npt

from probes.stats._num import F64, I64

__all__ = ["Acc", "first_max"]


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
