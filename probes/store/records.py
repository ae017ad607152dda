"""Plain records the store keeps besides windows: timestamped events and inventory snapshots.

They cross module boundaries (streams and discovery write them, reports read them), so they
are frozen dataclasses like those in `probes.types`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["APPEARED_EVENT", "BOOKKEEPING_EVENTS", "PRESENT_EVENT", "RESTART_EVENT",
           "SETTINGS_EVENT", "Event", "InventoryRow", "InventorySnapshot"]

# What the probe learnt of each pod's start, for its warm-up (`probes.store.starts`): an
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
