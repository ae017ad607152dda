"""The verdict: is the canary cohort worse than the baseline on any path?

One package from the question to the answer: `entry` (`verdict(query, settings, source)`,
the one way every caller asks), `judge` (the rules at the last look, pure),
`service` (a store or Prometheus → the windows and pods × strata grids → `judge`), `cache`
and `grids` (what the running probe keeps between verdicts), `pairs` (relay paths as a
caller × callee matrix), `settings` (what `run` records so that later verdicts judge as it
did) and `worker` (the running probe's verdicts in a process of their own).
"""

from probes.verdict.judge import (
    METRIC_SLOTS,
    PathVerdict,
    Verdict,
    judge,
)

__all__ = [
    "METRIC_SLOTS",
    "PathVerdict",
    "Verdict",
    "judge",
]
