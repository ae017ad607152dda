"""p99 as exceedances per pod (`probes.stats.pod_exceed`): the cuts sit where the method
says, pods that differ are noise on both sides, a version's slowdown still fails, healthy
canaries fail at most α, and a slow version is not passed on its fastest pods."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from probes.measure.histogram import BUCKET_COUNT, LOWER, UPPER, index_of
from probes.stats import quantile
from probes.stats.pod_exceed import exceedance_cuts, exceedance_track, pass_track
from probes.stats.quantile import Layout

LAYOUT = Layout.from_edges(LOWER, UPPER)
ALPHA = 0.01
THR = math.log(1 / ALPHA)
LOG2 = math.log(2.0)
RATIO, MARGIN_S = 1.2, 0.005


def estate(rng: np.random.Generator, scales: list[float], windows: int = 60,
           calls: int = 50, canary_calls: int | None = None, canary_pods: int = 0
           ) -> np.ndarray:
    """(pods, windows, buckets): lognormal calls (median 50 ms, σ 0.5) × each pod's scale;
    the last `canary_pods` pods make `canary_calls` calls per window (cohort balance)."""
    out = np.zeros((len(scales), windows, BUCKET_COUNT))
    for i, scale in enumerate(scales):
        k = calls if canary_calls is None or i < len(scales) - canary_pods else canary_calls
        x = rng.lognormal(math.log(0.05), 0.5, (windows, k)) * scale
        np.add.at(out[i], (np.arange(windows)[:, None], index_of(x.ravel()).reshape(x.shape)),
                  1.0)
    return out


def tracks(hist: np.ndarray, canary_pods: int) -> tuple[float, float]:
    """log E_fail (worst pods out) and log E_pass at the last look, from each pod's calls
    per window, as the live verdict judges: α split between the baseline p99's confidence
    sequence (the cuts) and the tracks, whose e-values are halved to compare with 1/α."""
    canary = np.arange(hist.shape[0]) >= hist.shape[0] - canary_pods
    cuts = exceedance_cuts(np.cumsum(hist[~canary].sum(axis=(0, 1))), LAYOUT, 0.99, RATIO,
                           MARGIN_S, THR + LOG2)
    above = np.cumsum(hist[..., ::-1], axis=-1)[..., ::-1]
    calls = hist.sum(axis=-1)

    def at(cut: np.ndarray) -> np.ndarray:
        return above[:, :, int(cut)]

    fail = exceedance_track(calls, at(cuts.baseline_fail), at(cuts.canary_fail), canary,
                            log_threshold=THR + LOG2, last_only=True)
    ok = pass_track(calls, at(cuts.baseline_level), at(cuts.canary_pass), canary, 0.99,
                    log_threshold=THR + LOG2, last_only=True)
    return float(fail.log_e_fail[-1]) - LOG2, float(ok.log_e_pass[-1]) - LOG2


def last_look(hist: np.ndarray, canary_pods: int) -> float:
    """log E_fail at the last look, worst pods out."""
    return tracks(hist, canary_pods)[0]


def test_a_slowdown_on_every_canary_pod_fails() -> None:
    # 100 calls per pod and window: cut from the baseline p99's confidence sequence, the
    # evidence needs about twice the calls the estimate's cuts did (with 50: log E −0.7).
    rng = np.random.default_rng(11)
    assert last_look(estate(rng, [1.0] * 6 + [1.5] * 3, calls=100), 3) >= THR


def test_a_slow_node_under_one_of_two_canary_pods_fails_at_most_alpha() -> None:
    # The other canary pod sits at the top of a baseline spread ±30 % and is called 6× as
    # often: judged on it alone as if its calls were independent (the pooled histograms
    # with the slow pod out) it can look slow; counted as one pod among pods that differ,
    # it is within H0 (the version changes nothing), so fails are at most Binomial(K, α).
    rng = np.random.default_rng(12)
    base = [0.7, 0.82, 0.94, 1.06, 1.18, 1.3]
    rollouts = 30
    fails = sum(int(last_look(estate(rng, [*base, 1.3, 2.6], windows=120, canary_calls=300,
                                     canary_pods=2), 2) >= THR) for _ in range(rollouts))
    assert fails <= binom.ppf(1 - 1e-6, rollouts, ALPHA)


def test_healthy_canaries_fail_at_most_alpha() -> None:
    # Pods alike: each rollout's fail is an event of probability at most α (the e-process is
    # valid asymptotically, per window a CLT), so fails over K rollouts are at most
    # Binomial(K, α), bounded here at its 1 − 1e-6 quantile.
    rng = np.random.default_rng(13)
    rollouts = 150
    fails = sum(int(last_look(estate(rng, [1.0] * 9, windows=30), 3) >= THR)
                for _ in range(rollouts))
    assert fails <= binom.ppf(1 - 1e-6, rollouts, ALPHA)


def test_a_one_pod_canary_fails_when_slower_than_the_baseline_pods_allow() -> None:
    # One canary pod 3x slower than six alike baseline pods is beyond any spread they show
    # (it is judged as a new pod against them); one like them, or within their ±30 %
    # spread, is not.
    rng = np.random.default_rng(14)
    assert last_look(estate(rng, [1.0] * 6 + [3.0]), 1) >= THR
    assert last_look(estate(rng, [1.0] * 7), 1) < THR
    base = [0.7, 0.82, 0.94, 1.06, 1.18, 1.3]
    assert last_look(estate(rng, [*base, 1.3]), 1) < THR


def test_a_healthy_canary_on_pods_alike_passes() -> None:
    rng = np.random.default_rng(15)
    fail, ok = tracks(estate(rng, [1.0] * 9, windows=60, calls=100), 3)
    assert ok >= THR > fail


def test_canaries_beyond_tolerance_pass_at_most_alpha() -> None:
    # Every canary call 1.3× slower (beyond ×1.2 + 5 ms at a p99 of ~160 ms) on pods alike:
    # the pass side's H0, so passes over K rollouts are at most Binomial(K, α).
    rng = np.random.default_rng(16)
    rollouts = 100
    passes = sum(int(tracks(estate(rng, [1.0] * 6 + [1.3] * 3, windows=30), 3)[1] >= THR)
                 for _ in range(rollouts))
    assert passes <= binom.ppf(1 - 1e-6, rollouts, ALPHA)


def test_a_slow_version_is_not_passed_on_its_fastest_pods() -> None:
    # Pods ±30 % apart; the version makes every call 1.5× slower, but the canary's two pods
    # are the estate's fastest: pooled, their calls look within tolerance (the premise,
    # checked); pod by pod, two pods cannot show the version within tolerance when the
    # baseline's own pods differ this much.
    rng = np.random.default_rng(17)
    base = [0.7, 0.82, 0.94, 1.06, 1.18, 1.3]
    hist = estate(rng, [*base, 0.7 * 1.5, 0.72 * 1.5], windows=120, canary_calls=150,
                  canary_pods=2)
    canary = np.arange(hist.shape[0]) >= hist.shape[0] - 2
    pooled = quantile.two_sample(np.cumsum(hist[~canary].sum(axis=(0, 1))),
                                 np.cumsum(hist[canary].sum(axis=(0, 1))), LAYOUT, 0.99, RATIO,
                                 MARGIN_S, THR)
    assert float(pooled.log_e_pass) >= THR
    assert tracks(hist, 2)[1] < THR


# The true p99 of the lognormal calls `estate` draws (median 50 ms, σ 0.5), and the
# tolerance's boundary above it.
P99 = 0.05 * math.exp(0.5 * 2.326348)
BOUNDARY = RATIO * P99 + MARGIN_S


def test_cuts_from_the_confidence_sequence_hold_where_the_true_p99_lies() -> None:
    # What each side's implication needs of its cuts (module docstring): the baseline's
    # fail cut at or below the true p99 and the canary's wholly above the boundary; the
    # baseline's pass cut at or above the true p99 and the canary's bucket starting at or
    # below the boundary. From the confidence sequence each holds but with chance α/2, so
    # misses over K baselines are at most Binomial(K, α/2); the estimate's bucket, one off
    # about half the time, misses far more often (the premise, checked).
    rng = np.random.default_rng(18)
    rollouts = 40
    misses = {True: 0, False: 0}
    for _ in range(rollouts):
        cum = np.cumsum(estate(rng, [1.0] * 6, windows=60).sum(axis=(0, 1)))
        for from_cs in (True, False):
            cuts = exceedance_cuts(cum, LAYOUT, 0.99, RATIO, MARGIN_S,
                                   THR + LOG2 if from_cs else None)
            held = (LAYOUT.lower[cuts.baseline_fail] <= P99
                    and LAYOUT.lower[cuts.canary_fail] >= BOUNDARY
                    and LAYOUT.lower[cuts.canary_pass] <= BOUNDARY)
            misses[from_cs] += not held
    assert misses[True] <= binom.ppf(1 - 1e-6, rollouts, ALPHA / 2)
    assert misses[False] > binom.ppf(1 - 1e-6, rollouts, ALPHA / 2)


def near_the_boundary(rng: np.random.Generator, offset_s: float, share: float,
                      calls: int = 100) -> np.ndarray:
    """Nine pods alike, three of them canary pods, each of which answers `share` of its
    calls (moved from below) `offset_s` from ×1.2 + 5 ms of the baseline's true p99."""
    to = int(index_of(np.array([BOUNDARY + offset_s]))[0])
    hist = estate(rng, [1.0] * 9, windows=60, calls=calls)
    for cell in hist[6:].reshape(-1, hist.shape[-1]):
        calls = np.repeat(np.arange(cell.size), cell.astype(np.int64))
        below = calls[calls < to]
        moved = rng.choice(below, size=rng.binomial(calls.size, share), replace=False)
        np.subtract.at(cell, moved, 1.0)
        cell[to] += moved.size
    return hist


