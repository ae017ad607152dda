"""p99's fail as a profile e-value over the baseline's p99 (`probes.stats.pod_profile`): its
buckets are conservative on both factors, its mean is at most 1 at H0's edge with pods that
differ, healthy canaries fail at most α (two pods against two included), and it fails where
the cuts at the confidence sequence's ends did, sooner."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, norm

from probes.stats.pod_profile import (
    ProfileInput,
    _factor,
    profile_cuts,
    profile_fails,
    profile_input,
    profile_threshold,
)
from probes.stats.pods import pod_track
from tests.unit.test_stats_pod_exceed import (
    ALPHA,
    LAYOUT,
    MARGIN_S,
    P99,
    RATIO,
    THR,
    estate,
    last_look,
    near_the_boundary,
)

SPREAD = [0.7, 0.82, 0.94, 1.06, 1.18, 1.3]
# The canary's scale whose p99 is the tolerance's boundary over the baseline's.
EDGE = (RATIO * P99 + MARGIN_S) / P99


def profile(hist: np.ndarray, canary_pods: int) -> tuple[float, int]:
    """log inf_q E(q) at the last look and the candidates it was sought over, from each pod's
    calls pooled over the windows (as the live verdict keeps them)."""
    canary = np.arange(hist.shape[0]) >= hist.shape[0] - canary_pods
    pooled = hist.sum(axis=1)
    cuts = profile_cuts(np.cumsum(pooled[~canary].sum(axis=0)),
                        np.cumsum(pooled[canary].sum(axis=0)), LAYOUT, 0.99, RATIO, MARGIN_S,
                        ALPHA)
    below = np.concatenate([np.zeros((hist.shape[0], 1)), np.cumsum(pooled, axis=-1)], axis=-1)
    grid = profile_input(below, canary, cuts, 0)
    return float(profile_fails([grid], 0.99, ALPHA)[0][0]), len(grid.at_q)


def fails(hist: np.ndarray, canary_pods: int) -> bool:
    return profile(hist, canary_pods)[0] >= profile_threshold(ALPHA)


def test_each_candidates_cuts_are_conservative_for_every_q_in_its_bucket() -> None:
    # The baseline counted from the bucket's lower edge (at least the calls at or beyond any
    # q in it), the canary from a bucket wholly at or above r·U + m (only calls beyond r·q + m
    # for every q in it); and the candidates hold the true p99 (the sequence at α/20).
    rng = np.random.default_rng(21)
    cum = np.cumsum(estate(rng, [1.0] * 6).sum(axis=(0, 1)))
    cuts = profile_cuts(cum, cum, LAYOUT, 0.99, RATIO, MARGIN_S, ALPHA)
    js = np.arange(int(cuts.first[0]), int(cuts.last[0]) + 1)
    assert js.size > 1
    assert (LAYOUT.lower[cuts.canary[js]] >= RATIO * LAYOUT.upper[js] + MARGIN_S).all()
    assert (LAYOUT.lower[cuts.canary[js] - 1] < RATIO * LAYOUT.upper[js] + MARGIN_S).all()
    assert LAYOUT.lower[js[0]] <= P99 < LAYOUT.upper[js[-1]]
    assert profile_threshold(ALPHA) < THR + math.log(2.0)  # α is no longer halved


def test_its_mean_is_at_most_one_at_the_edge_of_h0() -> None:
    # E[inf_q E(q)] ≤ E[E(q_b)] ≤ 1 where the canary's p99 is the tolerance's boundary:
    # three canary pods answering 5 % of their calls just inside r·q_b + m (pods alike), and
    # six canary pods whose scales are the baseline's ±10 % pods' × the boundary's ratio.
    # The sup over q instead of the inf has a mean of e^hundreds on the first.
    rng = np.random.default_rng(22)
    at_edge = [near_the_boundary(rng, -1e-4, 0.05) for _ in range(30)]
    assert np.mean(np.exp([profile(h, 3)[0] for h in at_edge])) <= 1.0
    spread = [0.9, 0.94, 0.98, 1.02, 1.06, 1.1]
    apart = [estate(rng, [*spread, *(s * EDGE for s in spread)]) for _ in range(30)]
    assert np.mean(np.exp([profile(h, 6)[0] for h in apart])) <= 1.0


def test_healthy_canaries_fail_at_most_alpha_pods_alike_one_pod_and_a_slow_node() -> None:
    # Each rollout's fail is an event of chance at most α, so fails over K rollouts are at
    # most Binomial(K, α) (bounded at its 1 − 1e-6 quantile): pods alike; a canary of one
    # pod within the baseline's spread; a slow node (2×) under one of three canary pods.
    rng = np.random.default_rng(23)
    rollouts = 40
    cases = [([1.0] * 9, 3), ([*SPREAD, 1.3], 1), ([*SPREAD, 1.0, 2.0, 0.9], 3)]
    for scales, canary_pods in cases:
        failed = sum(fails(estate(rng, scales, windows=30), canary_pods)
                     for _ in range(rollouts))
        assert failed <= binom.ppf(1 - 1e-6, rollouts, ALPHA), scales


def test_a_canary_twice_as_slow_fails_on_its_pods_or_its_one_pod() -> None:
    rng = np.random.default_rng(24)
    assert fails(estate(rng, [1.0] * 6 + [2.0] * 3), 3)
    assert fails(estate(rng, [1.0] * 6 + [2.0]), 1)


def test_it_decides_as_the_sequences_ends_did_on_clear_cases_and_sooner() -> None:
    # Clear cases keep their direction: a canary 2× slower fails both ways, a healthy one
    # neither. At ×1.5 with 50 calls per pod and window the cuts at the sequence's ends
    # cannot fail yet (the premise, checked) and the profile does.
    rng = np.random.default_rng(25)
    slow = estate(rng, [1.0] * 6 + [2.0] * 3)
    healthy = estate(rng, [1.0] * 9)
    assert fails(slow, 3) and last_look(slow, 3) >= THR
    assert not fails(healthy, 3) and last_look(healthy, 3) < THR
    sooner = estate(rng, [1.0] * 6 + [1.5] * 3, calls=50)
    assert last_look(sooner, 3) < THR
    assert fails(sooner, 3)


def test_nothing_fails_where_a_cohort_has_no_calls_or_the_sequence_is_unbounded() -> None:
    rng = np.random.default_rng(26)
    hist = estate(rng, [1.0] * 6 + [2.0] * 3, windows=1, calls=3)
    assert profile(hist, 3) == (-math.inf, 0)
    hist = estate(rng, [1.0] * 6 + [2.0] * 3)
    hist[-3:] = 0.0
    assert not fails(hist, 3)


def test_trying_the_estimates_candidate_first_decides_as_the_whole_infimum() -> None:
    # `profile_fails` reads a grid's other candidates only where its guess reaches the
    # threshold: where it fails the figure is the infimum over every candidate, and where
    # it does not it is at least that infimum and below the threshold.
    rng = np.random.default_rng(27)
    hists = [estate(rng, [1.0] * 6 + [f] * 3, windows=20) for f in (1.0, 1.3, 1.5, 2.0)]
    grids = []
    for hist in hists:
        pooled = hist.sum(axis=1)
        canary = np.arange(9) >= 6
        cuts = profile_cuts(np.cumsum(pooled[~canary].sum(axis=0)),
                            np.cumsum(pooled[canary].sum(axis=0)), LAYOUT, 0.99, RATIO,
                            MARGIN_S, ALPHA)
        below = np.concatenate([np.zeros((9, 1)), np.cumsum(pooled, axis=-1)], axis=-1)
        grids.append(profile_input(below, canary, cuts, 0))
    got, _ = profile_fails(grids, 0.99, ALPHA)
    thr = profile_threshold(ALPHA)
    for g, value in zip(grids, got, strict=True):
        each = [profile_fails([ProfileInput(g.calls, g.at_q[j:j + 1], g.at_level, g.canary)],
                              0.99, ALPHA)[0][0] for j in range(len(g.at_q))]
        assert value >= min(each) - 1e-9
        assert (value >= thr) == (min(each) >= thr)
        if value >= thr:
            assert value == pytest.approx(min(each))
    assert (got >= thr).any() and (got < thr).any()


def few_pod_rollouts(rng: np.random.Generator, rollouts: int, baseline: int, canary: int,
                     spread: float, factor: float, looks: tuple[int, ...], alpha: float
                     ) -> int:
    """Rollouts whose profile fails at some look (after `looks` calls per baseline pod, each
    pod's calls pooled over time, the canary's balanced to the baseline's), pods' latency
    scales uniform in 1 ± `spread` drawn anew per rollout (H0 is about the version's pods),
    the canary's × `factor`. All rollouts' looks are judged in one call."""
    flags = np.arange(baseline + canary) >= baseline
    per = np.where(flags, baseline / canary, 1.0)
    grids: list[ProfileInput] = []
    for _ in range(rollouts):
        scales = (1 + rng.uniform(-spread, spread, flags.size)) * np.where(flags, factor, 1.0)
        cdf = norm.cdf(np.log(LAYOUT.upper[:-1] / (0.05 * scales[:, None])) / 0.5)
        probs = np.diff(cdf, axis=1, prepend=0.0, append=1.0)
        hist, done, looked = np.zeros((flags.size, LAYOUT.size)), 0, []
        for k in looks:
            hist += np.array([rng.multinomial(round(m * (k - done)), p / p.sum())
                              for m, p in zip(per, probs, strict=True)])
            done = k
            looked.append(hist.copy())
        h = np.array(looked)
        cuts = profile_cuts(np.cumsum(h[:, ~flags].sum(axis=1), axis=-1),
                            np.cumsum(h[:, flags].sum(axis=1), axis=-1), LAYOUT, 0.99, RATIO,
                            MARGIN_S, alpha)
        below = np.concatenate([np.zeros((*h.shape[:2], 1)), np.cumsum(h, axis=-1)], axis=-1)
        grids += [profile_input(below[j], flags, cuts, j) for j in range(len(looks))]
    hit = profile_fails(grids, 0.99, alpha)[0] >= profile_threshold(alpha)
    return int(hit.reshape(rollouts, len(looks)).any(axis=1).sum())


# Calls per baseline pod at 1, 5, 15, 30 min and 1, 2, 4 h of 50 calls/s.
LOOKS = (3000, 15000, 45000, 90000, 180000, 360000, 720000)


def test_two_pods_against_two_apart_fail_a_healthy_canary_at_most_alpha() -> None:
    # Pods ±30 % apart, drawn per rollout, α 0.25 %: each rollout's fail is an event of
    # chance at most α. Each cohort's worst pod left out of τ² left two pods a side no
    # degrees of freedom (τ² 0: one canary pod against the known rate, call by call), and
    # 20 of these 600 failed.
    alpha = 0.0025
    failed = few_pod_rollouts(np.random.default_rng(41), 600, 2, 2, 0.3, 1.0, LOOKS, alpha)
    assert failed <= binom.ppf(1 - 1e-6, 600, alpha)


def test_three_pods_against_three_still_fail_a_canary_twice_as_slow() -> None:
    # Pods alike: every rollout fails within the hour. (Two a side cannot: each factor's
    # τ² comes from the two pods it tests, one degree of freedom.)
    rng = np.random.default_rng(43)
    assert few_pod_rollouts(rng, 20, 3, 3, 0.0, 2.0, LOOKS[:5], 0.0025) == 20


def test_each_factor_reads_the_other_cohorts_pods_only_through_their_sum() -> None:
    # E_b and E_c take τ² from the pods they test, so they are functions of disjoint pods
    # (their product's mean is then at most 1 at the true baseline p99): moving calls at
    # the other cohort's level between its pods, their sum kept, changes nothing.
    rng = np.random.default_rng(47)
    for canary_pods in (2, 3, 6):
        hist = estate(rng, [1.0, 0.8, 1.2, 0.9, 1.1, 1.0] + [EDGE * s for s in
                            rng.uniform(0.7, 1.3, canary_pods)],
                      canary_calls=300 // canary_pods, canary_pods=canary_pods)
        canary = np.arange(hist.shape[0]) >= hist.shape[0] - canary_pods
        pooled = hist.sum(axis=1)
        cuts = profile_cuts(np.cumsum(pooled[~canary].sum(axis=0)),
                            np.cumsum(pooled[canary].sum(axis=0)), LAYOUT, 0.99, RATIO,
                            MARGIN_S, ALPHA)
        below = np.concatenate([np.zeros((hist.shape[0], 1)), np.cumsum(pooled, axis=-1)],
                               axis=-1)
        g = profile_input(below, canary, cuts, 0)
        moved = g.at_level.copy()
        for cohort in (canary, ~canary):
            at = np.flatnonzero(cohort)
            shift = np.minimum(moved[at[0], 0], 7.0)
            moved[at[0]] -= shift
            moved[at[1]] += shift
        every = ProfileInput(g.calls, g.at_q, g.at_level, g.canary, 0)
        other = ProfileInput(g.calls, g.at_q, moved, g.canary, 0)
        for j in range(len(g.at_q)):
            pick = [ProfileInput(x.calls, x.at_q[j:j + 1], x.at_level, x.canary)
                    for x in (every, other)]
            a, b = profile_fails(pick, 0.99, ALPHA)[0]
            assert a == pytest.approx(b, rel=1e-9, abs=1e-9)
        assert len(g.at_q) > 1


def test_a_healthy_few_pod_estate_looked_at_every_window_fails_at_most_alpha() -> None:
    # As `small_estates_sim.py --every-look` draws them: pods ±30 % apart drawn anew per
    # rollout, the fail looked at after every 10 s window for an hour. Each rollout fails
    # with chance at most α, so more than the binomial's 1 − 1e-6 quantile is a broken test.
    from tests.servers.benchmark_script import load_benchmark

    sim = load_benchmark("small_estates_sim")
    alpha, rollouts = 0.0025, 40
    rng = np.random.default_rng(53)
    for baseline, canary in ((3, 2), (2, 2), (6, 1)):
        row = sim.P99Row(baseline, canary, 0.3, alpha, rollouts, edge=None)
        failed = 0
        for _ in range(rollouts):
            h, flags = sim._every_window(rng, row, 360, 500)
            failed += bool(sim._profile_fails(h, flags, alpha, sim.EVERY_LOOK_LAYOUT).any())
        assert failed <= binom.ppf(1 - 1e-6, rollouts, alpha)


def test_a_canary_of_one_pod_twice_as_slow_fails_within_minutes() -> None:
    # Eleven baseline pods alike, one canary pod ×2 (12 % of its calls beyond the cut
    # against 1 %): the one-pod rule's τ² bound and 2 τ margin still leave it thousands of
    # times the evidence it needs within ten minutes.
    from tests.servers.benchmark_script import load_benchmark

    sim = load_benchmark("small_estates_sim")
    rng = np.random.default_rng(59)
    row = sim.P99Row(11, 1, 0.0, 0.0025, 1, edge=None, factor=2.0)
    for _ in range(5):
        h, flags = sim._every_window(rng, row, 60, 500)
        assert sim._profile_fails(h, flags, 0.0025, sim.EVERY_LOOK_LAYOUT)[-1]


def test_a_tested_cohort_of_one_pod_keeps_the_others_pods_whatever_its_windows() -> None:
    # The one-pod rule judges a lone pod against the other cohort's pods (D21): a pod with
    # calls in several windows is one pod, so its factor's grid keeps every pod of the other.
    calls = np.array([[40.0, 50.0], [30.0, 20.0], [25.0, 35.0]])
    counts = np.array([[1.0, 2.0], [0.0, 1.0], [1.0, 0.0]])
    tested = np.array([True, False, False])
    got_calls, got_counts, got_tested = _factor(calls, counts, tested)
    assert got_calls is calls and got_counts is counts and got_tested is tested
    # Two tested pods: the other cohort is summed into one pod.
    two = np.array([True, True, False])
    got_calls, _, got_tested = _factor(calls, counts, two)
    assert got_calls.shape == (3, 2) and got_tested.tolist() == [True, True, False]
    assert (got_calls[-1] == calls[2]).all()
    three_other = np.vstack([calls, [[10.0, 10.0]]])
    got_calls, _, got_tested = _factor(three_other, np.vstack([counts, [[0.0, 0.0]]]),
                                       np.array([True, True, False, False]))
    assert got_calls.shape == (3, 2) and (got_calls[-1] == [35.0, 45.0]).all()


def test_capping_a_factors_worst_pod_never_fails_more_than_every_pod_in() -> None:
    # A factor is a test against a known rate (ratio 0), so capping or leaving out the
    # worst canary pod only lowers the sum; the spread it is judged with is never the
    # trimmed τ² alone (without both cohorts' worst pods, with few pods next to none), so
    # the capped fail is at most the fail with every pod in wherever it is evidence at all
    # (E > 1), at every look, whichever pod each look caps (nothing set aside as sick
    # here). With τ² trimmed, 4 and 6 canary pods broke this at 8 of these looks.
    rng = np.random.default_rng(61)
    for canary_pods in (2, 3, 4, 6):
        for _ in range(20):
            pods = 6 + canary_pods
            flags = np.arange(pods) >= 6
            n = np.where(flags, 6 * 300 // canary_pods, 300)[:, None] * np.ones(12)
            rate = 0.01 * rng.lognormal(0.0, 0.5, pods)
            s = rng.binomial(n.astype(np.int64), np.minimum(rate, 1.0)[:, None]).astype(float)
            t = pod_track(n, s, flags, 0.0, 0.01, log_threshold=THR)
            calm = (t.aside_canary < 0) & (t.aside_baseline < 0) & (t.log_e_fail > 0)
            assert (t.log_e_fail[calm] <= t.log_e_fail_all[calm] + 1e-9).all()
