"""report.md: the report as Markdown, for pasting into a postmortem.

The same figures as the HTML page without the charts: a summary per path, each relay
path's pair matrix (caller × callee), the first divergence per path and metric with how far
the rollout had got, the pooled figures per cohort, the worst pods, the events, the
compared period, and how it was computed.
"""

from __future__ import annotations

from collections.abc import Sequence

from probes.report._format import (
    FIGURE_HEADERS,
    PAIR_CORNER,
    UPGRADE_HEADERS,
    duration,
    figure_cells,
    first_line,
    metric_value,
    pair_figures,
    pair_notes,
    pod_lines,
    pod_method,
    replay_line,
    share,
    upgrade_line,
    upgrade_rows,
    warmup_line,
    when,
)
from probes.report._pairs import PairsSection
from probes.report.model import METRIC_LABELS, Period, Report

__all__ = ["report_markdown"]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def _period_head(p: Period) -> list[str]:
    cohorts = (f"baseline **{p.baseline}**, canary **{p.canary}**"
               if p.baseline and p.canary else "no baseline/canary pair")
    out = [f"- range: {when(p.since)} to {when(p.until)} ({cohorts})",
           f"- charts in {p.data.grid.step:g} s buckets; verdict replayed every {p.look_s:g} s "
           f"(first crossings pinned to the {p.data.window_s:g} s window)",
           f"- rollout progress from {p.rollout_source}"]
    out += [f"- note: {n}" for n in p.notes]
    return out


def _divergences(p: Period) -> list[str]:
    rows = []
    for s in p.sections:
        for d in s.divergences:
            rows.append([s.path, METRIC_LABELS[d.metric], when(d.at), share(d.canary_share),
                         metric_value(d.metric, d.baseline), metric_value(d.metric, d.canary),
                         f"{d.e_value:.3g}"])
    if not rows:
        return ["No sequential test crossed (fail) on any path in this range."]
    return _table(["path", "metric", "crossed at", f"pods on {p.canary}", "baseline then",
                   "canary then", "e-value"], rows)


def _worst(p: Period) -> list[str]:
    if not p.worst:
        return ["No endpoint returned errors in this range."]
    return _table(
        ["pod", "namespace", "version", "errors", "calls", "error rate", "paths"],
        [[w.pod, w.namespace or "–", w.version, f"{w.errors:,}", f"{w.requests:,}",
          f"{w.error_rate * 100:.2f}%", ", ".join(f"{k} ({v})" for k, v in w.paths)]
         for w in p.worst])


def _pairs(pairs: PairsSection) -> list[str]:
    rows = [[f"caller {caller}",
             *("not measured" if c is None else
               f"**{c.state.upper()}**: " + " · ".join(pair_figures(c)) for c in cells)]
            for caller, cells in pairs.rows()]
    return [*_table([PAIR_CORNER, *(f"callee {v}" for v in pairs.matrix.callees)], rows),
            "", *(f"- {n}" for n in pair_notes(pairs))]


def report_markdown(report: Report) -> str:
    cur, cmp_ = report.current, report.compared
    lines = [f"# skewprobe report: {when(cur.since)} to {when(cur.until)}", "",
             f"Store `{report.store}`, generated {when(report.generated_at)}.", ""]

    def add(title: str | None, body: Sequence[str]) -> None:
        if title:
            lines.extend([title, ""])
        lines.extend(body)
        lines.append("")

    add(None, _period_head(cur))
    headers = ["path", "verdict", "first divergence"]
    if cmp_ is not None:
        headers.append("compared period")
    rows = []
    for s in cur.sections:
        row = [s.path, s.verdict.upper(), first_line(s, cur).removeprefix("first divergence: ")]
        if cmp_ is not None:
            row.append(report.compared_note(s.path) or "")
        rows.append(row)
    add("## Summary", _table(headers, rows))
    for s in cur.sections:
        if s.pairs is not None:
            add(f"## Pair matrix of {s.path} (caller × callee), as of "
                f"{when(s.pairs.judged_at)}: {s.pairs.verdict.upper()}", _pairs(s.pairs))
    if cur.upgrade is not None:
        add("## Upgrade progress (inventory snapshots)",
            [upgrade_line(cur.upgrade), "", *_table(UPGRADE_HEADERS, upgrade_rows(cur.upgrade))])
    add("## First divergence per path and metric", _divergences(cur))
    per_pod = [f"- **{s.path}**: {line}" for s in cur.sections
               for line in [*pod_lines(s),
                            *([f"**finding: {s.concentration}**"] if s.concentration else []),
                            *filter(None, [replay_line(s)])]]
    if per_pod:
        add("## The pod as the unit (success rate, at the end of the range)", per_pod)
    bands = [(s.path, s.warmup) for s in cur.sections if s.warmup is not None]
    if bands:
        add(f"## Warm-up (first {duration(report.settings.warmup_s)} of each pod, kept out "
            "of the comparison)",
            [*(f"- **{path}**: {warmup_line(band)}" for path, band in bands), "",
             *_table(["path", "cohort", "pods", "calls", "errors", "error rate"],
                     [[path, c.cohort, str(len(c.pods)), f"{c.calls:,}", f"{c.errors:,}",
                       f"{100 * c.errors / c.calls:.2f}%" if c.calls else "–"]
                      for path, band in bands for c in band.cohorts])])
    add("## Worst endpoints (pods) by errors", _worst(cur))
    fig_rows = [[s.path, f.cohort, *figure_cells(f)] for s in cur.sections for f in s.figures]
    add("## Figures per path and cohort (pooled over the range)",
        _table(["path", *FIGURE_HEADERS], fig_rows))
    events = ["No events recorded in this range."]
    if cur.events:
        events = [", ".join(f"{k}: {n}" for k, n in cur.event_counts.items()), ""]
        events += [f"- {when(e.at)} {e.kind} {e.path} {e.cohort}".rstrip()
                   for e in cur.events if e.kind != "restart"][:50]
    add("## Events", events)
    if cmp_ is not None:
        add(f"## Compared period: {when(cmp_.since)} to {when(cmp_.until)}", _period_head(cmp_))
        add(None, _table(["path", "verdict", "first divergence"],
                         [[s.path, s.verdict.upper(),
                           first_line(s, cmp_).removeprefix("first divergence: ")]
                          for s in cmp_.sections]))
        add("### Worst endpoints in the compared period", _worst(cmp_))
    add("## How this was computed", [
        "The verdict is replayed as `skewprobe verdict` would have judged at each look: "
        "each metric's anytime-valid test on the baseline and canary totals since the "
        "path's origin (the first window both cohorts have in the range), "
        f"α = {report.settings.alpha:g} shared over 4 metrics × {len(cur.sections)} paths "
        f"(α per test {cur.alpha_share:.3g}), min_samples {report.settings.min_samples}. "
        "A crossing is the first look at which E_fail ≥ 1/α, pinned to the window within "
        "that look; a crossing that reverted before the next look is not seen. p99 comes "
        "from histograms pooled per bucket, never from averaged percentiles. Calls the "
        "probe could not make (probe_error) are not counted as the callee's errors.",
        "", pod_method(report.settings.warmup_s)])
    return "\n".join(lines)
