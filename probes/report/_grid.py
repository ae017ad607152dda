"""The report's time axis: chart buckets and the looks at which the verdict is replayed.

A chart needs at most a few hundred points to be read on a laptop, and a day of 10 s windows
is 8,640 of them, so windows are pooled into buckets: the smallest "round" size (10 s, 30 s,
1 min, 5 min, ...) that keeps a chart under `MAX_POINTS`. A bucket is a whole number of
windows, aligned to the epoch like the windows themselves, so every window falls in exactly
one bucket and a bucket's end is a window boundary.

The verdict is replayed at the end of every `k`-th bucket (a *look*), `k` chosen so a path
has at most `MAX_LOOKS` looks: each look costs one p99 test on pooled histograms, the
expensive one. First crossings are then pinned to the window inside the look
(`probes.verdict.replay`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_LOOKS", "MAX_POINTS", "TimeGrid", "choose_grid"]

MAX_POINTS = 300
MAX_LOOKS = 80
_ROUND = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800,
          21600, 43200, 86400)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TimeGrid:
    """Buckets [start + i·step, start + (i+1)·step) for i < count, looks every `per_look`."""

    start: float
    step: float
    count: int
    per_look: int

    @property
    def stop(self) -> float:
        return self.start + self.step * self.count

    @property
    def edges(self) -> F64:
        return self.start + self.step * np.arange(self.count + 1, dtype=np.float64)

    @property
    def centers(self) -> F64:
        return self.start + self.step * (np.arange(self.count, dtype=np.float64) + 0.5)

    def bucket_of(self, t: npt.ArrayLike) -> I64:
        """The bucket of each time (−1 outside the grid)."""
        tt = np.asarray(t, dtype=np.float64)
        # A small nudge keeps a window start that is an exact edge in its own bucket.
        idx = np.floor((tt - self.start) / self.step + 1e-9).astype(np.int64)
        return np.where((idx >= 0) & (idx < self.count), idx, -1)

    @property
    def looks(self) -> int:
        return -(-self.count // self.per_look)

    def look_of_bucket(self, bucket: npt.ArrayLike) -> I64:
        b = np.asarray(bucket, dtype=np.int64)
        return np.where(b >= 0, b // self.per_look, -1)

    @property
    def look_ends(self) -> F64:
        """The time of each look: the end of its last bucket."""
        last = np.minimum((np.arange(self.looks) + 1) * self.per_look, self.count)
        return self.start + self.step * last.astype(np.float64)

    @property
    def look_starts(self) -> F64:
        return self.start + self.step * (np.arange(self.looks) * self.per_look).astype(np.float64)


def choose_grid(since: float, until: float, window_s: float,
                max_points: int = MAX_POINTS, max_looks: int = MAX_LOOKS) -> TimeGrid:
    """Buckets over [since, until) for windows of `window_s` seconds (module docstring)."""
    if until <= since:
        raise ValueError("the grid needs since < until")
    window = max(float(window_s), 1e-3)
    span = until - since
    want = span / max_points
    step = None
    for r in _ROUND:
        ratio = r / window
        if r >= want and r >= window and abs(ratio - round(ratio)) < 1e-9:
            step = float(r)
            break
    if step is None:  # an odd window length: whole windows, as few as keep the bound
        step = window * max(1, math.ceil(want / window))
    start = math.floor(since / step) * step
    count = max(1, math.ceil((until - start) / step - 1e-9))
    per_look = max(1, math.ceil(count / max_looks))
    return TimeGrid(start=start, step=step, count=count, per_look=per_look)
