"""report.html: one self-contained page (inline CSS and SVG; no script, font or image is
fetched, so it opens offline and can be attached to a postmortem as it is).

Top to bottom: the range and cohorts; a summary table (one row per path, linked to its
section); every first divergence with how far the rollout had got; the worst pods; then a
section per path with its charts (side by side with the compared period's when there is
one; a relay path's pair matrix first), its worst pods and its pooled figures; the events;
how it was computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from probes.report._format import (
    FIGURE_HEADERS,
    PAIR_CORNER,
    UPGRADE_HEADERS,
    divergence_sentence,
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
from probes.report._rollout import INVENTORY
from probes.report.charts import STATE_COLOURS, Chart
from probes.report.model import METRIC_LABELS, PathSection, Period, Report
from probes.verdict.rules import State

__all__ = ["report_html"]

_CSS = """
:root { --fg:#1d232a; --muted:#5f6b76; --line:#e3e7eb; --bg:#f6f7f9; --card:#fff;
  --fail:%(fail)s; --pass:%(pass)s; --inc:%(inc)s; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; }
main { max-width:1320px; margin:0 auto; padding:24px 28px 48px; }
h1 { font-size:24px; margin:0 0 4px; }
h2 { font-size:18px; margin:0 0 10px; }
h3 { font-size:15px; margin:14px 0 6px; }
a { color:#0b5cad; text-decoration:none; } a:hover { text-decoration:underline; }
.sub { color:var(--muted); margin:0 0 16px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:16px 18px; margin:0 0 18px; }
.stats { display:flex; flex-wrap:wrap; gap:10px; margin:0 0 18px; }
.stat { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:10px 14px; min-width:150px; }
.stat b { display:block; font-size:22px; }
.stat span { color:var(--muted); font-size:12px; }
table { border-collapse:collapse; width:100%%; font-size:13px; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line);
  vertical-align:top; }
