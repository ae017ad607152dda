"""Numbers and sentences shared by the HTML and Markdown renderings."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from probes._parsing import rfc3339
from probes.report._pairs import PairsSection, PairView
from probes.report.model import METRIC_LABELS, Divergence, PathSection, Period, WarmupBand
from probes.report.summary import CohortFigures
from probes.verdict.replay import POOLED

__all__ = [
    "PAIR_CORNER", "UPGRADE_HEADERS", "divergence_sentence", "duration", "figure_cells",
    "metric_value", "pair_figures", "pair_notes", "pod_lines", "pod_method", "replay_line",
    "share", "upgrade_line", "upgrade_rows", "warmup_line", "when",
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
    if section.pairs is not None:
        return ("a relay path: every caller × callee pair judged against the old-old pair "
                f"as of {when(section.pairs.judged_at)} (not replayed look by look)")
    d = section.first
    if d is not None:
        return "first divergence: " + divergence_sentence(d, period)
    if section.judgement.tracks is None:
        return "the baseline and canary cohorts never overlapped on this path"
    return "no test crossed (no divergence)"


def pair_figures(cell: PairView) -> list[str]:
    """A matrix cell's figures pooled over the range: success, p99, attempts, calls."""
    return [f"{metric_value('success_rate', cell.success)} success",
            f"p99 {metric_value('latency_p99_ms', cell.p99_ms)}",
            f"{metric_value('attempts_per_request', cell.attempts)} attempts/req",
            f"{cell.requests:,} calls"]


def pair_notes(pairs: PairsSection) -> list[str]:
    """Why each pair that did not pass did not, and the stale routing seen per caller."""
    out = [f"{c.caller} -> {c.callee}: {c.state}: {c.reason}" for c in pairs.cells
           if c.state in ("fail", "inconclusive") and c.reason]
    out += [f"stale routing seen from callers on {s.caller}: {s.share * 100:.1f} % of relay "
            f"calls ({s.stale:,} of {s.calls:,}): {s.verdict}" for s in pairs.stale]
    return out


PAIR_CORNER = "caller \\ callee"


def duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def pod_lines(section: PathSection) -> list[str]:
    """The success rate as the live verdict judges it at the end of the range (the pod as
    the unit: a sick pod named, not blamed on the version); its concentration finding is
    `PathSection.concentration`."""
    m = section.pods
    if not m:
        return []
    return [f"success rate per pod at the end of this range: {str(m.get('verdict')).upper()}"
            f": {m.get('reason', '')}"]


def pod_method(warmup_s: float) -> str:
    """How success rate is judged per pod, for the report's "how this was computed"."""
    return ("Success rate takes the pod as the unit, as the live verdict does: one pod-level "
            "test per path over its pods × windows (each canary call compared with the "
            "baseline in the same window, the spread between pods counted), its state at "
            "each look decided by the live verdict's own rule (a fail that no single canary "
            f"pod makes). Each pod's first {duration(warmup_s)} is its warm-up: "
            "shown as its own band, kept out of the comparison. Where the store has no "
            "per-pod counts for a path, its success rate is replayed on calls pooled per "
            "cohort, and the path says so.")


def replay_line(section: PathSection) -> str | None:
    """Says so when the replay could not judge success rate per pod."""
    if section.success_unit != POOLED:
        return None
    return ("success rate replayed on calls pooled per cohort: the store has no per-pod "
            "(endpoint) windows for this path, so the pod-level test could not run")


def warmup_line(band: WarmupBand) -> str:
    """The warm-up band in one sentence, e.g. "warm-up (first 2 min of each pod): 1,920
    calls, 31 errors, kept out of the comparison (1.20.3: 6 pods, ...)"."""
    per = "; ".join(
        f"{c.cohort}: {len(c.pods)} {'pod' if len(c.pods) == 1 else 'pods'}, "
        f"{c.calls:,} calls, {c.errors:,} errors" for c in band.cohorts)
    return (f"warm-up (first {duration(band.seconds)} of each pod): {band.calls:,} calls, "
            f"{band.errors:,} errors, kept out of the comparison ({per})")


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
