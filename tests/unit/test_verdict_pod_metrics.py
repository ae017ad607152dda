"""p99 and attempts with the pod as the unit, on grids built in the test
(`probes.verdict.pod_metrics`): the pods' histograms are judged a batch of paths at a time
and the compared cohorts' rows taken without a copy where they are the whole grid; neither
may change a verdict."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from probes.measure.histogram import BUCKET_COUNT, index_of
from probes.spec import Tolerances
from probes.stats import pods as pods_module
from probes.stats.pods import ONE_POD_BASELINE, PodGrid, batches
from probes.verdict import pod_metrics
from probes.verdict.pod_metrics import pod_attempts_many, pod_latency_p99s

OLD, NEW, OTHER = "1.20.3", "1.21.0", "1.19.9"
WINDOWS, WINDOW_S, ALPHA = 6, 10.0, 0.01


def estate(rng: np.random.Generator, cohorts: Sequence[str], scales: Sequence[float],
           retry: Sequence[float], calls: int = 2000) -> PodGrid:
    """One path's grid: each pod's calls over `WINDOWS` windows, lognormal latencies
    (median 20 ms × its scale) and one retry per call with its chance `retry`."""
    pods = len(cohorts)
    n = rng.poisson(calls / WINDOWS, (pods, WINDOWS)).astype(float)
    latency = np.zeros((pods, BUCKET_COUNT))
    for i, scale in enumerate(scales):
        x = 0.02 * scale * rng.lognormal(0.0, 0.3, int(n[i].sum()))
        latency[i] = np.bincount(index_of(x), minlength=BUCKET_COUNT)
    retried = rng.binomial(n.astype(int), np.asarray(retry)[:, None]).astype(float)
    starts = np.arange(WINDOWS) * WINDOW_S
    zero = np.zeros(pods)
    return PodGrid(pods=tuple(f"p-{i}" for i in range(pods)), cohorts=tuple(cohorts),
                   starts=starts, calls=n, errors=np.zeros_like(n), warmup_calls=zero,
                   warmup_errors=zero, last_starts=starts, attempts_calls=n,
                   attempts_sum=n + retried, latency=latency, per_pod_metrics=True)


def estates(seed: int) -> list[PodGrid]:
    """Paths of 2 to 12 pods (so batches pad to other widths), a third cohort on some, one
    path whose canary has no calls (not judged, between judged ones), a one-pod canary, one
    slow canary pod among several, and a canary slow on every pod."""
    rng = np.random.default_rng(seed)
    out = []
    for path in range(9):
        pods = 12 if path == 5 else int(rng.integers(4, 13))
        canary = 1 if path == 2 else pods // 2 if path == 5 else int(rng.integers(2, pods - 1))
        cohorts = [OLD] * (pods - canary) + [NEW] * canary
        if path % 3 == 1:
            cohorts[1] = OTHER
        scales = list(rng.uniform(0.8, 1.25, pods))
        if path == 4:
            scales[-1] = 3.0
        if path == 5:
            scales = [3.0 if c == NEW else 1.0 for c in cohorts]
        retry = [0.3 if path == 5 and c == NEW else 0.02 for c in cohorts]
        grid = estate(rng, cohorts, scales, retry)
        if path == 6:
            gone = np.array([c == NEW for c in cohorts])
            grid.latency[gone] = 0.0  # type: ignore[index]
        out.append(grid)
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_p99_is_the_same_whatever_the_paths_per_batch(seed: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The pods' histograms stacked one path at a time, a few, or all at once (the bound
    `pods.batches` keeps) give the same verdicts, bit for bit: each batch's row of the cuts,
    its worst pod and its exceedances belong to its own paths."""
    grids = estates(seed)
    tol = Tolerances()
    whole = pod_latency_p99s(grids, OLD, NEW, tol, ALPHA, WINDOW_S)
    assert [mv.verdict for mv in whole].count("fail") >= 1  # the path slow on every pod
    assert whole[6].pods is None and whole[4].pods is not None
    assert whole[4].pods["worst"] == grids[4].pods[-1]
    seen = []
    for per_batch in (1, 2, 4):
        def cut(shapes: Sequence[tuple[int, ...]], k: int = per_batch) -> list[tuple[int, int]]:
            seen.append(len(shapes))
            return [(lo, min(lo + k, len(shapes))) for lo in range(0, len(shapes), k)]

        monkeypatch.setattr(pod_metrics, "batches", cut)
        assert pod_latency_p99s(grids, OLD, NEW, tol, ALPHA, WINDOW_S) == whole, per_batch
    assert seen == [8, 8, 8]  # the judged paths, batched
    monkeypatch.undo()
    # The bound itself, small enough that every path is a batch alone.
    monkeypatch.setattr(pods_module, "_BATCH_CELLS", 1)
    small = pod_latency_p99s(grids, OLD, NEW, tol, ALPHA, WINDOW_S)
    assert [(mv.verdict, mv.reason, mv.pods) for mv in small] == \
        [(mv.verdict, mv.reason, mv.pods) for mv in whole]