def test_a_canary_just_inside_the_boundary_fails_at_most_alpha() -> None:
    # Each canary pod answers 5 % of its calls 0.1 ms inside ×1.2 + 5 ms of the baseline's
    # true p99 and the rest as the baseline does: its p99 sits just within tolerance, the
    # fail side's H0. Cut at the estimated p99's bucket, 4 to 6 of 40 such rollouts failed;
    # cut from the confidence sequence, fails are at most Binomial(K, α).
    rng = np.random.default_rng(19)
    rollouts = 40
    fails = sum(int(last_look(near_the_boundary(rng, -1e-4, 0.05), 3) >= THR)
                for _ in range(rollouts))
    assert fails <= binom.ppf(1 - 1e-6, rollouts, ALPHA)


def test_a_canary_just_beyond_the_boundary_passes_at_most_alpha() -> None:
    # Each canary pod answers 1 % more of its calls 0.1 ms beyond ×1.2 + 5 ms of the
    # baseline's true p99 (0.31 % lie beyond it already): its p99 sits just beyond
    # tolerance, the pass side's H0, so passes are at most Binomial(K, α). Enough calls
    # that a pass tested against 1.6 % instead of 1 % would pass several of them.
    rng = np.random.default_rng(20)
    rollouts = 40
    passes = sum(int(tracks(near_the_boundary(rng, 1e-4, 0.01, calls=400), 3)[1] >= THR)
                 for _ in range(rollouts))
    assert passes <= binom.ppf(1 - 1e-6, rollouts, ALPHA)
