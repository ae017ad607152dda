"""The pod-clustered, time-stratified test (`probes.stats.pods`) on seeded grids of pods ×
windows. Bounds come from the method: a fail or pass is a crossing of log(1/α)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy.stats import binom

from probes.config import Tolerances
from probes.stats import bounded
from probes.stats import pods as pod_tracks_module
from probes.stats import pods as pods_module
from probes.stats.pods import (
    MEMO_MAX_PODS,
    MIXING_SCALES,
    PodGrid,
    TrackMemo,
    few_pods_factor,
    log_e_one_sided,
    needs_factor,
    pod_states,
    pod_track,
    pod_tracks,
)
from probes.verdict.metrics import pod_success_rate

LOG_THR = math.log(4 / 0.01)  # α = 1 % over four metric slots, as the verdict shares it
TOL = 0.001


def grid(rng: np.random.Generator, rates: list[float], canary: list[bool], windows: int,
         calls: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = rng.poisson(calls, (len(rates), windows)).astype(float)
    s = rng.binomial(n.astype(int), np.array(rates)[:, None]).astype(float)
    return n, s, np.array(canary)


def test_the_e_value_grows_with_the_drift_and_is_one_sided() -> None:
    v = np.array([100.0, 100.0, 100.0])
    log_e = log_e_one_sided(np.array([-30.0, 0.0, 30.0]), v)
    assert log_e[0] < log_e[1] < log_e[2]
    assert log_e[0] < 0.0 < log_e[2]


def test_a_regression_on_every_canary_pod_fails_and_a_healthy_one_passes() -> None:
    rng = np.random.default_rng(1)
    bad = grid(rng, [0.001] * 6 + [0.006] * 6, [False] * 6 + [True] * 6, 600)
    track = pod_track(*bad, 1.0, TOL, log_threshold=LOG_THR)
    assert track.log_e_fail[-1] >= LOG_THR
    assert track.log_e_pass[-1] < LOG_THR
    good = grid(rng, [0.001] * 12, [False] * 6 + [True] * 6, 600)
    track = pod_track(*good, 1.0, TOL, log_threshold=LOG_THR)
    assert track.log_e_pass[-1] >= LOG_THR
    assert not (track.log_e_fail >= LOG_THR).any()


def test_a_baseline_whose_calls_are_one_pods_is_not_left_without_it() -> None:
    # Two baseline rows, one still warming up (no calls): the fail side leaves the
    # baseline's worst pod out only where another pod has calls, so the row without calls
    # changes nothing (it used to drop the one pod with calls, and with it all evidence).
    rng = np.random.default_rng(2)
    n, s, canary = grid(rng, [0.001, 0.01, 0.01, 0.01], [False, True, True, True], 600)
    alone = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR)
    assert alone.log_e_fail[-1] >= LOG_THR
    padded = pod_track(np.vstack([np.zeros((1, 600)), n]), np.vstack([np.zeros((1, 600)), s]),
                       np.array([False, *canary]), 1.0, TOL, log_threshold=LOG_THR)
    assert padded.log_e_fail[-1] == pytest.approx(alone.log_e_fail[-1])


def test_one_sick_canary_pod_does_not_fail_the_version_and_is_named() -> None:
    rng = np.random.default_rng(2)
    n, s, canary = grid(rng, [0.001] * 6 + [0.05, 0.001, 0.001], [False] * 6 + [True] * 3, 600)
    track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR)
    # Every call independent (the pooled test) would fail it.
    pooled = bounded.two_sample(s[:6].sum(), n[:6].sum(), s[6:].sum(), n[6:].sum(), 1.0, TOL)
    assert float(pooled.log_e_fail) >= LOG_THR
    assert not (track.log_e_fail >= LOG_THR).any()  # without its worst pod it does not
    assert int(track.worst[-1]) == 0  # the first canary pod, the sick one
    assert track.excess[0, -1] > 0.9 * np.clip(track.excess[:, -1], 0, None).sum()


def test_an_outage_shared_by_both_cohorts_does_not_fail_the_canary() -> None:
    rng = np.random.default_rng(3)
    # The canary has 3 times the calls in the outage windows: pooled, it would look worse.
    n, s, canary = grid(rng, [0.001] * 6 + [0.001] * 6, [False] * 6 + [True] * 6, 300)
    n[6:, 100:103] *= 3
    s[:, 100:103] = rng.binomial(n[:, 100:103].astype(int), 0.3)
    track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR)
    assert not (track.log_e_fail >= LOG_THR).any()
    pooled_c = s[6:].sum() / n[6:].sum()
    pooled_b = s[:6].sum() / n[:6].sum()
    assert pooled_c - pooled_b > TOL  # the pooled comparison would blame the canary


def test_spread_between_pods_is_estimated_and_slows_the_pass() -> None:
    rng = np.random.default_rng(4)
    rates = list(0.001 * rng.lognormal(0, 1.0, 12))
    n, s, canary = grid(rng, rates, [False] * 6 + [True] * 6, 600)
    track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR)
    assert track.tau[-1] > 0.0
    same = pod_track(*grid(rng, [0.001] * 12, [False] * 6 + [True] * 6, 600), 1.0, TOL,
                     log_threshold=LOG_THR)
    assert same.tau[-1] < track.tau[-1]


def test_the_sampling_variance_charges_the_baseline_its_own_per_call_variance() -> None:
    """Under H0 only the canary's calls are at the boundary's rate q: the baseline's window
    means, against which they are compared, vary with its own calls' p(1 − p), on the fail
    side and the pass's alike."""
    windows, calls = 30, 1000.0
    n = np.full((12, windows), calls)
    s = np.full((12, windows), 1.0)  # every pod at exactly 0.1 %: τ² is 0
    canary = np.array([False] * 6 + [True] * 6)
    track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR, last_only=True)
    p, q = 1.0 / calls, 1.0 / calls + TOL
    # The fail side leaves the baseline's worst pod out of the window means: 5 of 6 pods.
    rho = 6 / 5
    want = windows * 6 * calls * (q * (1 - q) + rho * p * (1 - p)) / (q * (1 - q))
    assert float(track.v_pods_wo[-1]) == 0.0
    assert float(track.v_sampling_wo[-1]) == pytest.approx(want, rel=1e-9)
    # The pass keeps every baseline pod (none is set aside here).
    want = windows * 6 * calls * (q * (1 - q) + p * (1 - p)) / (q * (1 - q))
    assert float(track.v_sampling[-1]) == pytest.approx(want, rel=1e-9)


