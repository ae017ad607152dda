"""The pass side of the pod-level test (`probes.stats._pod_batch`): its e-value with half its
weight on a canary like the baseline (`log_e_pass`), and τ² taken at an upper confidence
bound (`tau2_upper`). Seeded; the bounds come from the method: the bound covers τ² at its
level, and the pass's e-value at the tolerance's boundary has mean at most 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chi2

from probes.stats import _pod_batch as pod_batch_module
from probes.stats._pod_mixture import log_e_one_sided, log_e_pass
from probes.stats._pod_spread import tau2_at, tau2_upper
from probes.stats.pods import pod_states, pod_track, pod_tracks

LOG_THR = math.log(4 / 0.01)  # α = 1 % over four metric slots, as the verdict shares it
TOL = 0.001


def grid(rng: np.random.Generator, rates: np.ndarray, canary: list[bool], windows: int,
         calls: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = rng.poisson(calls, (len(rates), windows)).astype(float)
    s = rng.binomial(n.astype(int), rates[:, None]).astype(float)
    return n, s, np.array(canary)


def test_the_pass_e_value_mixes_the_healthy_point_with_the_mixture_and_stays_one() -> None:
    d, v, theta = np.array([-5.0, 0.0, 40.0, 120.0]), np.full(4, 2000.0), 0.02
    point = theta * d - theta * theta * v / 2
    want = np.logaddexp(math.log(0.5) + point, math.log(0.5) + log_e_one_sided(d, v))
    np.testing.assert_allclose(log_e_pass(d, v, theta), want, rtol=1e-12)
    np.testing.assert_allclose(log_e_pass(d, v, theta, weight=0.0), log_e_one_sided(d, v))
    # An e-value: its mean is at most 1 where the drift is 0, the null's edge.
    z = np.random.default_rng(11).normal(0.0, math.sqrt(2000.0), 400_000)
    assert float(np.mean(np.exp(log_e_pass(z, 2000.0, theta)))) <= 1.0


def q_stats(rng: np.random.Generator, calls: np.ndarray, v: float, tau2: float, draws: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q's sum of squares, denominator and degrees of freedom, as `dl_tau2` forms them for
    one window, for `draws` cohorts of pods with these `calls`, each pod's rate normal
    around the cohort's with variance τ² plus its sampling's v/calls."""
    rates = (rng.normal(0.0, math.sqrt(tau2), (draws, calls.size))
             + rng.normal(0.0, 1.0, (draws, calls.size)) * np.sqrt(v / calls))
    total = calls.sum()
    mean = (rates * calls).sum(axis=1, keepdims=True) / total
    q = (calls * (rates - mean) ** 2).sum(axis=1)
    ones = np.ones(draws)
    return q, ones * (total - (calls ** 2).sum() / total), ones * (calls.size - 1)


@pytest.mark.parametrize("pods", [4, 8, 12])
def test_the_upper_bound_covers_tau2_at_its_level_and_is_never_below_the_estimate(
        pods: int) -> None:
    # With pods of equal calls and normal rates Q is (df·v + τ²·denom)·χ²_df / df exactly,
    # so the bound covers τ² in `level` of draws.
    rng = np.random.default_rng(pods)
    v, tau2, draws = 1e-3, 3e-7, 40_000
    calls = np.full(pods, 5000.0)
    q, denom, df = q_stats(rng, calls, v, tau2, draws)
    vv = np.full(draws, v)
    for level in (0.7, 0.9):
        up = tau2_upper(q, denom, df, vv, level)
        assert float(np.mean(up >= tau2)) == pytest.approx(level, abs=0.01)
    up = tau2_upper(q, denom, df, vv)
    est, _ = tau2_at(q, denom, df, vv)
    assert (up >= est).all()
    # Where the estimate is 0 (truncated), the bound still says how large τ² may be.
    zero = est == 0
    assert zero.any() and (up[zero] > 0).mean() > 0.5
    # Unequal calls: the moment bound is approximate, still near its level.
    uneven = np.geomspace(500.0, 20_000.0, pods)
    q, denom, df = q_stats(rng, uneven, v, tau2, draws)
    assert float(np.mean(tau2_upper(q, denom, df, vv) >= tau2)) >= 0.65


