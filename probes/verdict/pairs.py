"""Pair cohorts: the caller × callee version matrix of a relay path, judged cell by cell.

A relay path's results are keyed by the pair (caller's proxy version, callee's proxy version),
`probes.types.pair_cohort`. The baseline is the old-old pair (the oldest caller version with
the oldest callee version present); every other pair is the canary of one ordinary verdict
against it (`service.compute_verdict`, the same statistics, gates and tolerances as
any path), so "correct in isolation, inconsistent between callers" shows as the one cell that
fails. α is split evenly over the cells, so the matrix as a whole keeps the verdict's
false-fail bound.

Stale routing is judged per **caller** version, not per pair: `stale_endpoint` calls are the
caller's proxy routing by a list it no longer updates, whoever answered. A caller version
fails when the anytime-valid confidence sequence of its stale share (`stats.bounded.mean_cs`,
the one-cohort half of the success-rate test) lies wholly above the success-rate tolerance;
it passes when the sequence lies wholly below it. The old-old pair is no refuge here: when the
control plane moves past the oldest callers, their own pair is the stale one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from probes._parsing import parse_time
from probes.spec import JudgingSettings
from probes.stats.bounded import mean_cs
from probes.stats.cohorts import version_key
from probes.store import Store
from probes.store.table import WindowColumns
from probes.types import Outcome, pair_cohort, split_pair
from probes.verdict.rules import State, combine
from probes.verdict.service import (
    FROM_STORE,
    SourceJudge,
    _Overload,
    compute_verdict,
    verdict_from_source,
)

__all__ = ["CallerStale", "PairCell", "PairMatrix", "PairedVerdict", "format_matrix",
           "judge_matrix", "pair_matrix", "relay_paths", "stale_by_caller"]

FAIL, PASS, INCONCLUSIVE = State.FAIL, State.PASS, State.INCONCLUSIVE
# The old-old pair's cell: the baseline every other cell is judged against, not a state.
BASELINE = "baseline"
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
class CallerStale:
    """Stale routing seen from one caller version: its relay calls, the stale ones, the
    confidence sequence of the share and the verdict against the tolerance."""

    caller: str
    calls: int
    stale: int
    lower: float
    upper: float
    verdict: State

    @property
    def share(self) -> float:
        return self.stale / self.calls if self.calls else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"caller": self.caller, "calls": self.calls, "stale": self.stale,
                "share": self.share, "lower": self.lower, "upper": self.upper,
                "verdict": self.verdict}


@dataclass(frozen=True, slots=True)
class PairMatrix:
    """A relay path's matrix: callers (rows) × callees (columns), oldest first."""

    path: str
    callers: tuple[str, ...]
    callees: tuple[str, ...]
    cells: tuple[PairCell, ...]
    stale: tuple[CallerStale, ...] = ()

    @property
    def verdict(self) -> State:
        return combine([*(c.verdict for c in self.cells if c.verdict != BASELINE),
                        *(s.verdict for s in self.stale)])

    def cell(self, caller: str, callee: str) -> PairCell | None:
        return next((c for c in self.cells if (c.caller, c.callee) == (caller, callee)), None)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "verdict": self.verdict, "callers": list(self.callers),
                "callees": list(self.callees), "cells": [c.to_json() for c in self.cells],
                "stale": [s.to_json() for s in self.stale]}


def _ordered(names: set[str]) -> tuple[str, ...]:
    """Versions oldest first; names that are not versions after them, by name."""
    return tuple(sorted(names, key=lambda n: (version_key(n) is None, version_key(n) or (), n)))


def relay_paths(store_path: str) -> list[str]:
    """The paths in a store whose cohorts are pairs (relay paths), by name."""
    store = Store.open(store_path, readonly=True)
    try:
        pairs = [c for c in store.cohorts() if split_pair(c) is not None]
        # Only the pair cohorts' rows: a store without relay paths reads no windows.
        table = store.read_table(cohorts=pairs) if pairs else None
    finally:
        store.close()
    if table is None:
        return []
    return sorted({table.paths[p] for p in set(table.path.tolist())})


