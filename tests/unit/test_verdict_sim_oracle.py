"""The optima `benchmarks/verdict_sim.py` puts beside the verdict (BENCHMARKS.md D21): the
pod-level oracle must be the call-level SPRT when pods do not differ, slower when they do,
and sound at its own boundary; a broken oracle would misstate how far a goal is out of
reach."""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import pytest

from tests.servers.benchmark_script import load_benchmark

LOG_THR = math.log(4 / 0.01)
TOL = 0.001


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    return load_benchmark("verdict_sim")


def scenario(sim: ModuleType, name: str) -> object:
    return next(sc for sc in sim.SCENARIOS if sc.name == name)


def test_without_spread_the_pod_oracle_is_the_call_level_sprt(sim: ModuleType) -> None:
    rng = np.random.default_rng(5)
    est = sim.Estate(move_every_s=300.0, hours=1.0)
    for delta in (0.0, 0.005):
        r = sim.warm_only(sim.simulate(rng, est, scenario(sim, "independent"), delta, 10.0),
                          120.0)
        sprt = sim.sprt_time(r, delta, LOG_THR)
        assert not math.isnan(sprt)
        assert sim.oracle_time(r, 0.0, delta, LOG_THR) == sprt
        # A spread too small to matter leaves it within a window of the SPRT.
        assert abs(sim.oracle_time(r, 1e-4, delta, LOG_THR) - sprt) <= 1


def test_with_spread_the_pod_oracle_is_slower_than_the_sprt_that_knows_each_pod(
        sim: ModuleType) -> None:
    rng = np.random.default_rng(6)
    est = sim.Estate(move_every_s=300.0, hours=1.0)
    sc = scenario(sim, "pod spread, one-pod canary")
    slower = 0
    for _ in range(8):
        r = sim.simulate(rng, est, sc, 0.005, 10.0)
        sprt, oracle = sim.sprt_time(r, 0.005, LOG_THR), sim.oracle_time(r, 0.5, 0.005, LOG_THR)
        assert not math.isnan(sprt)
        slower += not (oracle <= sprt)  # later, or never within the hour
    assert slower >= 6


def test_the_oracles_fail_twice_the_tolerance_and_not_the_tolerance(sim: ModuleType) -> None:
    # Each oracle tests the boundary against 2× it; it is sound at exp(−LOG_THR) = 0.25 %,
    # so on 30 canaries at the boundary a crossing says the oracle is broken.
    rng = np.random.default_rng(7)
    est = sim.Estate(move_every_s=300.0, hours=1.0)
    sc = scenario(sim, "pod spread σ 0.5")
    for oracle in (lambda r: sim.oracle_time(r, 0.5, 2 * TOL, LOG_THR),
                   lambda r: sim.learned_time(r, 0.5, 2 * TOL, LOG_THR)):
        at = [oracle(sim.simulate(rng, est, sc, TOL, 10.0)) for _ in range(30)]
        assert all(math.isnan(x) for x in at)
        beyond = [oracle(sim.simulate(rng, est, sc, 3 * TOL, 10.0)) for _ in range(10)]
        assert sum(not math.isnan(x) for x in beyond) >= 8


def test_the_edge_sweep_counts_passes_before_any_fail(sim: ModuleType) -> None:
    # A healthy canary passes before it fails, one far beyond the tolerance fails first,
    # and one at the tolerance (the sweep's cells) does neither on these seeds.
    assert sim.passed_first(math.nan, 40.0) and sim.passed_first(90.0, 40.0)
    assert not sim.passed_first(10.0, 40.0) and not sim.passed_first(10.0, math.nan)
    est = sim.Estate(move_every_s=300.0, hours=1.0)
    one_pod = sim.Scenario("one pod", one_pod=True)
    for delta, want in ((0.0, 3), (0.01, 0), (None, 0)):
        assert sim.edge_passes(np.random.default_rng(9), est, one_pod, 3, LOG_THR,
                               delta) == want