th { color:var(--muted); font-weight:600; background:#fafbfc; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tr:hover td { background:#f8fafc; }
td:first-child { white-space:nowrap; }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px;
  font-weight:600; color:#fff; background:var(--inc); text-transform:uppercase; }
.badge.fail { background:var(--fail); } .badge.pass { background:var(--pass); }
.badge.inconclusive { background:#8a9299; }
.badge.none { background:#fff; color:var(--muted); border:1px solid var(--line); }
.chip { display:inline-flex; align-items:center; gap:5px; white-space:nowrap; }
.chip::before { content:""; width:10px; height:10px; border-radius:2px; background:var(--c); }
.grid { display:grid; grid-template-columns:1fr 1fr; gap:10px 14px; }
.grid .wide { grid-column:1 / -1; }
.grid .head { font-weight:600; color:var(--muted); font-size:13px; }
figure { margin:0; background:#fff; }
svg.chart { width:100%%; height:auto; display:block; }
.path h2 { display:flex; align-items:center; gap:10px; }
.lead { margin:0 0 4px; } .note { margin:0 0 10px; color:var(--muted); }
.regressed { color:var(--fail); font-weight:600; }
.finding { margin:0 0 10px; color:var(--fail); }
table.pairs { width:auto; margin:4px 0 10px; }
table.pairs td.pair { min-width:190px; height:64px; font-variant-numeric:tabular-nums; }
td.pair.fail { background:#fbe3e0; } td.pair.pass { background:#e3f2e6; }
td.pair.inconclusive { background:#eceef0; } td.pair.baseline { background:#e4edf7; }
details summary { cursor:pointer; color:var(--muted); margin:8px 0 4px; }
.method p { margin:0 0 8px; max-width:980px; }
ul.tight { margin:4px 0; padding-left:20px; }
"""


def _badge(verdict: str) -> str:
    cls = {"fail": "fail", "pass": "pass", "inconclusive": "inconclusive"}.get(verdict, "none")
    return f'<span class="badge {cls}">{escape(verdict)}</span>'


def _chip(name: str | None, colours: Mapping[str, str]) -> str:
    if not name:
        return "–"
    return f'<span class="chip" style="--c:{colours.get(name, "#999")}">{escape(name)}</span>'


def _anchor(path: str) -> str:
    return "path-" + "".join(ch if ch.isalnum() else "-" for ch in path)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]],
           numeric: Sequence[int] = ()) -> str:
    """Rows are HTML already (escaped by the caller)."""
    def cls(i: int) -> str:
        return ' class="num"' if i in numeric else ""

    head = "".join(f"<th{cls(i)}>{escape(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _period_line(p: Period, colours: Mapping[str, str]) -> str:
    return (f"{escape(when(p.since))} → {escape(when(p.until))} · baseline "
            f"{_chip(p.baseline, colours)} vs canary {_chip(p.canary, colours)} · charts in "
            f"{p.data.grid.step:g} s buckets, verdict replayed every {p.look_s:g} s")


def _stats(report: Report) -> str:
    cur = report.current
    verdicts = [s.verdict for s in cur.sections]
    diverged = sum(1 for s in cur.sections if s.first is not None)
    end_share = None
    if cur.canary:
        end_share = cur.rollout.share_at(cur.canary, cur.until)
    unit = "pods" if cur.rollout_source == INVENTORY else "probed endpoints"
    cells = [
        (str(len(cur.sections)), "paths"),
        (str(diverged), "paths diverged (a test failed)"),
        (str(verdicts.count("fail")), "failing at the end"),
        (share(end_share), f"of {unit} on {cur.canary or 'the canary'} at the end"),
        (str(len(cur.events)), "events (" + (", ".join(
            f"{k} {n}" for k, n in cur.event_counts.items()) or "none") + ")"),
    ]
    return '<div class="stats">' + "".join(
        f'<div class="stat"><b>{escape(v)}</b><span>{escape(t)}</span></div>' for v, t in cells
    ) + "</div>"


def _summary(report: Report) -> str:
    cur = report.current
    canary = cur.canary or "the canary"
    headers = ["path", "verdict", "first divergence", f"pods on {canary} then"]
    if report.compared is not None:
        headers.append("compared period")
    rows = []
    for s in cur.sections:
        d = s.first
        first = escape(first_line(s, cur).removeprefix("first divergence: "))
        row = [f'<a href="#{_anchor(s.path)}">{escape(s.path)}</a>', _badge(s.verdict),
               first, share(d.canary_share) if d else "–"]
        if report.compared is not None:
            note = report.compared_note(s.path) or ""
            css = ' class="regressed"' if "too" in note else ""
            row.append(f"<span{css}>{escape(note)}</span>")
        rows.append(row)
    return _table(headers, rows, numeric=(3,))


def _divergence_table(p: Period) -> str:
    rows = [[f'<a href="#{_anchor(s.path)}">{escape(s.path)}</a>',
             escape(METRIC_LABELS[d.metric]), escape(when(d.at)), share(d.canary_share),
             escape(metric_value(d.metric, d.baseline)), escape(metric_value(d.metric, d.canary)),
             f"{d.e_value:.3g}"] for s in p.sections for d in s.divergences]
    if not rows:
        return "<p>No sequential test crossed (fail) on any path in this range.</p>"
    return _table(["path", "metric", "crossed at", f"pods on {p.canary}", "baseline then",
                   "canary then", "e-value"], rows, numeric=(3, 4, 5, 6))


def _worst_table(p: Period, colours: Mapping[str, str]) -> str:
    if not p.worst:
        return "<p>No endpoint returned errors in this range.</p>"
    rows = [[escape(w.pod), escape(w.namespace or "–"), _chip(w.version, colours),
             f"{w.errors:,}", f"{w.requests:,}", f"{w.error_rate * 100:.2f}%",
             escape(", ".join(f"{k} ({v:,})" for k, v in w.paths))] for w in p.worst]
    return _table(["pod", "namespace", "version", "errors", "calls", "error rate", "paths"],
                  rows, numeric=(3, 4, 5))


def _pair_matrix(pairs: PairsSection) -> str:
    """Caller versions down, callee versions across; each cell tinted by its state."""
    head = "".join(f"<th>{escape(h)}</th>" for h in
                   (PAIR_CORNER, *(f"callee {v}" for v in pairs.matrix.callees)))
    body = []
    for caller, cells in pairs.rows():
        tds = [f"<th>caller {escape(caller)}</th>"]
        for cell in cells:
            if cell is None:
                tds.append('<td class="pair none">not measured</td>')
                continue
            figures = "<br>".join(escape(x) for x in pair_figures(cell))
            tds.append(f'<td class="pair {escape(cell.state)}">{_badge(cell.state)}<br>'
                       f"{figures}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    notes = "".join(f"<li>{escape(n)}</li>" for n in pair_notes(pairs))
    return (f'<h3>Pair matrix (caller × callee), as of {escape(when(pairs.judged_at))}: '
            f"{_badge(pairs.verdict)}</h3>"
            f'<table class="pairs"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            "</tbody></table>" + (f'<ul class="tight">{notes}</ul>' if notes else ""))


def _figure(chart: Chart, wide: bool) -> str:
    cls = ' class="wide"' if wide else ""
    return f"<figure{cls}>{chart.svg}</figure>"


def _path_section(report: Report, s: PathSection, charts: Sequence[Chart],
                  colours: Mapping[str, str]) -> str:
    cur, cmp_ = report.current, report.compared
    parts = [f'<section class="card path" id="{_anchor(s.path)}">',
             f"<h2>{escape(s.path)} {_badge(s.verdict)}</h2>"]
    lead = [escape(first_line(s, cur))]
    lead += [escape("also " + divergence_sentence(d, cur)) for d in s.divergences[1:]]
    parts.append('<p class="lead">' + "<br>".join(lead) + "</p>")
    if s.pairs is not None:
        parts.append(_pair_matrix(s.pairs))
    if cmp_ is not None:
        note = report.compared_note(s.path) or ""
        css = "note regressed" if "too" in note else "note"
        parts.append(f'<p class="{css}">Compared period: {escape(note)}</p>')
    parts.append('<div class="grid">')
    if cmp_ is not None:
        parts.append(f'<div class="head">this period ({escape(when(cur.since))} → '
                     f'{escape(when(cur.until))})</div>')
        parts.append(f'<div class="head">compared period ({escape(when(cmp_.since))} → '
                     f'{escape(when(cmp_.until))})</div>')
        before = cmp_.section(s.path)
        for c in charts:
            parts.append(_figure(c, wide=False))
            if before is None and c.period == cur.label:
                parts.append('<figure><p class="note">no data in the compared period</p>'
                             "</figure>")
    else:
        for c in charts:
            parts.append(_figure(c, wide=c.kind == "rollout"))
    parts.append("</div>")
    pod_text = pod_lines(s)
    if pod_text:
        parts.append('<p class="note pods">' + "<br>".join(escape(x) for x in pod_text)
                     + "</p>")
    if s.concentration:
        parts.append(f'<p class="finding"><b>finding: {escape(s.concentration)}</b></p>')
    if s.warmup is not None:
        parts.append('<p class="note warmup">' + escape(warmup_line(s.warmup)) + "</p>")
    pooled = replay_line(s)
    if pooled:
        parts.append('<p class="note">' + escape(pooled) + "</p>")
    if s.errors:
        items = ", ".join(f"{escape(e.pod)} ({_chip(e.version, colours)}, "
                          f"{escape(e.namespace or '–')}): {e.errors:,}" for e in s.errors)
        parts.append(f"<p>Pods with the most errors on this path: {items}</p>")
    rows = [[_chip(f.cohort, colours), *(escape(c) for c in figure_cells(f))]
            for f in s.figures]
    parts.append("<details><summary>figures per cohort, pooled over the range</summary>"
                 + _table(FIGURE_HEADERS, rows, numeric=(1, 2, 3, 4, 5)) + "</details>")
    parts.append("</section>")
    return "".join(parts)


def _events(p: Period) -> str:
    if not p.events:
        return "<p>No events recorded in this range.</p>"
    shown = [e for e in p.events if e.kind != "restart"][:200]
    items = "".join(
        f"<li>{escape(when(e.at))} <b>{escape(e.kind)}</b> {escape(e.path)} "
        f"{escape(e.cohort)} {escape(e.endpoint)}</li>" for e in shown)
    counts = ", ".join(f"{escape(k)}: {n:,}" for k, n in p.event_counts.items())
    return f"<p>{counts}</p>" + (f'<ul class="tight">{items}</ul>' if items else "")


def _method(report: Report) -> str:
    cur = report.current
    paragraphs = [
        "Each chart pools the windows of a bucket: success rate and attempts per request "
        "from summed counts, p99 from the bucket's pooled latency histogram (never an "
        "average of percentiles), stream resets per stream-hour of open streams. Calls the "
        "probe itself could not make (probe_error) are not counted as the callee's errors.",
        "The verdict is replayed as <code>skewprobe verdict</code> would have judged at each "
        "look: each metric's anytime-valid test (e-values) on the baseline and canary totals "
        "since the path's origin, the first window both cohorts have in the range, "
        f"α = {report.settings.alpha:g} shared over 4 metrics × {len(cur.sections)} paths "
        f"(α per test {cur.alpha_share:.3g}), min_samples {report.settings.min_samples}; "
        "stale data and too few samples are inconclusive. The first divergence is the first "
        "look at which E_fail ≥ 1/α, pinned to the window inside that look. A crossing "
        "that reverted before the next look is not seen.",
        escape(pod_method(report.settings.warmup_s)),
        "Rollout progress comes from " + escape(cur.rollout_source) + ". "
        + " ".join(escape(n) for n in cur.notes),
    ]
    return "".join(f"<p>{p}</p>" for p in paragraphs)


def report_html(report: Report, charts: Mapping[str, Sequence[Chart]],
                colours: Mapping[str, str]) -> str:
    """The whole page (module docstring)."""
    cur, cmp_ = report.current, report.compared
    css = _CSS % {"fail": STATE_COLOURS[State.FAIL], "pass": STATE_COLOURS[State.PASS],
                  "inc": STATE_COLOURS[State.INCONCLUSIVE]}
    title = f"skewprobe report: {when(cur.since)} to {when(cur.until)}"
    body = [
        "<main>",
        "<h1>skewprobe report</h1>",
        f'<p class="sub">{_period_line(cur, colours)}<br>store {escape(report.store)} · '
        f"generated {escape(when(report.generated_at))}</p>",
    ]
    if cmp_ is not None:
        body.append(f'<p class="sub">Compared with {_period_line(cmp_, colours)}</p>')
    body.append(_stats(report))
    body.append('<section class="card"><h2>Summary</h2>' + _summary(report) + "</section>")
    if cur.upgrade is not None:
        body.append('<section class="card"><h2>Upgrade progress</h2><p>'
                    + escape(upgrade_line(cur.upgrade)) + "</p>"
                    + _table(list(UPGRADE_HEADERS),
                             [[escape(c) for c in row] for row in upgrade_rows(cur.upgrade)])
                    + "</section>")
    body.append('<section class="card"><h2>First divergence per path and metric</h2>'
                + _divergence_table(cur) + "</section>")
    body.append('<section class="card"><h2>Worst endpoints (pods) by errors</h2>'
                + _worst_table(cur, colours)
                + ("<h3>In the compared period</h3>" + _worst_table(cmp_, colours)
                   if cmp_ is not None else "") + "</section>")
    for s in cur.sections:
        body.append(_path_section(report, s, charts.get(s.path, ()), colours))
    body.append('<section class="card"><h2>Events</h2>' + _events(cur) + "</section>")
    body.append('<section class="card method"><h2>How this was computed</h2>'
                + _method(report) + "</section>")
    body.append("</main>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{css}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")
