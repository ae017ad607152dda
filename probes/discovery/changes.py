"""Restarts seen through discovery: an endpoint that comes back with another proxy version.

A sidecar upgrade is a pod restart, and discovery sees it as the pod leaving and coming back
(same name for StatefulSets and the local fleet) on a new version. `RestartTracker` wraps a
discovery source's snapshots, passes them through unchanged, and records a `restart` event
(from → to, the endpoint's name) for every name that reappears on a different cohort, so a
report can mark each restart on its time axis. Kubernetes Deployments give a restarted pod a
new name; those upgrades show in the inventory snapshots instead.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence

from probes._types import Endpoint
from probes.store import Event

__all__ = [
    "RESTART",
    "RestartTracker",
]

RESTART = "restart"


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
        self._events: list[Event] = []

    def observe(self, snapshot: Sequence[Endpoint]) -> None:
        now = self._wall()
        for endpoint in snapshot:
            cohort = endpoint.labels.get(self.cohort_by, "unknown")
            before = self._last.get(endpoint.name)
            if before is not None and before != cohort:
                self._events.append(Event(
                    RESTART, now, cohort=cohort, endpoint=endpoint.name,
                    detail={"from": before, "to": cohort,
                            "namespace": endpoint.labels.get("namespace", "")},
                ))
            self._last[endpoint.name] = cohort
            self._last.move_to_end(endpoint.name)
        while len(self._last) > self._remember:  # bounded: the oldest names are forgotten
            self._last.popitem(last=False)

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
