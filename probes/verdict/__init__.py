"""The verdict: is the canary cohort worse than the baseline on any path?

One package from the question to the answer: `entry` (`verdict(query, settings, source)`,
the one way every caller asks), `rules` (the states, the gates, how states combine and which
test judges each metric, written once over arrays of looks), `judge` (the rules at the last
look, pure), `replay` (the same rules at every look: the report's first crossings),
`service` (a store or Prometheus → the windows and pods × strata grids → `judge`), `cache`
and `grids` (what the running probe keeps between verdicts), `pairs` (relay paths as a
caller × callee matrix), `settings` (what `run` records so that later verdicts judge as it
did) and `worker` (the running probe's verdicts in a process of their own).

Nothing is imported here: `probes.verdict.metrics` imports `rules`, and `judge` imports
`probes.verdict.metrics`, so a package that loaded `judge` on import would be half-built
whenever `probes.verdict.metrics` is imported first. Import from the modules:
`from probes.verdict.entry import verdict`, `from probes.verdict.judge import judge`.
"""

__all__: list[str] = []
