"""`benchmarks/p99_pod_t_sim.py`'s rule (BENCHMARKS.md D18, tried and not taken): one look
fails a canary whose every pod is far beyond the tolerance and not one whose pods match the
baseline's, or the table it prints measures nothing."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from tests.servers.benchmark_script import load_benchmark

CALLS = 10_000  # per pod: the binomial floor under a share of 1 % is then 0.1 pp
SHARES = (0.9, 1.0, 1.1, 0.95, 1.05, 1.0)  # per cent of each pod's calls in its slow bucket


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("p99_pod_t_sim")


def pods(size: int, slow_bucket: int, scale: float) -> np.ndarray:
    """Six pods' counts over `size` buckets: each pod's share (`SHARES` × `scale`) in
    `slow_bucket`, the rest in the first bucket."""
    out = np.zeros((len(SHARES), size))
    slow = np.array(SHARES) * scale / 100 * CALLS
    out[:, slow_bucket] = slow
    out[:, 0] = CALLS - slow
    return out


def look(bench: ModuleType, rule: str, canary_bucket: int, scale: float) -> bool:
    """One look of six canary pods (their slow calls in `canary_bucket`, `scale` × `SHARES`)
    against six baseline pods with `SHARES` a quarter of the way up the layout."""
    layout = bench.sim.EVERY_LOOK_LAYOUT
    base = pods(layout.size, layout.size // 4, 1.0)
    counts = np.concatenate([base, pods(layout.size, canary_bucket, scale)])
    canary = np.arange(counts.shape[0]) >= len(SHARES)
    alpha = 0.0025 / len(bench.SCHEDULE)
    return bool(bench.look_fails(counts, canary, layout, alpha, bench.sim.RATIO,
                                 bench.sim.MARGIN_S, rule))


@pytest.mark.parametrize("rule", ["fisher", "welch"])
def test_a_canary_three_times_the_slow_share_on_every_pod_fails(bench: ModuleType,
                                                                rule: str) -> None:
    # Every canary pod has 2.7-3.3 % of its calls beyond any cut, spread by 0.2 pp: the
    # canary's t against 1 % is ~23 on 5 degrees of freedom, past α/12's 8.3; above the
    # baseline's bucket its pods have no calls, t ~ -24 at the binomial floor.
    layout = bench.sim.EVERY_LOOK_LAYOUT
    assert look(bench, rule, layout.size - 1, 3.0)


@pytest.mark.parametrize("rule", ["fisher", "welch"])
def test_a_canary_whose_pods_match_the_baseline_does_not_fail(bench: ModuleType,
                                                              rule: str) -> None:
    # The same shares in the same bucket: at the candidates below it each cohort's mean is
    # 1 % (t = 0, p ½ each), so no look can reject every candidate.
    assert not look(bench, rule, bench.sim.EVERY_LOOK_LAYOUT.size // 4, 1.0)
