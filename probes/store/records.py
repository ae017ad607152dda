"""Plain records the store keeps besides windows: timestamped events and inventory snapshots.

They cross module boundaries (streams and discovery write them, reports read them), so they
are frozen dataclasses like those in `probes.types`.

`known_starts`: when each endpoint row's pod started, for the verdict's warm-up, where its
labels do not say (no `start_time`): from what the probe saw (`probes.discovery.changes`).
A row's pod start, for a row with no `start_time` label, from the events of its endpoint
in its cohort at or before the row's start (so a row reads the same whenever it is read
after it was written; the probe writes a window's events before the window):

- the latest `appeared` or `restart` event: a start the probe saw, then;
- else a `present` event (the endpoint was there when a probe run started, with no start
  time): of unknown age, so warm: -inf;
- else NaN, as before these events existed: the verdict counts the warm-up from the pod's
  first row it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["APPEARED_EVENT", "BOOKKEEPING_EVENTS", "PRESENT_EVENT", "RESTART_EVENT",
           "SETTINGS_EVENT", "START_EVENTS", "START_EVENTS_SQL", "Event", "InventoryRow",
           "InventorySnapshot", "known_starts"]

# What the probe learnt of each pod's start, for its warm-up (`known_starts`): an
# endpoint (in a cohort) present in the first snapshot of a run, of unknown age; one that
# appeared later, first seen then; one back on another cohort, a restart seen then.
PRESENT_EVENT = "present"
APPEARED_EVENT = "appeared"
RESTART_EVENT = "restart"
# How the run judges (`probes.verdict.settings`).
SETTINGS_EVENT = "settings"
# The probe's own bookkeeping, not something that happened to the estate: not listed as
# events in reports (one per endpoint at each start would drown the rest).
BOOKKEEPING_EVENTS = frozenset({PRESENT_EVENT, APPEARED_EVENT, SETTINGS_EVENT})


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened at one moment: a pod restart, a reconnect storm, a rollout step.

    `kind` is a short name (`restart`, `storm`, ...); `path`, `cohort` and `endpoint` are ""
    when they do not apply. `detail` must be JSON-serialisable (counts, endpoint lists, ...).
    Writing the same (at, kind, path, cohort, endpoint) again keeps the first one.
    """

    kind: str
    at: float
    path: str = ""
    cohort: str = ""
    endpoint: str = ""
    detail: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))


@dataclass(frozen=True, slots=True)
class InventoryRow:
    """Pods of one workload on one proxy version, and the age of the oldest of them."""

    namespace: str
    workload: str
    proxy_version: str
    pods: int
    max_age_s: float = 0.0


@dataclass(frozen=True, slots=True)
class InventorySnapshot:
    """The whole inventory at one moment (no rows: no pods were known)."""

    at: float
    rows: tuple[InventoryRow, ...]


START_EVENTS = (PRESENT_EVENT, APPEARED_EVENT, RESTART_EVENT)
# The events `known_starts` reads (parameters: START_EVENTS): of `present` only each pod's
# first, since a probe that restarts often writes one per pod each time.
START_EVENTS_SQL = (
    "SELECT endpoint, cohort, MIN(at), kind FROM events WHERE kind = ?"
    " GROUP BY endpoint, cohort"
    " UNION ALL SELECT endpoint, cohort, at, kind FROM events WHERE kind IN (?, ?)")

F64 = npt.NDArray[np.float64]


def known_starts(started: F64, start: F64, endpoint: npt.NDArray[np.integer],
                 cohort: npt.NDArray[np.integer], endpoints: Sequence[str],
                 cohorts: Sequence[str], events: Sequence[tuple[str, str, float, str]]
                 ) -> F64:
    """`started` (per row, NaN where the labels say nothing) with the module's rule applied
    from `events` (endpoint, cohort, at, kind); `endpoint` / `cohort` index the names."""
    missing = np.isnan(started)
    if not events or not missing.any():
        return started
    e_at = {name: i for i, name in enumerate(endpoints)}
    c_at = {name: i for i, name in enumerate(cohorts)}
    n_c = max(len(cohorts), 1)
    present = np.full(max(len(endpoints), 1) * n_c, np.inf)  # each pod's first `present`
    seen: list[tuple[int, float]] = []  # (pod, at) of the starts seen
    for name, coh, when, kind in events:
        e, c = e_at.get(name), c_at.get(coh)
        if e is None or c is None:
            continue
        pod = e * n_c + c
        if kind == PRESENT_EVENT:
            present[pod] = min(present[pod], when)
        else:
            seen.append((pod, when))
    rows = np.flatnonzero(missing)
    pod_of = endpoint[rows].astype(np.int64) * n_c + cohort[rows]
    t = start[rows]
    out = started.copy()
    out[rows[t >= present[pod_of]]] = -np.inf
    if seen:
        # The latest start seen at or before each row: one search over (pod, at) pairs laid
        # end to end, pods `span` apart so that no pod's times reach into the next one's.
        ev = np.array(seen, dtype=np.float64)
        lo = float(min(ev[:, 1].min(), t.min()))
        span = float(max(ev[:, 1].max(), t.max())) - lo + 1.0
        key = ev[:, 0] * span + (ev[:, 1] - lo)
        order = np.argsort(key)
        key, ev = key[order], ev[order]
        at = np.searchsorted(key, pod_of * span + (t - lo), side="right") - 1
        hit = (at >= 0) & (ev[np.maximum(at, 0), 0] == pod_of)
        out[rows[hit]] = ev[at[hit], 1]
    return out
