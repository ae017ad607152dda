"""What each chart of a report shows, as plain arrays: the seam between the report's data
and the drawing.

`chart_jobs` turns a `Report` into one `ChartJob` per chart, in page order. A job holds only
small arrays (a few hundred points per line), so jobs can be drawn in another process
(`probes.report.charts.render`, where `ChartJob` is defined: the drawing needs nothing of the
report's model) without sending the report's data there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from probes.report._rollout import INVENTORY
from probes.report.charts import ChartJob
from probes.report.model import METRIC_LABELS, PathSection, Period, Report
from probes.verdict.rules import CODES, State

__all__ = ["NARROW", "WIDE", "chart_jobs", "metric_values", "metrics_for"]

F64 = npt.NDArray[np.float64]
WIDE = (12.4, 2.9)
NARROW = (6.2, 2.5)


def metric_values(period: Period, section: PathSection, metric: str) -> dict[str, F64]:
    """Per cohort, the metric in each chart bucket (NaN where the bucket has no data)."""
    data = period.data
    p = data.path_index(section.path)
    out = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for cohort in section.cohorts:
            c = data.cohort_index(cohort)
            ch = {k: v[p, c] for k, v in data.chart.items()}
            if metric == "success_rate":
                v = np.where(ch["requests"] > 0, 100.0 * (1 - ch["errors"] / ch["requests"]),
                             np.nan)
            elif metric == "latency_p99_ms":
                v = ch["p99_s"] * 1000.0
            elif metric == "attempts_per_request":
                v = np.where(ch["attempts_count"] > 0,
                             ch["attempts_sum"] / ch["attempts_count"], np.nan)
            else:
                v = np.where(ch["stream_seconds"] > 0,
                             ch["stream_resets"] / (ch["stream_seconds"] / 3600.0), np.nan)
            out[cohort] = np.asarray(v, dtype=np.float64)
    return out


def limits(values: Sequence[F64], metric: str) -> tuple[float, float] | None:
    """A y range holding every finite value, with a little room (None: no values)."""
    finite = [v[np.isfinite(v)] for v in values]
    allv = np.concatenate(finite) if finite else np.zeros(0)
    if not allv.size:
        return None
    lo, hi = float(allv.min()), float(allv.max())
    pad = max((hi - lo) * 0.08, abs(hi) * 0.002) or 1.0  # all zero: show 0..1, not 0..1e-6
    top = min(hi + pad, 100.0 + pad / 4) if metric == "success_rate" else hi + pad
    bottom = lo - pad
    if bottom < 0 <= lo:
        bottom = 0.0
    return bottom, top


def metrics_for(sections: Sequence[PathSection]) -> list[str]:
    """The metrics charted for a path: those it has data for (a stream-only path makes no
    calls, so it has no success rate or p99 to draw)."""
    out = []
    if any(s.has_calls for s in sections):
        out.append("success_rate")
    if any(s.has_latency for s in sections):
        out.append("latency_p99_ms")
    if any(s.has_attempts for s in sections):
        out.append("attempts_per_request")
    if any(s.has_streams for s in sections):
        out.append("stream_resets_per_hour")
    return out


def _events(period: Period, section: PathSection) -> dict[str, F64]:
    kinds = sorted({e.kind for e in section.events})
    return {k: np.array([e.at for e in section.events if e.kind == k]) for k in kinds}


def _runs(period: Period, section: PathSection) -> tuple[tuple[float, float, int], ...]:
    """(start, width, state) per run of equal verdict states over [since, until).

    A look's state holds from the look (its end time) until the next one, as a gate asking
    in between would have been told; before the first look nothing was judged yet.
    """
    grid = period.data.grid
    tracks = section.judgement.tracks
    at = np.minimum(grid.look_ends, period.until)
    states = tracks.state if tracks is not None else np.full(at.size, CODES[State.NOT_APPLICABLE])
    starts = np.concatenate([[period.since], at])
    ends = np.concatenate([at, [period.until]])
    codes = np.concatenate([[CODES[State.NOT_APPLICABLE]], states]).astype(np.int8)
    keep = ends > starts
    starts, ends, codes = starts[keep], ends[keep], codes[keep]
    # One bar per run of equal states: a bar per look would be hundreds of SVG paths.
    change = np.flatnonzero(np.diff(codes)) + 1
    first = np.concatenate([[0], change]).astype(np.int64)
    last = np.concatenate([change, [codes.size]]).astype(np.int64) - 1
    return tuple((float(starts[a]), float(ends[b] - starts[a]), int(codes[a]))
                 for a, b in zip(first, last, strict=True))


def _rollout_job(index: int, period: Period, section: PathSection,
                 size: tuple[float, float], kinds: tuple[str, ...]) -> ChartJob:
    source = ("fleet inventory" if period.rollout_source == INVENTORY else
              "probed endpoints, all paths")
    at = np.clip(period.data.grid.edges, period.since, period.until)
    series: dict[str, F64] = {}
    rollout = section.rollout
    if rollout is not None and not rollout.empty:
        shares = rollout.sample(at) * 100.0
        series = {v: np.nan_to_num(shares[i]) for i, v in enumerate(rollout.versions)}
    return ChartJob(
        index=index, kind="rollout", path=section.path, period=period.label,
        title=f"{section.path}: rollout progress ({source}) and verdict state", size=size,
        since=period.since, until=period.until, x=at, series=series, ylim=(0.0, 100.0),
        events=_events(period, section), event_kinds=kinds,
        crossings=tuple(d.at for d in section.divergences), runs=_runs(period, section),
        empty_note="" if series else "no rollout data",
    )


def chart_jobs(report: Report) -> list[ChartJob]:
    """Every chart of `report`, in page order.

    One period: the metric charts, then the rollout chart at full width. With a compared
    period, each chart of this period is followed by the same chart of the compared one,
    at half width on the same y scale, so the two read side by side.
    """
    current, compared = report.current, report.compared
    jobs: list[ChartJob] = []
    for section in current.sections:
        before = compared.section(section.path) if compared is not None else None
        pairs = [(current, section)]
        if compared is not None and before is not None:
            pairs.append((compared, before))
        for metric in metrics_for([s for _, s in pairs]):
            values = [metric_values(per, s, metric) for per, s in pairs]
            ylim = limits([v for vs in values for v in vs.values()], metric)
            for (per, s), series in zip(pairs, values, strict=True):
                crossing = tuple(d.at for d in s.divergences if d.metric == metric)
                jobs.append(ChartJob(
                    index=len(jobs), kind=metric, path=s.path, period=per.label,
                    title=f"{s.path}: {METRIC_LABELS[metric]}", size=NARROW,
                    since=per.since, until=per.until, x=per.data.grid.centers, series=series,
                    ylim=ylim, events=_events(per, s),
                    event_kinds=tuple(sorted({e.kind for e in per.events})),
                    crossings=crossing,
                ))
        for per, s in pairs:
            size = NARROW if compared is not None else WIDE
            kinds = tuple(sorted({e.kind for e in per.events}))
            jobs.append(_rollout_job(len(jobs), per, s, size, kinds))
    return jobs
