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
  the baseline's, p(1−p) for a fail (the pass takes v_t for both, a margin for pods that
  differ), both at the baseline's window mean smoothed toward its running mean (a window
  without errors does not claim zero variance). The baseline alone sets them: a canary
  within tolerance varies no more than the
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
  the most the other canary pods plausibly show (`capped`): a sick pod among healthy ones
  is set aside and named, while a regression on every pod keeps its evidence; the
  baseline's worst pod is out of the window means the canary is compared with;
- pass when E_pass (the mirror image, against "canary beyond tolerance") ≥ 1/α;
- the canary pod with the largest excess and its share of the canary's excess are reported
  (`worst`, `worst_share`): "concentrated on shop-0" is a finding in its own right.

Where each part lives (this module names what the rest of the probe uses): `pod_cells`
the input grid and its per-pod attempts and latency, `_pod_read` grids laid out from the
store's rows, `_pod_batch` the statistic per look and the decision rule, `_pod_spread` τ²,
the few-pods allowance, sick pods and the cap, `_pod_mixture` the e-value, `_num` sums over
windows, `_pod_tracks` batches of grids and the memo.
"""

from __future__ import annotations

from probes.stats._pod_batch import ONE_POD_BASELINE, PodTrack, pod_states
from probes.stats._pod_mixture import (
    MIXING_SCALES,
    log_e_one_sided,
    needs_factor,
    needs_factors,
)
from probes.stats._pod_read import pod_grids, read_pod_grids
from probes.stats._pod_spread import few_pods_factor
from probes.stats._pod_tracks import MEMO_MAX_PODS, TrackMemo, pod_track, pod_tracks
from probes.stats.pod_cells import MAX_GRID_CELLS, PodGrid

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
