"""p99's fail with the pod as the unit: a profile e-value over the baseline's p99.

Why. The fail used to cut at the two ends of the baseline p99's confidence sequence at α/2
(`pod_exceed.exceedance_cuts`): until the sequence narrows to a few percent, a canary 1.5×
slower has barely more of its calls beyond r·U + m than the baseline has beyond L, and p99 ×1.5
failed in a median of 11 minutes where Wald's SPRT takes 0.3 (BENCHMARKS.md D18, D21).

Method. H0, the canary within tolerance, is q_c ≤ r·q_b + m. It is the union over candidate
baseline p99s q of

    H0(q) = {q ≤ q_b and q_c ≤ r·q + m}

(take q = q_b for one inclusion; q ≤ q_b gives r·q + m ≤ r·q_b + m for the other). Under
H0(q) two statements at known rates hold, one per cohort:

- baseline: a call is at or beyond q with chance ≥ 1 − p (q ≤ q_b means F_b(q−) ≤ p);
- canary: a call is beyond r·q + m with chance ≤ 1 − p (q_c ≤ r·q + m means F_c ≥ p there).

E_b(q) tests the first (its evidence says "q is above the baseline's p99") and E_c(q) the
second ("the canary is slow beyond r·q + m"), each through `pods.pod_tracks` against the known
rate (ratio 0), so the pod is the unit on both: τ² is noise, the tested cohort's worst pod is
capped (three pods or more) or left out (two), and a canary of one pod is judged against the
baseline pods' spread (BENCHMARKS.md D21). E_b runs on the baseline's non-exceedances with the
baseline as the tested cohort (H0: their rate ≤ p), so its worst pod, the one that makes q look
highest, is the one capped. Each factor's τ² comes from the pods it tests alone: the other
cohort's pods enter summed into one (its calls from its own cohort's estimated p-quantile),
which gives the window's pooled rate, the variance's yardstick, and nothing to τ² (`_factor`).
So E_b reads the baseline's pods and E_c the canary's, and the cohorts' calls and pods being
independent, under H0(q) E(q) = E_b(q)·E_c(q) is an e-process (with τ² pooled over both
cohorts, one underestimate raised both factors at once). The exception is a tested cohort of
one pod, judged against the other's pods' spread (D21): a canary of one pod's E_c reads the
baseline's pods, as E_b does. For the true q_b, inf over q of E(q) is at most E(q_b) at every
look, so rejecting
H0 when the infimum reaches 1/α errs with chance at most α (Ville). The infimum is taken anew
at every look: each q's product is its own process, and the least of them may be another
q's at each look; what is bounded is the one process at q_b.

Buckets. A bucket j = [L_j, U_j) stands for every q in it, conservatively on both factors: the
baseline's calls counted from L_j (at least those at or beyond q), the canary's from the first
bucket wholly at or above r·U_j + m (only calls beyond r·q + m). The family of buckets is
fixed, so each bucket's E is one process whatever the data.

Where the infimum is sought. Every bucket of the layout (equal counts kept once), so q_b's
bucket is always a candidate whichever pods ran, and the threshold is 1/α. A confidence
sequence on the baseline's pooled calls, which placed the candidates before, covers the p99
of the pods that ran, not their version's: on pods ±30 % apart it missed the version's
bucket in most rollouts, and six baseline pods drawn fast then put every candidate, and the
canary's cut with it, below the version's p99. The guess is tried first (`profile_fails`),
so a healthy path costs one candidate per look and a failing one all of its distinct ones.

Each factor's τ² (`TAU2_LEVEL`). Pods' shares of calls in a tail are right-skewed: pods ±30 %
apart in scale have 0.1-4 % of their calls beyond the version's p99, so a cohort drawn fast
shows a low share and a small spread at once, and a τ² estimated from it made E_b at the
version's p99 anything but an e-value (a mean of 1e28 on 6 vs 6). Each factor takes τ² at
the boundary's rate (τ ∝ p(1−p): the spread the pods would show at the rate H0 puts them
at), its spread term never below that of τ²'s upper bound at `TAU2_LEVEL`; and the figure is
never above the factor with every pod in (`pods.pod_fail_values`), as capping or setting a
pod aside can only remove evidence against a known rate.

What it rests on, besides `pods.pod_tracks`' own assumptions (a CLT per pod, the mixture's
tail asymptotic): pod effects no more skewed on the boundary's scale than the pods drawn
show, within τ²'s bound, which the every-look rows of `benchmarks/small_estates_sim.py`
measure (pods drawn per rollout, canaries at H0's edge, uniform and lognormal pod scales);
the product needs the cohorts' calls independent given the pods: an outage that slows both
cohorts raises E_c and lowers E_b at once, which lowers the product's mean. With two pods in
a cohort its factor's τ² has one degree of freedom and that factor next to no evidence: on
two pods a side only regressions far beyond ×2 fail, and two baseline pods bound the
version's p99 from above only far out (×3 on three canary pods stays inconclusive).
`benchmarks/p99_pods_sim.py` measures the false fails on estates whose pods differ, restart
cold and sit on slow nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from probes.stats.pods import pod_fail_values
from probes.stats.quantile import Layout

__all__ = ["TAU2_LEVEL", "ProfileCuts", "ProfileInput", "profile_cuts", "profile_fails",
           "profile_input", "profile_threshold"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]

# The share of α spent on the confidence sequence that bounds where the infimum is sought:
# small, as a wider sequence only adds buckets whose E is large anyway.
# The confidence of the upper bound each factor takes τ² at (`tau2_upper`), at the
# boundary's rate: with τ² as estimated, the factors at the version's p99 had means of
# 1e28 (E_b) and 1e2 (E_c) on 6 vs 6 pods ±30 % apart; with this, 0.9 and 0.004 at 30 min.
TAU2_LEVEL = 0.7
# Candidates tried at once per grid and round once its guess reaches the threshold
# (`profile_fails`), the nearest first: a healthy grid's infimum is usually near the guess.
_ROUNDS = (8, 64, 512)


def profile_threshold(alpha: float) -> float:
    """log 1/α, at which the profile fails: every bucket is a candidate, so no share of α
    goes to placing the baseline's p99."""
    return math.log(1.0 / alpha)


