"""Pods in the fake Kubernetes API that come and go: from the local fleet, or synthetic churn.

- `mirror_fleet`: the local fleet's simulated rollout (`targets.fleet`) drives the fake API,
  so an end-to-end test sees discovery and the inventory follow real restarting servers.
- `python -m tests.servers.kube_fleet --pods 2400 --churn 0.1 --kubeconfig PATH`: a fake API
  with thousands of pods and a steady restart rate, for `benchmarks/k8s_watch.py`; it
  prints one JSON line when ready and one per deletion (`{"deleted": "ns/name", "at": t}`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.servers.kube_api import FakeKubeApi, Json, _rfc3339
from tests.servers.kube_pods import pod

# -- the local fleet as pods -----------------------------------------------------------


async def mirror_fleet(fleet: Any, api: FakeKubeApi, *, namespace: str = "demo",
                       mesh: str = "istio") -> None:
    """Drive `api` from a started `targets.fleet.Fleet` until cancelled.

    Each fleet pod is a Pod of the Deployment `fleet.service` at the pod's loopback address,
    with named ports `http` and `grpc`. A restart shows as Kubernetes shows it: when it
    starts the old Pod gets a `deletionTimestamp`; when it ends that Pod is gone and a new
    Pod (new name, new proxy version) is Running and Ready.
    """
    from targets.fleet import EventKind

    names: dict[str, str] = {}
    generation = 0

    def publish(server: Any) -> None:
        nonlocal generation
        generation += 1
        name = f"{fleet.service}-{generation:05d}-{server.pod.rsplit('-', 1)[-1]}"
        names[server.pod] = name
        api.create(pod(name, namespace=namespace, workload=fleet.service, mesh=mesh,
                       version=server.version, ip=server.host, port=server.http_port,
                       grpc_port=server.grpc_port, started=_rfc3339(time.time())))

    start = len(fleet.history())
    for server in fleet.pods:
        publish(server)
    async for event in fleet.events(start):
        if event.kind == EventKind.RESTART_STARTED:
            api.delete(namespace, names[event.pod], graceful=True)
        elif event.kind == EventKind.RESTART_FINISHED:
            api.finish_delete(namespace, names[event.pod])
            publish(next(s for s in fleet.pods if s.pod == event.pod))


# -- synthetic churn, for the benchmark ------------------------------------------------


def fleet_pods(count: int, *, namespaces: int, version: str, generation: int = 0,
               ) -> Iterable[Json]:
    for i in range(count):
        ns = f"team-{i % namespaces}"
        workload = f"svc-{(i // namespaces) % 40}"
        yield pod(f"{workload}-{generation:04d}{i:05d}-x", namespace=ns, workload=workload,
                  mesh="istio", version=version, ip=f"10.{i // 250}.{i % 250}.{generation % 250}",
                  node=f"node-{i % 50}")


async def _churn(api: FakeKubeApi, *, per_minute: float, ready_after_s: float,
                 version: str, seed: int, report: Callable[[str], None]) -> None:
    """Restart pods at `per_minute` of the fleet per minute: graceful delete, a new Pending
    pod, then Running and Ready after `ready_after_s` — the events a real restart makes."""
    rng = random.Random(seed)
    pods = len(api.names("pods"))
    interval = 60.0 / max(1e-9, per_minute * pods)
    n = 0
    while True:
        await asyncio.sleep(interval)
        # A rollout restarts running pods that are not already terminating.
        victims = api.names("pods", lambda obj: obj["status"].get("phase") == "Running"
                            and not obj["metadata"].get("deletionTimestamp"))
        if not victims:
            continue
        ns, name = rng.choice(victims)
        api.delete(ns, name, graceful=True)
        report(json.dumps({"deleted": f"{ns}/{name}", "at": api.deleted_at[f"{ns}/{name}"]}))
        n += 1
        workload = name.split("-")[0] + "-" + name.split("-")[1]
        new_name = f"{workload}-r{n:07d}-x"
        fresh = pod(new_name, namespace=ns, workload=workload, mesh="istio", version=version,
                    ip=f"10.200.{n // 250 % 250}.{n % 250}", node=f"node-{n % 50}",
                    phase="Pending", ready=False)
        api.create(fresh)
        asyncio.get_running_loop().call_later(
            ready_after_s, _become_ready, api, ns, new_name, version, n)
        asyncio.get_running_loop().call_later(2.0, _finish, api, ns, name)


def _become_ready(api: FakeKubeApi, ns: str, name: str, version: str, n: int) -> None:
    old = api.get(ns, name)
    if old is None:
        return
    ready = pod(name, namespace=ns, workload=old["metadata"]["labels"]["app"], mesh="istio",
                version=version, ip=old["status"].get("podIP") or f"10.201.0.{n % 250}",
                node=old["spec"]["nodeName"])
    ready["metadata"] = old["metadata"]
    api.replace(ready)


def _finish(api: FakeKubeApi, ns: str, name: str) -> None:
    if api.get(ns, name) is not None:
        api.finish_delete(ns, name)


async def _serve(args: argparse.Namespace) -> None:
    api = FakeKubeApi(bookmark_every_s=args.bookmark_every)
    for obj in fleet_pods(args.pods, namespaces=args.namespaces, version=args.version):
        api.create(obj)
    await api.start(port=args.port)
    api.kubeconfig(Path(args.kubeconfig))
    print(json.dumps({"ready": api.url, "pods": args.pods}), flush=True)
    try:
        await _churn(api, per_minute=args.churn, ready_after_s=args.ready_after,
                     version=args.to_version, seed=args.seed,
                     report=lambda line: print(line, flush=True))
    finally:
        await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="fake Kubernetes API with pod churn")
    parser.add_argument("--pods", type=int, default=2400)
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--churn", type=float, default=0.10, help="fraction restarted per min")
    parser.add_argument("--ready-after", type=float, default=3.0)
    parser.add_argument("--version", default="1.21.2")
    parser.add_argument("--to-version", default="1.22.3")
    parser.add_argument("--bookmark-every", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kubeconfig", required=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
