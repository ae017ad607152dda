"""report.json: the report's figures for tools (postmortem templates, dashboards, CI).

The shape (`"schema": "skewprobe-report/1"`):

    {"schema", "generated_at", "store",
     "period": {"from", "to" (the part of "asked" the store has data for), "asked",
                "baseline", "canary", "bucket_s", "look_s", "alpha_share",
                "rollout_source", "notes", "events": {kind: count}},
     "compared": the same for the --compare-to period, or null,
     "settings": {"from" ("config", "store": as `run` recorded them, or "defaults"),
                  "alpha", "min_samples", "attempts_max", "warmup_s", "tolerances"},
     "paths": [{"path", "verdict", "origin",
                "first_divergence": {"metric", "at", "canary_share", "share_source",
                                     "share_at", "e_value", "baseline", "canary"} or null,
                "divergences": {metric: the same},
                "verdict_changes": [{"at", "verdict"}],
                "cohorts": {cohort: {"requests", "errors", "probe_errors", "success_rate",
                                     "latency_p99_ms", "attempts_per_request",
                                     "stream_resets_per_hour", "outcomes"}},
                "worst_pods": [{"pod", "namespace", "version", "errors"}],
                "success_rate_per_pod": {"verdict", "reason", "pods", "needs"} or null
                    (the live verdict at the end of the range, the pod as the unit: the
                    worst pod, its share, concentrated, the warm-up's calls and errors),
                "concentration": {"pod", "share", "finding"} or null (the live rule says
                    the canary's errors are concentrated on that pod: the finding in words),
                "warmup": {"seconds", "calls", "errors", "cohorts": {cohort: {"calls",
                    "errors", "pods": [{"pod", "calls", "errors"}]}}} or null (each pod's
                    first `warmup_s`, baseline and canary, kept out of the comparison; null
                    without per-pod counts),
                "success_rate_replay": "pods" (the replay judged success rate per pod, as
                    the live verdict) or "pooled" (no per-pod counts) or null,
                "compared": {"verdict", "first_divergence", "note"} or null,
                "pairs": {"verdict", "judged_at", "callers", "callees",
                          "cells": [{"caller", "callee", "verdict" (baseline for the
                              old-old pair), "reason", "requests", "success_rate",
                              "latency_p99_ms", "attempts_per_request"}],
                          "stale": [{"caller", "calls", "stale", "share", "lower", "upper",
                                     "verdict"}]} or null
                    (a relay path's caller × callee matrix: each pair's state as
                    `skewprobe verdict --at <the range's end>` judges it, its figures
                    pooled over the range; null for a direct path),
                "charts": [chart kinds]}],
     "worst_endpoints": [{"pod", "namespace", "version", "requests", "errors",
                          "error_rate", "paths": {path: errors}}],
     "events": [{"at", "kind", "path", "cohort", "endpoint", "detail"}]  (first 500)}

Times are RFC 3339 (UTC); rates are fractions (0.991), latencies milliseconds. A figure that
was not measured is null, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from probes._parsing import rfc3339
from probes.report._endpoints import WorstEndpoint
from probes.report._pairs import PairsSection
from probes.report.charts import Chart
from probes.report.model import Divergence, PathSection, Period, Report, WarmupBand
from probes.report.summary import CohortFigures
from probes.verdict.rules import STATES

__all__ = ["SCHEMA", "report_json"]

SCHEMA = "skewprobe-report/1"
_MAX_EVENTS = 500


def _num(x: float | None, digits: int = 6) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def _divergence(d: Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "metric": d.metric, "at": rfc3339(d.at), "canary_share": _num(d.canary_share, 4),
        "share_source": d.share_source or None,
        "share_at": None if d.share_at is None else rfc3339(d.share_at),
        "e_value": _num(d.e_value, 4),
        "baseline": _num(d.baseline), "canary": _num(d.canary),
    }


def _figures(f: CohortFigures) -> dict[str, Any]:
    return {
        "requests": f.requests, "errors": f.requests - f.successes - f.probe_errors,
        "probe_errors": f.probe_errors, "success_rate": _num(f.callee_success_rate),
        "latency_p99_ms": _num(f.p99_ms), "attempts_per_request": _num(f.attempts_per_request),
        "stream_resets_per_hour": _num(f.resets_per_hour), "outcomes": dict(f.outcomes),
    }


def _changes(period: Period, section: PathSection) -> list[dict[str, str]]:
    tracks = section.judgement.tracks
    if tracks is None:
        return []
    ends = period.data.grid.look_ends
    out, last = [], None
    for at, code in zip(ends, tracks.state, strict=True):
        name = STATES[int(code)].replace("n/a", "no comparison")
        if name != last:
            out.append({"at": rfc3339(min(float(at), period.until)), "verdict": name})
            last = name
    return out


def _period(p: Period) -> dict[str, Any]:
    return {
        "from": rfc3339(p.since), "to": rfc3339(p.until),
        "asked": {"from": rfc3339(p.asked[0]), "to": rfc3339(p.asked[1])}, "baseline": p.baseline,
        "canary": p.canary, "bucket_s": p.data.grid.step, "look_s": p.look_s,
        "window_s": p.data.window_s, "alpha_share": _num(p.alpha_share),
        "rollout_source": p.rollout_source, "notes": list(p.notes), "events": p.event_counts,
        "upgrade": p.upgrade,
    }


def report_json(report: Report, charts: Mapping[str, Sequence[Chart]]) -> dict[str, Any]:
    """The report as the JSON document described in the module docstring."""
    cur, cmp_ = report.current, report.compared
    paths = []
    for s in cur.sections:
        before = cmp_.section(s.path) if cmp_ is not None else None
        paths.append({
            "path": s.path, "verdict": s.verdict,
            "origin": None if s.judgement.origin is None else rfc3339(s.judgement.origin),
            "first_divergence": _divergence(s.first),
            "divergences": {d.metric: _divergence(d) for d in s.divergences},
            "verdict_changes": _changes(cur, s),
            "cohorts": {f.cohort: _figures(f) for f in s.figures},
            "worst_pods": [asdict(e) for e in s.errors],
            # The live verdict's success rate at the end of the range, the pod as the unit.
            "success_rate_per_pod": None if s.pods is None else {
                "verdict": s.pods.get("verdict"), "reason": s.pods.get("reason"),
                "pods": s.pods.get("pods"), "needs": s.pods.get("needs")},
            "concentration": _concentration(s),
            "warmup": None if s.warmup is None else _warmup(s.warmup),
            "success_rate_replay": s.success_unit,
            "compared": None if cmp_ is None else {
                "verdict": before.verdict if before else None,
                "first_divergence": _divergence(before.first) if before else None,
                "note": report.compared_note(s.path),
            },
            "pairs": None if s.pairs is None else _pairs(s.pairs),
            "charts": [c.kind for c in charts.get(s.path, ()) if c.period == cur.label],
        })
    cfg = report.settings
    return {
        "schema": SCHEMA,
        "generated_at": rfc3339(report.generated_at),
        "store": report.store,
        "period": _period(cur),
        "compared": None if cmp_ is None else {
            **_period(cmp_),
            "paths": [{"path": b.path, "verdict": b.verdict,
                       "first_divergence": _divergence(b.first)} for b in cmp_.sections],
            "worst_endpoints": [_worst(w) for w in cmp_.worst],
        },
        "settings": {"from": report.settings_from, "alpha": cfg.alpha,
                     "min_samples": cfg.min_samples, "attempts_max": cfg.attempts_max,
                     "warmup_s": cfg.warmup_s, "tolerances": asdict(cfg.tolerances)},
        "paths": paths,
        "worst_endpoints": [_worst(w) for w in cur.worst],
        "events": [
            {"at": rfc3339(e.at), "kind": e.kind, "path": e.path or None,
             "cohort": e.cohort or None, "endpoint": e.endpoint or None, "detail": dict(e.detail)}
            for e in cur.events[:_MAX_EVENTS]
        ],
    }


def _concentration(s: PathSection) -> dict[str, Any] | None:
    found = s.concentration
    if found is None or s.pods is None:
        return None
    pods = s.pods.get("pods") or {}
    return {"pod": pods.get("worst"), "share": pods.get("worst_share"), "finding": found}


def _pairs(pairs: PairsSection) -> dict[str, Any]:
    return {
        "verdict": pairs.verdict, "judged_at": rfc3339(pairs.judged_at),
        "callers": list(pairs.matrix.callers), "callees": list(pairs.matrix.callees),
        "cells": [{"caller": c.caller, "callee": c.callee, "verdict": c.state,
                   "reason": c.reason or None, "requests": c.requests,
                   "success_rate": _num(c.success), "latency_p99_ms": _num(c.p99_ms),
                   "attempts_per_request": _num(c.attempts)} for c in pairs.cells],
        "stale": [s.to_json() for s in pairs.stale],
    }


def _warmup(band: WarmupBand) -> dict[str, Any]:
    return {
        "seconds": band.seconds, "calls": band.calls, "errors": band.errors,
        "cohorts": {c.cohort: {"calls": c.calls, "errors": c.errors,
                               "pods": [{"pod": p, "calls": n, "errors": e}
                                        for p, n, e in c.pods]}
                    for c in band.cohorts},
    }


def _worst(w: WorstEndpoint) -> dict[str, Any]:
    return {"pod": w.pod, "namespace": w.namespace, "version": w.version,
            "requests": w.requests, "errors": w.errors, "error_rate": _num(w.error_rate),
            "paths": dict(w.paths)}
