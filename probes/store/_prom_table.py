"""Counter samples → per-row increases → the columns `probes.verdict.judge` reads.

Pure numpy, no I/O: `probes.store.prometheus` fetches the samples and calls these.

Samples arrive as a matrix per metric: row 0 holds each series' value at the range start
(NaN: absent), row k its value at the end of the k-th row (NaN: no sample then). A row's
increase is the difference of consecutive values, per series:

- a series absent at the start and present later started from zero (the probe creates a
  child on its first call, so its first value counts in full);
- a series missing for a while (failed scrapes leave staleness markers) keeps its last
  value, so what happened meanwhile lands in the row of its next sample;
- a counter reset is decided per *target* (the labels that are not the metric's own, i.e.
  job, instance and any external labels): when any series of a target goes down, every
  series of that target restarts from zero, as Prometheus' rate() assumes for one series.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from probes.store.table import F64, I64, WindowColumns

__all__ = [
    "LatencySpan",
    "PrometheusTable",
    "Samples",
    "assemble",
    "bucket_counts",
    "common_edges",
    "increases",
    "level_changes",
]

# Labels of skewprobe's own series; every other label identifies the target (the probe).
OWN_LABELS: Final = frozenset({"__name__", "path", "cohort", "outcome", "le", "reason"})

# (path, cohort, from, to): the latency of one path x cohort between two row boundaries.
LatencySpan = tuple[str, str, float, float]


@dataclass(frozen=True, slots=True, eq=False)
class Samples:
    """One metric's series: `values[0]` at the range start, `values[k]` at row k's end."""

    labels: tuple[Mapping[str, str], ...]
    values: F64

    @property
    def steps(self) -> int:
        return int(self.values.shape[0]) - 1

    def targets(self) -> I64:
        """A group id per series: series of the same target share it."""
        ids: dict[tuple[tuple[str, str], ...], int] = {}
        return np.array(
            [ids.setdefault(tuple(sorted((k, v) for k, v in lab.items() if k not in OWN_LABELS)),
                            len(ids)) for lab in self.labels],
            dtype=np.int64,
        )


def increases(samples: Samples) -> F64:
    """(steps, series) counter increases per row (module docstring for the rules)."""
    values = samples.values
    n_series = values.shape[1]
    out = np.zeros((samples.steps, n_series))
    if not n_series:
        return out
    groups = samples.targets()
    last = np.nan_to_num(values[0], nan=0.0)
    for k in range(1, values.shape[0]):
        v = values[k]
        seen = ~np.isnan(v)
        down = seen & (v < last)
        if down.any():
            reset = np.zeros(int(groups.max()) + 1, dtype=bool)
            reset[groups[down]] = True
            last = np.where(reset[groups], 0.0, last)
        out[k - 1] = np.where(seen, v - last, 0.0)
        last = np.where(seen, v, last)
    return out


def level_changes(samples: Samples) -> F64:
    """(steps, series) changes of a gauge per row; a missing sample keeps the last level."""
    values = samples.values
    level = np.nan_to_num(values[0], nan=0.0)
    out = np.zeros((samples.steps, values.shape[1]))
    for k in range(1, values.shape[0]):
        nxt = np.where(np.isnan(values[k]), level, values[k])
        out[k - 1] = nxt - level
        level = nxt
    return out


def _by_key(
    labels: Sequence[Mapping[str, str]], per_row: F64, key: tuple[str, ...]
) -> dict[tuple[str, ...], F64]:
    """Per-row sums over the series that share the values of the `key` labels."""
    out: dict[tuple[str, ...], F64] = {}
    for i, lab in enumerate(labels):
        k = tuple(lab.get(name, "") for name in key)
        acc = out.get(k)
        out[k] = per_row[:, i].copy() if acc is None else acc + per_row[:, i]
    return out


def _le(text: str) -> float:
    return float("inf") if text == "+Inf" else float(text)


def common_edges(labels: Sequence[Mapping[str, str]]) -> tuple[str, ...]:
    """The `le` values every (target, path, cohort) histogram has, sorted: counts at those
    edges are exact for each, so their sums are exact (probes of two versions may export
    different buckets). Raises ValueError for a histogram without +Inf."""
    groups = Samples(tuple(labels), np.zeros((1, len(labels)))).targets()
    seen: dict[tuple[int, str, str], set[str]] = {}
    for g, lab in zip(groups.tolist(), labels, strict=True):
        seen.setdefault((g, lab.get("path", ""), lab.get("cohort", "")), set()).add(lab["le"])
    if not seen:
        return ()
    common = set.intersection(*seen.values())
    if "+Inf" not in common:
        raise ValueError("a latency histogram has no +Inf bucket")
    return tuple(sorted(common, key=_le))


def bucket_counts(buckets: Samples, les: Sequence[str]) -> dict[tuple[str, str], I64]:
    """Per path x cohort, the calls in each bucket of `les` summed over every row."""
    total = increases(buckets).sum(axis=0, keepdims=True)
    keep = [i for i, lab in enumerate(buckets.labels) if lab["le"] in les]
    sums = _by_key([buckets.labels[i] for i in keep], total[:, keep], ("path", "cohort", "le"))
    out: dict[tuple[str, str], I64] = {}
    for key in sorted({k[:2] for k in sums}):
        cum = np.array([sums.get((*key, le), np.zeros(1))[0] for le in les])
        out[(key[0], key[1])] = np.maximum(np.diff(_ints(cum), prepend=0), 0)
    return out


def _edges(les: Sequence[str]) -> tuple[F64, F64]:
    finite = np.array([_le(x) for x in les[:-1]], dtype=np.float64)
    top = 2.0 * finite[-1] if finite.size else 1.0  # only the last bucket's midpoint uses it
    return np.concatenate(([0.0], finite)), np.concatenate((finite, [top]))


def _ints(x: F64) -> I64:
    # Increases of integer counters are exact in float64; rint only drops float noise.
    return np.asarray(np.rint(np.maximum(x, 0.0)), dtype=np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class PrometheusTable(WindowColumns):
    """Path windows rebuilt from Prometheus, as the columns `judge()` reads from a store's
    `WindowTable` (same names, same meaning; see `probes.store.table`).

    Rows may differ in length (`length`): the source reads a long range in windows at its
    two ends and in longer rows between (`probes.store.prometheus`). Latency is read only
    when pooled (`latency_by_group`, the way `judge()` reads it), over the exported
    histogram's buckets: bucket j holds (lower[j], upper[j]] of `latency_edges`, the first
    from 0, the last to +inf; `judge()` runs the p99 test on those edges. `lag_max_s` is 0:
    the probes' per-path lag is not exported.
    """

    latency_les: tuple[str, ...]
    latency_reader: Callable[[Sequence[LatencySpan]], Sequence[I64]] = field(repr=False)

    @property
    def latency_edges(self) -> tuple[F64, F64]:
        """(lower, upper) bucket edges in seconds."""
        return _edges(self.latency_les) if self.latency_les else (np.zeros(0), np.zeros(0))

    def latency_by_group(self, group: npt.ArrayLike, n_groups: int) -> I64:
        """(n_groups, buckets) pooled latency counts; `group[row]` = -1 skips the row.

        Each maximal run of a path x cohort's consecutive rows in one group is one span read
        from Prometheus (rows without calls between them add nothing: a row exists wherever
        the requests counter moved, and the histogram moves with it in the same scrape).
        """
        g = np.asarray(group, dtype=np.int64)
        if g.shape != (len(self),):
            raise ValueError("group must give one id per row")
        out = np.zeros((n_groups, len(self.latency_les)), dtype=np.int64)
        runs: list[tuple[int, LatencySpan]] = []
        for p in range(len(self.paths)):
            for c in range(len(self.cohorts)):
                rows = np.flatnonzero((self.path == p) & (self.cohort == c))
                begin = 0
                for i in range(1, rows.size + 1):
                    if i == rows.size or g[rows[i]] != g[rows[begin]]:
                        first, last = rows[begin], rows[i - 1]
                        if g[first] >= 0:
                            runs.append((int(g[first]), (
                                self.paths[p], self.cohorts[c], float(self.start[first]),
                                float(self.start[last] + self.length[last]))))
                        begin = i
        if runs and self.latency_les:
            for (gid, _), counts in zip(runs, self.latency_reader([r for _, r in runs]),
                                        strict=True):
                out[gid] += counts
        return out

    def totals(self, path: str, cohort: str) -> dict[str, float]:
        """Sums over every row of one path x cohort (for tests and reports)."""
        if path not in self.paths or cohort not in self.cohorts:
            return {}
        rows = (self.path == self.paths.index(path)) & (self.cohort == self.cohorts.index(cohort))
        return {
            "requests": int(self.requests[rows].sum()),
            "errors": int((self.requests - self.successes)[rows].sum()),
            "attempts_sum": int(self.attempts_sum[rows].sum()),
            "attempts_count": int(self.attempts_count[rows].sum()),
            "stream_seconds": float(self.stream_seconds[rows].sum()),
            "stream_resets": int(self.stream_resets[rows].sum()),
        }


def assemble(
    starts: F64,
    lengths: F64,
    *,
    les: tuple[str, ...],
    latency_reader: Callable[[Sequence[LatencySpan]], Sequence[I64]],
    requests: Samples,
    attempts: Samples,
    measured: Samples,
    churn: Samples,
    stream_seconds: Samples,
    stream_resets: Samples,
    streams_ended: Samples,
    streams_open: Samples,
) -> PrometheusTable:
    """The rows [starts[k], starts[k] + lengths[k]) of every path x cohort that has data."""
    n = starts.size
    pc = ("path", "cohort")

    def per(s: Samples, key: tuple[str, ...], gauge: bool = False) -> dict[tuple[str, ...], F64]:
        return _by_key(s.labels, level_changes(s) if gauge else increases(s), key)

    req = per(requests, (*pc, "outcome"))
    att, mea, chu = per(attempts, pc), per(measured, pc), per(churn, pc)
    sec, ended = per(stream_seconds, pc), per(streams_ended, pc)
    res = per(stream_resets, (*pc, "reason"))
    opened = per(streams_open, pc, gauge=True)

    keys = sorted({(k[0], k[1]) for src in (req, att, mea, chu, sec, res, ended) for k in src})
    outcome_names = tuple(sorted({k[2] for k in req}))
    reasons = tuple(sorted({k[2] for k in res}))
    paths = tuple(sorted({k[0] for k in keys}))
    cohorts = tuple(sorted({k[1] for k in keys}))
    zeros = np.zeros(n)

    def cols(src: Mapping[tuple[str, ...], F64], key: tuple[str, str],
             names: Sequence[str]) -> F64:
        if not names:
            return np.zeros((n, 0))
        return np.stack([src.get((*key, x), zeros) for x in names], axis=1)

    parts: list[dict[str, np.ndarray]] = []
    for key in keys:
        part = {
            "outcomes": _ints(cols(req, key, outcome_names)),
            "attempts_sum": _ints(att.get(key, zeros)),
            "attempts_count": _ints(mea.get(key, zeros)),
            "churn": _ints(chu.get(key, zeros)),
            "stream_seconds": np.maximum(sec.get(key, zeros), 0.0),
            "stream_resets": _ints(cols(res, key, reasons)),
            "streams_opened": _ints(ended.get(key, zeros) + opened.get(key, zeros)),
        }
        has = (
            (part["outcomes"].sum(axis=1) > 0) | (part["stream_seconds"] > 0)
            | (part["streams_opened"] > 0) | (part["stream_resets"].sum(axis=1) > 0)
        )
        rows = np.flatnonzero(has)
        part = {name: col[rows] for name, col in part.items()}
        part["row"] = rows
        part["path"] = np.full(rows.size, paths.index(key[0]))
        part["cohort"] = np.full(rows.size, cohorts.index(key[1]))
        parts.append(part)

    def cat(name: str, width: int | None = None) -> np.ndarray:
        if parts:
            return np.concatenate([p[name] for p in parts])
        return np.zeros((0, width) if width is not None else 0)

    row = cat("row").astype(np.int64)
    order = np.lexsort((cat("cohort"), cat("path"), row))
    outcomes = cat("outcomes", len(outcome_names)).astype(np.int64)[order]
    ok = outcome_names.index("ok") if "ok" in outcome_names else None
    return PrometheusTable(
        paths=paths,
        cohorts=cohorts,
        outcome_names=outcome_names,
        reset_reasons=reasons,
        start=np.asarray(starts, dtype=np.float64)[row[order]],
        length=np.asarray(lengths, dtype=np.float64)[row[order]],
        path=cat("path").astype(np.int32)[order],
        cohort=cat("cohort").astype(np.int32)[order],
        requests=outcomes.sum(axis=1).astype(np.int64),
        successes=outcomes[:, ok] if ok is not None else np.zeros(order.size, dtype=np.int64),
        attempts_sum=cat("attempts_sum").astype(np.int64)[order],
        attempts_count=cat("attempts_count").astype(np.int64)[order],
        churn=cat("churn").astype(np.int64)[order],
        lag_max_s=np.zeros(order.size),
        streams_opened=cat("streams_opened").astype(np.int64)[order],
        stream_seconds=cat("stream_seconds").astype(np.float64)[order],
        outcomes=outcomes,
        stream_resets=cat("stream_resets", len(reasons)).astype(np.int64)[order],
        latency_les=les,
        latency_reader=latency_reader,
    )
