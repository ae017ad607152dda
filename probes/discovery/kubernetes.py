"""Pods from the Kubernetes API, each with its proxy version (kubernetes-asyncio).

`KubernetesSource` is a discovery source (`snapshots()`: the full endpoint list, again on
every change) that also keeps the **pod inventory**: every pod in scope, probed or not, with
its proxy version, and the mesh's control-plane versions. The runner reads it through
`inventory_updates()` (an async iterator of `ClusterState`, coalesced: a slow reader gets
the newest state, never a backlog) or `state()`, to publish the inventory metrics and write
snapshots to the store; `health()` says whether the API is answering.

What is watched (each by a `Reflector`: list, then watch with resourceVersion and
bookmarks, relist on 410, backoff on errors):
- pods in each configured namespace (or cluster-wide), filtered by the label selector;
- Istio: ztunnel pods in the mesh namespace, so an ambient pod takes its node's ztunnel
  version (a ztunnel upgrade changes the cohort of every ambient pod on that node without
  restarting them);
- the control-plane Deployments (istiod, linkerd-destination) in the mesh namespace, for
  the skew bound — unless `control_plane_version` is configured.
A reflector that cannot read the mesh namespace (RBAC) only costs that information: pods
are still discovered.

Credentials: the pod's service account in a cluster, else a kubeconfig (`kubeconfig`,
`context`; default $KUBECONFIG or ~/.kube/config). A 401 reloads them (expiring tokens).
A broken kubeconfig is BadInput (exit 2); an API that does not answer is retried forever by
`snapshots()` (the last known endpoints stay probed) and is SourceUnavailable (exit 4) for
the one-shot `list_once()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import ApiClient, AppsV1Api, Configuration, CoreV1Api
from kubernetes_asyncio.config import load_incluster_config, load_kube_config
from kubernetes_asyncio.config.config_exception import ConfigException

from probes.discovery._reflector import (
    TRANSIENT,
    Reflector,
    ReflectorStats,
    WatchTiming,
    describe,
)
from probes.discovery.meshes import UNKNOWN, ControlPlane, NodeProxy, extractor_for
from probes.discovery.pods import PodRecord, endpoint_for, pod_record
from probes.errors import BadInput, SourceUnavailable
from probes.spec import KubernetesSpec
from probes.types import Endpoint

__all__ = [
    "SERVICE_ACCOUNT_DIR", "ClusterState", "KubernetesSource", "NamespaceMeta", "WatchTiming",
]

log = logging.getLogger("skewprobe.discovery.kubernetes")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True, slots=True)
class ClusterState:
    """The pod inventory at one moment.

    `pods` holds every pod in scope, sorted by `namespace/name` (filter with
    `PodRecord.counted` for the inventory and `.probed` for what is probed); ambient pods
    carry their node's ztunnel version. `control_planes` is the configured version, or the
    discovered deployments (empty when none were found). `synced` is False until every pod
    list has succeeded once.
    """

    at: float
    mesh: str
    pods: tuple[PodRecord, ...]
    control_planes: tuple[ControlPlane, ...]
    synced: bool


class KubernetesSource:
    """Discovery from the Kubernetes API. One `snapshots()` consumer at a time."""

    def __init__(
        self,
        spec: KubernetesSpec,
        *,
        timing: WatchTiming | None = None,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        environ: Mapping[str, str] | None = None,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
    ) -> None:
        self.spec = spec
        self.extractor = extractor_for(spec)
        self.timing = timing or WatchTiming()
        self._wall = wall
        self._rng = rng or random.Random()
        self._environ = os.environ if environ is None else environ
        self._sa_dir = Path(service_account_dir)
        self._configuration: Configuration | None = None
        self._pods: list[Reflector[PodRecord]] = []
        self._ztunnel: Reflector[NodeProxy] | None = None
        self._planes: Reflector[ControlPlane] | None = None
        self._generation = 0
        self._tick = asyncio.Event()
        self._fatal: BaseException | None = None
        self._running = False
        # key -> (record, ztunnel version used, resolved record, endpoint or None)
        self._cache: dict[str, tuple[PodRecord, str, PodRecord, Endpoint | None]] = {}
        self._told: set[str] = set()

    # -- public --------------------------------------------------------------------------

    async def snapshots(self) -> AsyncGenerator[Sequence[Endpoint], None]:
        """Yield the probed endpoints once every pod list succeeded, then on each change.

        While the API is unreachable nothing is yielded and the last list stays probed.
        """
        async with self._session():
            tasks = self._start()
            try:
                last: tuple[Endpoint, ...] | None = None
                seen = -1
                while True:
                    if self._fatal is not None:
                        raise self._fatal
                    if self._ready() and self._generation != seen:
                        seen = self._generation
                        endpoints = self._endpoints()
                        if endpoints != last:
                            last = endpoints
                            yield endpoints
                        continue
                    await self._changed()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def inventory_updates(self) -> AsyncGenerator[ClusterState, None]:
        """The inventory now (once synced) and after every change, while `snapshots()` runs.

        Coalescing: a consumer that is slower than the changes gets the latest state.
        Any number of consumers may iterate at once.
        """
        seen = -1
        while True:
            if self._ready() and self._generation != seen:
                seen = self._generation
                yield self.state()
                continue
            await self._changed()

    def state(self) -> ClusterState:
        """The inventory now (empty and `synced=False` before the first list)."""
        pods = tuple(sorted((entry[2] for entry in self._resolve()), key=lambda r: r.key))
        return ClusterState(
            at=self._wall(),
            mesh=self.spec.mesh,
            pods=pods,
            control_planes=self._control_planes(),
            synced=bool(self._pods) and all(r.synced for r in self._pods),
        )

    async def list_once(self) -> ClusterState:
        """List everything once (no watch): for `skewprobe inventory`.

        Raises SourceUnavailable when pods cannot be listed; a mesh namespace that cannot
        be read only leaves ztunnel versions or control planes out (with a warning).
        """
        async with self._session() as api:
            for reflector in self._pods:
                try:
                    await reflector.list()
                except TRANSIENT as exc:
                    raise SourceUnavailable(
                        f"kubernetes API {api.configuration.host}: listing pods"
                        f" ({reflector.name}): {describe(exc)}"
                    ) from exc
            for aux in (self._ztunnel, self._planes):
                if aux is None:
                    continue
                try:
                    await aux.list()
                except TRANSIENT as exc:
                    log.warning("%s: %s; the inventory goes without it", aux.name, describe(exc))
            return self.state()

    async def list_namespaces(self) -> dict[str, NamespaceMeta]:
        """Every namespace's labels and annotations, listed once: for `skewprobe plan`
        (restart tiers by label, Istio revision pinning). Raises SourceUnavailable when the
        API does not answer or refuses (a probe's RBAC need not include namespaces)."""
        async with self._session() as api:
            reflector: Reflector[NamespaceMeta] = Reflector(
                "namespaces", CoreV1Api(api).list_namespace, (), selector=None,
                convert=_namespace_meta, on_change=lambda: None, timing=self.timing,
                rng=self._rng, reauth=self._reauth,
            )
            try:
                await reflector.list()
            except TRANSIENT as exc:
                raise SourceUnavailable(
                    f"kubernetes API {api.configuration.host}: listing namespaces:"
                    f" {describe(exc)}"
                ) from exc
            return {meta.name: meta for meta in reflector.store.values()}

    def health(self) -> tuple[bool, str]:
        """(ok, one line): ok while every pod list has synced and the API answers.

        Meant for readiness: while the API is down the probe goes on probing what it knew.
        """
        if self._fatal is not None:
            return False, f"kubernetes: {self._fatal}"
        failing = [r for r in self._pods if r.failing]
        pods = sum(len(r.store) for r in self._pods)
        if not self._pods or not all(r.synced for r in self._pods):
            why = f": {failing[0].stats.last_error}" if failing else ""
            return False, f"kubernetes: waiting for the first pod list{why}"
        if failing:
            first = failing[0]
            return False, (
                f"kubernetes: {first.name}: {first.stats.last_error}; serving the last"
                f" known {pods} pods"
            )
        # The mesh namespace (ztunnel, control plane) only adds detail: note, do not fail.
        notes = "".join(
            f"; {aux.name}: {aux.stats.last_error}"
            for aux in (self._ztunnel, self._planes) if aux is not None and aux.failing
        )
        return True, f"kubernetes: watching {pods} pods{notes}"

    def stats(self) -> dict[str, ReflectorStats]:
        """List/watch counters per reflector (names like `pods/shop`, `ztunnel`)."""
        return {r.name: r.stats for r in self._all()}

    # -- credentials and client ----------------------------------------------------------

    def _in_cluster(self) -> bool:
        if self.spec.in_cluster is not None:
            return self.spec.in_cluster
        return not self.spec.kubeconfig and bool(self._environ.get("KUBERNETES_SERVICE_HOST"))

    async def _load_credentials(self, configuration: Configuration) -> None:
        """Fill `configuration` from the service account or the kubeconfig (BadInput if
        neither can be read)."""
        try:
            if self._in_cluster():
                load_incluster_config(
                    client_configuration=configuration,
                    token_filename=str(self._sa_dir / "token"),
                    cert_filename=str(self._sa_dir / "ca.crt"),
                    environ=self._environ,
                )
            else:
                await load_kube_config(
                    config_file=_expand(self.spec.kubeconfig),
                    context=self.spec.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (ConfigException, OSError, yaml.YAMLError, KeyError, TypeError) as exc:
            where = "in-cluster config" if self._in_cluster() else "kubeconfig"
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadInput(f"kubernetes {where}: {text}") from exc

    async def _reauth(self) -> None:
        if self._configuration is not None:
            log.info("kubernetes: 401 Unauthorized; reloading credentials")
            await self._load_credentials(self._configuration)

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[ApiClient]:
        if self._running:
            raise RuntimeError("this KubernetesSource is already running")
        self._running = True
        self._fatal = None
        try:
            configuration = Configuration()
            await self._load_credentials(configuration)
            self._configuration = configuration
            api = ApiClient(configuration=configuration)
            api.user_agent = "skewprobe"
            try:
                self._build(api)
                yield api
            finally:
                await api.close()
        finally:
            self._running = False

    def _build(self, api: ApiClient) -> None:
        spec, timing, extractor = self.spec, self.timing, self.extractor
        core, apps = CoreV1Api(api), AppsV1Api(api)

        def reflector(
            name: str, call: Any, args: tuple[Any, ...], selector: str | None, convert: Any
        ) -> Any:
            return Reflector(
                name, call, args, selector=selector, convert=convert, on_change=self._bump,
                timing=timing, rng=self._rng, reauth=self._reauth,
            )

        def to_record(obj: Mapping[str, Any]) -> PodRecord:
            return pod_record(obj, extractor, port=spec.port, copy_labels=spec.labels)

        if spec.namespaces:
            self._pods = [
                reflector(f"pods/{ns}", core.list_namespaced_pod, (ns,), spec.selector, to_record)
                for ns in spec.namespaces
            ]
        else:
            self._pods = [
                reflector("pods", core.list_pod_for_all_namespaces, (), spec.selector, to_record)
            ]
        system = spec.system_namespace
        self._ztunnel = self._planes = None
        if extractor.node_proxy_selector:
            self._ztunnel = reflector(
                "ztunnel", core.list_namespaced_pod, (system,), extractor.node_proxy_selector,
                extractor.node_proxy,
            )
        if extractor.control_plane_selector and not spec.control_plane_version:
            self._planes = reflector(
                "control-plane", apps.list_namespaced_deployment, (system,),
                extractor.control_plane_selector, extractor.control_plane,
            )

    def _all(self) -> Iterator[Reflector[Any]]:
        yield from self._pods
        for aux in (self._ztunnel, self._planes):
            if aux is not None:
                yield aux

    def _start(self) -> list[asyncio.Task[None]]:
        tasks = []
        for reflector in self._all():
            task = asyncio.create_task(reflector.run(), name=f"kubernetes {reflector.name}")
            task.add_done_callback(self._reflector_done)
            tasks.append(task)
        return tasks

    def _reflector_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fatal = task.exception()  # credentials became unreadable
            self._bump()

    # -- change notification -------------------------------------------------------------

    def _bump(self) -> None:
        self._generation += 1
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def _changed(self) -> None:
        await self._tick.wait()
        if self.timing.settle_s > 0:
            await asyncio.sleep(self.timing.settle_s)  # let a burst of events land together

    def _ready(self) -> bool:
        """Every pod list done, and the ztunnel list tried (ambient versions need it)."""
        if not self._pods or not all(r.synced for r in self._pods):
            return False
        return self._ztunnel is None or self._ztunnel.attempted

    # -- building snapshots --------------------------------------------------------------

    def _ztunnel_versions(self) -> dict[str, str]:
        """Node → version of its ztunnel: the newest pod not terminating wins (a DaemonSet
        rollout briefly runs two on a node)."""
        best: dict[str, NodeProxy] = {}
        for proxy in (self._ztunnel.store.values() if self._ztunnel else ()):
            held = best.get(proxy.node)
            rank = (not proxy.terminating, proxy.created_at)
            if held is None or rank > (not held.terminating, held.created_at):
                best[proxy.node] = proxy
        return {node: proxy.version for node, proxy in best.items()}

    def _resolve(self) -> list[tuple[PodRecord, str, PodRecord, Endpoint | None]]:
        nodes = self._ztunnel_versions()
        cache: dict[str, tuple[PodRecord, str, PodRecord, Endpoint | None]] = {}
        for reflector in self._pods:
            for key, record in reflector.store.items():
                via = nodes.get(record.node, UNKNOWN) if record.proxy.mode == "ambient" else ""
                hit = self._cache.get(key)
                if hit is None or hit[0] is not record or hit[1] != via:
                    resolved = record
                    if via:
                        source = f"ztunnel on node {record.node}" if via != UNKNOWN else (
                            f"no ztunnel known on node {record.node or '(unscheduled)'}"
                        )
                        resolved = replace(
                            record, proxy=replace(record.proxy, version=via, source=source)
                        )
                    endpoint = endpoint_for(resolved) if resolved.probed else None
                    hit = (record, via, resolved, endpoint)
                    self._explain(resolved)
                cache[key] = hit
        self._cache = cache
        self._told &= cache.keys()  # forget pods that are gone
        return list(cache.values())

    def _explain(self, record: PodRecord) -> None:
        """Say once why a running, ready pod is not probed (a port that does not exist)."""
        explain = record.port_problem and record.ready and not record.terminating
        if explain and record.key not in self._told:
            self._told.add(record.key)
            log.warning("pod %s is not probed: %s", record.key, record.port_problem)

    def _endpoints(self) -> tuple[Endpoint, ...]:
        endpoints = [entry[3] for entry in self._resolve() if entry[3] is not None]
        return tuple(sorted(endpoints, key=lambda e: e.name))

    def _control_planes(self) -> tuple[ControlPlane, ...]:
        if self.spec.control_plane_version:
            return (ControlPlane(self.spec.control_plane_version, "", "config"),)
        if self._planes is None:
            return ()
        return tuple(sorted(self._planes.store.values(), key=lambda c: (c.revision, c.source)))


@dataclass(frozen=True, slots=True)
class NamespaceMeta:
    """A namespace's name, labels and annotations."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


def _namespace_meta(obj: Mapping[str, Any]) -> NamespaceMeta:
    meta = obj.get("metadata") or {}
    return NamespaceMeta(
        str(meta.get("name", "")),
        {str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
    )


def _expand(path: str | None) -> str | None:
    """`~` in a configured kubeconfig path; None means $KUBECONFIG or ~/.kube/config."""
    return os.path.expanduser(path) if path else None
