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

- sampling: Σ_t N_ct·(v_t + r²·u_t·N_ct/N_bt), the canary's calls and p_t's own noise,
  with v_t the canary's per-call variance at H0's boundary, max(p(1−p), q(1−q)), and u_t
  the baseline's own, p(1−p), both at the baseline's window mean smoothed toward its
  running mean (a window without errors does not claim zero variance). The baseline alone
  sets them: a canary within tolerance varies no more than the boundary, and a worse
  canary's own errors must not widen the yardstick they are measured by (that slowed fails
  by the ratio of the pooled to the boundary variance, 1.75× at +0.5 pp on 0.1 %);
- pods: τ²·(Σ_i N_i² + r²·Σ_j W_j²), where N_i is canary pod i's calls and W_j the weight
  baseline pod j carries in the p_t's (Σ_t N_ct·n_jt/N_bt). τ² is the spread between pods
  of one cohort beyond sampling noise, estimated from both cohorts' pods (each against its
  own cohort's window means, so time effects do not count) by DerSimonian and Laird's
  moment estimator. This term grows with the square of the calls: evidence saturates at
  what the number of pods can say, which is the honest answer when pods differ. With few
  pods τ² is itself uncertain: on both sides the term is scaled by a t-type factor for τ²'s
  degrees of freedom and τ² taken as at least half its standard error (`few_pods_factor`),
  so a few pods that happen to agree do not make it a per-call test (a fail's τ², which
  leaves each cohort's worst pod out, is then never below the pass's); and a pass takes τ²
  at an upper confidence bound (`tau2_upper`, χ²-type, from how many pods and how many
  calls each has), so that its point alternative (below) is charged for τ² where it is
  poorly known.

D/√V is tested with a one-sided normal-mixture e-process (Robbins' mixture, as in Johari,
Pekelis & Walsh's always-valid p-values and Howard et al.'s asymptotic confidence
sequences), averaged over a grid of mixing scales so that small and large effects both
decide fast. The pass's puts half its weight on one drift instead (`log_e_pass`): the one a
canary like the baseline has, the case a pass is for. It is anytime-valid asymptotically (a
CLT per window and a consistent variance estimate); `benchmarks/verdict_sim.py` measures
what that is worth on simulated estates with pods that differ, restart cold and share
outages.

Decisions (`pod_states`, the one rule the live verdict and the report's replay both apply):
- a canary of one pod is judged as a new pod drawn from the baseline's (a prediction
  interval for a new study, Higgins, Thompson & Spiegelhalter 2009): its excess against
  sampling plus τ² from the baseline's pods, with the few-pods allowance on both sides. It
  fails when it is beyond what the baseline's pods plausibly do (the reason names it and
  says a restart or a second canary pod tells pod from version) and passes when it is
  within them and the tolerance;
- with several canary pods, fail when E_fail ≥ 1/α with the worst canary pod *capped* at
  the most the other canary pods plausibly show (`capped`): a sick pod among healthy ones
  is set aside and named, while a regression on every pod keeps its evidence; the
  baseline's worst pod is out of the window means the canary is compared with;
- pass when E_pass (the mirror image, against "canary beyond tolerance") ≥ 1/α;
- the canary pod with the largest excess and its share of the canary's excess are reported
  (`worst`, `worst_share`): "concentrated on shop-0" is a finding in its own right.

Where each part lives (this module names what the rest of the probe uses): `pod_cells`
the input grid, laid out from the store's rows, with its per-pod attempts and latency,
`_pod_batch` the statistic per look and the decision rule, `_pod_spread` τ²,
the few-pods allowance, sick pods and the cap, `_pod_mixture` the e-value, `_num` sums over
windows; here, `pod_tracks`: the test over many grids in batches of bounded memory, and the
memo that lets a caller asking again as windows arrive sum only the new ones.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from probes.stats._num import F64, I64, Acc, Bool
from probes.stats._pod_batch import (
    ONE_POD_BASELINE,
    PodTrack,
    batch_looks,
    pod_batch,
    pod_states,
)
from probes.stats._pod_mixture import (
    MIXING_SCALES,
    log_e_one_sided,
    needs_factor,
    needs_factors,
)
from probes.stats._pod_spread import few_pods_factor
from probes.stats.pod_cells import MAX_GRID_CELLS, PodGrid, pod_grids, read_pod_grids

