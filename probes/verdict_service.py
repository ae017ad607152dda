"""From the store to a verdict: what `skewprobe verdict`, `GET /verdict` and `POST /gate` share.

`probes.verdict` is pure statistics over windows; this module reads the windows (store →
verdict in the flow), resolves the query (paths, cohorts, the comparison's start), and turns
the result into the DESIGN.md JSON or a table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probes._exceptions import BadInput
from probes._spec import CohortSpec, Config, Tolerances
from probes._timeparse import parse_time
from probes.store import Store
from probes.verdict import judge


@dataclass(frozen=True, slots=True)
class JudgingSettings:
    """The parts of a config that a verdict needs (a verdict needs no targets)."""

    tolerances: Tolerances = Tolerances()
    alpha: float = 0.01
    min_samples: int = 100
    window_s: float = 10.0
    cohort: CohortSpec = CohortSpec()

    @classmethod
    def from_config(cls, config: Config) -> JudgingSettings:
        return cls(
            tolerances=config.tolerances,
            alpha=config.alpha,
            min_samples=config.min_samples,
            window_s=config.window_s,
            cohort=config.cohort,
        )


def load_judging_config(path: str | None) -> JudgingSettings:
    if path is None:
        return JudgingSettings()
    from probes.config import load_config

    return JudgingSettings.from_config(load_config(path))


def compute_verdict(
    store_path: str,
    settings: JudgingSettings | Config,
    *,
    path: str | Sequence[str] | None = None,
    baseline: str | None = None,
    canary: str | None = None,
    since: str | None = None,
    now: float,
    overloaded: bool = False,
) -> Mapping[str, Any]:
    """Read the store and judge. Raises StoreError (exit 4) or BadInput (exit 2)."""
    if isinstance(settings, Config):
        settings = JudgingSettings.from_config(settings)
    paths = [path] if isinstance(path, str) else (list(path) if path else None)
    since_t = parse_time(since, now=now) if since else None
    if since_t is not None and since_t > now:
        raise BadInput(f"--since {since!r} is in the future")
    store = Store.open(store_path, readonly=True)
    try:
        if paths:
            known = set(store.paths())
            unknown = [p for p in paths if p not in known]
            if unknown:
                raise BadInput(f"no data for path(s) {', '.join(unknown)} in {store_path}")
        windows = store.read_windows(since=since_t, paths=paths)
    finally:
        store.close()
    verdict = judge(
        windows,
        tolerances=settings.tolerances,
        alpha=settings.alpha,
        min_samples=settings.min_samples,
        window_s=settings.window_s,
        now=now,
        baseline=baseline or settings.cohort.baseline,
        canary=canary or settings.cohort.canary,
        since=since_t,
        paths=paths,
        overloaded=overloaded,
    )
    return verdict.to_json()


_METRIC_LABELS = {
    "success_rate": ("success", lambda v: f"{v * 100:.2f}%"),
    "latency_p99_ms": ("p99", lambda v: f"{v:.1f}ms"),
    "attempts_per_request": ("attempts/req", lambda v: f"{v:.2f}"),
    "stream_resets_per_hour": ("resets/h", lambda v: f"{v:.1f}"),
}


def format_table(result: Mapping[str, Any]) -> str:
    """A plain-text table: one row per path and metric, then the reasons."""
    rows = [("path", "metric", str(result.get("baseline")), str(result.get("canary")), "verdict")]
    for path in result.get("paths", []):
        rows.append((path["path"], "", "", "", path["verdict"].upper()))
        for name, metric in path.get("metrics", {}).items():
            label, fmt = _METRIC_LABELS.get(name, (name, str))
            cells = [
                fmt(metric[side]) if isinstance(metric.get(side), int | float) else "-"
                for side in ("baseline", "canary")
            ]
            rows.append(("", label, cells[0], cells[1], metric.get("verdict", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.append(f"overall: {result['verdict'].upper()}")
    for reason in result.get("reasons", []):
        lines.append(f"  - {reason}")
    for path in result.get("paths", []):
        for reason in path.get("reasons", []):
            lines.append(f"  - {path['path']}: {reason}")
    return "\n".join(lines)
