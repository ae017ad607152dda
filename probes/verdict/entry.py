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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probes.spec import JudgingSettings, PrometheusSettings
from probes.verdict.pairs import PairedVerdict, prometheus_verdict, store_verdict
from probes.verdict.service import FROM_STORE, WindowSource, _Overload, verdict_from_source

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
        return store_verdict(source.path, settings, overload=source.overload,
                             cache=source.cache, **query.keywords())
    if isinstance(source, PrometheusSettings):
        return prometheus_verdict(source, settings, **query.keywords())
    return PairedVerdict(verdict_from_source(source, settings, **query.keywords()), ())