def test_needs_says_how_far_a_decision_is() -> None:
    k = needs_factor(10.0, 100.0, 0.0, LOG_THR)
    assert k is not None and k > 1.0
    assert log_e_one_sided(k * 10.0, k * 100.0) >= LOG_THR
    assert needs_factor(-1.0, 100.0, 0.0, LOG_THR) is None
    # A pods' term that grows with the calls' square caps the evidence: never decided.
    assert needs_factor(1.0, 100.0, 1.0, LOG_THR) is None


def test_the_last_look_alone_is_the_last_column_of_the_full_track() -> None:
    """`last_only` (the live verdict) gives the numbers the full track (the report's replay)
    gives at its last look, and the same decision, on grids of every shape the store makes:
    pods that start late or leave, windows one cohort lacks, one canary pod, a sick pod."""
    rng = np.random.default_rng(20261204)
    for case in range(60):
        pods = int(rng.integers(2, 14))
        windows = int(rng.integers(1, 200))
        canary = rng.random(pods) < rng.uniform(0.1, 0.9)
        canary[0], canary[-1] = False, True  # both cohorts present
        rates = 0.001 * rng.lognormal(0.0, 1.0, pods)
        rates[int(rng.integers(pods))] *= 20 if case % 3 == 0 else 1
        n = rng.poisson(rng.uniform(1, 80), (pods, windows)).astype(float)
        n *= rng.random((pods, windows)) > rng.uniform(0.0, 0.4)  # gaps, warm-ups left out
        s = rng.binomial(n.astype(int), np.minimum(rates, 1.0)[:, None]).astype(float)
        if case % 4 == 1:
            s = s * rng.uniform(0.2, 1.0, s.shape)  # retry volume: sums of values in [0, 1]
        ratio, margin = (1.0, TOL) if case % 2 else (1.5, 0.0)
        full = pod_track(n, s, canary, ratio, margin, log_threshold=LOG_THR)
        last = pod_track(n, s, canary, ratio, margin, log_threshold=LOG_THR, last_only=True)
        for name in full.__slots__:
            a, b = getattr(full, name), getattr(last, name)
            assert b.shape[-1] == 1, name
            np.testing.assert_allclose(b[..., 0], a[..., -1], rtol=1e-9, atol=1e-12,
                                       err_msg=f"case {case}: {name}")
        assert pod_states(last, LOG_THR)[0] == pod_states(full, LOG_THR)[-1]