__all__ = [
    "MAX_GRID_CELLS",
    "MEMO_MAX_PODS",
    "MIXING_SCALES",
    "ONE_POD_BASELINE",
    "PodGrid",
    "PodTrack",
    "TrackMemo",
    "batches",
    "few_pods_factor",
    "log_e_one_sided",
    "needs_factor",
    "needs_factors",
    "pod_fail_values",
    "pod_grids",
    "pod_states",
    "pod_track",
    "pod_tracks",
    "read_pod_grids",
]


def pod_track(n: F64, s: F64, canary: Bool, ratio: float, margin: float,
              scales: tuple[float, ...] = MIXING_SCALES, *, log_threshold: float,
              last_only: bool = False) -> PodTrack:
    """The test of H0: μ_c ≤ ratio·μ_b + margin at every look (module docstring).

    `n`, `s`: (pods, windows) calls and sums, windows in time order (a window where no pod
    has calls may be left out or kept, it changes nothing); `canary`: (pods,) cohort flags.
    `log_threshold`: log 1/α of the decisions to be taken on the track (`pod_states`), for
    the allowance for τ² from few pods (`few_pods_factor`).
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
        out += pod_batch(grids[lo:hi], ratio, margin, scales, log_threshold, Acc(last_only),
                          pod_ratio)
    return out


def pod_fail_values(grids: Sequence[tuple[F64, F64, Bool]], ratio: float, margin: float,
                    scales: tuple[float, ...] = MIXING_SCALES, *, log_threshold: float) -> F64:
    """The last look's `log_e_fail` of `pod_tracks(grids, ..., last_only=True)`, one per
    grid, without a `PodTrack` per grid: a profile over candidate cuts
    (`probes.stats.pod_profile`) judges several grids per path and reads this figure of each,
    and building the tracks cost more than judging them."""
    out = [batch_looks(grids[lo:hi], ratio, margin, scales, log_threshold,
                       Acc(True))[0]["log_e_fail"][:, -1] for lo, hi in _batches(grids)]
    return np.concatenate(out) if out else np.zeros(0)


def _batches(grids: Sequence[tuple[F64, F64, Bool]]) -> list[tuple[int, int]]:
    """`grids` cut into runs [lo, hi) of at most `_BATCH_CELLS` padded cells each."""
    return batches([np.shape(grid[0]) for grid in grids])


def batches(shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    """Runs [lo, hi) of arrays of these shapes ((rows,) or (rows, columns)) that, stacked
    and padded to their run's most rows and columns, hold at most `_BATCH_CELLS` cells: a
    batch of `pod_tracks`' grids, or of the pods' latency histograms that
    `probes.verdict.pod_metrics` judges p99 from. An array larger than that is a run alone."""
    out: list[tuple[int, int]] = []
    lo = rows = cols = 0
    for i, shape in enumerate(shapes):
        r, c = max(rows, shape[0]), max(cols, shape[1] if len(shape) > 1 else 0)
        if i > lo and (i - lo + 1) * r * c > _BATCH_CELLS:
            out.append((lo, i))
            lo, r, c = i, shape[0], shape[1] if len(shape) > 1 else 0
        rows, cols = r, c
    if lo < len(shapes):
        out.append((lo, len(shapes)))
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
                acc = Acc(True, {}, folded[lo:hi])
                out += pod_batch(cells[lo:hi], ratio, margin, scales, log_threshold, acc,
                                  pod_ratio)
                # The pods the batch was padded to (`pod_batch`: at least one).
                kept.append((acc.kept_now, max(1, *(n.shape[0] for n, _, _ in cells[lo:hi]))))
            sums = _merged(kept)
        else:
            folded = np.maximum(start, width - self.depth)
            acc = Acc(True, self._sums, folded - start)
            out = pod_batch([(n[:, k:], s[:, k:], c) for (n, s, c), k in
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
# with one path at a time (BENCHMARKS.md D16). The p99's per-pod histograms (groups × pods ×
# buckets) are batched by it too: a cold verdict's peak is then not four copies of them all
# (BENCHMARKS.md D23).
_BATCH_CELLS = 250_000
