"""Anytime-valid cohort statistics for the verdict.

- `bounded`: [0, 1]-bounded means (error rates, scaled attempts): beta-mixture CSs and the
  two-sample composite e-values;
- `quantile`: quantiles from bucket histograms (p99 latency);
- `rates`: Poisson rates with exposure (stream resets per stream-hour);
- `series`: per-cohort totals over the comparison span (or per look), from windows or store
  columns;
- `pods`: pods × windows, time-stratified and pod-clustered (the pod as the unit);
- `cohorts`: version-aware choice of baseline and canary;
- `pod_exceed`, `pod_profile`, `pod_quantile`: p99 with the pod as the unit (the pass's
  cuts and track, the fail's profile e-value, the worst pod).

Statistics only: the verdict's states, gates and per-metric verdicts built on these are
`probes.verdict` (`rules`, `metrics`, `pod_metrics`).
"""

from __future__ import annotations

from probes.stats import bounded, cohorts, pods, quantile, rates, series

__all__ = ["bounded", "cohorts", "pods", "quantile", "rates", "series"]