@dataclass(frozen=True, slots=True, eq=False)
class ProfileCuts:
    """Per row of the baseline's cumulative counts: each candidate bucket j's canary cut
    `canary[j]` over the layout (the first bucket wholly at or above r·U_j + m; the layout's
    size counts nothing), and the buckets of the baseline's and the canary's estimated
    p-quantiles (`level_b`, `level_c`): the baseline's is the guess tried first, and from
    them the other cohort's pods are counted for τ²."""

    canary: I64
    level_b: I64
    level_c: I64


def _level(cum: F64, layout: Layout, p: float) -> I64:
    n = cum[..., -1]
    rank = np.maximum(1.0, np.ceil(np.round(p * n, 9)))
    return np.minimum(np.sum(cum < rank[..., None], axis=-1), layout.size - 1).astype(np.int64)


def profile_cuts(cum_b: F64, cum_c: F64, layout: Layout, p: float, ratio: float,
                 margin_s: float) -> ProfileCuts:
    """The cuts (module docstring) for rows of the cohorts' pooled cumulative bucket counts
    (rows, buckets)."""
    cb = np.atleast_2d(np.asarray(cum_b, dtype=np.float64))
    cc = np.atleast_2d(np.asarray(cum_c, dtype=np.float64))
    canary = np.searchsorted(layout.lower, ratio * layout.upper + margin_s, side="left")
    canary[~np.isfinite(layout.upper)] = layout.size
    return ProfileCuts(np.asarray(canary, dtype=np.int64), _level(cb, layout, p),
                       _level(cc, layout, p))


@dataclass(frozen=True, slots=True, eq=False)
class ProfileInput:
    """One grid's pods for the profile: `calls` (pods, windows) with a latency; `at_q`
    (candidates, pods, windows) the calls each baseline pod has from candidate j's lower edge
    and each canary pod from j's canary cut; `at_level` (pods, windows) each pod's calls from
    its own cohort's level; `canary` (pods,) the cohort flags; `guess` the candidate holding
    the baseline's estimated p-quantile, tried first (`profile_fails`)."""

    calls: F64
    at_q: F64
    at_level: F64
    canary: Bool
    guess: int = 0


def profile_input(below: F64, canary: Bool, cuts: ProfileCuts, row: int) -> ProfileInput:
    """One grid's `ProfileInput` from `below` (pods, buckets + 1), each pod's calls below each
    bucket (none in the first column, all of them in the last), at row `row` of `cuts`: each
    pod's calls pooled over time, as the live verdict keeps them. Every bucket is a
    candidate; those whose counts are another's (no call between them, in either cohort) are
    kept once. A pod's calls from a cut on are its calls less those below."""
    level_b = int(cuts.level_b[row])
    calls = below[:, -1:]
    at_q = (calls - np.where(canary[:, None], below[:, cuts.canary], below[:, :-1])).T
    # Each pod's count falls (or stays) from one bucket to the next, so equal candidates
    # are neighbours: the first of each run stands for it.
    first = np.flatnonzero(np.r_[True, (np.diff(at_q, axis=0) != 0).any(axis=1)])
    level = calls[:, 0] - np.where(canary, below[:, int(cuts.level_c[row])], below[:, level_b])
    # The guess: the candidate holding the baseline's estimated p-quantile.
    guess = int(np.searchsorted(first, level_b, side="right")) - 1
    return ProfileInput(calls.copy(), at_q[first][..., None], level[:, None], canary, guess)


