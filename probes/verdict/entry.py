"""One way to ask for a verdict: `verdict(query, settings, source)`.

`skewprobe verdict`, the running probe's `GET /verdict` and `POST /gate` (through its
verdict worker), its last verdict at exit, `skewprobe demo` and the report all ask here.
The query says what is judged and as of when, the settings how (`probes.spec
.JudgingSettings`, the config's `judging`), the source where the windows are:

- `StoreSource`: one probe's SQLite store, direct paths as `service.compute_verdict` judges
  them (the probe's late sends left out of p99) and each relay path as its caller × callee
  matrix (`pairs.pair_matrix`);
- `PrometheusSettings`: every probe's series in Prometheus, the same way;
- an open `service.WindowSource` (a `Store` already open): every window judged as it is,
  direct paths only (the report's per-pod figures at the end of its range).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probes._parsing import parse_time
from probes.spec import JudgingSettings, PrometheusSettings
from probes.store import Store
from probes.verdict.pairs import PairedVerdict, judge_matrix, pair_matrix, relay_paths
from probes.verdict.service import (
    FROM_STORE,
    WindowSource,
    _Overload,
    compute_verdict,
    prometheus_judge,
    verdict_from_source,
)

if TYPE_CHECKING:
    from probes.verdict.cache import VerdictCache

__all__ = ["Query", "Source", "StoreSource", "verdict"]


@dataclass(frozen=True, slots=True)
class Query:
    """What is asked: the verdict as of `now` on `path` (one, several, or None: every
    path), `baseline` against `canary` (None: the settings' cohorts, else picked from the
    versions seen), compared `since` (None: the canary's first window)."""

    now: float
    path: str | Sequence[str] | None = None
    baseline: str | None = None
    canary: str | None = None
    since: str | None = None

    def keywords(self) -> dict[str, Any]:
        """The query as the verdict functions' keywords."""
        return {"path": self.path, "baseline": self.baseline, "canary": self.canary,
                "since": self.since, "now": self.now}


@dataclass(frozen=True, slots=True)
class StoreSource:
    """A probe's SQLite store at `path`. `overload`: the probe's overload reason as the
    running probe knows it (None: not overloaded), or FROM_STORE to read it from the store's
    events (a verdict after the fact); `cache`: the running probe's verdict cache."""

    path: str
    overload: str | _Overload | None = FROM_STORE
    cache: VerdictCache | None = None


Source = StoreSource | PrometheusSettings | WindowSource


def verdict(query: Query, settings: JudgingSettings, source: Source) -> PairedVerdict:
    """The verdict on `query`, judged with `settings` from `source` (module docstring).
    Raises BadInput (exit 2, HTTP 400) for a bad query, StoreError or SourceUnavailable
    (exit 4, HTTP 503) for a source that cannot be read."""
    if isinstance(source, StoreSource):
        return _from_store(query, settings, source)
    if isinstance(source, PrometheusSettings):
        return _from_prometheus(query, settings, source)
    return PairedVerdict(verdict_from_source(source, settings, **query.keywords()), ())


def _split_asked(path: str | Sequence[str] | None, relays: Sequence[str],
                 every_path: Callable[[], list[str]]) -> tuple[list[str], list[str] | None]:
    """(the paths asked, the direct paths to judge among them): None when every path is,
    as with no relay paths; all the source's paths but the relay ones when none was asked."""
    asked = [path] if isinstance(path, str) else list(path or [])
    if asked:
        return asked, [p for p in asked if p not in relays]
    if relays:
        return asked, [p for p in every_path() if p not in relays]
    return asked, None


def _from_store(query: Query, settings: JudgingSettings, source: StoreSource) -> PairedVerdict:
    """The direct paths as `compute_verdict` judges them (through the running probe's
    cache, if given), each relay path as its matrix (`pair_matrix`)."""
    def every_path() -> list[str]:
        with Store.open(source.path, readonly=True) as store:
            return store.paths()

    relays = relay_paths(source.path)
    asked, direct = _split_asked(query.path, relays, every_path)
    matrices = tuple(pair_matrix(source.path, settings, path=p, now=query.now,
                                 since=query.since, overload=source.overload)
                     for p in relays if not asked or p in asked)
    result = None
    if direct is None or direct:
        result = compute_verdict(source.path, settings, path=direct, baseline=query.baseline,
                                 canary=query.canary, since=query.since, now=query.now,
                                 overload=source.overload, cache=source.cache)
    return PairedVerdict(result, matrices)


def _from_prometheus(query: Query, settings: JudgingSettings,
                     prometheus: PrometheusSettings) -> PairedVerdict:
    """As `_from_store`, from every probe's series in Prometheus. A relay path is one whose
    series carry pair cohorts; the probes' health (overload, a probe not scraped) counts in
    every pair as in every direct path. Raises SourceUnavailable when Prometheus does not
    answer."""
    # Here, not at the top: a verdict from a store, and the CLI's start, need no httpx.
    from probes.store.prometheus import PrometheusSource

    with PrometheusSource(prometheus, step_s=settings.window_s,
                          clock=lambda: query.now) as source:
        judge = prometheus_judge(source)
        at = source.now()  # the instant it answers for, as `judge` judges
        relays = source.pair_paths()
        asked, direct = _split_asked(query.path, relays, source.paths)
        since_t = parse_time(query.since, now=at) if query.since else None
        matrices = tuple(
            judge_matrix(source.read_table(since=since_t, until=at, paths=[p]), settings,
                         judge, path=p, since=query.since, now=at)
            for p in relays if not asked or p in asked)
        result = None
        if direct is None or direct:
            result = judge(settings, path=direct, baseline=query.baseline,
                           canary=query.canary, since=query.since)
    return PairedVerdict(result, matrices)
