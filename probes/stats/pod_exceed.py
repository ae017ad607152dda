"""p99 with the pod as the unit: exceedances per pod × window through `pod_track`.

The live verdict's pass is this module's; its fail is `pod_profile`'s profile e-value, which
spends α once and cuts the canary at r·q + m for each candidate q (BENCHMARKS.md D18). The
fail side below is the rule before it, kept for the benchmarks that compare the two.

Why. A test on the cohorts' pooled histograms treats every call as independent: a canary
pod on a slow node carries the canary's whole tail, and with pods ±30 % apart one or two
canary pods make the canary's p99 a coin toss against the tolerance, both ways. The pooled
test then fails healthy canaries and, worse, passes slow ones (a ×1.5 canary on its fastest
pods; BENCHMARKS.md D18). The success rate counts the spread between pods as noise (τ²,
`probes.stats.pods`); this gives p99 the same, on both sides.

Method. At a look, let [L_lo, U_lo) and [L_hi, U_hi) be the buckets holding the lower and
upper ends of the baseline p99's confidence sequence (`quantile.quantile_cs`, at α/2). The
tolerance is H0: q_c ≤ r·q_b + m. Each call becomes a 0/1 exceedance of a cut, per pod (per
pod × window where the caller keeps windows apart), through `pod_track`'s τ² and
normal-mixture e-process, at α/2:

- fail side: a baseline call exceeds from bucket lo on, a canary call from the first
  bucket wholly at or above r·U_hi + m. With q_b in the sequence a baseline call exceeds
  with chance ≥ 1 − p, and a canary within tolerance (q_c ≤ r·q_b + m ≤ r·U_hi + m) with
  chance ≤ 1 − p, so H0 implies μ_c ≤ μ_b; `pod_track` compares the cohorts' rates (ratio
  1, margin 0), and fails when that is rejected with each cohort's worst pod out;
- pass side: a canary call exceeds from the bucket holding r·L_lo + m on. A canary beyond
  tolerance (q_c > r·q_b + m ≥ r·L_lo + m) has more than 1 − p of its calls there, a
  known rate, so the canary's rate is tested against 1 − p itself (ratio 0, margin 1 − p):
  pass when "at least 1 − p" is rejected, every canary pod in. The baseline's calls enter
  through the sequence (their sampling noise) and their pods through the spread: τ² from
  both cohorts' pods, the baseline's counted from the bucket of its estimated p-quantile
  (where their rates are near 1 − p, as a canary's are at H0's edge), and the baseline
  pods' weights in the spread term kept (`pod_ratio` 1), since the baseline's p99 stands
  for its pods' as a sample. Against the baseline's own exceedance rate (a two-sample test)
  the pass had the baseline's sampling noise twice and a cut above the sequence's upper end
  (rates near 0.6 %, not 1 %): several times the calls (BENCHMARKS.md D18).

A decision errs only if the sequence misses q_b (chance α/2) or the track errs (α/2). The
sequence's width and the buckets (64 per octave, ~1.1 % wide) are the slack between the two
sides: with the estimate's bucket as if it were known, a canary within about a bucket of
the boundary failed about one rollout in ten (BENCHMARKS.md D18); the sequence's cuts cost
the fail side about twice the calls to decide, the pass side little.

Known limits (an independent review's findings, not yet closed):
- The live verdict pools each pod's warm calls over time (one column, what the verdict
  cache keeps), so there are no time strata: a latency trend over the rollout weighs on
  the cohort whose calls came later. The comparison starts at the first window both
  cohorts share, and cohort-balanced sampling keeps their calls per second alike; per-pod
  × window cells would give p99 the success rate's strata.
- τ² is pooled over both cohorts' pods: when the canary's pods spread more than the
  baseline's (a version that makes pods differ), it is underestimated for the canary and a
  canary at the pass side's H0 passed in about 3 % of simulated rollouts at α = 0.25 %
  (BENCHMARKS.md D19). On small estates τ²'s few degrees of freedom are allowed for
  (`pods.few_pods_factor`).


What it costs: the spread between pods bounds the evidence. With pods ±30 % apart a pod's
rate above the baseline's p99 ranges 0.1–4 %, so a handful of canary pods cannot show the
version within ×1.2 as fast as pooled calls seemed to; it says so (inconclusive, with how
far it is) instead of passing a slow version on its fastest pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from probes.stats._pod_batch import PodTrack
from probes.stats.pods import pod_tracks
from probes.stats.quantile import Layout, quantile_cs

__all__ = ["ExceedanceCuts", "Exceedances", "exceedance_cuts", "exceedance_track",
           "exceedance_tracks", "pass_track", "pass_tracks"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class ExceedanceCuts:
    """Per row of the baseline's cumulative counts, the first bucket from which a call
    exceeds: the baseline's and the canary's on the fail side, the canary's on the pass
    side, and the bucket holding the baseline's estimated p-quantile, whose exceedances
    give the pass side's τ² (module docstring). A cut of the layout's size counts nothing."""

    baseline_fail: I64
    canary_fail: I64
    baseline_level: I64
    canary_pass: I64


def exceedance_cuts(cum_b: F64, layout: Layout, p: float, ratio: float, margin_s: float,
                    log_threshold: float | None = None) -> ExceedanceCuts:
    """The cuts (module docstring) for each row of the baseline's cumulative bucket counts
    (..., buckets). With `log_threshold`, from the baseline p-quantile's confidence sequence
    at that level (`quantile.quantile_cs`) rather than its estimate: the baseline's fail cut
    from the sequence's lower bucket, the canary's from its upper bucket on the fail side and
    its lower one on the pass side, so each side's implication holds wherever the true
    quantile lies in the sequence. An unbounded sequence cuts so that neither side can
    decide."""
    cum = np.asarray(cum_b, dtype=np.float64)
    n = cum[..., -1]
    rank = np.maximum(1.0, np.ceil(np.round(p * n, 9)))
    j = np.minimum(np.sum(cum < rank[..., None], axis=-1), layout.size - 1).astype(np.int64)
    if log_threshold is None:
        j_lo = j_hi = j
    else:
        lo, hi = quantile_cs(cum, layout, p, log_threshold)
        j_lo = np.maximum(np.searchsorted(layout.lower, lo, side="right") - 1, 0)
        j_hi = np.searchsorted(layout.upper, hi, side="left")  # size: no upper bound
    size = layout.size
    bounded = j_hi < size
    upper = layout.upper[np.minimum(j_hi, size - 1)]
    k = np.where(bounded, np.searchsorted(layout.lower, ratio * upper + margin_s, side="left"),
                 size)
    # The bucket holding r·L + m: the first whose upper edge is above it.
    kp = np.searchsorted(layout.upper, ratio * layout.lower[j_lo] + margin_s, side="right")
    # An empty baseline cuts its level at the last bucket as well: no rates, no τ² from it.
    return ExceedanceCuts(np.asarray(j_lo, dtype=np.int64), np.asarray(k, dtype=np.int64),
                          np.asarray(j, dtype=np.int64),
                          np.minimum(np.asarray(kp, dtype=np.int64), size - 1))


# One grid's exceedances: (calls, above_b, above_c, canary), as `exceedance_track` takes them.
Exceedances = tuple[F64, F64, F64, Bool]


def exceedance_track(calls: F64, above_b: F64, above_c: F64, canary: Bool, *,
                     log_threshold: float, last_only: bool = False) -> PodTrack:
    """The fail side's `pod_track` on exceedances (module docstring): `calls` (pods,
    windows) the cells' calls with a latency, `above_b` / `above_c` their calls from the
    baseline's / the canary's fail cut; each pod's row is read from its own cohort's. Its
    `log_e_fail` is the fail side's evidence."""
    return exceedance_tracks([(calls, above_b, above_c, canary)], log_threshold=log_threshold,
                             last_only=last_only)[0]


