"""Anytime-valid cohort statistics for the verdict.

- `bounded`: [0, 1]-bounded means (error rates, scaled attempts): beta-mixture CSs and the
  two-sample composite e-values;
- `quantile`: quantiles from bucket histograms (p99 latency);
- `rates`: Poisson rates with exposure (stream resets per stream-hour);
- `metrics`: the four verdict metrics on top of those, many paths at once;
- `series`: per-cohort totals over the comparison span, from windows or store columns;
- `pods`: pods × windows, time-stratified and pod-clustered (the pod as the unit);
- `sequential`: the same tests replayed at every look over time (when did each first cross);
- `cohorts`: version-aware choice of baseline and canary.

`probes.verdict.judge` is the entry point; these modules are its parts.
"""

from __future__ import annotations

from probes.stats import bounded, cohorts, metrics, pods, quantile, rates, sequential, series

__all__ = [
    "bounded", "cohorts", "metrics", "pods", "quantile", "rates", "sequential", "series",
]