def test_the_upper_bound_shrinks_as_calls_grow_on_pods_alike() -> None:
    # τ² = 0: the bound is a few v/denom, so it falls as the calls grow, at a rate set by
    # χ² alone (the median draw's bound × calls is the same at any calls).
    rng = np.random.default_rng(3)
    v, draws = 1e-3, 20_000
    medians = []
    for each in (1000.0, 10_000.0, 100_000.0):
        q, denom, df = q_stats(rng, np.full(10, each), v, 0.0, draws)
        medians.append(float(np.median(tau2_upper(q, denom, df, np.full(draws, v)))) * each)
    assert medians[0] > 0.0
    assert medians == pytest.approx([medians[0]] * 3, rel=0.05)
    # Equal calls n: Q is v·χ²_df and denom df·n, so at the median draw the bound is
    # v·(χ²_df(½) / χ²_df(0.3) − 1) / n.
    df_ = 9
    want = v * (chi2.median(df_) / chi2.ppf(0.3, df_) - 1.0)
    assert medians[1] == pytest.approx(want, rel=0.05)


def boundary_grids(seed: int, m: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`m` rollouts of 6 baseline and 4 canary pods whose rates differ (lognormal σ 0.5
    around 0.1 %), the canary's version exactly at the tolerance."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(m):
        rates = 0.001 * rng.lognormal(-0.125, 0.5, 10)
        rates[6:] += TOL
        out.append(grid(rng, rates, [False] * 6 + [True] * 4, 60, 200))
    return out


def test_the_pass_at_the_tolerance_has_e_value_mean_at_most_one_with_the_upper_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each pod's spread dominates its sampling after 12,000 calls, so τ² from ten pods sets
    # the pass's variance: the upper bound keeps the e-value's mean within 1 (Markov: a
    # pass at the boundary at most α of the time), where with no spread counted it is many.
    grids = boundary_grids(7, 1000)

    def mean_e() -> float:
        tracks = pod_tracks(grids, 1.0, TOL, log_threshold=LOG_THR, last_only=True)
        return float(np.mean(np.exp([t.log_e_pass[-1] for t in tracks])))

    assert mean_e() <= 1.0
    monkeypatch.setattr(pod_batch_module, "_pass_tau2",
                        lambda tau2, q, df, v, weight: np.zeros_like(tau2))
    assert mean_e() > 5.0


def test_the_healthy_point_passes_a_healthy_canary_sooner_and_not_one_at_the_tolerance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    firsts: dict[float, list[int]] = {0.5: [], 0.0: []}
    for seed in range(5):
        healthy = grid(np.random.default_rng(seed), np.full(12, 0.001),
                       [False] * 6 + [True] * 6, 720, 300)
        edge = grid(np.random.default_rng(seed), np.array([0.001] * 6 + [0.001 + TOL] * 6),
                    [False] * 6 + [True] * 6, 720, 300)
        for weight, first in firsts.items():
            monkeypatch.setattr(pod_batch_module, "POINT_WEIGHT", weight)
            states = pod_states(pod_track(*healthy, 1.0, TOL, log_threshold=LOG_THR), LOG_THR)
            assert (states == "pass").any()
            first.append(int(np.argmax(states == "pass")))
            at_edge = pod_states(pod_track(*edge, 1.0, TOL, log_threshold=LOG_THR), LOG_THR)
            assert not (at_edge == "pass").any()
    assert all(a <= b for a, b in zip(firsts[0.5], firsts[0.0], strict=True))
    assert sum(firsts[0.5]) < sum(firsts[0.0])
