"""Numbers and sentences shared by the HTML and Markdown renderings."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from probes._timeparse import rfc3339
from probes.report.model import METRIC_LABELS, Divergence, PathSection, Period
from probes.report.summary import CohortFigures

__all__ = [
    "UPGRADE_HEADERS", "divergence_sentence", "figure_cells", "metric_value", "pod_lines",
    "share", "upgrade_line", "upgrade_rows", "when",
]


def when(t: float) -> str:
    """A time for tables: RFC 3339, UTC, to the second."""
    return rfc3339(t)


def clock(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")


def metric_value(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    if metric == "success_rate":
        return f"{value * 100:.2f}%"
    if metric == "latency_p99_ms":
        return f"{value:.1f} ms"
    if metric == "attempts_per_request":
        return f"{value:.2f}"
    return f"{value:.1f}/h"


def share(value: float | None) -> str:
    return "unknown" if value is None else f"{value * 100:.0f}%"


def divergence_sentence(d: Divergence, period: Period) -> str:
    """E.g. "success rate first crossed at 10:04:10Z, with 42% of pods on 1.21.0
    (inventory): 97.9% vs 99.9%"."""
    src = ""
    if d.share_source:
        at = f" at {clock(d.share_at)}" if d.share_at is not None else ""
        src = f" ({d.share_source}{at})"
    return (f"{METRIC_LABELS[d.metric]} crossed at {when(d.at)}, with {share(d.canary_share)} "
            f"of pods on {period.canary}{src}: {metric_value(d.metric, d.canary)} vs "
            f"{metric_value(d.metric, d.baseline)}")


def figure_cells(f: CohortFigures) -> list[str]:
    """calls, success, p99, attempts/request, resets per stream-hour, top errors."""
    errors = sorted(((n, o) for o, n in f.outcomes.items() if o != "ok"), reverse=True)
    return [
        f"{f.requests:,}",
        metric_value("success_rate", f.callee_success_rate),
        metric_value("latency_p99_ms", f.p99_ms),
        metric_value("attempts_per_request", f.attempts_per_request),
        metric_value("stream_resets_per_hour", f.resets_per_hour),
        ", ".join(f"{o} {n:,}" for n, o in errors[:3]) or "–",
    ]


FIGURE_HEADERS = ["cohort", "calls", "success", "p99", "attempts/req", "resets/stream-h",
                  "top errors"]


def first_line(section: PathSection, period: Period) -> str:
    d = section.first
    if d is not None:
        return "first divergence: " + divergence_sentence(d, period)
    if section.judgement.tracks is None:
        return "the baseline and canary cohorts never overlapped on this path"
    return "no test crossed (no divergence)"


def pod_lines(section: PathSection, warmup_s: float) -> list[str]:
    """The success rate as the live verdict judges it at the end of the range (the pod as
    the unit: a sick pod named, not blamed on the version), and the warm-up band."""
    m = section.pods
    if not m:
        return []
    pods = m.get("pods", {})
    lines = [f"success rate per pod at the end of this range: {str(m.get('verdict')).upper()}"
             f": {m.get('reason', '')}"]
    warm = pods.get("warmup") or {}
    if warm.get("calls"):
        minutes = f"{warmup_s / 60:g} min" if warmup_s >= 60 else f"{warmup_s:g} s"
        lines.append(f"warm-up (each pod's first {minutes}, kept out of the comparison): "
                     f"{warm['calls']:,} calls, {warm.get('errors', 0):,} errors")
    return lines


def upgrade_rows(upgrade: Mapping[str, Any], most: int = 12) -> list[list[str]]:
    """The upgrade's progress as table rows (time, pods on target, namespaces done, long
    tail), at most `most`: the first, the last and evenly spaced ones between."""
    points = upgrade["points"]
    if len(points) > most:
        step = (len(points) - 1) / (most - 1)
        points = [points[round(i * step)] for i in range(most)]
    return [
        [p["at"], f"{p['on_target']}/{p['pods']}" + (f" ({p['share'] * 100:.1f} %)"
                                                        if p["share"] is not None else ""),
         f"{p['namespaces_done']}/{p['namespaces']}", str(p["long_tail_pods"])]
        for p in points
    ]


UPGRADE_HEADERS = ("snapshot", "pods on the target", "namespaces done", "long tail (pods)")


def upgrade_line(upgrade: Mapping[str, Any]) -> str:
    """One line: the target, the projected date and how it was projected."""
    done = upgrade["projected_done_by"]
    return (f"target {upgrade['target']} (the newest version seen); every pod on it by"
            f" {done or 'no date'} ({upgrade['projection']}); long tail: pods off the target"
            f" older than {upgrade['max_pod_age_days']:g} d; {upgrade['tiers']}")
