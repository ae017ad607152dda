"""`PodGrid`: one path's calls and errors per pod and window, the pod-level verdict's input."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from probes.stats._num import F64, Bool

__all__ = ["MAX_GRID_CELLS", "PodGrid"]


@dataclass(frozen=True, slots=True, eq=False)
class PodGrid:
    """One path's calls and errors per pod and window: the input of the pod-level verdict.

    A pod is an endpoint in one cohort (a pod restarted onto the new proxy is a new pod).
    `calls` / `errors` are (pods, windows) over the windows `starts`, with each pod's
    warm-up left out; `warmup_calls` / `warmup_errors` are what the warm-up held, per pod.
    A column is one window, or adjacent ones merged to bound the grid's size: `starts` is
    when each column's first window began, `last_starts` when its last one did.
    Per-pod attempts and latency, where the source keeps them (`per_pod_metrics`: every
    warm cell was written with them): `attempts_calls` / `attempts_sum` (pods, windows) as
    `calls`, and `latency` (pods, buckets of `probes.measure.histogram`), the warm calls'
    histogram over all the grid's windows; None where no row from `since` has any.
    """

    pods: tuple[str, ...]
    cohorts: tuple[str, ...]
    starts: F64
    calls: F64
    errors: F64
    warmup_calls: F64
    warmup_errors: F64
    last_starts: F64
    attempts_calls: F64 | None = None
    attempts_sum: F64 | None = None
    latency: F64 | None = None
    per_pod_metrics: bool = False

    def of(self, cohort: str) -> Bool:
        return np.array([c == cohort for c in self.cohorts], dtype=bool)


# A grid above this many cells is judged in coarser time strata (adjacent windows merged):
# memory stays bounded for hundreds of pods over a day, and strata of a few windows still
# cancel an outage shared by both cohorts.
MAX_GRID_CELLS = 2_000_000
