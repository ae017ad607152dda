"""Per-endpoint figures: the worst pods by error count, and the endpoints probed per version.

Endpoint windows are many (a day of 50 paths x 6 pods at 10 s is 2.6 million), so the
worst pods are found in two sums the store does (`Store.read_endpoint_totals`): the windows
that had errors, summed per endpoint (exact error counts; fast, as most windows have
none), then the whole range for the few worst endpoints only. A store without that method
is read an hour at a time and summed here (same result, slower).

Which endpoints were probed on which version (the rollout's share when the store has no
inventory snapshots) is sampled from the first window of every chart bucket: pods change
version only by restarting, so a bucket's first window tells its state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from probes.report._collect import TimeGrid
from probes.store import Store
from probes.types import EndpointWindow

__all__ = ["EndpointTotal", "PathErrors", "WorstEndpoint", "probed_per_bucket", "worst"]

_SLICE_S = 3600.0


@dataclass(frozen=True, slots=True)
class EndpointTotal:
    """One endpoint on one path over a bucket (or the whole range when `bucket` is None)."""

    bucket: float | None
    path: str
    endpoint: str
    cohort: str
    namespace: str
    pod: str
    requests: int
    errors: int


@dataclass(frozen=True, slots=True)
class WorstEndpoint:
    """One pod's calls and errors over all paths in the range, and the paths that erred."""

    pod: str
    namespace: str
    version: str
    requests: int
    errors: int
    paths: tuple[tuple[str, int], ...]

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class PathErrors:
    """A pod's errors on one path (exact), for the path's own short list."""

    pod: str
    namespace: str
    version: str
    errors: int


def _total(w: EndpointWindow, bucket: float | None, requests: int, errors: int) -> EndpointTotal:
    return EndpointTotal(bucket, w.path, w.endpoint, w.cohort, w.labels.get("namespace", ""),
                         w.labels.get("pod", w.endpoint), requests, errors)


def endpoint_totals(store: Store, since: float, until: float, paths: Sequence[str] | None,
                    *, endpoints: Sequence[str] | None = None,
                    failing_only: bool = False) -> list[EndpointTotal]:
    """Endpoint windows summed per (path, endpoint, cohort) over [since, until)."""
    bulk = getattr(store, "read_endpoint_totals", None)
    if bulk is not None:
        rows = bulk(since, until, paths=paths, endpoints=endpoints, failing_only=failing_only)
        return [_total(w, None, w.requests, w.errors) for w in rows]
    wanted = None if endpoints is None else set(endpoints)
    sums: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    first: dict[tuple[str, str, str], EndpointWindow] = {}
    lo = since
    while lo < until:
        hi = min(until, lo + _SLICE_S)
        for w in store.read_endpoint_windows(since=lo, until=hi, paths=paths):
            if (wanted is not None and w.endpoint not in wanted) or (
                    failing_only and not w.errors):
                continue
            key = (w.path, w.endpoint, w.cohort)
            acc = sums[key]
            acc[0] += w.requests
            acc[1] += w.errors
            first.setdefault(key, w)
        lo = hi
    return [_total(first[k], None, r, e) for k, (r, e) in sorted(sums.items())]


def worst(store: Store, since: float, until: float, paths: Sequence[str] | None,
          *, limit: int = 10, per_path: int = 3
          ) -> tuple[list[WorstEndpoint], dict[str, list[PathErrors]]]:
    """The `limit` pods with the most errors (all paths), and each path's `per_path` worst."""
    failing = endpoint_totals(store, since, until, paths, failing_only=True)
    errors: dict[tuple[str, str, str], int] = defaultdict(int)
    pod_of: dict[tuple[str, str, str], str] = {}
    on_path: dict[str, list[PathErrors]] = defaultdict(list)
    for t in failing:
        key = (t.endpoint, t.namespace, t.cohort)
        errors[key] += t.errors
        pod_of[key] = t.pod
        on_path[t.path].append(PathErrors(t.pod, t.namespace, t.cohort, t.errors))
    top = sorted(errors, key=lambda k: (-errors[k], k))[:limit]
    exact = endpoint_totals(store, since, until, paths, endpoints=sorted({k[0] for k in top}))
    calls: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    by_path: dict[tuple[str, str, str], dict[str, int]] = defaultdict(dict)
    for t in exact:
        key = (t.endpoint, t.namespace, t.cohort)
        calls[key][0] += t.requests
        calls[key][1] += t.errors
        if t.errors:
            by_path[key][t.path] = t.errors
    ranked = [
        WorstEndpoint(pod_of[k], k[1], k[2], calls[k][0], calls[k][1],
                      tuple(sorted(by_path[k].items(), key=lambda kv: (-kv[1], kv[0]))))
        for k in top
    ]
    ranked.sort(key=lambda w: (-w.errors, -w.error_rate, w.pod))
    lists = {p: sorted(v, key=lambda e: (-e.errors, e.pod))[:per_path] for p, v in on_path.items()}
    return ranked, lists


def probed_per_bucket(store: Store, grid: TimeGrid, since: float, until: float,
                      window_s: float, paths: Sequence[str] | None) -> list[EndpointTotal]:
    """Endpoints with calls in the first window of each bucket, per path and version."""
    out: list[EndpointTotal] = []
    for edge in grid.edges[:-1]:
        lo = max(float(edge), since)
        if lo >= until:
            break
        rows: Iterable[EndpointWindow] = store.read_endpoint_windows(
            since=lo, until=min(until, lo + window_s), paths=paths)
        out.extend(_total(w, float(edge), w.requests, w.errors) for w in rows if w.requests)
    return out
