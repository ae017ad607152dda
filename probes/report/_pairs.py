"""A relay path's pair matrix in the report: caller version × callee version.

Each cell's state is what `skewprobe verdict --at <end of the range>` says of that pair
(`probes.verdict.pairs.pair_matrix`, the same code the CLI and a running probe's `/verdict` use:
every pair against the old-old pair, α split over the pairs), and its figures (calls,
success rate, p99, attempts per request) are the pair cohort's, pooled over the range like
every other figure in the report. Stale routing is judged per caller version, beside it.
The pair verdict is not replayed look by look: a relay path has no first divergence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from probes.report._collect import Collected
from probes.report.summary import CohortFigures
from probes.spec import JudgingSettings
from probes.types import pair_cohort, split_pair
from probes.verdict.entry import Query, StoreSource, verdict
from probes.verdict.pairs import CallerStale, PairMatrix

__all__ = ["PairView", "PairsSection", "pair_sections", "relay_paths_in"]


@dataclass(frozen=True, slots=True)
class PairView:
    """One cell: the pair's state at the end of the range, why, and its pooled figures."""

    caller: str
    callee: str
    state: str  # baseline | pass | fail | inconclusive
    reason: str
    requests: int
    success: float | None
    p99_ms: float | None
    attempts: float | None


@dataclass(frozen=True, slots=True, eq=False)
class PairsSection:
    """The matrix of one relay path, as the report shows it."""

    matrix: PairMatrix
    judged_at: float
    cells: tuple[PairView, ...]

    @property
    def verdict(self) -> str:
        return self.matrix.verdict

    @property
    def stale(self) -> tuple[CallerStale, ...]:
        return self.matrix.stale

    def cell(self, caller: str, callee: str) -> PairView | None:
        return next((c for c in self.cells if (c.caller, c.callee) == (caller, callee)), None)

    def rows(self) -> list[tuple[str, list[PairView | None]]]:
        """A row per caller version (oldest first), a cell per callee version (None: the
        pair was never measured)."""
        return [(a, [self.cell(a, b) for b in self.matrix.callees])
                for a in self.matrix.callers]


def relay_paths_in(data: Collected, paths: Sequence[int]) -> set[str]:
    """The paths (of `paths`, indices into `data`) whose cohorts are caller -> callee pairs."""
    pairs = np.array([split_pair(c) is not None for c in data.cohorts], dtype=bool)
    return {data.paths[p] for p in paths if (data.present[p] & pairs).any()}


def pair_sections(store_path: str, data: Collected, names: Collection[str],
                  settings: JudgingSettings, figures: Mapping[str, Sequence[CohortFigures]],
                  ) -> dict[str, PairsSection]:
    """Per relay path in `names`, its matrix judged at the end of the range (`data.until`)
    with the report's settings, each cell with the pair's figures pooled over the range."""
    if not names:
        return {}  # asking for no path would judge every direct path
    judging = dataclasses.replace(settings, window_s=data.window_s)
    # One ask for every relay path: a matrix each, no direct path.
    answer = verdict(Query(now=data.until, path=sorted(names)), judging,
                     StoreSource(store_path))
    out = {}
    for matrix in answer.matrices:
        name = matrix.path
        pooled = {f.cohort: f for f in figures.get(name, ())}
        cells = []
        for judged in matrix.cells:
            f = pooled.get(pair_cohort(judged.caller, judged.callee))
            cells.append(PairView(
                judged.caller, judged.callee, judged.verdict, judged.reason,
                0 if f is None else f.requests,
                None if f is None else f.callee_success_rate,
                None if f is None else f.p99_ms,
                None if f is None else f.attempts_per_request))
        out[name] = PairsSection(matrix, data.until, tuple(cells))
    return out
