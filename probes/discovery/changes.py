"""Restarts seen through discovery: an endpoint that comes back with another proxy version.

A sidecar upgrade is a pod restart, and discovery sees it as the pod leaving and coming back
(same name for StatefulSets and the local fleet) on a new version. `RestartTracker` wraps a
discovery source's snapshots, passes them through unchanged, and records a `restart` event
(from → to, the endpoint's name) for every name that reappears on a different cohort, so a
report can mark each restart on its time axis. Kubernetes Deployments give a restarted pod a
new name; those upgrades show in the inventory snapshots instead.

It also records what the verdict's warm-up needs to know of pods without a `start_time`
label (`probes.store.records.known_starts`): a `present` event for each endpoint (in its
cohort) of the first snapshot, of unknown age, and an `appeared` event for each one first
seen later.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence

from probes.store import APPEARED_EVENT, PRESENT_EVENT, RESTART_EVENT, Event
from probes.types import Endpoint

__all__ = [
    "RESTART",
    "RestartTracker",
]

RESTART = RESTART_EVENT


class RestartTracker:
    def __init__(
        self,
        cohort_by: str,
        *,
        wall: Callable[[], float] = time.time,
        remember: int = 100_000,
    ) -> None:
        self.cohort_by = cohort_by
        self._wall = wall
        self._remember = remember
        self._last: OrderedDict[str, str] = OrderedDict()
        # (name, cohort) seen so far, for the first-sight events (bounded as `_last`).
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._first = True
        self._events: list[Event] = []

    def _sighted(self, endpoint: Endpoint, cohort: str, now: float) -> None:
        """A `present` (first snapshot) or `appeared` event for a pod first seen in `cohort`,
        unless its start is known from its labels."""
        key = (endpoint.name, cohort)
        if key in self._seen:
            self._seen.move_to_end(key)
            return
        self._seen[key] = None
        if not endpoint.labels.get("start_time"):
            self._events.append(Event(PRESENT_EVENT if self._first else APPEARED_EVENT, now,
                                      cohort=cohort, endpoint=endpoint.name))

    def observe(self, snapshot: Sequence[Endpoint]) -> None:
        now = self._wall()
        for endpoint in snapshot:
            cohort = endpoint.labels.get(self.cohort_by, "unknown")
            self._sighted(endpoint, cohort, now)
            before = self._last.get(endpoint.name)
            if before is not None and before != cohort:
                self._events.append(Event(
                    RESTART, now, cohort=cohort, endpoint=endpoint.name,
                    detail={"from": before, "to": cohort,
                            "namespace": endpoint.labels.get("namespace", "")},
                ))
            self._last[endpoint.name] = cohort
            self._last.move_to_end(endpoint.name)
        self._first = False
        while len(self._last) > self._remember:  # bounded: the oldest names are forgotten
            self._last.popitem(last=False)
        while len(self._seen) > self._remember:
            self._seen.popitem(last=False)

    def drain(self) -> list[Event]:
        """The events recorded since the last drain."""
        events, self._events = self._events, []
        return events

    async def wrap(
        self, snapshots: AsyncIterator[Sequence[Endpoint]]
    ) -> AsyncIterator[Sequence[Endpoint]]:
        async for snapshot in snapshots:
            self.observe(snapshot)
            yield snapshot
