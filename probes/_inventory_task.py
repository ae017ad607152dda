"""With Kubernetes discovery: the pod inventory the probe keeps while it runs.

On every change the discovery source reports: the inventory and skew gauges on `/metrics`,
the `/inventory` report, and a control-plane event in the store when its versions change.
After each window: a snapshot of pod counts per workload and version in the store, when
they changed and at most every `inventory.snapshot_every`, so the store stays small.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from probes._exceptions import SourceUnavailable, StoreError
from probes._spec import Config
from probes.discovery import DiscoverySource
from probes.inventory import SkewMetrics, inventory_rows, report_from_pods
from probes.inventory_cli import CONTROL_PLANE_EVENT
from probes.metrics import ProbeMetrics
from probes.store import Event, Store

__all__ = ["InventoryKeeper"]

log = logging.getLogger("skewprobe.run")


class InventoryKeeper:
    """`follow()` as a task for the run; `snapshot()` after each window; `report()` for
    `/inventory`. `store` is set once the run has opened it."""

    def __init__(self, config: Config, source: DiscoverySource, metrics: ProbeMetrics,
                 skew_metrics: SkewMetrics) -> None:
        self.config = config
        self.source = source
        self.metrics = metrics
        self.skew_metrics = skew_metrics
        self.store: Store | None = None
        self._report: Mapping[str, Any] | None = None
        self._written: tuple[float, frozenset[tuple[str, str, str, int]]] = (0.0, frozenset())

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
                self._store_call(self._write_control_plane, state.at, planes)

    def snapshot(self, *, force: bool) -> None:
        """A store snapshot when pod counts changed, at most every `inventory_every_s`
        (`force`: now, if they changed: at shutdown)."""
        state = self.source.state()  # type: ignore[attr-defined]
        if not state.synced:
            return
        rows = inventory_rows(state.pods, state.at)
        self.metrics.set_inventory(rows)  # keeps the age gauges current between changes
        key = frozenset((r.namespace, r.workload, r.proxy_version, r.pods) for r in rows)
        last_at, last_key = self._written
        if key == last_key or (not force and state.at - last_at < self.config.inventory_every_s):
            return
        assert self.store is not None
        if self._store_call(self.store.write_inventory, state.at, rows):
            self._written = (state.at, key)

    async def report(self) -> Mapping[str, Any]:
        if self._report is None:
            raise SourceUnavailable(
                "no pod inventory yet (static targets, or the first list is pending)"
            )
        return self._report

    def _write_control_plane(self, at: float, planes: list[dict[str, Any]]) -> None:
        assert self.store is not None
        self.store.write_events([Event(CONTROL_PLANE_EVENT, at, detail={"versions": planes})])

    def _store_call(self, fn: Callable[..., None], *args: Any) -> bool:
        try:
            fn(*args)
        except StoreError as exc:
            self.metrics.store_error()
            log.error("store write failed: %s", exc)
            return False
        return True