@pytest.mark.parametrize("batch_cells", [1_000_000, 200])
def test_a_batch_of_grids_is_judged_as_each_grid_alone(batch_cells: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`pod_tracks` pads grids of different sizes into batches (one, or several when the
    cells exceed its bound): each grid's track, full and last look, is what it gets alone,
    whatever else is in the batch (one canary pod, none, one baseline pod, pods and windows
    without calls)."""
    monkeypatch.setattr(pod_tracks_module, "_BATCH_CELLS", batch_cells)
    rng = np.random.default_rng(31)
    for case in range(60):
        grids = []
        for _ in range(int(rng.integers(1, 6))):
            pods, windows = int(rng.integers(1, 9)), int(rng.integers(1, 30))
            canary = np.zeros(pods, dtype=bool)
            canary[rng.choice(pods, int(rng.integers(0, pods + 1)), replace=False)] = True
            n = rng.poisson(rng.uniform(0, 60), (pods, windows)).astype(float)
            n *= rng.random((pods, windows)) > 0.2
            if rng.random() < 0.3:
                n[int(rng.integers(pods))] = 0.0
            rates = rng.uniform(0.0, 0.05, pods)
            s = rng.binomial(n.astype(int), rates[:, None]).astype(float)
            grids.append((n, s, canary))
        ratio, margin = (1.0, TOL) if case % 2 else (1.2, 0.01)
        for last_only in (False, True):
            batch = pod_tracks(grids, ratio, margin, log_threshold=LOG_THR, last_only=last_only)
            for i, (n, s, canary) in enumerate(grids):
                alone = pod_track(n, s, canary, ratio, margin, log_threshold=LOG_THR,
                                  last_only=last_only)
                for name in alone.__slots__:
                    a, b = getattr(alone, name), getattr(batch[i], name)
                    assert a.shape == b.shape, (case, i, name)
                    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12,
                                               err_msg=f"case {case}, grid {i}: {name}")


@pytest.mark.parametrize("batch_cells", [1_000_000, 300])
def test_a_memo_gives_what_summing_afresh_gives(batch_cells: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`TrackMemo` (the running probe's verdicts, one after each window): grids that gain
    windows, whose newest windows are written again, that gain a pod, or whose kept
    windows change (a pod's warm-up moved) give at every call what `pod_tracks` gives
    summing every window afresh, in one batch or several kept as one; and only a change
    to kept windows or pods sums every window again."""
    monkeypatch.setattr(pod_tracks_module, "_BATCH_CELLS", batch_cells)
    rng = np.random.default_rng(20261205)
    for case in range(12):
        memo = TrackMemo()
        grids = []
        for _ in range(int(rng.integers(1, 5))):
            pods = int(rng.integers(2, 8))
            canary = rng.random(pods) < 0.5
            canary[0], canary[-1] = False, True
            grids.append([np.zeros((pods, 0)), np.zeros((pods, 0)), canary,
                          0.001 * rng.lognormal(0.0, 1.0, pods)])
        ratio, margin = (1.0, TOL) if case % 2 else (1.5, 0.0)
        expected_whole = 1
        for call in range(25):
            changed_kept = False
            for g in grids:
                n, s, canary, rates = g
                new = int(rng.integers(0, 4))
                n_new = rng.poisson(rng.uniform(1, 60), (len(rates), new)).astype(float)
                n_new *= rng.random(n_new.shape) > 0.2
                s_new = rng.binomial(n_new.astype(int), np.minimum(rates, 1)[:, None])
                n, s = np.hstack([n, n_new]), np.hstack([s, s_new.astype(float)])
                if n.shape[1] and rng.random() < 0.3:  # the newest window written again
                    n[:, -1] += rng.poisson(3, len(rates))
                if call % 9 == 8 and n.shape[1] > 12:  # a kept window changes
                    n[:, 1] += 1.0
                    changed_kept = True
                if call == 13:  # a pod joins, in the canary
                    n = np.vstack([n, np.zeros((1, n.shape[1]))])
                    s = np.vstack([s, np.zeros((1, s.shape[1]))])
                    canary, rates = np.append(canary, True), np.append(rates, 0.002)
                    changed_kept = True
                g[:] = [n, s, canary, rates]
            items = [(n, s, c) for n, s, c, _ in grids]
            expected_whole += bool(call and changed_kept)
            kept = pod_tracks(items, ratio, margin, log_threshold=LOG_THR, last_only=True,
                              memo=memo)
            afresh = pod_tracks(items, ratio, margin, log_threshold=LOG_THR, last_only=True)
            for i, (a, b) in enumerate(zip(afresh, kept, strict=True)):
                for name in a.__slots__:
                    np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-9,
                                               atol=1e-9, err_msg=f"{case}/{call}/{i} {name}")
                assert pod_states(b, LOG_THR)[0] == pod_states(a, LOG_THR)[0]
        assert memo.summed_whole == expected_whole, (case, memo.summed_whole, expected_whole)
        # Only the newest window was written again: all but the last two are kept.
        assert memo.depth == 2
        assert memo.kept_windows == sum(max(n.shape[1] - 2, 0) for n, *_ in grids)


