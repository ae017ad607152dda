"""`benchmarks/p99_pods_sim.py` draws its rollouts from `verdict_sim.simulate` and puts Wald's
SPRT beside the p99 verdict (BENCHMARKS.md D18): the two must keep fitting together, and the
SPRT must fail a slow canary and not a healthy one, or the table misstates the optimum."""

from __future__ import annotations

import math
import sys
from types import ModuleType

import numpy as np
import pytest

from tests.servers.benchmark_script import load_benchmark

LOG_THR = math.log(4 / 0.01)


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    return load_benchmark("p99_pods_sim")


def one_rollout(sim: ModuleType, factor: float, seed: int) -> tuple[float | None, dict]:
    """Half an hour of the simulated estate, every canary call `factor` slower: the SPRT's
    minutes to a fail (None: none) and the verdict's flags per look."""
    vs = sys.modules["verdict_sim"]
    est = vs.Estate(hours=0.5)
    sc = sim.LatencyScenario("test", canary_factor=factor)
    rng = np.random.default_rng(seed)
    drawn = vs.simulate(rng, est, vs.Scenario("test"), 0.0, 10.0)
    hist, lo, scale = sim.histograms(rng, drawn.n, drawn.canary, drawn.starts, est, sc)
    assert hist.shape[:2] == drawn.n.shape and scale.shape == drawn.canary.shape
    flags = sim.pods_p99_tracks(hist, drawn.canary, drawn.starts,
                                sim._layout(lo, hist.shape[2]), LOG_THR)
    return sim.p99_sprt(hist, lo, scale, drawn.canary, drawn.starts, LOG_THR), flags


def test_the_sprt_fails_a_canary_twice_as_slow(sim: ModuleType) -> None:
    # Each canary call beyond the cut with chance ~12 % against 1 %: thousands of calls in
    # the half hour, the log-likelihood ratio far past log 400 (β is e^-hundreds).
    minutes, flags = one_rollout(sim, 2.0, seed=1)
    assert minutes is not None and minutes < 30
    assert flags["exceed"].any()  # the verdict fails it too


def test_a_healthy_canary_has_no_fail_to_find(sim: ModuleType) -> None:
    # Within tolerance there is no alternative beyond H0 for the SPRT to accept, and the
    # verdict does not fail it either.
    minutes, flags = one_rollout(sim, 1.0, seed=2)
    assert minutes is None
    assert not flags["exceed"].any()
