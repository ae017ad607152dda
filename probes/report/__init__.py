"""Post-incident comparison reports, and the pooled figures the demo prints.

Entry points (imported from their modules, so `import probes.report` stays light):
`probes.report.write.write_report` (the three files; `skewprobe report` is `probes.cli.report`),
`probes.report.summary.summarise` / `format_figures` (the demo's table).

The flow inside: `_collect` (one pass over the store's windows) → `probes.verdict.replay`
(the verdict replayed at every look, first crossings), `_pairs` (relay paths' caller ×
callee matrices) and `_rollout` / `_endpoints` → `model` (what the report says) →
`_chartdata` → `charts` (matplotlib SVG) → `html`, `markdown`, `jsonout` → `write`.
"""

__all__: list[str] = []  # the entry points live in their modules (above)
