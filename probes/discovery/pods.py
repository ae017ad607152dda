"""One Pod object → one `PodRecord`, and a record → the `Endpoint` the engine probes.

Pure functions over the Pod JSON the Kubernetes API returns. A record keeps only what the
probe and the inventory need (a few hundred bytes instead of the tens of kilobytes of a
parsed Pod), so 2,400 pods stay small in memory.

Which pods are probed: phase `Running`, condition `Ready` true, a pod IP, a port to call,
and no `deletionTimestamp`. A terminating pod stops being probed the moment its deletion
starts (the API marks it before the containers get SIGTERM), as the endpoints controller
removes it from a Service: the probe measures what callers in the mesh can reach, and a
draining pod's failures are the drain, not the proxy version.

Which pods the inventory counts: every pod that is not finished (`Succeeded`/`Failed`) and
not terminating, probed or not (Pending, not ready, no port): a pod that never becomes
ready still holds its proxy version and the control-plane upgrade hostage. Terminating
pods are left out so a restart is never counted twice (old pod and new pod).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from sys import intern
from types import MappingProxyType
from typing import Any, Final

from probes.discovery.meshes import Extractor, ProxyInfo
from probes.types import Endpoint

__all__ = [
    "PROXY_CONTAINERS",
    "PodRecord",
    "endpoint_for",
    "owner_workload",
    "parse_time",
    "pod_record",
]

# Mesh proxy containers: their ports are the proxy's (admin, metrics), never the app's
# default port.
PROXY_CONTAINERS: Final = frozenset({"istio-proxy", "linkerd-proxy"})
_FINISHED: Final = frozenset({"Succeeded", "Failed"})
_HEXISH = re.compile(r"^[a-z0-9]+$")

Json = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What discovery keeps of one pod.

    `workload` is `kind/name` of the owning workload (`deployment/checkout`), the pod
    itself (`pod/debug-shell`) when it has no controller. `labels` holds only the pod
    labels the config chose to copy. `port` is the port to probe (None: nothing to probe).
    """

    namespace: str
    name: str
    uid: str
    workload: str
    node: str
    ip: str
    phase: str
    ready: bool
    terminating: bool
    started_at: float | None
    created_at: float | None
    start_time: str
    proxy: ProxyInfo
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ports: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    port: int | None = None
    port_problem: str = ""
    # How the pod stops (for `skewprobe plan`'s drain timers): the pod's
    # terminationGracePeriodSeconds and Istio's per-pod terminationDrainDuration
    # (`proxy.istio.io/config`); None when the pod does not set them.
    grace_s: float | None = None
    drain_s: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def counted(self) -> bool:
        """In the inventory: alive (not finished) and not terminating."""
        return self.phase not in _FINISHED and not self.terminating

    @property
    def probed(self) -> bool:
        """Probed: running, ready, addressable, with a port, and not terminating."""
        return (
            self.phase == "Running"
            and self.ready
            and bool(self.ip)
            and self.port is not None
            and not self.terminating
        )

    def age_s(self, now: float) -> float:
        """Seconds since the pod started (since it was created, before it starts)."""
        since = self.started_at if self.started_at is not None else self.created_at
        return max(0.0, now - since) if since is not None else 0.0


