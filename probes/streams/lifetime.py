"""The lifetime check: is a maximum connection / stream duration in effect, and if not, how
many open streams would an upgrade of this tier reset that are older than a threshold?

A server-side cap (gRPC `max_connection_age`, Envoy `max_stream_duration`, an L7 proxy's
tunnel timeout) shows in the lifetimes of ended streams: most of them end within a narrow
band near the cap, and no open stream is much older than it. Without a cap, streams live as
long as their pods, and upgrading the tier cuts every one of them at once: the reconnect
storm the seed warns about. So the check reports, per (path, cohort):

* `find_cap`: the densest band of ended lifetimes, [x, x·(1 + band_rel) + band_abs_s]. A
  cap is in effect when at least `min_ended` streams ended on the server's side, a share of
  at least `min_fraction` of them ended inside the band, those ends are spread over at least
  `min_spread` of a cap length in time (one burst of same-aged streams, as a single restart
  of streams opened together, is not a cap), and at most `max_open_beyond` of the open
  streams are older than the band's top (a cap cannot coexist with older streams).
  Streams the probe ended itself (`client_rotated`, `client_stopped`) are left out: their
  lifetime says nothing about the server.
* `lifetime_report`: the finding plus the open streams older than `threshold_s`: "upgrading
  this tier now resets N streams aged > 1 h".

Pure functions over plain records; the recorder keeps the records.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from probes.clients import EndReason, OpenStream

__all__ = ["CapFinding", "Lifetime", "LifetimeReport", "find_cap", "lifetime_report"]


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One ended (established) stream: how long it lived, when it ended, why."""

    lifetime_s: float
    ended_at: float
    reason: str


@dataclass(frozen=True, slots=True)
class CapFinding:
    """Whether lifetimes are capped; `cap_s` is the median lifetime inside the band."""

    capped: bool
    why: str
    ended: int = 0
    in_band: int = 0
    cap_s: float | None = None
    band: tuple[float, float] | None = None
    spread_s: float = 0.0
    open_beyond: int = 0
    reasons: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "reasons", MappingProxyType(dict(self.reasons)))

    @property
    def fraction(self) -> float:
        return self.in_band / self.ended if self.ended else 0.0


def find_cap(
    ended: Iterable[Lifetime],
    open_ages: Iterable[float] = (),
    *,
    band_rel: float = 0.1,
    band_abs_s: float = 0.5,
    min_ended: int = 10,
    min_fraction: float = 0.6,
    min_spread: float = 0.5,
    max_open_beyond: float = 0.05,
) -> CapFinding:
    """Whether a maximum stream lifetime is in effect (see the module docstring)."""
    server = sorted(
        (e for e in ended if e.reason not in EndReason.CLIENT_SIDE), key=lambda e: e.lifetime_s
    )
    ages = list(open_ages)
    n = len(server)
    if n < min_ended:
        return CapFinding(False, f"too few ended streams to tell ({n} < {min_ended})", ended=n)
    lifetimes = [e.lifetime_s for e in server]
    best_i, best_j = 0, 0
    j = 0
    for i, low in enumerate(lifetimes):
        high = low * (1.0 + band_rel) + band_abs_s
        j = max(j, i)
        while j + 1 < n and lifetimes[j + 1] <= high:
            j += 1
        # Ties go to the longer lifetimes: a cap is the top of the distribution.
        if j - i >= best_j - best_i:
            best_i, best_j = i, j
    band_members = server[best_i : best_j + 1]
    low = lifetimes[best_i]
    top = low * (1.0 + band_rel) + band_abs_s
    cap = statistics.median(e.lifetime_s for e in band_members)
    ends = [e.ended_at for e in band_members]
    spread = max(ends) - min(ends)
    beyond = sum(1 for a in ages if a > top)
    reasons = Counter(e.reason for e in band_members)
    finding = CapFinding(
        False, "", ended=n, in_band=len(band_members), cap_s=cap, band=(low, top),
        spread_s=spread, open_beyond=beyond, reasons=reasons,
    )
    share = len(band_members) / n
    band_text = f"{_dur(low)}–{_dur(top)}"
    if share < min_fraction:
        why = (f"no cap: lifetimes spread out (at most {share:.0%} of {n} ended streams "
               f"within one band, {band_text})")
    elif spread < min_spread * cap:
        why = (f"no cap yet: {share:.0%} of {n} ended streams lived {band_text} but ended "
               f"together (one burst over {_dur(spread)}, not repeated cuts)")
    elif ages and beyond > max_open_beyond * len(ages):
        why = f"no cap: {beyond} of {len(ages)} open streams are older than {_dur(top)}"
    else:
        top_reasons = ", ".join(f"{r} {c}" for r, c in reasons.most_common(3))
        why = (f"lifetimes capped near {_dur(cap)}: {share:.0%} of {n} ended streams ended "
               f"within {band_text} ({top_reasons})")
        return dataclasses.replace(finding, capped=True, why=why)
    return dataclasses.replace(finding, why=why)


@dataclass(frozen=True, slots=True)
class LifetimeReport:
    """The lifetime check of one path × cohort."""

    path: str
    cohort: str
    cap: CapFinding
    open_streams: int
    aged: int
    threshold_s: float
    oldest_s: float

    @property
    def summary(self) -> str:
        older = f"{self.aged} of {self.open_streams} open streams aged > {_dur(self.threshold_s)}"
        if self.cap.capped:
            return f"{self.cap.why}; upgrading now resets {older}"
        return (
            f"no maximum stream lifetime seen ({self.cap.why}); upgrading this tier now "
            f"resets {older} (oldest {_dur(self.oldest_s)})"
        )


def lifetime_report(
    ended: Mapping[tuple[str, str], Sequence[Lifetime]],
    open_streams: Iterable[OpenStream],
    *,
    threshold_s: float = 3600.0,
) -> list[LifetimeReport]:
    """One report per (path, cohort) seen in `ended` or `open_streams`, sorted."""
    ages: dict[tuple[str, str], list[float]] = {}
    for stream in open_streams:
        ages.setdefault((stream.path, stream.cohort), []).append(stream.age_s)
    reports = []
    for key in sorted(set(ended) | set(ages)):
        open_ages = ages.get(key, [])
        reports.append(LifetimeReport(
            path=key[0],
            cohort=key[1],
            cap=find_cap(ended.get(key, ()), open_ages),
            open_streams=len(open_ages),
            aged=sum(1 for a in open_ages if a > threshold_s),
            threshold_s=threshold_s,
            oldest_s=max(open_ages, default=0.0),
        ))
    return reports


def _dur(seconds: float) -> str:
    """A short human duration: 850 ms, 42 s, 12.5 min, 3.2 h."""
    if seconds < 1.0:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120.0:
        return f"{seconds:.3g} s"
    if seconds < 7200.0:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
