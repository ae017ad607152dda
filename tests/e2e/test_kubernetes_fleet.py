"""End to end: the local fleet's rollout drives the fake API; discovery and the inventory
follow it from version A to version B, and every endpoint reaches the pod it names."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

import httpx

from probes.discovery.kubernetes import KubernetesSource, WatchTiming
from probes.inventory import report_from_pods
from probes.spec import KubernetesSpec
from targets.fleet import Fleet
from tests.servers.kube_api import FakeKubeApi
from tests.servers.kube_fleet import mirror_fleet

OLD, NEW = "1.21.2", "1.22.3"


async def test_rollout_moves_the_inventory_and_the_endpoints(tmp_path: Path) -> None:
    base = f"127.{random.randint(64, 250)}.{random.randint(0, 255)}.1"
    async with FakeKubeApi() as api, Fleet(pods=3, version=OLD, base_host=base,
                                           namespace="demo", service="checkout",
                                           drain_s=0.0) as fleet:
        mirror = asyncio.create_task(mirror_fleet(fleet, api))
        spec = KubernetesSpec(mesh="istio", namespaces=("demo",), port="http",
                              kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")),
                              control_plane_version=NEW)
        source = KubernetesSource(spec, timing=WatchTiming(settle_s=0.0))
        snapshots = source.snapshots()
        updates = source.inventory_updates()
        try:
            async with asyncio.timeout(10):
                endpoints = await anext(snapshots)
                while len(endpoints) < 3:
                    endpoints = await anext(snapshots)
            async with httpx.AsyncClient() as client:
                for endpoint in endpoints:
                    answer = await client.get(f"http://{endpoint.host}:{endpoint.port}/")
                    assert answer.headers["x-proxy-version"] == endpoint.labels["proxy_version"]
            assert {e.host for e in endpoints} == {s.host for s in fleet.pods}

            rollout = asyncio.create_task(fleet.rollout(NEW, interval_s=0.05))
            seen: list[dict[str, int]] = []
            async with asyncio.timeout(20):
                async for state in updates:
                    counts: dict[str, int] = {}
                    for pod in state.pods:
                        if pod.counted:
                            counts[pod.proxy.version] = counts.get(pod.proxy.version, 0) + 1
                    seen.append(counts)
                    if counts == {NEW: 3}:
                        break
            await rollout
            assert seen[0] == {OLD: 3}
            on_new = [c.get(NEW, 0) for c in seen]
            assert on_new == sorted(on_new) and any(0 < n < 3 for n in on_new)  # progress
            report = report_from_pods(source.state().pods, source.state().control_planes,
                                      spec.supported_skew, now=source.state().at)
            assert report["fraction_on_newest"] == 1.0 and report["long_tail"] == []
            async with asyncio.timeout(10):
                endpoints = await anext(snapshots)
                while {e.labels["proxy_version"] for e in endpoints} != {NEW} \
                        or len(endpoints) < 3:
                    endpoints = await anext(snapshots)
        finally:
            await updates.aclose()
            await snapshots.aclose()
            mirror.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await mirror