def profile_fails(grids: Sequence[ProfileInput], p: float, alpha: float
                  ) -> tuple[F64, I64]:
    """Per grid, log inf over its candidates of E_b(q)·E_c(q) (module docstring), to be
    compared with `profile_threshold(alpha)`, and the candidate (index into its `at_q`) that
    attains it; −inf where a grid has no candidate or a cohort no calls.

    Each grid's `guess` is tried first, and its other candidates only where that one reaches
    the threshold, the nearest first and a few more each round (`_ROUNDS`), until one stays
    below or none is left: the infimum is at most any candidate's E, so a grid with one
    candidate below cannot fail, and most grids of a healthy rollout cost one candidate
    instead of hundreds (a warm verdict judges every path). Where some candidate stays
    below, the figure is its E (at least the infimum; the decision is the same), else the
    infimum itself."""
    log_thr = profile_threshold(alpha)
    out = np.full(len(grids), -np.inf)
    arg = np.full(len(grids), -1, dtype=np.int64)
    tried = [i for i, g in enumerate(grids) if len(g.at_q)]
    first = _values(grids, [(i, grids[i].guess) for i in tried], p, log_thr)
    out[tried], arg[tried] = first, [grids[i].guess for i in tried]
    # Each remaining grid's candidates by distance from its guess, the guess done.
    order = {i: np.argsort(np.abs(np.arange(len(grids[i].at_q)) - grids[i].guess),
                           kind="stable")[1:]
             for i, v in zip(tried, first.tolist(), strict=True) if v >= log_thr}
    done = dict.fromkeys(order, 0)
    for size in (*_ROUNDS, None):
        pairs = [(i, int(j)) for i in order
                 for j in order[i][done[i]:None if size is None else done[i] + size]]
        if not pairs:
            break
        got = _values(grids, pairs, p, log_thr)
        for (i, j), v in zip(pairs, got.tolist(), strict=True):
            if v < out[i]:
                out[i], arg[i] = v, j
        for i in list(order):
            done[i] += len(order[i][done[i]:None if size is None else done[i] + size])
            if out[i] < log_thr or done[i] >= len(order[i]):
                del order[i]
    return out, arg


def _values(grids: Sequence[ProfileInput], pairs: Sequence[tuple[int, int]], p: float,
            log_thr: float) -> F64:
    """log E_b(q)·E_c(q) for each (grid, candidate) of `pairs`."""
    items_c: list[tuple[F64, F64, Bool]] = []
    items_b: list[tuple[F64, F64, Bool]] = []
    for i, j in pairs:
        g = grids[i]
        canary = np.asarray(g.canary, dtype=bool)
        calls = np.asarray(g.calls, dtype=np.float64)
        at = np.asarray(g.at_q[j], dtype=np.float64)
        on_c = canary[:, None]
        # Canary tested beyond r·q + m; the baseline's pods from their level.
        items_c.append(_factor(calls, np.where(on_c, at, g.at_level), canary))
        # Baseline tested: its calls below q against the rate p, the canary's pods from
        # their level.
        items_b.append(_factor(calls, calls - np.where(on_c, g.at_level, at), ~canary))
    return (pod_fail_values(items_c, 0.0, 1.0 - p, log_threshold=log_thr,
                            tau2_level=TAU2_LEVEL)
            + pod_fail_values(items_b, 0.0, p, log_threshold=log_thr, tau2_level=TAU2_LEVEL))


def _factor(calls: F64, counts: F64, tested: Bool) -> tuple[F64, F64, Bool]:
    """One factor's grid for `pods.pod_fail_values`: the tested cohort's pods as they are,
    the other cohort's summed into one pod, which adds nothing to τ² (no degrees of
    freedom) and leaves the window's pooled rate, the variance's yardstick, as it was. So
    each factor's τ² comes from the pods it tests and the two factors read disjoint pods:
    with τ² from both cohorts, one underestimate raised both at once. A tested cohort of
    one pod keeps the other's pods: its rule judges it against their spread (D21)."""
    # Pods with calls, not cells: a pod with calls in several windows is still one pod.
    if int((calls[tested].reshape(int(tested.sum()), -1).sum(axis=1) > 0).sum()) <= 1:
        return calls, counts, tested
    other = ~tested
    return (np.concatenate([calls[tested], calls[other].sum(axis=0, keepdims=True)]),
            np.concatenate([counts[tested], counts[other].sum(axis=0, keepdims=True)]),
            np.arange(int(tested.sum()) + 1) < int(tested.sum()))
