"""Pair cohorts: the caller × callee version matrix of a relay path, judged cell by cell.

A relay path's results are keyed by the pair (caller's proxy version, callee's proxy version),
`probes._types.pair_cohort`. The baseline is the old-old pair (the oldest caller version with
the oldest callee version present); every other pair is the canary of one ordinary verdict
against it (`verdict_service.compute_verdict`, the same statistics, gates and tolerances as
any path), so "correct in isolation, inconsistent between callers" shows as the one cell that
fails. α is split evenly over the cells, so the matrix as a whole keeps the verdict's
false-fail bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probes._spec import Config
from probes._types import pair_cohort, split_pair
from probes.stats.cohorts import version_key
from probes.store import Store
from probes.verdict_service import JudgingSettings, compute_verdict

__all__ = ["PairCell", "PairMatrix", "format_matrix", "pair_matrix", "relay_paths"]

FAIL, PASS, INCONCLUSIVE, BASELINE = "fail", "pass", "inconclusive", "baseline"
_METRICS = (("success_rate", "success"), ("latency_p99_ms", "p99_ms"),
            ("attempts_per_request", "attempts"))


@dataclass(frozen=True, slots=True)
class PairCell:
    """One (caller, callee) pair: its verdict against the old-old pair and its figures."""

    caller: str
    callee: str
    verdict: str  # pass | fail | inconclusive | baseline
    requests: int
    figures: Mapping[str, float | None]  # success, p99_ms, attempts (None: not measured)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"caller": self.caller, "callee": self.callee, "verdict": self.verdict,
                "requests": self.requests, **self.figures, "reason": self.reason or None}


@dataclass(frozen=True, slots=True)
class PairMatrix:
    """A relay path's matrix: callers (rows) × callees (columns), oldest first."""

    path: str
    callers: tuple[str, ...]
    callees: tuple[str, ...]
    cells: tuple[PairCell, ...]

    @property
    def verdict(self) -> str:
        judged = [c.verdict for c in self.cells if c.verdict != BASELINE]
        if FAIL in judged:
            return FAIL
        return PASS if judged and all(v == PASS for v in judged) else INCONCLUSIVE

    def cell(self, caller: str, callee: str) -> PairCell | None:
        return next((c for c in self.cells if (c.caller, c.callee) == (caller, callee)), None)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "verdict": self.verdict, "callers": list(self.callers),
                "callees": list(self.callees), "cells": [c.to_json() for c in self.cells]}


def _ordered(names: set[str]) -> tuple[str, ...]:
    """Versions oldest first; names that are not versions after them, by name."""
    return tuple(sorted(names, key=lambda n: (version_key(n) is None, version_key(n) or (), n)))


def relay_paths(store_path: str) -> list[str]:
    """The paths in a store whose cohorts are pairs (relay paths), by name."""
    store = Store.open(store_path, readonly=True)
    try:
        table = store.read_table()
    finally:
        store.close()
    found: set[str] = set()
    for i, cohort in enumerate(table.cohorts):
        if split_pair(cohort) is not None:
            rows = table.cohort == i
            found.update(table.paths[p] for p in set(table.path[rows].tolist()))
    return sorted(found)


def pair_matrix(
    store_path: str, settings: JudgingSettings | Config, *, path: str, now: float,
    since: str | None = None,
) -> PairMatrix:
    """Judge every pair of `path` against its old-old pair, from the store at `store_path`."""
    if isinstance(settings, Config):
        settings = JudgingSettings.from_config(settings)
    store = Store.open(store_path, readonly=True)
    try:
        table = store.read_table(paths=[path])
    finally:
        store.close()
    pairs = {p for c in set(table.cohort.tolist())
             if (p := split_pair(table.cohorts[c])) is not None}
    callers = _ordered({a for a, _ in pairs})
    callees = _ordered({b for _, b in pairs})
    if not pairs:
        return PairMatrix(path, (), (), ())
    base = (callers[0], callees[0])
    others = sorted(pairs - {base}, key=lambda p: (callers.index(p[0]), callees.index(p[1])))
    share = dataclasses.replace(settings, alpha=settings.alpha / max(1, len(others)))
    cells: list[PairCell] = []
    base_figures: dict[str, float | None] = {}
    base_requests = 0
    for caller, callee in others:
        result = compute_verdict(store_path, share, path=path, since=since, now=now,
                                 baseline=pair_cohort(*base),
                                 canary=pair_cohort(caller, callee))
        judged = (result.get("paths") or [{}])[0]
        metrics = judged.get("metrics", {})
        samples = judged.get("samples", {})
        base_requests = max(base_requests, int(samples.get("baseline") or 0))
        for key, short in _METRICS:
            if key in metrics and metrics[key].get("baseline") is not None:
                base_figures[short] = metrics[key]["baseline"]
        cells.append(PairCell(
            caller, callee, judged.get("verdict", INCONCLUSIVE),
            int(samples.get("canary") or 0),
            {short: metrics.get(key, {}).get("canary") for key, short in _METRICS},
            (judged.get("reasons") or [""])[0] if judged.get("verdict") != PASS else "",
        ))
    figures = {short: base_figures.get(short) for _, short in _METRICS}
    cells.insert(0, PairCell(*base, BASELINE, base_requests, figures))
    return PairMatrix(path, callers, callees, tuple(cells))


def _figure(cell: PairCell) -> str:
    parts = [cell.verdict]
    success, attempts = cell.figures.get("success"), cell.figures.get("attempts")
    if success is not None:
        parts.append(f"{success * 100:.2f}%")
    if attempts is not None:
        parts.append(f"{attempts:.2f} att")
    return " ".join(parts)


def format_matrix(matrix: PairMatrix) -> str:
    """The matrix as a text table: a row per caller version, a column per callee version."""
    head = [f"{matrix.path}: caller \\ callee", *matrix.callees]
    rows = [head]
    for caller in matrix.callers:
        row = [caller]
        for callee in matrix.callees:
            cell = matrix.cell(caller, callee)
            row.append("-" if cell is None else _figure(cell))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines += [f"  {c.caller} -> {c.callee}: {c.verdict}: {c.reason}"
              for c in matrix.cells if c.verdict in (FAIL, INCONCLUSIVE) and c.reason]
    return "\n".join([*lines, f"pairs verdict: {matrix.verdict}"])
