"""Is the probe itself overloaded? A rule over its own schedule, read once per window.

Latency is measured from each call's intended send time, so a starved probe (late sends,
skipped sends) adds its own delay to every cohort alike: a latency regression is diluted
towards "no difference" and the sample counts shrink. The verdict must then say
"inconclusive: probe overloaded" instead of judging.

The rule, over the last `windows` windows (30 s at the default 10 s windows):

- any call skipped: the schedule fell more than `max_catch_up` behind, `max_in_flight`
  calls were already running, or results arrived after their window was forgotten; or
- more than `budget_share` (1 %) of sends left later than `budget_s` (10 ms), i.e. the
  schedule lag p99 was over the probe's budget (issue 7: p99 <= 10 ms).

It clears only when the last `windows` windows are clean, so a verdict never flips back to
judging on the first good window after a stall.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["LAG_BUDGET_S", "OVERLOAD_EVENT", "OVERLOAD_WINDOWS", "OverloadWatch"]

# The store's event for a change of state: detail {"reason": "..."} while overloaded,
# {"reason": null} when it clears. `skewprobe verdict` reads the state from the last one.
OVERLOAD_EVENT: Final = "overload"

LAG_BUDGET_S: Final = 0.010
LAG_BUDGET_SHARE: Final = 0.01
OVERLOAD_WINDOWS: Final = 3


class OverloadWatch:
    """Keeps running totals at window boundaries and says why the probe is overloaded."""

    def __init__(
        self,
        windows: int = OVERLOAD_WINDOWS,
        *,
        budget_s: float = LAG_BUDGET_S,
        budget_share: float = LAG_BUDGET_SHARE,
    ) -> None:
        if windows < 1 or budget_s <= 0 or not 0 <= budget_share < 1:
            raise ValueError("windows >= 1, budget_s > 0 and budget_share in [0, 1) required")
        self.budget_s = budget_s
        self.budget_share = budget_share
        # (calls, lagged, skipped) totals at each of the last `windows` window boundaries.
        # Starts from zero, so a probe starved from its first window is caught at once.
        self._marks: deque[tuple[int, int, int]] = deque([(0, 0, 0)], maxlen=windows + 1)
        self.reason: str | None = None
        self.changed = False  # did the last `update` change the state (overloaded or not)?

    @property
    def overloaded(self) -> bool:
        return self.reason is not None

    def update(self, calls: int, lagged: int, skipped: int) -> str | None:
        """Mark a window boundary with the running totals of calls made, calls sent later
        than `budget_s`, and calls skipped; return why the probe is overloaded, or None."""
        self._marks.append((calls, lagged, skipped))
        was = self.reason is not None
        (c0, l0, s0), (c1, l1, s1) = self._marks[0], self._marks[-1]
        calls, lagged, skipped = c1 - c0, l1 - l0, s1 - s0
        span = f"in the last {len(self._marks) - 1} windows"
        if skipped:
            self.reason = f"probe overloaded: {skipped} calls skipped {span}"
        elif calls and lagged > self.budget_share * calls:
            self.reason = (
                f"probe overloaded: {lagged / calls:.1%} of {calls} calls sent more than "
                f"{self.budget_s * 1000:g} ms late {span} (schedule lag p99 over budget)"
            )
        else:
            self.reason = None
        self.changed = was != (self.reason is not None)
        return self.reason
