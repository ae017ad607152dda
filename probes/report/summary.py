"""Per-path, per-cohort figures pooled over windows: what the demo's table and reports show.

Latency percentiles come from each cohort's pooled histogram (counts added over windows),
never from averaging per-window percentiles.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from probes.measure.histogram import Histogram, counts_from_tuple
from probes.types import Outcome, PathWindow

__all__ = [
    "CohortFigures",
    "format_figures",
    "summarise",
]


@dataclass(slots=True)
class CohortFigures:
    path: str
    cohort: str
    requests: int = 0
    successes: int = 0
    attempts_sum: int = 0
    attempts_count: int = 0
    churn: int = 0
    streams_opened: int = 0
    stream_seconds: float = 0.0
    stream_resets: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    latency: Histogram = field(default_factory=Histogram)

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.requests if self.requests else None

    @property
    def probe_errors(self) -> int:
        """Calls the probe itself could not make: they say nothing about the callee."""
        return self.outcomes.get(Outcome.PROBE_ERROR, 0)

    @property
    def callee_success_rate(self) -> float | None:
        """Success among the calls that reached the callee (probe errors left out, as the
        verdict counts them)."""
        n = self.requests - self.probe_errors
        return self.successes / n if n else None

    @property
    def p99_ms(self) -> float | None:
        return self.latency.quantile(0.99) * 1000 if self.latency.count else None

    @property
    def attempts_per_request(self) -> float | None:
        """None when no call reported its attempts: not measured, never 1."""
        return self.attempts_sum / self.attempts_count if self.attempts_count else None

    @property
    def resets_per_hour(self) -> float | None:
        return self.stream_resets / (self.stream_seconds / 3600) if self.stream_seconds else None


def summarise(windows: Iterable[PathWindow]) -> list[CohortFigures]:
    """Pool windows by (path, cohort), sorted by path then cohort."""
    pooled: dict[tuple[str, str], CohortFigures] = {}
    counts: dict[tuple[str, str], np.ndarray] = {}
    for w in windows:
        key = (w.path, w.cohort)
        fig = pooled.get(key)
        if fig is None:
            fig = pooled[key] = CohortFigures(path=w.path, cohort=w.cohort)
            counts[key] = counts_from_tuple(w.latency).copy()
        else:
            counts[key] += counts_from_tuple(w.latency)
        fig.requests += w.requests
        fig.successes += w.outcomes.get(Outcome.OK, 0)
        fig.attempts_sum += w.attempts_sum
        fig.attempts_count += w.attempts_count
        fig.churn += w.churn
        fig.streams_opened += w.streams_opened
        fig.stream_seconds += w.stream_seconds
        fig.stream_resets += sum(w.stream_resets.values())
        for outcome, n in w.outcomes.items():
            fig.outcomes[outcome] = fig.outcomes.get(outcome, 0) + n
    for key, fig in pooled.items():
        fig.latency = Histogram(counts[key])
    return sorted(pooled.values(), key=lambda f: (f.path, _version_key(f.cohort)))


def _version_key(version: str) -> tuple[int, ...] | tuple[float]:
    parts = version.split("-")[0].split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (float("inf"),)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_figures(rows: Sequence[CohortFigures]) -> str:
    """A plain-text table of the pooled figures."""
    header = ("path", "cohort", "calls", "success", "p99 ms", "attempts/req", "churn",
              "streams", "resets/h", "top errors")
    table = [header]
    for f in rows:
        errors = sorted(((n, o) for o, n in f.outcomes.items() if o != Outcome.OK), reverse=True)
        table.append((
            f.path,
            f.cohort,
            str(f.requests),
            "-" if f.success_rate is None else f"{f.success_rate * 100:.2f}%",
            _cell(f.p99_ms, ".1f"),
            _cell(f.attempts_per_request, ".2f"),
            str(f.churn),
            str(f.streams_opened) if f.streams_opened else "-",
            _cell(f.resets_per_hour, ".1f"),
            ", ".join(f"{o}={n}" for n, o in errors[:2]) or "-",
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    )
