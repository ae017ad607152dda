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

Where the infimum is sought. Only the buckets of the baseline p99's confidence sequence at
α·`CS_SHARE` (`quantile.quantile_cs`), the profile tested at the rest, (1 − `CS_SHARE`)·α: a
decision errs only if the sequence ever misses q_b or E(q_b) ever reaches its threshold
(union bound). Outside the sequence the baseline's own calls place q_b, and buckets far from
q_b have one factor overwhelming and the other only polynomially small (the normal mixture's
tail), so the infimum is near q_b; the sequence keeps the search to a few dozen buckets early
and a handful later. Against the sequence's ends at α/2 each, the threshold drops from 2/α to
1/(0.95·α), and each candidate's canary cut sits at r·q + m rather than r·U + m.

What it rests on, besides `pods.pod_tracks`' own assumptions (a CLT per pod, a consistent τ²,
the mixture's tail asymptotic): the sequence is on the baseline's pooled calls, so its q_b is
the pooled p99 of the pods that ran (as the pass's cuts take it), not their version's: where
the baseline's pods differ, the pods drawn move it by more than the sequence's width late in
a rollout, which the every-look rows of `benchmarks/small_estates_sim.py` measure (pods drawn
per rollout, canaries at H0's edge); the product needs the cohorts' calls independent given
the pods: an outage that slows both cohorts raises E_c and lowers E_b at once, which lowers
the product's mean. With two pods in a cohort its factor's τ² has one degree of freedom and
that factor next to no evidence: on two pods a side only regressions far beyond ×2 fail.
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
from probes.stats.quantile import Layout, quantile_cs

__all__ = ["CS_SHARE", "ProfileCuts", "ProfileInput", "profile_cuts", "profile_fails",
           "profile_input", "profile_threshold"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]

# The share of α spent on the confidence sequence that bounds where the infimum is sought:
# small, as a wider sequence only adds buckets whose E is large anyway.
CS_SHARE = 0.05


def profile_threshold(alpha: float) -> float:
    """log 1/α' at which the profile fails: α less the sequence's share."""
    return math.log(1.0 / ((1.0 - CS_SHARE) * alpha))


@dataclass(frozen=True, slots=True, eq=False)
class ProfileCuts:
    """Per row of the baseline's cumulative counts: the candidate buckets `first`..`last`
    (the baseline p99's confidence sequence; `last` < `first` where it is unbounded above,
    so nothing fails), each candidate j's canary cut `canary[j]` over the layout (the first
    bucket wholly at or above r·U_j + m; the layout's size counts nothing), and the buckets
    of the baseline's and the canary's estimated p-quantiles (`level_b`, `level_c`), from
    which the other cohort's pods are counted for τ²."""

    first: I64
    last: I64
    canary: I64
    level_b: I64
    level_c: I64


def _level(cum: F64, layout: Layout, p: float) -> I64:
    n = cum[..., -1]
    rank = np.maximum(1.0, np.ceil(np.round(p * n, 9)))
    return np.minimum(np.sum(cum < rank[..., None], axis=-1), layout.size - 1).astype(np.int64)


def profile_cuts(cum_b: F64, cum_c: F64, layout: Layout, p: float, ratio: float,
                 margin_s: float, alpha: float) -> ProfileCuts:
    """The candidates and cuts (module docstring) for rows of the cohorts' pooled cumulative
    bucket counts (rows, buckets)."""
    cb = np.atleast_2d(np.asarray(cum_b, dtype=np.float64))
    cc = np.atleast_2d(np.asarray(cum_c, dtype=np.float64))
    lo, hi = quantile_cs(cb, layout, p, math.log(1.0 / (CS_SHARE * alpha)))
    first = np.maximum(np.searchsorted(layout.lower, lo, side="right") - 1, 0)
    last = np.where(np.isfinite(hi), np.searchsorted(layout.upper, hi, side="left"), -1)
    canary = np.searchsorted(layout.lower, ratio * layout.upper + margin_s, side="left")
    canary[~np.isfinite(layout.upper)] = layout.size
    return ProfileCuts(np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64),
                       np.asarray(canary, dtype=np.int64), _level(cb, layout, p),
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
    pod's calls pooled over time, as the live verdict keeps them. Only the columns the cuts
    name are read: a pod's calls from a cut on are its calls less those below."""
    first, level_b = int(cuts.first[row]), int(cuts.level_b[row])
    js = np.arange(first, int(cuts.last[row]) + 1)
    calls = below[:, -1:]
    at_q = calls - np.where(canary[:, None], below[:, cuts.canary[js]], below[:, js])
    level = calls[:, 0] - np.where(canary, below[:, int(cuts.level_c[row])], below[:, level_b])
    return ProfileInput(calls.copy(), at_q.T[..., None], level[:, None], canary,
                        min(max(level_b - first, 0), max(js.size - 1, 0)))


def profile_fails(grids: Sequence[ProfileInput], p: float, alpha: float
                  ) -> tuple[F64, I64]:
    """Per grid, log inf over its candidates of E_b(q)·E_c(q) (module docstring), to be
    compared with `profile_threshold(alpha)`, and the candidate (index into its `at_q`) that
    attains it; −inf where a grid has no candidate or a cohort no calls.

    Each grid's `guess` is tried first, and its other candidates only where that one reaches
    the threshold: the infimum is at most any candidate's E, so a grid whose guess stays below
    cannot fail, and most grids of a healthy rollout cost one candidate instead of several
    (a warm verdict judges every path). Where the guess stays below, the figure is its E (at
    least the infimum; the decision is the same), else the infimum itself."""
    log_thr = profile_threshold(alpha)
    out = np.full(len(grids), -np.inf)
    arg = np.full(len(grids), -1, dtype=np.int64)
    tried = [i for i, g in enumerate(grids) if len(g.at_q)]
    first = _values(grids, [(i, grids[i].guess) for i in tried], p, log_thr)
    out[tried], arg[tried] = first, [grids[i].guess for i in tried]
    rest = [i for i, v in zip(tried, first.tolist(), strict=True) if v >= log_thr]
    pairs = [(i, j) for i in rest for j in range(len(grids[i].at_q))]
    every = _values(grids, pairs, p, log_thr)
    at = 0
    for i in rest:
        k = len(grids[i].at_q)
        arg[i] = int(np.argmin(every[at:at + k]))
        out[i] = float(every[at + arg[i]])
        at += k
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
    return (pod_fail_values(items_c, 0.0, 1.0 - p, log_threshold=log_thr)
            + pod_fail_values(items_b, 0.0, p, log_threshold=log_thr))


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
