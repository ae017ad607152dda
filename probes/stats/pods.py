"""The pod as the unit of evidence: a time-stratified, pod-clustered sequential comparison of
two cohorts' [0, 1]-bounded means (error rates, scaled retry volume).

Why. Cohorts are not randomised: which pods run the new proxy is decided by restart order, so
pod age, node and neighbours travel with the version, and the calls of one pod share its
fate. A test that treats every call as independent reads one sick pod as a sick version, and
a dependency outage that hits both cohorts, pooled over windows in which the cohorts' shares
of the calls differ, as a difference between them (Simpson's paradox).

Data. A grid of cells, pods × windows, each with the calls `n` and the sum `s` of the
per-call values x in [0, 1] (1 per error; (attempts − 1)/(attempts_max − 1) for retry
volume). Cells the caller leaves out (a pod's warm-up, windows in which the probe was
overloaded) are zero.

The statistic, for H0 "canary within tolerance", μ_c ≤ r·μ_b + m, at a look after window T:

    D = Σ_{t ≤ T} Σ_{i ∈ canary} (s_it − n_it·q_t),    q_t = r·p_t + m,

with p_t the baseline's pooled mean in window t: each canary call is compared with the
baseline *in the same window* (stratified by time), so an outage or a drift that hits both
cohorts moves p_t and the canary alike and cancels; windows without both cohorts are left
out. Under H0 at its boundary E[D] ≤ 0. Its variance has two parts:

- sampling: Σ_t N_ct·v_t·(1 + r²·N_ct/N_bt), the canary's calls and p_t's own noise, with
  v_t the per-call variance at H0's boundary, max(p(1−p), q(1−q)) at the baseline's window
  mean smoothed toward its running mean (a window without errors does not claim zero
  variance). The baseline alone sets it: a canary within tolerance varies no more than the
  boundary, and a worse canary's own errors must not widen the yardstick they are measured
  by (that slowed fails by the ratio of the pooled to the boundary variance, 1.75× at
  +0.5 pp on 0.1 %);
- pods: τ²·(Σ_i N_i² + r²·Σ_j W_j²), where N_i is canary pod i's calls and W_j the weight
  baseline pod j carries in the p_t's (Σ_t N_ct·n_jt/N_bt). τ² is the spread between pods
  of one cohort beyond sampling noise, estimated from both cohorts' pods (each against its
  own cohort's window means, so time effects do not count) by DerSimonian and Laird's
  moment estimator. This term grows with the square of the calls: evidence saturates at
  what the number of pods can say, which is the honest answer when pods differ. With few
  pods τ² is itself uncertain: for a pass the term is scaled by a t-type factor for τ²'s
  degrees of freedom and τ² taken as at least half its standard error (`few_pods_factor`),
  so a few pods that happen to agree do not make it a per-call test.

D/√V is tested with a one-sided normal-mixture e-process (Robbins' mixture, as in Johari,
Pekelis & Walsh's always-valid p-values and Howard et al.'s asymptotic confidence
sequences), averaged over a grid of mixing scales so that small and large effects both
decide fast. It is anytime-valid asymptotically (a CLT per window and a consistent variance
estimate); `benchmarks/verdict_sim.py` measures what that is worth on simulated estates with
pods that differ, restart cold and share outages.

Decisions (`pod_states`, the one rule the live verdict and the report's replay both apply):
- a canary of one pod is judged as a new pod drawn from the baseline's (a prediction
  interval for a new study, Higgins, Thompson & Spiegelhalter 2009): its excess against
  sampling plus τ² from the baseline's pods, with the few-pods allowance on both sides. It
  fails when it is beyond what the baseline's pods plausibly do (the reason names it and
  says a restart or a second canary pod tells pod from version) and passes when it is
  within them and the tolerance;
- with several canary pods, fail when E_fail ≥ 1/α with the worst canary pod *capped* at
  the most the other canary pods plausibly show (`_capped`): a sick pod among healthy ones
  is set aside and named, while a regression on every pod keeps its evidence; the
  baseline's worst pod is out of the window means the canary is compared with;
- pass when E_pass (the mirror image, against "canary beyond tolerance") ≥ 1/α;
- the canary pod with the largest excess and its share of the canary's excess are reported
  (`worst`, `worst_share`): "concentrated on shop-0" is a finding in its own right.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr, stdtrit

from probes.stats._num import logsumexp

__all__ = [
    "MAX_GRID_CELLS",
    "MEMO_MAX_PODS",
    "MIXING_SCALES",
    "ONE_POD_BASELINE",
    "PodGrid",
    "PodTrack",
    "TrackMemo",
    "few_pods_factor",
    "log_e_one_sided",
    "needs_factor",
    "needs_factors",
    "pod_grids",
    "pod_states",
    "pod_track",
    "pod_tracks",
    "read_pod_grids",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]

# Prior scales of the standardised drift θ (the effect per unit of per-call standard
# deviation): 0.01 is a 0.03 pp shift at 0.1 % errors, 1 a shift as large as the noise.
MIXING_SCALES = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
# Where τ² comes from few pods, it is taken as at least this many standard errors of its
# estimate were the pods alike: pods that agree say "spread at most about the noise", not
# "no spread" (the calibration is in BENCHMARKS.md D19).
_SE_FLOOR = 0.5
# Pseudo-calls at the running mean that smooth each window's mean for the variance.
_SMOOTH_CALLS = 50.0
# How many standard errors above the other canary pods' pooled excess per call the worst
# may plausibly be: it is capped there (`_capped`).
_CAP_Z = 2.0
# A cohort's worst pod this many standard errors beyond what the other pods' spread allows
# is set aside as sick (`_outlier`): about 3e-7 one-sided per pod and look for a normal pod.
_ASIDE_Z = 5.0
# The fewest pods a cohort must have for one of them to be set aside: with fewer, the
# others' spread is too uncertain to call one of them sick.
_ASIDE_MIN_PODS = 3
# The fewest baseline pods that judge a canary of one pod: fewer show too little of the
# spread a new pod is judged against (at σ 0.5 between pods, 3-5 baseline pods failed a
# healthy one-pod canary in 1-4 % of rollouts at α 1 %; BENCHMARKS.md D21).
ONE_POD_BASELINE = 6
# How many of the baseline's pod standard deviations (τ) beyond them a canary of one pod
# must be to fail, on top of the evidence (D21).
_ONE_POD_TAIL = 2.0
# How many standard errors above its estimate τ² is taken for a canary of one pod. The
# bound rests on baseline pods with a tenth of the canary pod's calls each, so it dominates
# the variance; one standard error kept A/A fails within α with 2.5× the fails at 2× tol (D21).
_ONE_POD_SE = 1.0


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


@dataclass(frozen=True, slots=True, eq=False)
class PodTrack:
    """`pod_track`'s result: one entry per look (after each window of the grid), or only the
    last look's (`pod_track(last_only=True)`, what the live verdict answers for).

    `log_e_fail` caps the canary's worst pod (one canary pod: judged against the
    baseline's pods); `log_e_fail_all` keeps every pod as it is; `log_e_pass` is against
    "canary beyond tolerance".
    `d` (all pods, fail direction, in standard-deviation units) with the pass's variance in
    two parts, `v_sampling` what grows with the calls (sampling, and the few-pods floor) and
    `v_pods` what grows with their square (the spread term), and the fail side's
    capped `d_wo`, `v_sampling_wo`, `v_pods_wo` let `needs_factor` say how far a
    decision is. `excess` is (canary pods, looks): each canary pod's excess over the
    boundary; `worst` the index (into the canary pods) of the largest. `aside_canary`
    (into the canary pods) and `aside_baseline` (into the grid's pods) name the pod each
    cohort set aside as sick at each look (`_outlier`), −1 for none: the pass, and a
    canary of one pod, are judged without them.
    """

    calls_baseline: F64
    calls_canary: F64
    sum_baseline: F64
    sum_canary: F64
    tau: F64
    pods_baseline: I64
    pods_canary: I64
    excess: F64
    worst: I64
    aside_canary: I64
    aside_baseline: I64
    log_e_fail: F64
    log_e_fail_all: F64
    log_e_pass: F64
    d: F64
    v_sampling: F64
    v_pods: F64
    d_wo: F64
    v_sampling_wo: F64
    v_pods_wo: F64


def _first_max(a: F64, axis: int) -> I64:
    """The pod with the largest value, the first of those tied: values are rounded first,
    so that sums taken in another order (the last look alone, a full track, a batch) pick
    the same pod."""
    return np.argmax(np.round(a, 6), axis=axis)


def _cum(a: F64) -> F64:
    return np.cumsum(a, axis=-1)


class _Acc:
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


def pod_track(n: F64, s: F64, canary: Bool, ratio: float, margin: float,
              scales: tuple[float, ...] = MIXING_SCALES, *, log_threshold: float,
              last_only: bool = False) -> PodTrack:
    """The test of H0: μ_c ≤ ratio·μ_b + margin at every look (module docstring).

    `n`, `s`: (pods, windows) calls and sums, windows in time order (a window where no pod
    has calls may be left out or kept, it changes nothing); `canary`: (pods,) cohort flags.
    `log_threshold`: log 1/α of the decisions to be taken on the track (`pod_states`), for
    the pass's allowance for τ² from few pods (`few_pods_factor`).
    `last_only`: the last look alone (the live verdict), the same numbers as the last
    entry of the full track (the report's replay) at a fraction of its cost.
    """
    return pod_tracks([(n, s, canary)], ratio, margin, scales, log_threshold=log_threshold,
                      last_only=last_only)[0]


def pod_tracks(grids: Sequence[tuple[F64, F64, Bool]], ratio: float, margin: float,
               scales: tuple[float, ...] = MIXING_SCALES, *, log_threshold: float,
               last_only: bool = False, pod_ratio: float | None = None,
               memo: TrackMemo | None = None) -> list[PodTrack]:
    """`pod_track` for many (n, s, canary) grids at once (one per path), in one pass of
    array operations over batches of them: a verdict judges every path, and one call per
    path cost more in numpy's per-call overhead than in arithmetic. Grids are padded with
    pods and windows without calls, which change nothing; a batch holds at most
    `_BATCH_CELLS` padded cells, so memory stays what one large grid needs.
    `pod_ratio` (default `ratio`) weighs the baseline's pods in the spread term: a test
    against a constant (ratio 0) whose constant the baseline's pods stand for keeps their
    spread with 1 (`probes.stats.pod_exceed`'s pass side).
    `memo` (last look only): the sums of an earlier call kept, so that grids which only
    gained windows since are summed over their newer windows alone (`TrackMemo`)."""
    if memo is not None and last_only:
        return memo.tracks(grids, (ratio, margin, scales, log_threshold, pod_ratio))
    out: list[PodTrack] = []
    for lo, hi in _batches(grids):
        out += _pod_batch(grids[lo:hi], ratio, margin, scales, log_threshold, _Acc(last_only),
                          pod_ratio)
    return out


def _batches(grids: Sequence[tuple[F64, F64, Bool]]) -> list[tuple[int, int]]:
    """`grids` cut into runs [lo, hi) of at most `_BATCH_CELLS` padded cells each."""
    out: list[tuple[int, int]] = []
    lo = rows = cols = 0
    for i, grid in enumerate(grids):
        shape = np.shape(grid[0])
        r, c = max(rows, shape[0]), max(cols, shape[1] if len(shape) > 1 else 0)
        if i > lo and (i - lo + 1) * r * c > _BATCH_CELLS:
            out.append((lo, i))
            lo, r, c = i, shape[0], shape[1] if len(shape) > 1 else 0
        rows, cols = r, c
    if lo < len(grids):
        out.append((lo, len(grids)))
    return out


# A memo sums every pod's drop at every call: one pass per pod, so past this many pods in
# a grid the memo costs more than it saves (BENCHMARKS.md D16) and is not used.
MEMO_MAX_PODS = 32


class TrackMemo:
    """What `pod_tracks(last_only=True)` summed over each grid's settled windows, kept
    between the calls of a caller that asks again as windows arrive (the running probe's
    verdict cache): a call whose grids are the last call's with windows added sums only
    the windows after the kept ones, every pod's drop summed, all grids in one batch, so a
    verdict costs what its new windows cost rather than the whole rollout's.

    Grids are checked, not trusted: when a grid's kept windows changed (a pod's warm-up
    moved, a pod added, the grids laid out afresh), or the grids or parameters are others,
    every window is summed again, so the answer is the one without a memo but for the
    order of floating-point sums. The newest windows may still change (the store re-writes
    recent windows): the last `depth` of each grid are summed at every call and not kept,
    `depth` growing to the most seen to change. One memo serves one sequence of calls (a
    metric of one query). Grids of more than `MEMO_MAX_PODS` pods are summed afresh."""

    def __init__(self) -> None:
        self._params: tuple[Any, ...] | None = None
        self._grids: list[tuple[F64, F64, Bool]] = []
        self._folded = np.zeros(0, dtype=np.int64)  # per grid: its windows in `_sums`
        self._sums: dict[Hashable, F64] = {}
        self.depth = 2
        self.summed_whole = 0  # calls that summed every window, for the tests

    @property
    def kept_windows(self) -> int:
        """The windows the kept sums hold, over every grid."""
        return int(self._folded.sum())

    def tracks(self, grids: Sequence[tuple[F64, F64, Bool]], params: tuple[Any, ...]
               ) -> list[PodTrack]:
        """`pod_tracks(grids, *params, last_only=True)`; params (ratio, margin, scales,
        log_threshold, pod_ratio)."""
        ratio, margin, scales, log_threshold, pod_ratio = params
        # Copies: the grids are kept to check the next call's against, and a caller's
        # array written in place would otherwise compare equal to itself.
        cells = [(np.array(n, dtype=np.float64), np.array(s, dtype=np.float64),
                  np.array(c, dtype=bool)) for n, s, c in grids]
        if (not cells or any(n.ndim != 2 or s.shape != n.shape for n, s, _ in cells)
                or max(n.shape[0] for n, _, _ in cells) > MEMO_MAX_PODS):
            self._params = None  # summed afresh: nothing kept
            return pod_tracks(cells, ratio, margin, scales, log_threshold=log_threshold,
                              last_only=True, pod_ratio=pod_ratio)
        width = np.array([n.shape[1] for n, _, _ in cells], dtype=np.int64)
        start = self._unchanged(cells) if params == self._params else None
        out: list[PodTrack] = []
        if start is None:
            # Batch by batch, as without a memo (memory), then kept as one batch.
            self.summed_whole += 1
            folded = np.maximum(width - self.depth, 0)
            kept: list[tuple[dict[Hashable, F64], int]] = []
            for lo, hi in _batches(cells):
                acc = _Acc(True, {}, folded[lo:hi])
                out += _pod_batch(cells[lo:hi], ratio, margin, scales, log_threshold, acc,
                                  pod_ratio)
                # The pods the batch was padded to (`_pod_batch`: at least one).
                kept.append((acc.kept_now, max(1, *(n.shape[0] for n, _, _ in cells[lo:hi]))))
            sums = _merged(kept)
        else:
            folded = np.maximum(start, width - self.depth)
            acc = _Acc(True, self._sums, folded - start)
            out = _pod_batch([(n[:, k:], s[:, k:], c) for (n, s, c), k in
                              zip(cells, start.tolist(), strict=True)],
                             ratio, margin, scales, log_threshold, acc, pod_ratio)
            sums = acc.kept_now
        self._params, self._grids, self._folded, self._sums = params, cells, folded, sums
        return out

    def _unchanged(self, grids: list[tuple[F64, F64, Bool]]) -> I64 | None:
        """Where each grid's windows after the kept ones start (the kept count), or None
        when the kept windows of one of them changed; `depth` grows to the windows seen to
        change since the last call."""
        if len(self._grids) != len(grids):
            return None
        for (n0, s0, c0), (n, s, c), k in zip(self._grids, grids, self._folded.tolist(),
                                              strict=True):
            if (n.shape[0] != n0.shape[0] or n.shape[1] < k or not np.array_equal(c, c0)
                    or not np.array_equal(n[:, :k], n0[:, :k])
                    or not np.array_equal(s[:, :k], s0[:, :k])):
                return None
            w = min(n.shape[1], n0.shape[1])
            changed = ((n[:, k:w] != n0[:, k:w]) | (s[:, k:w] != s0[:, k:w])).any(axis=0)
            if changed.any():
                self.depth = max(self.depth, n.shape[1] - k - int(np.argmax(changed)))
        return self._folded


def _merged(batches: list[tuple[dict[Hashable, F64], int]]) -> dict[Hashable, F64]:
    """The kept sums of consecutive batches (each with its padded pod count) as one batch's.
    A batch lacks the sums of dropping a pod none of its grids has in that cohort: they
    are those of dropping none, (name, −1)."""
    if len(batches) == 1:
        return batches[0][0]
    pods = max(p for _, p in batches)
    out: dict[Hashable, F64] = {}
    for key in dict.fromkeys(k for sums, _ in batches for k in sums):
        parts = []
        for sums, p in batches:
            a = sums[key] if key in sums else sums[(key[0], -1)]  # type: ignore[index]
            if a.ndim == 3 and p < pods:
                a = np.pad(a, ((0, 0), (0, pods - p), (0, 0)))
            parts.append(a)
        out[key] = np.concatenate(parts, axis=0)
    return out


# The most padded cells (groups × pods × windows) one batch of `pod_tracks` holds: each of
# its ~20 arrays is then 2 MB at most: a warm verdict's peak allocation stays what it was
# with one path at a time (BENCHMARKS.md D16).
_BATCH_CELLS = 250_000


def _pod_batch(grids: Sequence[tuple[F64, F64, Bool]], ratio: float, margin: float,
               scales: tuple[float, ...], log_threshold: float, acc: _Acc,
               pod_ratio: float | None = None) -> list[PodTrack]:
    last_only = acc.last_only
    g_n = len(grids)
    shapes = [np.shape(x[0]) for x in grids]
    rows = np.array([sh[0] for sh in shapes], dtype=np.int64)
    cols = np.array([sh[1] if len(sh) > 1 else 0 for sh in shapes], dtype=np.int64)
    p_max, w_max = max(int(rows.max()), 1), max(int(cols.max()), 1)
    n = np.zeros((g_n, p_max, w_max))
    s = np.zeros((g_n, p_max, w_max))
    canary = np.zeros((g_n, p_max), dtype=bool)
    real = np.arange(p_max)[None, :] < rows[:, None]
    for g, (n_g, s_g, c_g) in enumerate(grids):
        r, w = int(rows[g]), int(cols[g])
        n[g, :r, :w] = np.asarray(n_g, dtype=np.float64).reshape(r, w)
        s[g, :r, :w] = np.asarray(s_g, dtype=np.float64).reshape(r, w)
        canary[g, :r] = np.asarray(c_g, dtype=bool)
    base = real & ~canary
    mask_c, mask_b = canary[..., None], base[..., None]

    n_bt, n_ct = (n * mask_b).sum(axis=1), (n * mask_c).sum(axis=1)
    both = ((n_bt > 0) & (n_ct > 0))[:, None, :]
    n = np.where(both, n, 0.0)
    s = np.where(both, s, 0.0)
    nc, sc = n * mask_c, s * mask_c
    nb, sb = n * mask_b, s * mask_b
    n_bt, n_ct = nb.sum(axis=1), nc.sum(axis=1)  # (groups, windows)
    s_bt, s_ct = sb.sum(axis=1), sc.sum(axis=1)
    calls_b, calls_c = acc(n_bt, "calls_b"), acc(n_ct, "calls_c")  # (groups, looks)
    sum_b, sum_c = acc(s_bt, "sum_b"), acc(s_ct, "sum_c")

    def running_mean(calls: F64, sums: F64) -> F64:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(calls > 0, sums / np.where(calls > 0, calls, 1), 0.0)

    with np.errstate(divide="ignore", invalid="ignore"):
        inv_b = np.where(n_bt > 0, 1.0 / np.where(n_bt > 0, n_bt, 1.0), 0.0)
    # Each window's variance smooths towards the baseline's running mean as of that window
    # (so per window even for the last look alone: cheap, one row); the scales use it at
    # the looks.
    p_window_b = running_mean(acc.running(n_bt, "calls_b"), acc.running(s_bt, "sum_b"))
    p_run = running_mean(calls_b + calls_c, sum_b + sum_c)
    p_run_b = running_mean(calls_b, sum_b)
    p_t = s_bt * inv_b
    q_t = np.clip(ratio * p_t + margin, 0.0, 1.0)
    # The variance at H0's boundary, from the baseline alone (module docstring).
    p_smooth = (s_bt + _SMOOTH_CALLS * p_window_b) / (n_bt + _SMOOTH_CALLS)
    q_smooth = np.clip(ratio * p_smooth + margin, 0.0, 1.0)
    v_t = np.maximum(p_smooth * (1.0 - p_smooth), q_smooth * (1.0 - q_smooth))
    v_t = np.maximum(v_t, 1e-9)
    # One scale for the whole track: the boundary's per-call variance at the running mean.
    q_run = np.clip(ratio * p_run_b + margin, 0.0, 1.0)
    sd2 = np.maximum(np.maximum(p_run_b * (1 - p_run_b), q_run * (1 - q_run)), 1e-9)

    sum_sc, sum_sb = acc(sc, "sc"), acc(sb, "sb")
    excess = sum_sc - acc.dot(nc, q_t, "nc.q")  # (groups, pods, looks); 0 off the canary
    pod_calls_c = acc(nc, "nc")
    own = acc.dot(nc, v_t * (1.0 + ratio * ratio * n_ct * inv_b), "own")
    w_b = acc.dot(nb, n_ct * inv_b, "w_b")  # W_j, 0 off the baseline

    # τ²: each pod against its own cohort's window means, DerSimonian–Laird per look.
    pod_calls_b = acc(nb, "nb")
    # Also picks the baseline pod the fail side drops.
    resid_b = sum_sb - acc.dot(nb, p_t, "nb.p")
    v_pool = np.maximum(p_run * (1.0 - p_run), 1e-12)
    pods_c = (pod_calls_c > 0).sum(axis=1)
    pods_b = (pod_calls_b > 0).sum(axis=1)
    everyone = np.ones(g_n, dtype=bool)
    cohorts = [(nc, sc, pod_calls_c, sum_sc, canary), (nb, sb, pod_calls_b, sum_sb, base)]
    tau2, df, _, _, q_all = _tau2([(*cohorts[0], None, everyone),
                                   (*cohorts[1], None, everyone)], v_pool, acc, "all")

    d_all = excess.sum(axis=1)
    vs_all = own.sum(axis=1)
    sq_calls = (pod_calls_c ** 2).sum(axis=1)
    sq_w = (w_b ** 2).sum(axis=1)
    sd = np.sqrt(sd2)
    r_pods = ratio if pod_ratio is None else pod_ratio
    vp_all = tau2 * (sq_calls + r_pods * r_pods * sq_w)

    # The worst canary pod at each look (the one an operator is told about); the first
    # canary pod while none has calls.
    masked = np.where(pod_calls_c > 0, excess, -np.inf)
    worst = _first_max(masked, axis=1)
    some = np.isfinite(masked).any(axis=1)

    # Each cohort's worst pod: the canary's by excess, the baseline's by its standardised
    # residual. τ² without either (`tau2_fail`) is the spread the other pods show.
    with np.errstate(divide="ignore", invalid="ignore"):
        z_b = np.where(pod_calls_b > 0, resid_b / np.sqrt(np.where(pod_calls_b > 0,
                                                                   pod_calls_b, 1.0)), -np.inf)
    several_b = base.sum(axis=1) > 1
    drop_b = np.where(several_b[:, None], _first_max(z_b, axis=1), -1)
    ex_pp, own_pp, sq_w_fail, worst_wo = _fail_side(
        nb, sb, nc, sc, pod_calls_c, base, drop_b, ratio, margin, v_t, acc)
    some_c = np.asarray(canary.any(axis=1))
    tau2_fail, _, _, dropped, _ = _tau2([(*cohorts[0], worst_wo, some_c),
                                      (*cohorts[1], drop_b, several_b)], v_pool, acc, "wo")
    # A worst pod the others' spread cannot account for is sick, not the version's: set
    # aside (out of the window means, τ² and D) and named. The canary keeps its only pod.
    aside_c = np.where(_outlier(*dropped[0], tau2_fail, v_pool) & (pods_c >= _ASIDE_MIN_PODS),
                       worst_wo, -1)
    aside_b = np.where(_outlier(*dropped[1], tau2_fail, v_pool) & (drop_b >= 0)
                       & (pods_b >= _ASIDE_MIN_PODS), drop_b, -1)
    tau2_p, df_p, se_p, _, _ = _tau2([(*cohorts[0], aside_c, some_c),
                                   (*cohorts[1], aside_b, several_b)], v_pool, acc, "aside")
    out_b = (aside_b >= 0)[:, None, :]
    ex_p = np.where(out_b, ex_pp, excess)
    own_p = np.where(out_b, own_pp, own)
    n_aside = _pick(pod_calls_c, aside_c)
    calls_kept = calls_c - n_aside
    with np.errstate(divide="ignore", invalid="ignore"):
        keep_share = np.where(calls_c > 0, calls_kept / np.where(calls_c > 0, calls_c, 1.0), 0.0)
    d_p = ex_p.sum(axis=1) - _pick(ex_p, aside_c)
    vs_p = own_p.sum(axis=1) - _pick(own_p, aside_c)
    weights_p = (sq_calls - n_aside ** 2
                 + r_pods * r_pods * np.where(aside_b >= 0, sq_w_fail, sq_w) * keep_share ** 2)
    # Only the pass, and a canary of one pod, allow for τ² from few pods: a pass is the
    # claim a gate must not make wrongly, and the fail side of several canary pods already
    # trims each cohort's worst pod (BENCHMARKS.md D19 has what the allowance cost it).
    vp_pass, vs_floor = _few_pods(tau2_p, df_p, se_p, weights_p, vs_p, sd2, log_threshold,
                                  scales)
    v_pass = (vs_p + vs_floor + vp_pass) / sd2
    log_pass = log_e_one_sided(-d_p / sd, v_pass, scales)

    # The fail side of several canary pods: every canary pod in, the worst capped where
    # the others say it stands apart (`_capped`), against window means without the
    # baseline's worst pod (a sick baseline pod would otherwise mask a regression on every
    # canary pod); τ² without either worst pod, trimmed alike so equal cohorts stay alike.
    # Two canary pods leave the worst out instead: the other's bound is too wide a guide
    # (τ² without either cohort's worst pod has next to no degrees of freedom then), and a
    # cap near it failed alike pods ±50 % apart in 3 % of rollouts (BENCHMARKS.md D21).
    d_cap, _ = _capped(ex_pp, pod_calls_c, sd2, tau2_fail)
    n_w = _pick(pod_calls_c, worst_wo)
    with np.errstate(divide="ignore", invalid="ignore"):
        share_wo = np.where(calls_c > 0, (calls_c - n_w) / np.where(calls_c > 0, calls_c, 1.0),
                            0.0)
    two = pods_c == 2
    d_wo = np.where(two, ex_pp.sum(axis=1) - _pick(ex_pp, worst_wo), d_cap)
    vs_wo = own_pp.sum(axis=1) - np.where(two, _pick(own_pp, worst_wo), 0.0)
    vp_wo = tau2_fail * np.where(
        two, sq_calls - n_w ** 2 + ratio * ratio * sq_w_fail * share_wo ** 2,
        sq_calls + ratio * ratio * sq_w_fail)
    # A canary of one pod is judged as a new pod drawn from the baseline's: its excess
    # against the spread the baseline's pods show (τ² from them alone, as the one canary
    # pod adds no degrees of freedom), with the few-pods allowance: a prediction interval
    # for a new pod (Higgins, Thompson & Spiegelhalter 2009, with a t-type factor for τ²'s
    # few degrees of freedom as Hartung-Knapp intervals have), the same as its pass's.
    # It fails only beyond `_ONE_POD_TAIL` τ of the baseline's pods besides: pods' rates
    # have long upper tails (lognormal), which a spread estimated as a variance
    # understates, and a new pod at the top of the baseline's spread is not a sick
    # version. Either side needs `ONE_POD_BASELINE` baseline pods to measure the spread
    # a new pod is judged against.
    one_pod = pods_b >= ONE_POD_BASELINE
    # Its spread is every baseline pod's, none set aside: a pod at the top of a long tail
    # is what a new pod may be too.
    # While the pods' calls are few, τ² cannot be told from 0: it is taken at an upper
    # bound (`_ONE_POD_SE` standard errors above it), so that a pod is never judged
    # against a spread the baseline has not yet had the calls to show.
    # (The pass takes τ² as estimated, with the few-pods allowance: it measured within α
    # at twice the tolerance, and the upper bound would cost it several times the calls.)
    weights_all = sq_calls + r_pods * r_pods * sq_w

    # Its τ² comes from the baseline's pods alone, at their per-call variance: the pooled
    # one counts the canary's errors, and a sick canary pod must not widen the yardstick
    # it is judged by.
    tau2_b, se_b = _tau2_at(*q_all, df, np.maximum(p_run_b * (1.0 - p_run_b), 1e-12))

    def one_pod_variance(tau2_one: F64) -> F64:
        vp, floor = _few_pods(tau2_one, df, se_b, weights_all, vs_all, sd2, log_threshold,
                              scales)
        return (vs_all + floor + vp) / sd2

    log_one = log_e_one_sided((d_all - _ONE_POD_TAIL * np.sqrt(tau2_b) * calls_c) / sd,
                              one_pod_variance(tau2_b + _ONE_POD_SE * se_b), scales)
    log_pass = np.where(pods_c >= 2, log_pass,
                        log_e_one_sided(-d_all / sd, one_pod_variance(tau2_b), scales))
    log_fail = np.where(pods_c >= 2, log_e_one_sided(d_wo / sd, (vs_wo + vp_wo) / sd2, scales),
                        np.where(one_pod, log_one, -np.inf))
    log_pass = np.where((pods_c >= 2) | one_pod, log_pass, -np.inf)
    log_fail_all = log_e_one_sided(d_all / sd, (vs_all + vp_all) / sd2, scales)
    empty = (calls_b <= 0) | (calls_c <= 0)
    neg = np.full_like(d_all, -np.inf)
    log_fail, log_fail_all, log_pass = (np.where(empty, neg, x)
                                        for x in (log_fail, log_fail_all, log_pass))
    # Back to each grid: its own looks, its canary pods in their order, `worst` among them.
    rank = np.cumsum(canary, axis=1) - 1
    worst_c = np.where(some, np.take_along_axis(rank, worst, axis=1), 0)
    aside_rank = np.where(aside_c >= 0, np.take_along_axis(rank, np.maximum(aside_c, 0), axis=1),
                          -1)
    out = []
    for g in range(g_n):
        k = slice(None) if last_only else slice(0, max(int(cols[g]), 0))
        mine = canary[g]
        out.append(PodTrack(
            calls_baseline=calls_b[g, k], calls_canary=calls_c[g, k],
            sum_baseline=sum_b[g, k], sum_canary=sum_c[g, k], tau=np.sqrt(tau2[g, k]),
            pods_baseline=pods_b[g, k].astype(np.int64),
            pods_canary=pods_c[g, k].astype(np.int64), excess=excess[g][mine][:, k],
            worst=worst_c[g, k].astype(np.int64),
            aside_canary=aside_rank[g, k].astype(np.int64),
            aside_baseline=aside_b[g, k].astype(np.int64),
            log_e_fail=log_fail[g, k], log_e_fail_all=log_fail_all[g, k],
            log_e_pass=log_pass[g, k],
            d=d_p[g, k] / sd[g, k], v_sampling=(vs_p + vs_floor)[g, k] / sd2[g, k],
            v_pods=vp_pass[g, k] / sd2[g, k],
            d_wo=d_wo[g, k] / sd[g, k], v_sampling_wo=vs_wo[g, k] / sd2[g, k],
            v_pods_wo=vp_wo[g, k] / sd2[g, k],
        ))
    return out


def _pick(a: F64, pod: I64) -> F64:
    """a[g, pod[g, t], t] where pod ≥ 0, else 0: `a` (groups, pods, looks)."""
    got = np.take_along_axis(a, np.maximum(pod, 0)[:, None, :], axis=1)[:, 0]
    return np.where(pod >= 0, got, 0.0)


def _outlier(resid: F64, calls: F64, tau2: F64, v_pool: F64) -> Bool:
    """Whether a cohort's dropped pod (its residual against the other pods' window means
    and its calls, from `_tau2`) is worse than sampling and the others' spread τ² account
    for by more than `_ASIDE_Z` standard errors: a sick pod, not one end of the spread."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(calls > 0, resid / np.sqrt(calls * v_pool + tau2 * calls * calls), 0.0)
    return np.asarray(z > _ASIDE_Z)


def few_pods_factor(df: npt.ArrayLike, v: npt.ArrayLike, log_threshold: float,
                    scales: tuple[float, ...] = MIXING_SCALES) -> F64:
    """By how much the spread term's variance grows because τ² comes from few pods:
    (t_df(1 − α) / z)², at least 1, with α = exp(−`log_threshold`), `df` τ²'s degrees of
    freedom and z a lower bound of the standardised sum at which the e-process reaches 1/α
    given the variance `v` (standard-deviation units).

    Why. Once the calls are many the spread term dominates, the statistic stops growing
    and is a t statistic with τ²'s degrees of freedom (the pods counted, less one per
    cohort), not a normal one: with three baseline pods against one canary pod (df 2),
    pods that happen to agree make τ² small, and a canary pod that happens to be fast
    passed a version beyond the tolerance in 2–3 % of rollouts whatever α. The e-process
    decides there at a threshold z that barely moves, so scaling the spread term by (t/z)²
    aims its error at α. It does not get there everywhere (BENCHMARKS.md D19): a balanced
    canary pod has several times a baseline pod's calls, so τ² rests on pods whose own
    variance is mostly sampling and has fewer effective degrees of freedom than counted;
    with one or two canary pods on 4–8 pods a canary at the boundary still passed in
    2–5 % of rollouts at α = 1 %. With many pods t is below z and nothing changes (twelve pods:
    df 10, t_10(0.99) = 2.8 against z ≥ 3.3 at α = 1 %); with none to count (df 0) there is
    nothing to scale (and with one canary pod `pod_tracks` gives no pass)."""
    df_ = np.asarray(df, dtype=np.float64)
    v_ = np.maximum(np.asarray(v, dtype=np.float64), 0.0)[..., None]
    rho2v = np.asarray(scales, dtype=np.float64) ** 2 * v_
    # One scale's e-value is at most 2(1 + ρ²V)^(−½) exp(ρ²D²/(2(1 + ρ²V))); the mixture,
    # their mean, reaches 1/α only where some scale does.
    with np.errstate(divide="ignore", invalid="ignore"):
        z2 = (2.0 * (1.0 + rho2v) / rho2v
              * np.maximum(log_threshold - math.log(2.0) + 0.5 * np.log1p(rho2v), 0.0))
        z = np.sqrt(np.min(np.where(rho2v > 0, z2, np.inf), axis=-1))
        t = stdtrit(np.maximum(df_, 1.0), -math.expm1(-log_threshold))
        factor = np.where((df_ >= 1) & np.isfinite(z) & (z > 0), (t / z) ** 2, 1.0)
    return np.asarray(np.maximum(factor, 1.0), dtype=np.float64)


def pod_states(track: PodTrack, log_threshold: float) -> npt.NDArray[np.str_]:
    """The pod-level decision at every look of `track`: "fail" when E_fail, with the
    canary's worst pod capped, reaches 1/α (`log_threshold` = log 1/α); else "pass" when
    E_pass reaches it; else "inconclusive" (so too while a cohort has no warm calls: its
    e-values are −inf). The one rule: the live verdict takes its last look
    (`probes.stats.metrics.pod_success_rate`), the report's replay every look
    (`probes.stats.sequential.pod_looks`)."""
    fail = np.asarray(track.log_e_fail) >= log_threshold
    ok = np.asarray(track.log_e_pass) >= log_threshold
    return np.where(fail, "fail", np.where(ok, "pass", "inconclusive"))


def _fail_side(nb: F64, sb: F64, nc: F64, sc: F64, pod_calls_c: F64, base: Bool, drop_b: I64,
               ratio: float, margin: float, v_t: F64, acc: _Acc
               ) -> tuple[F64, F64, F64, I64]:
    """The fail direction's sums with the baseline pod `drop_b[group, look]` (−1: none) out
    of the window means: each canary pod's excess and sampling variance (groups, pods,
    looks), the baseline pods' weights Σ W_j² (groups, looks), and the canary pod with the
    largest excess (its τ² leaves it out); `pod_calls_c` the canary pods' calls summed over
    the windows. One pass per distinct dropped pod, over the groups that drop it."""
    g_n, looks = drop_b.shape
    ex_pp = np.zeros(pod_calls_c.shape)
    own_pp = np.zeros(pod_calls_c.shape)
    sq_w = np.zeros((g_n, looks))
    worst = np.zeros((g_n, looks), dtype=np.int64)
    n_ct = nc.sum(axis=1)
    for k in acc.drops(drop_b, base.any(axis=0)):
        at = drop_b == k
        g: Any = slice(None) if acc.every_drop else np.flatnonzero(at.any(axis=1))
        at = at[g]
        nb_g, sb_g, nc_g, sc_g = nb[g], sb[g], nc[g], sc[g]
        n_ct_g, pc_g = n_ct[g], pod_calls_c[g]
        keep = base[g].copy()
        if k >= 0:
            keep[:, k] = False
        n_bt = nb_g.sum(axis=1) - (nb_g[:, k] if k >= 0 else 0.0)
        s_bt = sb_g.sum(axis=1) - (sb_g[:, k] if k >= 0 else 0.0)
        both = ((n_bt > 0) & (n_ct_g > 0)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv_b = np.where(n_bt > 0, 1.0 / np.where(n_bt > 0, n_bt, 1.0), 0.0)
        q_t = np.clip(ratio * s_bt * inv_b + margin, 0.0, 1.0)
        excess = acc.dot(sc_g, both, ("fail.sc", k)) - acc.dot(nc_g, both * q_t, ("fail.nc.q", k))
        own = acc.dot(nc_g, both * v_t[g] * (1.0 + ratio * ratio * n_ct_g * inv_b),
                      ("fail.own", k))
        w = acc.dot(nb_g, n_ct_g * inv_b, ("fail.w", k)) * keep[..., None]
        wc = _first_max(np.where(pc_g > 0, excess, -np.inf), axis=1)
        ex_pp[g] = np.where(at[:, None, :], excess, ex_pp[g])
        own_pp[g] = np.where(at[:, None, :], own, own_pp[g])
        sq_w[g] = np.where(at, (w ** 2).sum(axis=1), sq_w[g])
        worst[g] = np.where(at, wc, worst[g])
    return ex_pp, own_pp, sq_w, worst


def _capped(excess: F64, calls: F64, sd2: F64, tau2: F64) -> tuple[F64, I64]:
    """Σ of the canary pods' excesses with the worst pod's (by excess per call) capped at
    the most the other canary pods plausibly have (their pooled excess per call plus
    `_CAP_Z` standard errors, sampling and spread), and that pod; (groups, pods, looks) in,
    (groups, looks) out. A sick pod among healthy ones is set aside this way, while a
    regression on every pod keeps (nearly) all its evidence. Pooled, the others' bound is
    not set by a pod that has just joined with a handful of calls. The sum is never above
    the uncapped one."""
    has = calls > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(has, excess / np.where(has, calls, 1.0), -np.inf)
    worst = _first_max(rate, axis=1)
    r_w = np.take_along_axis(rate, worst[:, None, :], axis=1)[:, 0]
    n_w = np.take_along_axis(calls, worst[:, None, :], axis=1)[:, 0]
    e_w = np.take_along_axis(excess, worst[:, None, :], axis=1)[:, 0]
    n_o = calls.sum(axis=1) - n_w
    with np.errstate(divide="ignore", invalid="ignore"):
        cap = np.where(n_o > 0, (excess.sum(axis=1) - e_w) / np.where(n_o > 0, n_o, 1.0)
                       + _CAP_Z * np.sqrt(sd2 / np.where(n_o > 0, n_o, 1.0) + tau2), np.inf)
        over = np.where(np.isfinite(cap) & np.isfinite(r_w), np.maximum(r_w - cap, 0.0), 0.0)
    return excess.sum(axis=1) - n_w * over, worst


def _few_pods(tau2: F64, df: F64, tau2_se: F64, weights: F64, v_sampling: F64, sd2: F64,
              log_threshold: float, scales: tuple[float, ...]) -> tuple[F64, F64]:
    """The spread term τ²·`weights` with τ² from few pods allowed for (`few_pods_factor`):
    scaled by the factor, and τ² taken as at least part of its standard error as the
    factor rises above 1 (all of `_SE_FLOOR` from 2 on), so that a few pods that happen
    to agree do not claim no spread at all. Returned in two parts, by how they grow with
    the calls: with their square (τ² estimated), and with the calls (the floor: a standard
    error shrinks as they grow)."""
    factor = few_pods_factor(df, (v_sampling + tau2 * weights) / sd2, log_threshold, scales)
    floor = _SE_FLOOR * np.minimum(factor - 1.0, 1.0) * tau2_se
    floored = floor > tau2
    return (factor * np.where(floored, 0.0, tau2) * weights,
            factor * np.where(floored, floor, 0.0) * weights)


def _tau2(cohorts: list[tuple[F64, F64, F64, F64, Bool, I64 | None, Bool]], v_pool: F64,
          acc: _Acc, tag: str
          ) -> tuple[F64, F64, F64, list[tuple[F64, F64]], tuple[F64, F64]]:
    """DerSimonian–Laird τ² per group and look from each cohort's pods (calls `n`, sums
    `s`: groups × pods × windows, 0 off the cohort; `calls`, `sums` theirs summed over the
    windows, as `acc` sums them; the cohort's pods `members`), each pod measured against its
    cohort's window means, leaving out the pod `drop[group, look]` (−1: none; None: none ever), in
    the groups where the cohort `counts`: out of the sum of squares and out of the window
    means, so one sick pod neither counts itself nor makes every healthy pod look off.
    Each distinct dropped pod costs one pass over the cells of the groups that drop it (the
    worst pod rarely changes once data accrues; with a memo every pod of the cohort,
    `members`, is dropped in turn). `tag` names the kept sums. With τ², its degrees of
    freedom (pods counted, less one per cohort) and its standard error were the pods alike
    (Q's is √(2 df) then), per cohort the dropped pod's residual against the others'
    window means and its calls (0 where none is dropped), for `_outlier`, and Q's sum of
    squares with its denominator, for a τ² at another per-call variance (`_tau2_at`)."""
    q, df, denom = (np.zeros(v_pool.shape) for _ in range(3))
    dropped: list[tuple[F64, F64]] = []
    for i, (n, s, calls, sums, members, drop, counts) in enumerate(cohorts):
        out_resid, out_calls = np.zeros(v_pool.shape), np.zeros(v_pool.shape)
        dropped.append((out_resid, out_calls))
        n_t, s_t = n.sum(axis=1), s.sum(axis=1)
        if drop is None:
            drop = np.full(v_pool.shape, -1, dtype=np.int64)
            ks = [-1]
        else:
            ks = acc.drops(drop, members.any(axis=0))
        for k in ks:
            at = (drop == k) & counts[:, None]
            g: Any = slice(None) if acc.every_drop else np.flatnonzero(at.any(axis=1))
            if not acc.every_drop and not g.size:
                continue
            at = at[g]
            n_g, s_g = n[g], s[g]
            n_o = n_t[g] - (n_g[:, k] if k >= 0 else 0.0)
            s_o = s_t[g] - (s_g[:, k] if k >= 0 else 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                mean = np.where(n_o > 0, s_o / np.where(n_o > 0, n_o, 1.0), 0.0)
            resid = sums[g] - acc.dot(n_g, mean, (f"{tag}{i}.n.mean", k))
            calls_g = calls[g]
            keep = calls_g > 0
            if k >= 0:
                keep[:, k] = False
            c = np.where(keep, calls_g, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                q_k = np.where(keep, resid ** 2 / np.where(keep, calls_g, 1.0), 0.0).sum(axis=1)
            kept = keep.sum(axis=1)
            total = c.sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                denom_k = np.where(kept > 1, total - (c ** 2).sum(axis=1)
                                   / np.where(total > 0, total, 1.0), 0.0)
            q[g] += np.where(at, q_k, 0.0)
            df[g] += np.where(at, np.maximum(kept - 1, 0), 0)
            denom[g] += np.where(at, denom_k, 0.0)
            if k >= 0:
                out_resid[g] += np.where(at, resid[:, k], 0.0)
                out_calls[g] += np.where(at, calls_g[:, k], 0.0)
    tau2, se = _tau2_at(q, denom, df, v_pool)
    return tau2, df, se, dropped, (q, denom)


def _tau2_at(q: F64, denom: F64, df: F64, v: F64) -> tuple[F64, F64]:
    """DerSimonian–Laird τ² and its standard error from Q's sum of squares `q` and its
    denominator (`_tau2`) at the per-call variance `v`."""
    ok = (df > 0) & (denom > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(ok, 1.0 / np.where(denom > 0, denom, 1.0), 0.0)
    return (np.where(ok, np.maximum(0.0, (q - df * v) * inv), 0.0),
            np.where(ok, np.sqrt(2.0 * df) * v * inv, 0.0))


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


@dataclass(frozen=True, slots=True, eq=False)
class PodGrid:
    """One path's calls and errors per pod and window: the input of the pod-level verdict.

    A pod is an endpoint in one cohort (a pod restarted onto the new proxy is a new pod).
    `calls` / `errors` are (pods, windows) over the windows `starts`, with each pod's
    warm-up left out; `warmup_calls` / `warmup_errors` are what the warm-up held, per pod.
    A column is one window, or adjacent ones merged to bound the grid's size: `starts` is
    when each column's first window began, `last_starts` when its last one did.
    Per-pod attempts and latency, where the source keeps them (`per_pod_metrics`: every
    warm cell was written with them): `attempts_calls` / `attempts_sum` (pods, windows) as
    `calls`, and `latency` (pods, buckets of `probes.measure.histogram`), the warm calls'
    histogram over all the grid's windows; None where no row from `since` has any.
    """

    pods: tuple[str, ...]
    cohorts: tuple[str, ...]
    starts: F64
    calls: F64
    errors: F64
    warmup_calls: F64
    warmup_errors: F64
    last_starts: F64
    attempts_calls: F64 | None = None
    attempts_sum: F64 | None = None
    latency: F64 | None = None
    per_pod_metrics: bool = False

    def of(self, cohort: str) -> Bool:
        return np.array([c == cohort for c in self.cohorts], dtype=bool)


# A grid above this many cells is judged in coarser time strata (adjacent windows merged):
# memory stays bounded for hundreds of pods over a day, and strata of a few windows still
# cancel an outage shared by both cohorts.
MAX_GRID_CELLS = 2_000_000


def read_pod_grids(source: Any, *, since: float | None, until: float | None,
                   paths: Iterable[str] | None = None, cohorts: Iterable[str] | None = None,
                   warmup_s: float, window_s: float, stratum_s: float | None = None,
                   exclude: Sequence[tuple[float, float]] = (),
                   per_pod: bool = True) -> dict[str, PodGrid] | None:
    """Per path, the pods × windows grid read from `source` (its `read_endpoint_columns`,
    the SQLite store's) as every reader takes it: from `warmup_s` before `since`, so a pod
    seen then is warm at `since`; `stratum_s` sums windows into coarser strata; windows
    touching an `exclude` span (late sends) keep their calls but not their latency. With
    `per_pod`, the grids carry the pods' attempts and latency too
    (`probes.stats.pod_cells`). None when the source keeps no per-pod counts (Prometheus
    series)."""
    read = getattr(source, "read_endpoint_columns", None)
    if read is None:
        return None
    lo = None if since is None else since - warmup_s
    length_s = stratum_s or window_s
    stream = getattr(source, "stream_endpoint_columns", None)
    if per_pod and stream is not None:
        from probes.stats.pod_cells import LatencyFold

        # The latency records a chunk at a time, summed into each pod's histogram as they
        # come: a day's records held whole grew with pods past the store's size (BENCHMARKS.md D23).
        with stream(since=lo, until=until, paths=paths, cohorts=cohorts,
                    stratum_s=stratum_s) as (cols, chunks):
            fold = LatencyFold(cols, since=since, warmup_s=warmup_s, length_s=length_s,
                               exclude=exclude)
            for chunk in chunks:
                fold.add(chunk)
        return fold.grids(_grids_of(cols, since, warmup_s, length_s, exclude, per_pod))
    cols = read(since=lo, until=until, paths=paths, cohorts=cohorts, stratum_s=stratum_s,
                **({"latency": True} if per_pod else {}))
    return _grids_of(cols, since, warmup_s, length_s, exclude, per_pod)


def _grids_of(cols: Any, since: float | None, warmup_s: float, length_s: float,
              exclude: Sequence[tuple[float, float]], per_pod: bool) -> dict[str, PodGrid]:
    """`pod_grids` of endpoint columns read for `read_pod_grids`, rows `length_s` long."""
    extra = None
    if per_pod:
        from probes.stats.pod_cells import per_pod_of

        extra = per_pod_of(cols, length_s, exclude)
    return pod_grids(
        cols.start, cols.path, cols.endpoint, cols.cohort,
        cols.requests, cols.errors,
        paths=cols.paths, endpoints=cols.endpoints, cohorts=cols.cohorts, since=since,
        warmup_s=warmup_s, started=cols.started, per_pod=extra,
    )


def _unique(t: F64) -> tuple[F64, npt.NDArray[np.intp]]:
    """`np.unique(t, return_inverse=True)`, without its sort when `t` is in order already
    (the verdict cache keeps each path's strata by start)."""
    if t.size and np.all(t[1:] >= t[:-1]):
        new = np.empty(t.size, dtype=bool)
        new[0] = True
        np.not_equal(t[1:], t[:-1], out=new[1:])
        return t[new], np.cumsum(new) - 1
    starts, window = np.unique(t, return_inverse=True)
    return starts, window


def pod_grids(start: F64, path: npt.NDArray[np.int32], endpoint: npt.NDArray[np.int32],
              cohort: npt.NDArray[np.int32], requests: I64, errors: I64, *,
              paths: tuple[str, ...], endpoints: tuple[str, ...], cohorts: tuple[str, ...],
              since: float | None, warmup_s: float,
              started: F64 | None = None, per_pod: Any = None) -> dict[str, PodGrid]:
    """Per path, the pods × windows grid of the rows with start ≥ `since` (columns as
    `EndpointColumns` holds them). A pod's warm-up is its first `warmup_s` from when it
    started (`started`, per row, where known) or else from the first window the rows show
    it in, so pass rows from `warmup_s` before `since` too: a pod seen then has warmed up by
    `since`. A pod restarted under its own name (a StatefulSet's) has a new start.
    `per_pod` (`probes.stats.pod_cells.PerPod`): the rows' attempts and latency, which the
    grids then carry too (`pod_cells.add_per_pod`)."""
    out: dict[str, PodGrid] = {}
    if not len(start):
        return out
    # Rows grouped by path once (stable: each path's rows keep their order), not a mask
    # over every row per path: a day of 50 paths' pods was mostly that.
    order = np.argsort(path, kind="stable")
    by_path = path[order]
    if per_pod is not None:
        from probes.stats.pod_cells import by_path as entries_by_path

        per_pod = entries_by_path(per_pod, len(paths))
    cuts = np.flatnonzero(by_path[1:] != by_path[:-1]) + 1
    for rows in np.split(order, cuts):
        p = path[rows[0]]
        t, e, c = start[rows], endpoint[rows], cohort[rows]
        n, k = requests[rows].astype(np.float64), errors[rows].astype(np.float64)
        pod_key = e.astype(np.int64) * len(cohorts) + c
        keys, pod = np.unique(pod_key, return_inverse=True)
        first = np.full(len(keys), np.inf)
        np.minimum.at(first, pod, t)
        began = first[pod] if started is None else np.where(
            np.isnan(started[rows]), first[pod], started[rows])
        warm = t >= began + warmup_s
        kept = t >= since if since is not None else np.ones(len(t), dtype=bool)
        starts, window = _unique(t[kept])
        if not len(starts):
            continue
        merge = max(1, math.ceil(len(keys) * len(starts) / MAX_GRID_CELLS))
        window = window // merge
        cols = int(window.max()) + 1 if len(window) else 0
        shape = (len(keys), cols)
        pk, wk, hot = pod[kept], window, ~warm[kept]
        cell = pk[~hot] * cols + wk[~hot]

        def summed(at: I64, x: F64, size: int) -> F64:
            return np.bincount(at, weights=x, minlength=size).astype(np.float64)

        grid_n = summed(cell, n[kept][~hot], shape[0] * cols).reshape(shape)
        grid_s = summed(cell, k[kept][~hot], shape[0] * cols).reshape(shape)
        w_n = summed(pk[hot], n[kept][hot], len(keys))
        w_s = summed(pk[hot], k[kept][hot], len(keys))
        grid = PodGrid(
            pods=tuple(endpoints[int(x) // len(cohorts)] for x in keys),
            cohorts=tuple(cohorts[int(x) % len(cohorts)] for x in keys),
            starts=starts[::merge], calls=grid_n, errors=grid_s,
            warmup_calls=w_n, warmup_errors=w_s,
            last_starts=starts[np.minimum((np.arange(cols) + 1) * merge, len(starts)) - 1],
        )
        if per_pod is not None:
            from probes.stats.pod_cells import add_per_pod

            grid = add_per_pod(grid, per_pod, rows, p, keys, pod, kept, warm, window,
                               n_cohorts=len(cohorts), since=since, warmup_s=warmup_s,
                               first=first)
        out[paths[int(p)]] = grid
    return out
