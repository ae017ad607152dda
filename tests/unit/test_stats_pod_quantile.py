"""p99 with the pod as the unit (`probes.stats.pod_quantile`): one pod fails nothing, a
version does, a slow baseline pod does not mask it, and healthy canaries fail at most α."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from probes.measure.histogram import BUCKET_COUNT, LOWER, UPPER, index_of
from probes.stats.pod_quantile import pod_quantile_track, worst_pods
from probes.stats.quantile import Layout

LAYOUT = Layout.from_edges(LOWER, UPPER)
ALPHA = 0.01
THR = math.log(1 / ALPHA)
RATIO, MARGIN_S = 1.2, 0.005


def estate(rng: np.random.Generator, scales: list[float], calls: int = 3000) -> np.ndarray:
    """(pods, 1 look, buckets): lognormal calls (median 50 ms, σ 0.5) × each pod's scale."""
    x = rng.lognormal(math.log(0.05), 0.5, (len(scales), calls)) * np.array(scales)[:, None]
    return np.stack([np.bincount(index_of(row), minlength=BUCKET_COUNT) for row in x]
                    ).astype(float)[:, None, :]


def track(hist: np.ndarray, canary_pods: int):  # type: ignore[no-untyped-def]
    canary = np.arange(hist.shape[0]) >= hist.shape[0] - canary_pods
    return pod_quantile_track(hist, canary, LAYOUT, 0.99, RATIO, MARGIN_S, THR)


def test_a_canary_of_one_pod_never_fails_however_slow() -> None:
    rng = np.random.default_rng(1)
    t = track(estate(rng, [1.0] * 6 + [3.0]), 1)
    assert t.log_e_fail[0] == -np.inf
    assert t.log_e_fail_all[0] >= THR  # pooled, it would have failed
    assert t.pods_canary[0] == 1 and t.worst[0] == 0


def test_one_slow_canary_pod_is_left_out_and_named() -> None:
    rng = np.random.default_rng(2)
    t = track(estate(rng, [1.0] * 6 + [1.0, 3.0, 1.0]), 3)
    assert t.log_e_fail_all[0] >= THR and t.log_e_fail[0] < THR
    assert t.worst[0] == 1
    # Nearly all of the canary's calls above the baseline's p99 are that pod's.
    assert t.worst_share[0] > 0.8 and math.isclose(t.worst_call_share[0], 1 / 3)


def test_a_slowdown_on_every_canary_pod_fails_despite_a_slow_baseline_pod() -> None:
    # The baseline's slow pod lifts its pooled p99; left out, the version's ×1.5 shows.
    rng = np.random.default_rng(3)
    t = track(estate(rng, [1.0] * 5 + [2.5] + [1.5] * 3), 3)
    assert t.log_e_fail[0] >= THR
    assert t.log_e_fail[0] > t.log_e_fail_all[0]


def test_every_look_is_judged_from_cumulative_histograms() -> None:
    rng = np.random.default_rng(4)
    per_look = np.concatenate([estate(rng, [1.0] * 4 + [1.5] * 3, calls=400)
                               for _ in range(5)], axis=1)
    t = track(np.cumsum(per_look, axis=1), 3)
    assert t.log_e_fail.shape == (5,)
    assert t.log_e_fail[-1] >= THR  # 2,000 calls per pod decide a ×1.5 slowdown


def test_healthy_canaries_fail_at_most_alpha() -> None:
    # Pods alike, calls independent: the pooled test is valid at α, so its fails over K
    # rollouts are at most Binomial(K, α) (bounded here at its 1 − 1e-6 quantile). Trimming
    # leaves out a third of the canary's calls and a sixth of the baseline's, each cohort's
    # slowest pod: the canary's tail loses more, so the trimmed test fails no more often.
    rng = np.random.default_rng(5)
    rollouts = 200
    fails = fails_all = 0
    for _ in range(rollouts):
        t = track(estate(rng, [1.0] * 9, calls=1000), 3)
        fails += int(t.log_e_fail[0] >= THR)
        fails_all += int(t.log_e_fail_all[0] >= THR)
    bound = binom.ppf(1 - 1e-6, rollouts, ALPHA)
    assert fails_all <= bound and fails <= bound


def test_worst_pods_of_many_groups_are_each_groups_own() -> None:
    # The live verdict finds every path's worst canary pod at once (`worst_pods`, pods
    # padded): the same pods, worst pod and shares as each path's own track, including
    # pods without calls, a cohort of one pod, tied pods and a canary without calls.
    rng = np.random.default_rng(5)
    groups = []
    for g in range(40):
        pods = int(rng.integers(2, 9))
        scales = list(rng.choice([1.0, 1.3, 2.0], pods))
        hist = estate(rng, scales, calls=int(rng.integers(50, 800)))[:, 0, :]
        canary = np.zeros(pods, dtype=bool)
        canary[rng.choice(pods, int(rng.integers(1, pods)), replace=False)] = True
        if g % 5 == 1:
            hist[rng.integers(pods)] = 0.0  # a pod without warm calls
        if g % 7 == 2:
            hist[canary] = hist[np.flatnonzero(canary)[0]]  # canary pods tied
        if g % 11 == 3:
            hist[canary] = 0.0  # no canary calls at all
        groups.append((hist, canary))
    width = max(len(c) for _, c in groups)
    stacked = np.zeros((len(groups), width, BUCKET_COUNT))
    canary_all = np.zeros((len(groups), width), dtype=bool)
    real = np.zeros((len(groups), width), dtype=bool)
    for i, (hist, canary) in enumerate(groups):
        stacked[i, :len(canary)], canary_all[i, :len(canary)], real[i, :len(canary)] = (
            hist, canary, True)
    found = worst_pods(stacked, canary_all, real, 0.99)
    for i, (hist, canary) in enumerate(groups):
        one = pod_quantile_track(hist[:, None, :], canary, LAYOUT, 0.99, RATIO, MARGIN_S, THR,
                                 tests=False)
        assert found.pods_baseline[i] == one.pods_baseline[-1], i
        assert found.pods_canary[i] == one.pods_canary[-1], i
        assert found.worst[i] == one.worst[-1], i
        assert found.worst_share[i] == one.worst_share[-1], i
        assert found.worst_call_share[i] == one.worst_call_share[-1], i
    # Given the counts summed over the buckets already (the live verdict has that sum).
    summed = worst_pods(np.cumsum(stacked, axis=-1), canary_all, real, 0.99, cumulative=True)
    for field in ("pods_baseline", "pods_canary", "worst", "worst_share", "worst_call_share"):
        np.testing.assert_array_equal(getattr(summed, field), getattr(found, field))