def exceedance_tracks(grids: Sequence[Exceedances], *, log_threshold: float,
                      last_only: bool = False) -> list[PodTrack]:
    """`exceedance_track` for many grids in one batch (`pods.pod_tracks`)."""
    return pod_tracks(_items(grids), 1.0, 0.0, log_threshold=log_threshold,
                      last_only=last_only)


def pass_track(calls: F64, above_level: F64, above_c: F64, canary: Bool, p: float, *,
               log_threshold: float, last_only: bool = False) -> PodTrack:
    """The pass side's `pod_track` (module docstring): the canary's calls from its pass cut
    (`above_c`) against the rate 1 − p, the baseline's from its level (`above_level`) in τ²
    only. Its `log_e_pass` is the pass side's evidence."""
    return pass_tracks([(calls, above_level, above_c, canary)], p, log_threshold=log_threshold,
                       last_only=last_only)[0]


def pass_tracks(grids: Sequence[Exceedances], p: float, *, log_threshold: float,
                last_only: bool = False) -> list[PodTrack]:
    """`pass_track` for many grids in one batch (`pods.pod_tracks`)."""
    return pod_tracks(_items(grids), 0.0, 1.0 - p, log_threshold=log_threshold,
                      last_only=last_only, pod_ratio=1.0)


def _items(grids: Sequence[Exceedances]) -> list[tuple[F64, F64, Bool]]:
    items = []
    for calls, above_b, above_c, canary in grids:
        is_canary = np.asarray(canary, dtype=bool)
        s = np.where(is_canary[:, None], np.asarray(above_c, dtype=np.float64),
                     np.asarray(above_b, dtype=np.float64))
        items.append((np.asarray(calls, dtype=np.float64), s, is_canary))
    return items