def parse_time(text: str | None) -> float | None:
    """RFC 3339 as the API writes it (`2024-05-01T10:00:00Z`) → epoch seconds."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def owner_workload(pod: Json) -> str:
    """`kind/name` of the workload that owns the pod.

    A ReplicaSet made by a Deployment is named `<deployment>-<pod-template-hash>`, and the
    pod carries the hash as a label: stripping it names the Deployment (the same holds for
    Argo Rollouts with `rollouts-pod-template-hash`). A ReplicaSet whose name does not end
    in the pod's hash was made by hand and is its own workload.
    """
    meta = pod.get("metadata") or {}
    refs = meta.get("ownerReferences") or ()
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is None:
        return f"pod/{meta.get('name', '')}"
    kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
    if kind == "ReplicaSet":
        labels = meta.get("labels") or {}
        for label, parent in (("pod-template-hash", "deployment"),
                              ("rollouts-pod-template-hash", "rollout")):
            suffix = labels.get(label)
            if suffix and name.endswith(f"-{suffix}") and _HEXISH.match(suffix):
                return f"{parent}/{name[: -len(suffix) - 1]}"
    return f"{kind.lower()}/{name}"


def _ready(status: Json) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _named_ports(spec: Json) -> dict[str, int]:
    """Named container ports; an app container's name wins over a proxy's of the same name."""
    ports: dict[str, int] = {}
    containers = list(spec.get("containers") or ())
    containers.sort(key=lambda c: c.get("name") in PROXY_CONTAINERS)
    for container in containers:
        for port in container.get("ports") or ():
            name, number = port.get("name"), port.get("containerPort")
            if name and isinstance(number, int) and name not in ports:
                ports[name] = number
    return ports


def _default_port(spec: Json) -> int | None:
    for container in spec.get("containers") or ():
        if container.get("name") in PROXY_CONTAINERS:
            continue
        for port in container.get("ports") or ():
            if isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def _probe_port(
    spec: Json, ports: Mapping[str, int], want: str | int | None
) -> tuple[int | None, str]:
    if isinstance(want, int):
        return want, ""  # Kubernetes does not require a port to be declared to be served
    if isinstance(want, str):
        if want in ports:
            return ports[want], ""
        return None, f"no container port named {want!r}"
    found = _default_port(spec)
    return found, "" if found is not None else "no container port declared; set a port"


def pod_record(
    pod: Json,
    extractor: Extractor,
    *,
    port: str | int | None = None,
    copy_labels: Sequence[str] = (),
) -> PodRecord:
    """Condense one Pod object (a dict of the API's JSON)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    ports = _named_ports(spec)
    number, problem = _probe_port(spec, ports, port)
    start_time = status.get("startTime") or ""
    # Namespaces, nodes, workloads and phases repeat across thousands of pods: one copy each.
    return PodRecord(
        namespace=intern(str(meta.get("namespace", ""))),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        workload=intern(owner_workload(pod)),
        node=intern(str(spec.get("nodeName") or "")),
        ip=str(status.get("podIP") or ""),
        phase=intern(str(status.get("phase") or "Pending")),
        ready=_ready(status),
        terminating=bool(meta.get("deletionTimestamp")),
        started_at=parse_time(start_time),
        created_at=parse_time(meta.get("creationTimestamp")),
        start_time=start_time,
        proxy=extractor.proxy(pod),
        labels=MappingProxyType({k: str(labels[k]) for k in copy_labels if k in labels}),
        ports=MappingProxyType(ports),
        port=number,
        port_problem=problem,
        grace_s=_seconds(spec.get("terminationGracePeriodSeconds")),
        drain_s=_istio_drain((meta.get("annotations") or {}).get("proxy.istio.io/config")),
    )


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _istio_drain(config: Any) -> float | None:
    """`terminationDrainDuration` from a pod's `proxy.istio.io/config` annotation (YAML of a
    ProxyConfig, e.g. `terminationDrainDuration: 20s`); None when absent or unreadable."""
    if not isinstance(config, str) or "terminationDrainDuration" not in config:
        return None
    import yaml

    from probes._parsing import parse_duration

    try:
        value = (yaml.safe_load(config) or {}).get("terminationDrainDuration")
        return parse_duration(str(value)) if value is not None else None
    except (yaml.YAMLError, AttributeError, ValueError):
        return None


def endpoint_for(record: PodRecord) -> Endpoint:
    """The endpoint of a probed pod: `namespace/pod` at podIP:port with its labels.

    Labels: the chosen pod labels, then `namespace`, `pod`, `workload`, `node`,
    `start_time`, `proxy_version` (the cohort) and `revision` (Istio) — ours win over a pod
    label of the same name, so a pod cannot relabel its own cohort.
    """
    assert record.port is not None
    labels = dict(record.labels)
    labels.update(
        namespace=record.namespace,
        pod=record.name,
        workload=record.workload,
        node=record.node,
        start_time=record.start_time,
        proxy_version=record.proxy.version,
    )
    if record.proxy.revision:
        labels["revision"] = record.proxy.revision
    return Endpoint(
        name=record.key, host=record.ip, port=record.port, labels=labels, ports=record.ports
    )
