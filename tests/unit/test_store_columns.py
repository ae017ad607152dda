"""Row algebra on the store's column dataclasses (`probes.store.columns`): joins re-index
names, sums keep counts exact, and a column another change adds flows through untouched."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from probes.store.columns import concat, reduce, take
from probes.store.table import EndpointColumns, EndpointLatency

_NO_LATENCY = EndpointLatency.empty()  # the schema's own records, not asked for here


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class WithAttempts(EndpointColumns):
    """EndpointColumns as a later schema may have them: per-endpoint attempts per row, and a
    compressed-row latency histogram."""

    attempts: np.ndarray
    latency_ptr: np.ndarray
    latency_bucket: np.ndarray
    latency_count: np.ndarray


def cols(paths: tuple[str, ...], endpoints: tuple[str, ...], rows: list[tuple]) -> WithAttempts:
    start, path, endpoint, requests, attempts, hist = zip(*rows, strict=True)
    ptr = np.cumsum([0, *(len(h) for h in hist)])
    return WithAttempts(
        paths=paths, endpoints=endpoints, cohorts=("v1",), start=np.array(start, float),
        path=np.array(path, np.int32), endpoint=np.array(endpoint, np.int32),
        cohort=np.zeros(len(rows), np.int32), requests=np.array(requests, np.int64),
        errors=np.zeros(len(rows), np.int64), started=np.full(len(rows), np.nan),
        attempts_sum=np.array(attempts, np.int64), attempts_count=np.array(requests, np.int64),
        unrecorded=np.zeros(len(rows), np.int64), latency=_NO_LATENCY,
        attempts=np.array(attempts, np.int64), latency_ptr=ptr.astype(np.int64),
        latency_bucket=np.array([b for h in hist for b, _ in h], np.uint16),
        latency_count=np.array([c for h in hist for _, c in h], np.uint8))


def named(c: WithAttempts, row: int) -> tuple:
    lo, hi = c.latency_ptr[row], c.latency_ptr[row + 1]
    hist = dict(zip(c.latency_bucket[lo:hi].tolist(), c.latency_count[lo:hi].tolist(),
                    strict=True))
    return (float(c.start[row]), c.paths[c.path[row]], c.endpoints[c.endpoint[row]],
            int(c.requests[row]), int(c.attempts[row]), hist)


def test_a_join_reindexes_names_and_keeps_every_column() -> None:
    a = cols(("search",), ("pod-b",), [(10.0, 0, 0, 5, 6, [(3, 2)])])
    b = cols(("checkout", "search"), ("pod-a", "pod-b"),
             [(20.0, 0, 0, 7, 9, [(1, 1), (4, 250)]), (20.0, 1, 1, 1, 1, [])])
    joined = concat(a, b)
    assert joined.paths == ("checkout", "search") and joined.endpoints == ("pod-a", "pod-b")
    assert [named(joined, r) for r in range(3)] == [
        (10.0, "search", "pod-b", 5, 6, {3: 2}),
        (20.0, "checkout", "pod-a", 7, 9, {1: 1, 4: 250}),
        (20.0, "search", "pod-b", 1, 1, {}),
    ]
    assert [named(take(joined, [2, 0]), r) for r in range(2)] == [
        named(joined, 2), named(joined, 0)]


def test_rows_sum_into_groups_exactly_whatever_the_columns() -> None:
    c = cols(("p",), ("e0", "e1"), [(0.0, 0, 0, 5, 6, [(3, 200)]), (10.0, 0, 1, 1, 2, []),
                                    (20.0, 0, 0, 7, 7, [(3, 200), (5, 1)])])
    out = reduce(c, np.array([0, 1, 0]), 2)
    # Counts add (a pooled bucket outgrows a window's uint8), the start is the newest row's.
    assert named(out, 0) == (20.0, "p", "e0", 12, 13, {3: 400, 5: 1})
    assert named(out, 1) == (10.0, "p", "e1", 1, 2, {})


def test_compressed_rows_pooled_slice_by_slice_are_pooled_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A day of path windows is pooled a slice of entries at a time (memory): slices of a
    # few entries, cut inside groups and across empty rows, give the one-pass sums.
    from probes.store import columns

    rng = np.random.default_rng(3)
    rows = [(float(t), 0, int(rng.integers(2)), int(rng.integers(1, 9)), 1,
             [(int(b), int(rng.integers(1, 200))) for b in sorted(
                 rng.choice(40, int(rng.integers(0, 6)), replace=False))])
            for t in range(60)]
    c = cols(("p",), ("e0", "e1"), rows)
    group = rng.integers(0, 7, len(rows))
    whole = reduce(c, group, 7)
    for size in (1, 3, 50):
        monkeypatch.setattr(columns, "REDUCE_SLICE", size)
        sliced = reduce(c, group, 7)
        assert [named(sliced, r) for r in range(7)] == [named(whole, r) for r in range(7)]
    assert sum(len(named(whole, r)[-1]) for r in range(7)) > 20