@pytest.mark.parametrize("edges", [False, True])
def test_p99_summed_over_the_buckets_used_is_p99_over_every_bucket(
        edges: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pod's calls below each bucket are summed over the buckets some compared pod has
    calls in, not all of them: the verdicts are those over every bucket, bit for bit, with
    a third cohort's calls outside that range and, with `edges`, calls in the first and the
    last bucket."""
    grids = estates(3)
    other = np.array([c == OTHER for c in grids[1].cohorts])
    grids[1].latency[other, 5] += 7  # type: ignore[index]  # not compared: not used
    if edges:
        grids[0].latency[0, 0] += 3  # type: ignore[index]
        grids[3].latency[-1, BUCKET_COUNT - 1] += 2  # type: ignore[index]
    tol = Tolerances()
    used: list[slice] = []
    real = pod_metrics._used

    def spied(parts: Sequence[object]) -> slice:
        used.append(real(parts))  # type: ignore[arg-type]
        return used[-1]

    monkeypatch.setattr(pod_metrics, "_used", spied)
    fast = pod_latency_p99s(grids, OLD, NEW, tol, ALPHA, WINDOW_S)
    width = [u.stop - u.start for u in used]
    assert width == ([BUCKET_COUNT] if edges else width) and (edges or width[0] < 400)
    monkeypatch.setattr(pod_metrics, "_used", lambda parts: slice(0, BUCKET_COUNT))
    assert pod_latency_p99s(grids, OLD, NEW, tol, ALPHA, WINDOW_S) == fast
    assert [mv.verdict for mv in fast].count("fail") >= 1


def test_attempts_are_the_same_with_another_cohorts_pods_in_the_grid() -> None:
    """Where a grid holds only the compared cohorts their rows are the grid's own arrays,
    else a copy of theirs: a grid with a third cohort's pods judges as the grid without
    them, and its arrays are left as they were."""
    grids = estates(3)
    tol = Tolerances()
    with_other = [g for g in grids if OTHER in g.cohorts]
    assert with_other
    without = []
    for g in with_other:
        keep = np.array([c != OTHER for c in g.cohorts])
        without.append(PodGrid(
            pods=tuple(p for p, k in zip(g.pods, keep, strict=True) if k),
            cohorts=tuple(c for c, k in zip(g.cohorts, keep, strict=True) if k),
            starts=g.starts, calls=g.calls[keep], errors=g.errors[keep],
            warmup_calls=g.warmup_calls[keep], warmup_errors=g.warmup_errors[keep],
            last_starts=g.last_starts, attempts_calls=g.attempts_calls[keep],  # type: ignore[index]
            attempts_sum=g.attempts_sum[keep], latency=g.latency[keep],  # type: ignore[index]
            per_pod_metrics=True))
    before = [(g.attempts_calls.copy(), g.attempts_sum.copy()) for g in grids]  # type: ignore[union-attr]
    judged = pod_attempts_many(grids, OLD, NEW, tol, ALPHA, WINDOW_S, 3)
    assert judged[5].verdict == "fail" and {mv.verdict for mv in judged} != {"fail"}
    alone = pod_attempts_many(without, OLD, NEW, tol, ALPHA, WINDOW_S, 3)
    assert [judged[i] for i, g in enumerate(grids) if OTHER in g.cohorts] == alone
    assert all(np.array_equal(g.attempts_calls, n) and np.array_equal(g.attempts_sum, s)
               for g, (n, s) in zip(grids, before, strict=True))


def test_batches_cover_every_array_in_order_within_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`pods.batches`: consecutive runs covering every array once, each within the bound
    when padded to its run's largest shape, an array over the bound a run alone."""
    monkeypatch.setattr(pods_module, "_BATCH_CELLS", 600)
    rng = np.random.default_rng(5)
    shapes = [(int(rng.integers(1, 30)), int(rng.integers(1, 40))) for _ in range(200)]
    runs = batches(shapes)
    assert [lo for lo, _ in runs] == [0, *(hi for _, hi in runs[:-1])]
    assert runs[-1][1] == len(shapes)
    for lo, hi in runs:
        rows = max(r for r, _ in shapes[lo:hi])
        cols = max(c for _, c in shapes[lo:hi])
        assert hi - lo == 1 or (hi - lo) * rows * cols <= 600
        if hi < len(shapes):  # the next array would not have fitted
            rows, cols = max(rows, shapes[hi][0]), max(cols, shapes[hi][1])
            assert (hi - lo + 1) * rows * cols > 600
    assert any(hi - lo > 1 for lo, hi in runs) and any(r * c > 600 for r, c in shapes)


def test_a_p99_fail_names_the_worst_pod_and_is_compared_with_one_over_alpha() -> None:
    """The live fail is the profile over the baseline's p99 (`probes.stats.pod_profile`):
    a canary of one pod 3× slower than eight alike baseline pods fails, and the reason names
    it with what would tell pod from version; a canary 3× slower on every pod fails with
    its worst pod under `pods`; the e-value the JSON gives is at least 1/α when it fails and
    below when it does not (a healthy canary)."""
    rng = np.random.default_rng(6)
    tol = Tolerances()
    one = estate(rng, [OLD] * 8 + [NEW], [1.0] * 8 + [3.0], [0.02] * 9)
    every = estate(rng, [OLD] * 6 + [NEW] * 4, [1.0] * 6 + [3.0, 3.1, 2.9, 3.4], [0.02] * 10)
    healthy = estate(rng, [OLD] * 6 + [NEW] * 4, [1.0] * 10, [0.02] * 10)
    one_v, every_v, healthy_v = pod_latency_p99s([one, every, healthy], OLD, NEW, tol, ALPHA,
                                                 WINDOW_S)
    assert one_v.verdict == "fail" and "restart p-8, or add a canary pod" in one_v.reason
    assert every_v.verdict == "fail" and every_v.pods is not None
    assert every_v.pods["worst"] == "p-9"
    assert healthy_v.verdict != "fail"
    assert one_v.e_fail is not None and one_v.e_fail >= 1 / ALPHA
    assert every_v.e_fail is not None and every_v.e_fail >= 1 / ALPHA
    assert healthy_v.e_fail is not None and healthy_v.e_fail < 1 / ALPHA


def test_p99_against_a_baseline_of_one_pod_says_it_cannot_fail() -> None:
    """A baseline of one pod is tested as a pod of its version against the canary pods'
    spread, which takes `ONE_POD_BASELINE` canary pods: with three, a canary 3× slower on
    every pod stays inconclusive, and the reason says why and what would decide (rather
    than "not yet"); with six, or with a second baseline pod, it fails."""
    rng = np.random.default_rng(6)
    tol = Tolerances()
    grids = [estate(rng, [OLD] * nb + [NEW] * nc, [1.0] * nb + [3.0] * nc,
                    [0.02] * (nb + nc), calls=20_000)
             for nb, nc in ((1, 3), (1, ONE_POD_BASELINE), (2, 3))]
    few, many, two = pod_latency_p99s(grids, OLD, NEW, tol, ALPHA, WINDOW_S)
    assert few.verdict == "inconclusive"
    assert "cannot fail against a baseline of one pod" in few.reason
    assert "a second baseline pod would decide" in few.reason
    assert many.verdict == "fail" and "baseline of one pod" not in many.reason
    assert two.verdict == "fail" and "baseline of one pod" not in two.reason
