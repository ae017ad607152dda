"""The exported latency histogram's buckets: /metrics bytes against the p99 verdict a
Prometheus source reaches with them (BENCHMARKS.md D20).

Bytes: a registry with 4 paths × 2 cohorts, every per-call series present (two outcomes,
attempts, churn, a verdict per path), divided by the 8 path × cohort series.

Verdicts: for each bucket layout, the pooled p99 test (`probes.verdict.metrics.latency_p99`,
the test a verdict from Prometheus runs on the exported edges) on simulated cohorts, beside
the same test on the store's layout (64 per doubling) for the same calls. Lognormal
latencies (σ 0.5) at medians 1, 10, 50, 200 and 500 ms, `--calls` per cohort; the canary as
fast as the baseline (a pass expected) or ×1.6 slower at the p99 (a fail expected);
`--trials` draws per median. Reported: how often each layout gives the expected state, the
wrong one, and the store's.

    .venv/bin/python benchmarks/metrics_buckets.py              # 20 trials per cell
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from probes.measure.histogram import BUCKET_COUNT, LOWER, UPPER, index_of
from probes.metrics import DURATION_BUCKETS, PROMETHEUS_DURATION_BUCKETS, ProbeMetrics
from probes.spec import Tolerances
from probes.stats.quantile import Layout
from probes.types import CallOutcome, CallResult, Outcome
from probes.verdict import metrics as M

LAYOUTS = {
    "16 per doubling, 1 ms-30 s (source: prometheus)": PROMETHEUS_DURATION_BUCKETS,
    "4 per doubling, 2 ms-10 s, 30 s (the default)": DURATION_BUCKETS,
}
MEDIANS_MS = (1.0, 10.0, 50.0, 200.0, 500.0)
SIGMA = 0.5
ALPHA = 0.01 / 4  # a path's share of α = 1 % over its four metric slots, as judge() splits it


def exposition_bytes(edges: tuple[float, ...]) -> float:
    """/metrics bytes per path × cohort with these duration buckets."""
    reg = CollectorRegistry()
    m = ProbeMetrics(reg, duration_buckets=edges)
    empty = len(generate_latest(reg))
    for path in ("checkout", "catalog", "echo", "health"):
        for cohort in ("1.20.3", "1.21.0"):
            for latency in (0.002, 0.02, 0.2):
                m.observe(CallResult(path, "pod-0", cohort, 0.0, latency, 0.0,
                                     CallOutcome(Outcome.OK, 200, attempts=1)))
            m.observe(CallResult(path, "pod-0", cohort, 0.0, 0.01, 0.0,
                                 CallOutcome(Outcome.HTTP_5XX, 503)))
            m.set_verdict(path, "pass")
    return (len(generate_latest(reg)) - empty) / 8


def _exported(edges: tuple[float, ...]) -> tuple[Layout, np.ndarray]:
    """The layout a Prometheus source judges on (`probes.store._prom_table`), and the
    finite `le` edges to bin calls with (bucket j holds (le[j-1], le[j]], the last +Inf)."""
    finite = np.array(edges)
    lower = np.concatenate(([0.0], finite))
    upper = np.concatenate((finite, [2.0 * finite[-1]]))
    return Layout.from_edges(lower, upper), finite


def _verdict(counts_b: np.ndarray, counts_c: np.ndarray, layout: Layout) -> str:
    cum_b = np.cumsum(counts_b)[None, :].astype(float)
    cum_c = np.cumsum(counts_c)[None, :].astype(float)
    return M.latency_p99(cum_b, cum_c, layout, Tolerances(), ALPHA)[0].verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    store_layout = Layout.from_edges(LOWER, UPPER)
    exported = {name: _exported(edges) for name, edges in LAYOUTS.items()}
    for name, edges in LAYOUTS.items():
        print(f"{name}: {len(edges)} buckets, {exposition_bytes(edges):,.0f} B of /metrics"
              " per path × cohort")
    # The p99 of a lognormal is median·exp(2.326σ): ×1.6 at the p99 is ×1.6 throughout.
    for label, factor, expected, wrong in (("equal", 1.0, "pass", "fail"),
                                           ("x1.6", 1.6, "fail", "pass")):
        right = {name: 0 for name in LAYOUTS}
        wrongs = {name: 0 for name in LAYOUTS}
        agree = {name: 0 for name in LAYOUTS}
        store_right = 0
        n = 0
        for median in MEDIANS_MS:
            mu = math.log(median / 1000.0)
            for _ in range(args.trials):
                b = rng.lognormal(mu, SIGMA, args.calls)
                c = rng.lognormal(mu + math.log(factor), SIGMA, args.calls)
                sb = np.bincount(index_of(b), minlength=BUCKET_COUNT)
                sc = np.bincount(index_of(c), minlength=BUCKET_COUNT)
                store = _verdict(sb, sc, store_layout)
                store_right += store == expected
                n += 1
                for name, (layout, finite) in exported.items():
                    eb = np.bincount(np.searchsorted(finite, b), minlength=layout.size)
                    ec = np.bincount(np.searchsorted(finite, c), minlength=layout.size)
                    got = _verdict(eb, ec, layout)
                    right[name] += got == expected
                    wrongs[name] += got == wrong
                    agree[name] += got == store
        print(f"{label} canary ({expected} expected), {n} draws over medians "
              f"{', '.join(f'{m:g}' for m in MEDIANS_MS)} ms: store layout {store_right}/{n}")
        for name in LAYOUTS:
            print(f"  {name}: {expected} {right[name]}/{n}, {wrong} (wrong) {wrongs[name]}/{n},"
                  f" agrees with the store {agree[name]}/{n}")


if __name__ == "__main__":
    main()
