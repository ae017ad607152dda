"""The running probe's Kubernetes inventory (`probes.run._inventory_task`): its series, the
control plane written when it changes, snapshots at most every `every_s` unless forced."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from probes.discovery.kubernetes import ClusterState
from probes.discovery.meshes import ControlPlane, IstioExtractor
from probes.discovery.pods import pod_record
from probes.errors import SourceUnavailable
from probes.inventory import CONTROL_PLANE_EVENT, SkewMetrics
from probes.metrics import ProbeMetrics
from probes.run._inventory_task import InventoryKeeper
from probes.spec import Config, KubernetesSpec
from probes.store import Store
from tests.servers import kube_pods as kp

PODS = tuple(pod_record(kp.pod(f"checkout-x-{i}", mesh="istio", version="1.22.3"),
                        IstioExtractor()) for i in range(3))
PLANE = (ControlPlane("1.22.3", source="config"),)


class Source:
    """Inventory updates from a list of states; `state()` is the last one yielded."""

    def __init__(self, states: list[ClusterState]) -> None:
        self.states = states
        self.now = states[0]

    async def inventory_updates(self) -> AsyncIterator[ClusterState]:
        for state in self.states:
            self.now = state
            yield state

    def state(self) -> ClusterState:
        return self.now


def _keeper(source: Source, registry: CollectorRegistry, every_s: float) -> InventoryKeeper:
    config = Config(source="store", paths=(), kubernetes=KubernetesSpec(mesh="istio"),
                    inventory_every_s=every_s)
    return InventoryKeeper(config, source, ProbeMetrics(registry),  # type: ignore[arg-type]
                           SkewMetrics(registry))


def _state(at: float, pods: int, planes: tuple[ControlPlane, ...] = PLANE) -> ClusterState:
    return ClusterState(at=at, mesh="istio", pods=PODS[:pods], control_planes=planes,
                        synced=True)


async def test_series_report_and_control_plane_changes(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    source = Source([_state(10.0, 3), _state(20.0, 2),
                     _state(30.0, 2, (ControlPlane("1.23.0", source="config"),))])
    task = _keeper(source, registry, every_s=300.0)
    with pytest.raises(SourceUnavailable):
        await task.report()
    with Store.open(tmp_path / "p.db") as store:
        task.store = store
        await task.follow()
        events = store.read_events(kinds=[CONTROL_PLANE_EVENT])
    # Written when the control plane changes, not at every update.
    assert [(e.at, e.detail["versions"][0]["version"]) for e in events] == [
        (10.0, "1.22.3"), (30.0, "1.23.0")]
    assert (await task.report())["control_plane"] is not None
    assert registry.get_sample_value(
        "skewprobe_inventory_pods", {"namespace": "shop", "proxy_version": "1.22.3"}) == 2


def test_snapshots_when_counts_change_at_most_every_every_s(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    source = Source([_state(100.0, 3)])
    task = _keeper(source, registry, every_s=60.0)
    with Store.open(tmp_path / "p.db") as store:
        task.store = store
        task.snapshot(force=False)
        source.now = _state(130.0, 2)  # changed, but within every_s of the last
        task.snapshot(force=False)
        source.now = _state(170.0, 2)
        task.snapshot(force=False)
        task.snapshot(force=True)  # unchanged: nothing even when forced
        source.now = _state(171.0, 1)
        task.snapshot(force=True)  # changed: forced past every_s (shutdown)
        assert [s.at for s in store.read_inventory()] == [100.0, 170.0, 171.0]


def test_static_and_file_endpoints_are_snapshotted_as_pods(tmp_path: Path) -> None:
    """Without Kubernetes, the endpoints probed stand for the pods: grouped by namespace,
    workload (service label, else the endpoint) and the cohort label, written when the
    counts change."""
    from probes.run._inventory_task import EndpointInventory, endpoint_rows
    from probes.types import Endpoint

    def ep(name: str, version: str | None) -> Endpoint:
        labels = {"namespace": "demo", "service": "checkout"}
        if version is not None:
            labels["proxy_version"] = version
        return Endpoint(name, "127.0.0.1", 1, labels)

    endpoints = [ep("a", "1.20.3"), ep("b", "1.20.3"), ep("c", "1.21.0"),
                 Endpoint("etcd-0", "127.0.0.1", 2379)]
    rows = endpoint_rows(endpoints, "proxy_version", now=0.0)
    assert [(r.namespace, r.workload, r.proxy_version, r.pods) for r in rows] == [
        ("", "etcd-0", "unknown", 1), ("demo", "checkout", "1.20.3", 2),
        ("demo", "checkout", "1.21.0", 1)]
    inventory = EndpointInventory(Config(source="store", paths=()),
                                  ProbeMetrics(CollectorRegistry()), lambda: endpoints)
    with Store.open(tmp_path / "s.db") as store:
        inventory.store = store
        inventory.snapshot(force=False)
        inventory.snapshot(force=True)  # no change: nothing more written
        endpoints[2] = ep("c", "1.20.3")
        inventory.snapshot(force=True)
        snapshots = store.read_inventory()
    assert [sorted((r.proxy_version, r.pods) for r in s.rows) for s in snapshots] == [
        [("1.20.3", 2), ("1.21.0", 1), ("unknown", 1)], [("1.20.3", 3), ("unknown", 1)]]