def pair_matrix(
    store_path: str, settings: JudgingSettings, *, path: str, now: float,
    since: str | None = None, every_window: bool = False,
    overload: str | _Overload | None = FROM_STORE,
) -> PairMatrix:
    """Judge every pair of `path` against its old-old pair, from the store at `store_path`.

    As `skewprobe verdict` judges, the latency of windows whose sends were late (an
    overloaded probe) is left out of p99; `every_window` judges every window it wrote
    (for tests about pairs, not about a loaded machine's overload rule, as
    `verdict_from_source` is used elsewhere). `overload`
    as `compute_verdict` takes it (a running probe knows its own)."""
    since_t = parse_time(since, now=now) if since else None
    store = Store.open(store_path, readonly=True)
    try:
        table = store.read_table(since=since_t, until=now, paths=[path])
    finally:
        store.close()

    def judge(share: JudgingSettings, **query: Any) -> Mapping[str, Any]:
        if every_window:
            with Store.open(store_path, readonly=True) as source:
                return verdict_from_source(source, share, now=now, **query)
        return compute_verdict(store_path, share, overload=overload, now=now, **query)

    return judge_matrix(table, settings, judge, path=path, since=since, now=now)


def judge_matrix(table: WindowColumns, settings: JudgingSettings, judge: SourceJudge, *,
            path: str, since: str | None, now: float) -> PairMatrix:
    """The matrix of `path` from its rows in `table` (any source's): each pair other than
    the old-old one judged against it by `judge`, with α split over them; stale routing
    per caller version from the same rows."""
    # Only the windows that had ended by `now`, as the verdict reads them (`--at`).
    ended = table.start + table.length <= now + 1e-6
    of_cohort = [split_pair(c) for c in table.cohorts]
    pairs = {p for c in set(table.cohort[ended].tolist()) if (p := of_cohort[c]) is not None}
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
        result = judge(share, path=path, since=since, baseline=pair_cohort(*base),
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
    stale = _judge_stale(_caller_counts(table, ended), settings)
    return PairMatrix(path, callers, callees, tuple(cells), stale)


def _caller_counts(table: WindowColumns, ended: np.ndarray) -> dict[str, tuple[int, int]]:
    """Relay calls and `stale_endpoint` calls per caller version, over every pair cohort in
    the `ended` rows of `table` (callers oldest first)."""
    col = (table.outcome_names.index(Outcome.STALE_ENDPOINT)
           if Outcome.STALE_ENDPOINT in table.outcome_names else None)
    calls: dict[str, tuple[int, int]] = {}
    for i, cohort in enumerate(table.cohorts):
        pair = split_pair(cohort)
        rows = (table.cohort == i) & ended
        if pair is not None and rows.any():
            n, k = calls.get(pair[0], (0, 0))
            calls[pair[0]] = (n + int(table.requests[rows].sum()),
                              k + (0 if col is None else int(table.outcomes[rows, col].sum())))
    return {c: calls[c] for c in _ordered(set(calls))}


def _judge_stale(calls: Mapping[str, tuple[int, int]], settings: JudgingSettings,
                 ) -> tuple[CallerStale, ...]:
    tolerance = settings.tolerances.success_rate_drop_pp / 100.0
    log_threshold = math.log(max(1, len(calls)) / settings.alpha)  # α split over the callers
    return tuple(_caller_stale(c, n, k, tolerance, log_threshold, settings.min_samples)
                 for c, (n, k) in calls.items())


def stale_by_caller(store_path: str, settings: JudgingSettings, *, since: float,
                    until: float) -> tuple[CallerStale, ...]:
    """Stale routing per caller version over every relay path of a store, from the windows
    that started at `since` or later and had ended by `until` (what `skewprobe inventory`
    shows next to the skew bound), judged as the pair matrix judges it."""
    store = Store.open(store_path, readonly=True)
    try:
        pairs = [c for c in store.cohorts() if split_pair(c) is not None]
        if not pairs:
            return ()
        table = store.read_table(since=since, until=until, cohorts=pairs)
    finally:
        store.close()
    return _judge_stale(_caller_counts(table, table.start + table.length <= until + 1e-6),
                        settings)


def _caller_stale(caller: str, calls: int, stale: int, tolerance: float,
                  log_threshold: float, min_samples: int) -> CallerStale:
    lower, upper = (float(x) for x in mean_cs(stale, calls, log_threshold))
    if lower > tolerance:
        verdict = FAIL
    elif upper <= tolerance and calls >= min_samples:
        verdict = PASS
    else:
        verdict = INCONCLUSIVE
    return CallerStale(caller, calls, stale, lower, upper, verdict)


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
    lines += [f"  stale routing seen from callers on {s.caller}: {s.share * 100:.1f} % of relay"
              f" calls ({s.stale} of {s.calls}): {s.verdict}"
              for s in matrix.stale if s.stale or s.verdict == FAIL]
    return "\n".join([*lines, f"pairs verdict: {matrix.verdict}"])


def _reasons(matrix: PairMatrix) -> list[str]:
    """Why a matrix did not pass, as lines of the verdict's `reasons`: every failing pair and
    caller version when it fails, else the first undecided pair."""
    def cells(state: str) -> list[str]:
        return [f"{matrix.path}: pair {pair_cohort(c.caller, c.callee)} {state}: "
                f"{c.reason or 'no decision yet'}" for c in matrix.cells if c.verdict == state]

    if matrix.verdict == FAIL:
        return [*cells(FAIL),
                *(f"{matrix.path}: stale routing seen from callers on {s.caller}: "
                  f"{s.share * 100:.1f} % of relay calls ({s.stale} of {s.calls}): {FAIL}"
                  for s in matrix.stale if s.verdict == FAIL)]
    if matrix.verdict == INCONCLUSIVE:
        undecided = cells(INCONCLUSIVE) or [
            f"{matrix.path}: stale routing from callers on {s.caller}: {INCONCLUSIVE}"
            for s in matrix.stale if s.verdict == INCONCLUSIVE]
        return undecided[:1] or [f"{matrix.path}: no pair to judge yet"]
    return []


@dataclass(frozen=True, slots=True)
class PairedVerdict:
    """A store's verdict with its relay paths: `direct`, the verdict JSON of the other paths
    (None when every path asked is a relay path), and a matrix per relay path. A failing
    pair fails the whole; a pass needs every path and every matrix to pass."""

    direct: Mapping[str, Any] | None
    matrices: tuple[PairMatrix, ...]

    @property
    def verdict(self) -> State:
        return combine([*([self.direct["verdict"]] if self.direct else []),
                               *(m.verdict for m in self.matrices)])

    def to_json(self) -> dict[str, Any]:
        """The verdict JSON; `pairs` added (one matrix per relay path) when there are any."""
        doc: dict[str, Any] = dict(self.direct) if self.direct else {
            "verdict": INCONCLUSIVE, "baseline": None, "canary": None,
            "window": {"from": None, "to": None}, "paths": [], "reasons": []}
        if not self.matrices:
            return doc
        pair_reasons = [r for m in self.matrices for r in _reasons(m)]
        return {**doc, "verdict": self.verdict,
                "reasons": [*pair_reasons, *doc.get("reasons", [])],
                "pairs": [m.to_json() for m in self.matrices]}

    def format(self, table: Callable[[Mapping[str, Any]], str]) -> str:
        """The text form: `table` of the direct paths, then each matrix."""
        parts = [table(self.direct)] if self.direct else []
        parts += [format_matrix(m) for m in self.matrices]
        return "\n\n".join(parts)
