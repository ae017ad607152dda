"""The inventory the probe keeps while it runs.

With Kubernetes discovery (`InventoryKeeper`), on every change the discovery source reports:
the inventory and skew gauges on `/metrics`, the `/inventory` report, and a control-plane
event in the store when its versions change. With static or file targets
(`EndpointInventory`), the endpoints discovered stand for the pods (no gauges, no
`/inventory`), so `skewprobe plan` and `inventory --store` read the store of any run.
After each window, either way: a snapshot of pod counts per workload and version in the
store, when they changed and at most every `inventory.snapshot_every`, so the store stays
small.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from probes.discovery import DiscoverySource
from probes.discovery.meshes import UNKNOWN
from probes.errors import SourceUnavailable, StoreError
from probes.inventory import (
    CONTROL_PLANE_EVENT,
    SkewMetrics,
    inventory_rows,
    report_from_pods,
)
from probes.metrics import ProbeMetrics
from probes.spec import Config
from probes.store import Event, InventoryRow, Store
from probes.types import Endpoint

__all__ = ["EndpointInventory", "InventoryKeeper", "endpoint_rows"]

log = logging.getLogger("skewprobe.run")


class _Snapshots:
    """Writes inventory snapshots to `store`: when the counts changed, at most every
    `every_s` (`force`: whenever they changed, as at shutdown)."""

    def __init__(self, every_s: float, metrics: ProbeMetrics) -> None:
        self.every_s = every_s
        self.metrics = metrics
        self.store: Store | None = None
        self._written: tuple[float, frozenset[tuple[str, str, str, int]]] = (0.0, frozenset())

    def write(self, at: float, rows: Sequence[InventoryRow], *, force: bool) -> None:
        key = frozenset((r.namespace, r.workload, r.proxy_version, r.pods) for r in rows)
        last_at, last_key = self._written
        if key == last_key or (not force and at - last_at < self.every_s):
            return
        assert self.store is not None
        if _store_call(self.metrics, self.store.write_inventory, at, rows):
            self._written = (at, key)


class _Inventory:
    """What both inventories share: their snapshots, and the store they go to (`store`,
    set once the run has opened it)."""

    def __init__(self, config: Config, metrics: ProbeMetrics) -> None:
        self.metrics = metrics
        self._snapshots = _Snapshots(config.inventory_every_s, metrics)

    @property
    def store(self) -> Store | None:
        return self._snapshots.store

    @store.setter
    def store(self, store: Store | None) -> None:
        self._snapshots.store = store

    async def report(self) -> Mapping[str, Any]:
        """The `/inventory` report: SourceUnavailable (HTTP 503) while there is none."""
        raise SourceUnavailable(
            "no pod inventory yet (static targets, or the first list is pending)"
        )


def _store_call(metrics: ProbeMetrics, fn: Callable[..., None], *args: Any) -> bool:
    try:
        fn(*args)
    except StoreError as exc:
        metrics.store_error()
        log.error("store write failed: %s", exc)
        return False
    return True


def _started(labels: Mapping[str, str]) -> float | None:
    """A `start_time` label (RFC 3339, as discovery and the fleet set it) as epoch seconds."""
    text = labels.get("start_time")
    try:
        return None if text is None else datetime.fromisoformat(
            text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def endpoint_rows(endpoints: Iterable[Endpoint], cohort_by: str, now: float
                  ) -> list[InventoryRow]:
    """Endpoints as inventory rows: grouped by their `namespace` label, their workload (the
    `workload`, `service` or `app` label, else the endpoint's own name) and their cohort
    label (`unknown` without one, as the engine's cohort); ages from `start_time`."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for e in endpoints:
        labels = e.labels
        workload = labels.get("workload") or labels.get("service") or labels.get("app") or e.name
        key = (labels.get("namespace", ""), workload, labels.get(cohort_by, UNKNOWN))
        started = _started(labels)
        groups.setdefault(key, []).append(0.0 if started is None else max(0.0, now - started))
    return [InventoryRow(ns, workload, version, len(ages), max(ages))
            for (ns, workload, version), ages in sorted(groups.items())]


class EndpointInventory(_Inventory):
    """With static or file targets: `snapshot()` after each window, of the endpoints
    `endpoints()` gives (the engine's)."""

    def __init__(self, config: Config, metrics: ProbeMetrics,
                 endpoints: Callable[[], Iterable[Endpoint]]) -> None:
        super().__init__(config, metrics)
        self.cohort_by = config.judging.cohort.by
        self.endpoints = endpoints

    def snapshot(self, *, force: bool) -> None:
        endpoints = list(self.endpoints())
        if endpoints:  # none yet: nothing discovered is not an empty fleet
            now = time.time()
            self._snapshots.write(now, endpoint_rows(endpoints, self.cohort_by, now),
                                  force=force)


class InventoryKeeper(_Inventory):
    """With Kubernetes discovery: `follow()` as a task for the run; `snapshot()` after each
    window; `report()` for `/inventory`."""

    def __init__(self, config: Config, source: DiscoverySource, metrics: ProbeMetrics,
                 skew_metrics: SkewMetrics) -> None:
        super().__init__(config, metrics)
        self.config = config
        self.source = source
        self.skew_metrics = skew_metrics
        self._report: Mapping[str, Any] | None = None

    async def follow(self) -> None:
        """Metrics on every inventory change; the control plane to the store when it changes."""
        spec = self.config.kubernetes
        assert spec is not None
        planes_seen = None
        async for state in self.source.inventory_updates():  # type: ignore[attr-defined]
            self.metrics.set_inventory(inventory_rows(state.pods, state.at))
            report = report_from_pods(state.pods, state.control_planes, spec.supported_skew,
                                      now=state.at, mesh=state.mesh)
            self.skew_metrics.update(report)
            self._report = report
            planes = [{"version": p.version, "revision": p.revision, "source": p.source}
                      for p in state.control_planes]
            if planes != planes_seen:
                planes_seen = planes
                _store_call(self.metrics, self._write_control_plane, state.at, planes)

    def snapshot(self, *, force: bool) -> None:
        """A store snapshot when pod counts changed, at most every `inventory_every_s`
        (`force`: now, if they changed: at shutdown)."""
        state = self.source.state()  # type: ignore[attr-defined]
        if not state.synced:
            return
        rows = inventory_rows(state.pods, state.at)
        self.metrics.set_inventory(rows)  # keeps the age gauges current between changes
        self._snapshots.write(state.at, rows, force=force)

    async def report(self) -> Mapping[str, Any]:
        return await super().report() if self._report is None else self._report

    def _write_control_plane(self, at: float, planes: list[dict[str, Any]]) -> None:
        assert self.store is not None
        self.store.write_events([Event(CONTROL_PLANE_EVENT, at, detail={"versions": planes})])
