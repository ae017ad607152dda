"""The pod-level test's e-value: a one-sided normal mixture over the standardised drift
(`probes.stats.pods` describes the statistic it is applied to), and how far a sum is from a
decision."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr

from probes.stats._num import F64, logsumexp

__all__ = ["MIXING_SCALES", "POINT_WEIGHT", "log_e_one_sided", "log_e_pass", "needs_factor",
           "needs_factors"]


# Prior scales of the standardised drift θ (the effect per unit of per-call standard
# deviation): 0.01 is a 0.03 pp shift at 0.1 % errors, 1 a shift as large as the noise.
MIXING_SCALES = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
# The share of the pass's e-value on the drift a canary like the baseline has (`log_e_pass`):
# a healthy canary, what a pass is for, then needs about the calls of a test that knows its
# effect, and other effects pay log 2 in the threshold.
POINT_WEIGHT = 0.5


def log_e_one_sided(d: npt.ArrayLike, v: npt.ArrayLike,
                    scales: tuple[float, ...] = MIXING_SCALES) -> F64:
    """log of the one-sided normal-mixture e-value for a positive drift of a sum `d` whose
    variance is `v` (both in units of the per-call standard deviation), averaged over the
    mixing `scales`. For one scale ρ (a half-normal prior on the drift):
    E = 2 (1 + ρ²V)^(−½) exp(ρ²D² / (2(1 + ρ²V))) Φ(ρD / √(1 + ρ²V)).
    """
    d_ = np.asarray(d, dtype=np.float64)[..., None]
    v_ = np.maximum(np.asarray(v, dtype=np.float64), 0.0)[..., None]
    rho2 = np.asarray(scales, dtype=np.float64) ** 2
    den = 1.0 + rho2 * v_
    with np.errstate(invalid="ignore"):
        parts = (math.log(2.0) - 0.5 * np.log(den) + rho2 * d_ * d_ / (2.0 * den)
                 + log_ndtr(np.sqrt(rho2) * d_ / np.sqrt(den)))
    out = logsumexp(parts, axis=-1) - math.log(len(scales))
    return np.asarray(np.where(np.isfinite(d_[..., 0]), out, -np.inf), dtype=np.float64)


def log_e_pass(d: npt.ArrayLike, v: npt.ArrayLike, theta: npt.ArrayLike,
               scales: tuple[float, ...] = MIXING_SCALES, weight: float = POINT_WEIGHT) -> F64:
    """log of the pass side's e-value for a positive drift of a sum `d` with variance `v`
    (standard-deviation units): `weight` on the point alternative θ = `theta` (drift per
    unit of `v`), exp(θD − θ²V/2), the rest on `log_e_one_sided`'s mixture. The mixture is
    an average of these same terms over θ, each an e-process where the drift is at most 0,
    so any weights keep it one; `weight` 0 is the mixture alone."""
    mix = log_e_one_sided(d, v, scales)
    if weight <= 0.0:
        return mix
    d_ = np.asarray(d, dtype=np.float64)
    th = np.maximum(np.asarray(theta, dtype=np.float64), 0.0)
    with np.errstate(invalid="ignore"):
        point = th * d_ - th * th * np.maximum(np.asarray(v, dtype=np.float64), 0.0) / 2.0
        out = np.logaddexp(math.log(weight) + point, math.log1p(-weight) + mix)
    return np.asarray(np.where(np.isfinite(d_), out, -np.inf), dtype=np.float64)


def needs_factor(d: float, v_sampling: float, v_pods: float, log_threshold: float,
                 scales: tuple[float, ...] = MIXING_SCALES, most: float = 1e4) -> float | None:
    """By what factor the calls would have to grow for the e-value of a sum `d` with these
    variance parts to reach `log_threshold`, if the present rates held: the sum and the
    sampling variance grow with the calls, the pods' variance with their square. None when
    `d` points the other way or no factor up to `most` gets there."""
    return needs_factors([d], [v_sampling], [v_pods], log_threshold, scales, most)[0]


def needs_factors(d: Sequence[float], v_sampling: Sequence[float], v_pods: Sequence[float],
                  log_threshold: float, scales: tuple[float, ...] = MIXING_SCALES,
                  most: float = 1e4) -> list[float | None]:
    """`needs_factor` for many sums at once (one per path)."""
    d_, vs, vp = (np.asarray(x, dtype=np.float64)[:, None] for x in (d, v_sampling, v_pods))
    k = np.geomspace(1.0, most, 400)[None, :]
    with np.errstate(invalid="ignore"):
        log_e = log_e_one_sided(k * d_, k * vs + k * k * vp, scales)
    hit = (log_e >= log_threshold) & (d_ > 0)
    first = np.argmax(hit, axis=1)
    return [float(k[0, j]) if hit[i, j] else None for i, j in enumerate(first)]