def test_a_memo_takes_odd_grids_as_summing_afresh_does(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    """No grids; a grid of no pods alone in its batch; grids the caller writes in place
    between calls (the memo keeps copies); grids of more pods than a memo pays for."""
    monkeypatch.setattr(pod_tracks_module, "_BATCH_CELLS", 30)
    memos = [TrackMemo(), TrackMemo()]
    assert pod_tracks([], 1.0, TOL, log_threshold=LOG_THR, last_only=True,
                      memo=memos[0]) == []
    rng = np.random.default_rng(7)
    buf_n = rng.poisson(40, (4, 12)).astype(float)
    buf_s = rng.binomial(buf_n.astype(int), 0.01).astype(float)
    canary = np.array([False, False, True, True])
    big = grid(rng, [0.001] * (MEMO_MAX_PODS + 2), [False, True] * (MEMO_MAX_PODS // 2 + 1), 5)
    empty = (np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0, dtype=bool))
    for call in range(4):
        for items, memo in zip(([empty, (buf_n, buf_s, canary)], [big]), memos, strict=True):
            kept = pod_tracks(items, 1.0, TOL, log_threshold=LOG_THR, last_only=True,
                              memo=memo)
            afresh = pod_tracks(items, 1.0, TOL, log_threshold=LOG_THR, last_only=True)
            for a, b in zip(afresh, kept, strict=True):
                for name in a.__slots__:
                    np.testing.assert_allclose(getattr(b, name), getattr(a, name),
                                               rtol=1e-9, atol=1e-9, err_msg=f"{call} {name}")
        buf_n[2:, :6] += 30.0  # kept windows rewritten in the caller's own arrays
        buf_s[2:, :6] += 20.0
    # Every call sums afresh: the kept windows were rewritten, or the pods are too many.
    assert memos[0].summed_whole == 4 and memos[1].summed_whole == 0


def test_pods_tied_on_excess_are_picked_alike_by_the_live_verdict_and_the_replay() -> None:
    """Two canary pods with the same calls and errors, in other windows, tie on their
    excess (the baseline's rate varies by window, but each pod's calls are the same in
    every window); summed in another order, their sums differ in the last bits. The pod
    each way of summing (the last look alone, the full track) picks is the first."""
    rng = np.random.default_rng(2)
    windows = 40
    n = np.full((5, windows), 50.0)
    s = np.zeros((5, windows))
    s[:3] = rng.binomial(50, 0.02, windows)
    s[3] = rng.binomial(50, 0.03, windows)
    s[4] = s[3][rng.permutation(windows)]
    canary = np.array([False, False, False, True, True])
    full = pod_track(n, s, canary, 1.2, TOL, log_threshold=LOG_THR)
    last = pod_track(n, s, canary, 1.2, TOL, log_threshold=LOG_THR, last_only=True)
    assert full.worst[-1] == last.worst[0] == 0
    np.testing.assert_allclose(last.v_sampling_wo[0], full.v_sampling_wo[-1], rtol=1e-9)


def test_logsumexp_is_scipys_for_real_input() -> None:
    """The statistics' own log-sum-exp (no per-call dispatch) against scipy's, with the
    −inf and +inf terms e-values produce."""
    from scipy.special import logsumexp as scipy_logsumexp

    from probes.stats._num import logsumexp

    rng = np.random.default_rng(9)
    a = rng.normal(0, 300, (40, 6))
    a[3] = -np.inf
    a[5, 2] = -np.inf
    a[7, 1] = np.inf
    for axis in (0, -1):
        # Older scipy (the lowest version allowed) warns on the +inf term; its result is +inf.
        with np.errstate(over="ignore", invalid="ignore"):
            reference = scipy_logsumexp(a, axis=axis)
        np.testing.assert_allclose(logsumexp(a, axis=axis), reference, rtol=1e-12)


def test_the_grids_unique_starts_are_numpys_sorted_or_not() -> None:
    from probes.stats.pod_cells import ordered_unique

    rng = np.random.default_rng(10)
    for t in (np.sort(rng.integers(0, 50, 300)).astype(float),
              rng.integers(0, 50, 300).astype(float), np.array([5.0])):
        got, inverse = ordered_unique(t)
        want, want_inverse = np.unique(t, return_inverse=True)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(inverse, want_inverse)


def test_the_few_pods_factor_grows_as_the_pods_get_fewer_and_is_one_with_many() -> None:
    log_thr = math.log(1 / 0.01)
    v = np.full(5, 1e4)
    factor = few_pods_factor(np.array([1.0, 2.0, 4.0, 10.0, 40.0]), v, log_thr, MIXING_SCALES)
    assert (np.diff(factor) <= 0).all()
    assert factor[0] > 25 and factor[1] > 4  # t with 1 and 2 df has heavy tails
    assert factor[3] == factor[4] == 1.0  # ten pods: t_10 is below the e-process's threshold
    # nothing to scale
    assert few_pods_factor(np.array([0.0]), v[:1], log_thr, MIXING_SCALES)[0] == 1.0


def small_estate_passes(rng: np.random.Generator, rollouts: int, baseline: int, canary: int,
                        spread: float, alpha: float, windows: int = 60, calls: int = 200
                        ) -> int:
    """Rollouts passed at some look, every tenth window, of a canary version at the pass
    side's H0 (its pods' mean error rate the baseline's 1 % + the 0.5 pp tolerance), pods'
    rates lognormal with σ `spread` around their version's, drawn anew each rollout (the
    version's mean is the population's), the canary balanced to the baseline's calls."""
    margin, log_thr = 0.005, math.log(1 / alpha)
    passed = 0
    for _ in range(rollouts):
        scale = rng.lognormal(-spread ** 2 / 2, spread, baseline + canary)
        rates = np.where(np.arange(baseline + canary) < baseline, 0.01, 0.01 + margin) * scale
        is_canary = np.arange(baseline + canary) >= baseline
        n = np.where(is_canary, calls * baseline / canary, calls)[:, None] * np.ones(windows)
        s = rng.binomial(n.astype(np.int64), np.clip(rates, 0, 1)[:, None]).astype(float)
        track = pod_track(n, s, is_canary, 1.0, margin, log_threshold=log_thr)
        passed += bool((track.log_e_pass[9::10] >= log_thr).any())
    return passed


def test_a_small_estate_passes_a_canary_at_the_boundary_at_most_alpha() -> None:
    # Three pods against one and two against two, their error rates ±50 % apart: a few
    # pods that happen to agree gave τ² ≈ 0, and a fast canary pod then passed a canary at
    # the boundary in 3-5 % of rollouts at α = 1 % (32 of these 800): τ² from few pods is
    # uncertain, and the test must allow for it.
    rng = np.random.default_rng(31)
    rollouts, alpha = 400, 0.01
    passes = sum(small_estate_passes(rng, rollouts, baseline, canary, 0.5, alpha)
                 for baseline, canary in ((3, 1), (2, 2)))
    assert passes <= binom.ppf(1 - 1e-6, 2 * rollouts, alpha)


def one_canary_pod_verdict(rates: list[float], canary: list[bool], rng: np.random.Generator
                           ) -> Any:
    n, s, _ = grid(rng, rates, canary, 120, calls=200)
    looks = np.arange(n.shape[1], dtype=float)
    names = tuple(f"pod-{i}" for i in range(len(rates)))
    return pod_success_rate(
        PodGrid(pods=names, cohorts=tuple("1.21" if c else "1.20" for c in canary),
                starts=looks * 10, calls=n, errors=s, warmup_calls=np.zeros(len(rates)),
                warmup_errors=np.zeros(len(rates)), last_starts=looks * 10),
        "1.20", "1.21", Tolerances(), 0.01, 10.0)


def test_a_canary_of_one_pod_fails_far_outside_the_baseline_and_passes_within_it() -> None:
    # One canary pod is judged as a new pod against the spread the baseline's pods show:
    # +3 pp on a pod whose baseline pods sit at 0.05-0.07 % fails (30x the 0.1 pp tolerance),
    # and names the pod with what would tell pod from version; a pod like the baseline's
    # passes; a pod just inside the baseline's own spread does neither yet.
    rng = np.random.default_rng(5)
    rates_b = [0.0005, 0.0006, 0.0007, 0.0005, 0.0006, 0.0007, 0.0006]
    flags = [False] * len(rates_b) + [True]
    sick = one_canary_pod_verdict([*rates_b, 0.03], flags, rng)
    assert sick.verdict == "fail"
    assert "the canary's one pod pod-7" in sick.reason
    assert "restart pod-7, or add a canary pod, to tell" in sick.reason
    healthy = one_canary_pod_verdict([*rates_b, 0.0006], flags, rng)
    assert healthy.verdict == "pass"
    assert "within the baseline's pods" in healthy.reason
    # With one baseline pod there is no spread to judge a new pod against: neither side
    # claims what it cannot measure, and the pass's allowance keeps it undecided.
    n, s, canary = grid(rng, [0.001, 0.0], [False, True], 120, calls=200)
    track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR)
    assert pods_module.pod_states(track, LOG_THR)[-1] != "fail"


def test_the_few_pods_allowance_is_on_both_sides() -> None:
    # Three pods against three: τ² from them is uncertain on the fail side as on the pass
    # side, so both need more evidence at a smaller α; the fail with every pod kept as it
    # is (reported beside it) does not depend on α.
    rng = np.random.default_rng(11)
    flags = [False] * 3 + [True] * 3
    n, s, canary = grid(rng, [0.01, 0.012, 0.009, 0.02, 0.018, 0.021], flags, 120, calls=200)
    strict, lax = (pod_track(n, s, canary, 1.0, 0.005, log_threshold=math.log(1 / a))
                   for a in (1e-6, 0.01))
    assert (strict.log_e_fail <= lax.log_e_fail).all()
    assert (strict.log_e_fail < lax.log_e_fail).any()
    assert np.array_equal(strict.log_e_fail_all, lax.log_e_fail_all)
    for side in ("", "_wo"):
        strict_v, lax_v = (getattr(t, f"v_sampling{side}") + getattr(t, f"v_pods{side}")
                           for t in (strict, lax))
        assert (strict_v >= lax_v).all() and (strict_v > lax_v).any()


def ramp(rng: np.random.Generator, rates: np.ndarray, windows: int = 240
         ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """An estate of len(`rates`) pods as a rollout moves them into the canary: one grid
    per step, 2 to half of them canary pods (the canary's calls balanced to the baseline's)."""
    out = []
    pods = rates.size
    for k in range(2, pods // 2 + 1):
        canary = np.arange(pods) >= pods - k
        calls = np.where(canary, 100.0 * (pods - k) / k, 100.0)
        n = rng.poisson(calls[:, None], (pods, windows)).astype(float)
        s = rng.binomial(n.astype(np.int64), rates[:, None]).astype(float)
        out.append((n, s, canary))
    return out


def test_the_fail_on_ten_pods_or_more_is_what_it_was_without_the_allowance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Twelve pods: τ² has ten degrees of freedom or more, the few-pods factor is 1, and the
    # fail is what it is without the allowance, to the bit, at every look and canary size,
    # for a healthy canary and a regression, pods alike and spread.
    rng = np.random.default_rng(17)
    base = 0.01 * rng.lognormal(-0.045, 0.3, 12)
    grids = [*ramp(rng, np.full(12, 0.01)), *ramp(rng, base),
             *ramp(rng, np.where(np.arange(12) >= 6, base + 0.02, base))]
    now = pod_tracks(grids, 1.0, 0.005, log_threshold=LOG_THR)
    assert max(float(t.log_e_fail.max()) for t in now) >= LOG_THR  # the regression fails

    def without(df: Any, v: Any, log_threshold: float, scales: Any) -> np.ndarray:
        return np.ones(np.shape(df))

    monkeypatch.setattr("probes.stats._pod_spread.few_pods_factor", without)
    before = pod_tracks(grids, 1.0, 0.005, log_threshold=LOG_THR)
    for a, b in zip(now, before, strict=True):
        assert np.array_equal(a.log_e_fail, b.log_e_fail)
        assert np.array_equal(a.v_pods_wo, b.v_pods_wo)


def two_against_two(rng: np.random.Generator, rollouts: int, worse_pp: float, spread: float,
                    windows: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Rollouts of two baseline pods at 1 % errors against two canary pods + `worse_pp`, each
    pod's rate × lognormal(σ `spread`, mean 1) drawn anew per rollout, 200 calls a window."""
    canary = np.array([False, False, True, True])
    out = []
    for _ in range(rollouts):
        rates = np.where(canary, 0.01 + worse_pp / 100, 0.01) * rng.lognormal(
            -spread ** 2 / 2, spread, 4)
        n = np.full((4, windows), 200.0)
        s = rng.binomial(n.astype(np.int64), np.clip(rates, 0, 1)[:, None]).astype(float)
        out.append((n, s, canary))
    return out


def test_two_pods_against_two_fail_a_canary_within_tolerance_at_most_alpha() -> None:
    # A canary at the tolerance's boundary (+0.5 pp), pods ±30 % apart drawn per rollout:
    # its fail is an event of chance at most α. Leaving each cohort's worst pod out of τ²
    # left it no degrees of freedom (τ² 0, a per-call test of one pod against one): 23 of
    # these 100 failed within the hour at α 1 %.
    alpha = 0.01
    tracks = pod_tracks(two_against_two(np.random.default_rng(19), 100, 0.5, 0.3, 360),
                        1.0, 0.005, log_threshold=math.log(1 / alpha))
    failed = sum(bool((t.log_e_fail >= math.log(1 / alpha)).any()) for t in tracks)
    assert failed <= binom.ppf(1 - 1e-6, 100, alpha)


def test_two_pods_against_two_still_fail_a_gross_regression() -> None:
    # +3 pp on 1 %, pods alike: every rollout fails within 20 minutes.
    tracks = pod_tracks(two_against_two(np.random.default_rng(20), 20, 3.0, 0.0, 120),
                        1.0, 0.005, log_threshold=LOG_THR)
    assert all((t.log_e_fail >= LOG_THR).any() for t in tracks)


def test_a_small_estate_whose_pods_agree_is_told_how_far_a_pass_is() -> None:
    # Three pods against two, alike: the few-pods floor shrinks as calls grow, so more
    # calls decide (not "more pods"), and `needs` says how many.
    rng = np.random.default_rng(3)

    def verdict(windows: int) -> Any:
        n = np.full((5, windows), 150.0)
        n[3:] *= 1.5
        s = rng.binomial(n.astype(np.int64), 0.01).astype(float)
        looks = np.arange(windows) * 10.0
        return pod_success_rate(
            PodGrid(pods=("a", "b", "c", "d", "e"), cohorts=("old",) * 3 + ("new",) * 2,
                    starts=looks,
                    calls=n, errors=s, warmup_calls=np.zeros(5), warmup_errors=np.zeros(5),
                    last_starts=looks),
            "old", "new", Tolerances(success_rate_drop_pp=0.5), 0.01, 10.0)

    early = verdict(60)
    assert early.verdict == "inconclusive" and early.needs["calls"] is not None
    assert "not enough evidence yet; a pass needs about" in early.reason
    assert verdict(480).verdict == "pass"


def test_a_sick_pod_in_either_cohort_is_set_aside_and_the_version_judged_on_the_rest() -> None:
    # Eight baseline pods and four canary pods at 0.1 %, alike; one pod at 10x in one
    # cohort. Its spread would otherwise be the whole τ² and keep a healthy canary from
    # ever passing; set aside, the rest pass, and the pod is named. Without it, nothing
    # is set aside.
    rng = np.random.default_rng(8)
    flags = [False] * 8 + [True] * 4
    for sick, who in ((9, "canary"), (2, "baseline")):
        rates = [0.001] * 12
        rates[sick] = 0.01
        n, s, canary = grid(rng, rates, flags, 360, calls=200)
        track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR, last_only=True)
        assert pods_module.pod_states(track, LOG_THR)[-1] == "pass"
        if who == "canary":
            assert int(track.aside_canary[-1]) == sick - 8
            assert int(track.aside_baseline[-1]) == -1
        else:
            assert int(track.aside_baseline[-1]) == sick
            assert int(track.aside_canary[-1]) == -1
    n, s, canary = grid(rng, [0.001] * 12, flags, 360, calls=200)
    track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR)
    assert (track.aside_canary == -1).all() and (track.aside_baseline == -1).all()


def test_a_sick_canary_pod_set_aside_stays_capped_when_a_new_pod_joins() -> None:
    """A new canary pod's first window (30 calls, 1 error) has a higher error rate than the
    sick pod: the cap moves to it, and the sick pod, set aside, must not count whole."""
    rng = np.random.default_rng(3)
    rates = [0.001] * 15 + [0.01, 0.001]
    n = rng.poisson(300, (17, 120)).astype(float)
    n[16, :-1], n[16, -1] = 0.0, 30.0
    s = rng.binomial(n.astype(int), np.array(rates)[:, None]).astype(float)
    s[16, -1] = 1.0
    track = pod_track(n, s, np.array([False] * 11 + [True] * 6), 1.0, TOL,
                      log_threshold=LOG_THR)
    assert (track.aside_canary[-5:] == 4).all()
    states = pod_states(track, LOG_THR)
    assert states[-2] == "pass" and states[-1] != "fail"


def test_a_canary_of_one_pod_on_a_small_estate_says_why_it_is_not_judged() -> None:
    # Five baseline pods show too little of the spread a new pod may have: neither side
    # decides, however far off the pod is, and the reason says what would.
    rng = np.random.default_rng(6)
    verdict = one_canary_pod_verdict([0.001] * 5 + [0.05], [False] * 5 + [True], rng)
    assert verdict.verdict == "inconclusive"
    assert "judged against 6 baseline pods or more (5 here" in verdict.reason
    assert "a second canary pod would decide" in verdict.reason


def one_pod_canary_fails(rng: np.random.Generator, rollouts: int, spread: float,
                         delta: float) -> int:
    """Rollouts of an hour in which a canary of one pod, called 10× as often as each of 11
    baseline pods (cohort balance), failed; the pods' rates × lognormal(`spread`), mean
    0.1 %, the canary pod's + `delta`."""
    fails = 0
    canary = np.array([False] * 11 + [True])
    for _ in range(rollouts):
        rates = 0.001 * rng.lognormal(-spread ** 2 / 2, spread, 12)
        rates[-1] += delta
        n = rng.poisson(np.where(canary, 500.0, 50.0)[:, None], (12, 360)).astype(float)
        s = rng.binomial(n.astype(np.int64), rates[:, None]).astype(float)
        track = pod_track(n, s, canary, 1.0, TOL, log_threshold=LOG_THR)
        fails += bool((pods_module.pod_states(track, LOG_THR) == "fail").any())
    return fails


def test_a_canary_of_one_pod_twice_the_tolerance_worse_fails_within_the_hour() -> None:
    # Its τ² is taken at an upper bound that rests on baseline pods each with a tenth of
    # its calls: at two standard errors above the estimate, a pod twice the tolerance
    # worse on an estate whose pods agree failed within the hour in 4 of these 20 (12 at
    # one standard error); a
    # spread σ 0.5 between pods must still not fail a healthy one beyond α.
    assert one_pod_canary_fails(np.random.default_rng(12), 20, 0.0, 2 * TOL) >= 10
    assert one_pod_canary_fails(np.random.default_rng(13), 150, 0.5, 0.0) <= 2
