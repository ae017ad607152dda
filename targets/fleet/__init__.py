"""The local fleet: N reference-target pods on loopback, and a simulated rollout.

Each pod is a `TargetServer` on its own address 127.0.0.(base+i) with the same ports, as
real pods share a container port. The fleet publishes its endpoint list for discovery to a
JSON file, atomically (temp file + rename) on every change:

    {"generation": 7, "endpoints": [{"name": "checkout-0", "address": "127.0.0.2:18080",
      "ports": {"http": 18080, "grpc": 19090},
      "labels": {"pod": "checkout-0", "namespace": "demo", "service": "checkout",
                 "proxy_version": "1.20.3"}}, ...]}

A rollout restarts pods batch by batch from one version to another, as a sidecar upgrade
does: the pod leaves the endpoint list (a terminating pod is not ready), keeps serving for
`notice_s` with health failing, drains (`drain_s`) and closes its listeners, then a new
server of the new version binds the same address and the pod re-enters the list. Every
step is a `FleetEvent` that a demo can show and a test can await (`wait_for`, `events`).

    python -m targets.fleet --pods 12 --from 1.20.3 --to 1.21.0 --rollout-after 10s \\
        --interval 4s --endpoints-file /tmp/fleet.json --profiles targets/examples/profiles.yaml

With `--sidecar haproxy` (`Fleet(sidecar=HaproxySidecars(...))`) each pod's sidecar is a real
HAProxy process instead of the emulated one; see `targets.haproxy`. With a relay as well, the
relay pods' outbound side is real too: one outbound HAProxy per caller version
(`targets.haproxy_outbound`), its server list set through HAProxy's runtime API to what the
emulated control plane gives that version (`targets.meshview`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Final, Protocol
from urllib.parse import urlsplit, urlunsplit

from probes.errors import BadInput
from targets.meshview import EmulatedMesh
from targets.profile import Faults, ProfileSet, VersionProfile
from targets.relay_config import RelayConfig
from targets.server import TargetServer, hostport

ORDERS = ("ordinal", "reverse", "random")


class EventKind:
    ROLLOUT_STARTED: Final = "rollout_started"
    RESTART_STARTED: Final = "restart_started"
    RESTART_FINISHED: Final = "restart_finished"
    ROLLOUT_FINISHED: Final = "rollout_finished"
    POD_ADDED: Final = "pod_added"  # scaled up: a new pod, on a new address
    POD_REMOVED: Final = "pod_removed"  # scaled down: the pod is gone with its address


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """One step of a rollout. `at` is wall-clock seconds; `seq` its index in the history."""

    seq: int
    kind: str
    at: float
    pod: str | None = None
    from_version: str | None = None
    to_version: str | None = None


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """A published pod, as discovery sees it."""

    name: str
    host: str
    http_port: int
    grpc_port: int | None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    def to_json(self) -> dict[str, object]:
        ports = {"http": self.http_port}
        if self.grpc_port is not None:
            ports["grpc"] = self.grpc_port
        return {"name": self.name, "address": hostport(self.host, self.http_port),
                "ports": ports, "labels": dict(self.labels)}


class Pod(Protocol):
    """What the fleet needs of a pod: a `TargetServer` (emulated sidecar) or, in HAProxy
    mode, a `targets.haproxy.HaproxyPod`."""

    pod: str
    host: str

    @property
    def version(self) -> str: ...

    @property
    def http_port(self) -> int: ...

    @property
    def grpc_port(self) -> int | None: ...

    async def start(self) -> None: ...

    async def stop(self, drain_s: float = ..., *, notice_s: float = ...) -> None: ...


class OutboundProxy(Protocol):
    """A caller version's real outbound proxy (`targets.haproxy_outbound.HaproxyOutbound`)."""

    @property
    def address(self) -> str: ...

    @property
    def upstreams(self) -> tuple[str, ...]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def set_upstreams(self, addresses: Sequence[str]) -> bool: ...


class SidecarFactory(Protocol):
    """Builds the pods of a real-sidecar mode (`targets.haproxy.HaproxySidecars`), and the
    outbound proxy of a caller version for the relay."""

    def app_profile(self, version: str) -> VersionProfile: ...

    def pod(
        self, profile: VersionProfile, *, host: str, http_port: int, grpc_port: int | None,
        pod: str, seed: int | None, keep_alive_s: float, drain_s: float, notice_s: float,
        namespace: str = "", relay: RelayConfig | None = None,
    ) -> Pod: ...

    def outbound(self, version: str, *, name: str, upstreams: Sequence[str],
                 slots: int) -> OutboundProxy: ...


def _every_route(profile: VersionProfile, worse: Callable[[Faults], Faults]) -> VersionProfile:
    return dataclasses.replace(profile, defaults=worse(profile.defaults),
                               routes={r: worse(f) for r, f in profile.routes.items()})


def on_bad_node(profile: VersionProfile, error_rate: float) -> VersionProfile:
    """`profile` on a node that fails `error_rate` of every route's calls besides its own
    faults (persistent errors: a retry on the same pod fails again)."""
    return _every_route(profile, lambda f: dataclasses.replace(
        f, error_rate=1.0 - (1.0 - f.error_rate) * (1.0 - error_rate)))


def on_slow_node(profile: VersionProfile, delay_s: float) -> VersionProfile:
    """`profile` on a node that adds `delay_s` to every route's calls besides its own
    latency (a noisy neighbour, a throttled CPU)."""
    return _every_route(profile, lambda f: dataclasses.replace(
        f, latency=dataclasses.replace(f.latency, fixed_s=f.latency.fixed_s + delay_s)))


def pod_hosts(base_host: str, count: int) -> list[str]:
    """`count` loopback addresses from `base_host` up, skipping .0 and .255."""
    try:
        address = ipaddress.IPv4Address(base_host)
    except ValueError:
        raise BadInput(f"bad base host {base_host!r} (want an IPv4 loopback address)") from None
    hosts: list[str] = []
    while len(hosts) < count:
        if not address.is_loopback:
            raise BadInput(f"{count} pods from {base_host} leave 127.0.0.0/8")
        if address.packed[-1] not in (0, 255):
            hosts.append(str(address))
        address += 1
    return hosts


class Fleet:
    """N pods of one service; `start()`, `rollout()`, `stop()`.

    `sidecar` switches to a real-sidecar mode: pods come from its `pod()` and versions are
    checked against it instead of `profiles` (which must then be None).

    `bad_nodes` maps a pod's ordinal to an error rate its node adds to every route, whatever
    the version and across restarts (the pod keeps its host): sick pods that are not the
    version's fault, in either cohort, as a bad node or a noisy neighbour makes them.
    `slow_nodes` likewise maps an ordinal to a delay in seconds its node adds to every call.

    `relay` makes every pod a relay pod with that allowlist, its outbound side that of its
    proxy version: the retries of the version's profile (`outbound`) and the endpoint view
    `mesh` keeps for that version (`targets.meshview.EmulatedMesh`; default: one whose
    control plane runs `version`). The fleet pushes its published endpoints to `mesh` as
    `service`'s list, so a caller whose version falls outside the control plane's skew
    (`mesh.move_control_plane`) keeps routing by the last list it took: after a `scale`
    down, to addresses no pod holds.

    With `relay` and a real sidecar, the outbound side is real as well: each caller version
    gets one outbound proxy from `sidecar.outbound` (HAProxy with that version's retries),
    started before its first pod, and the allowlist's destinations that name `service` name
    that proxy's address on its pods. Its server list is the mesh's view for its version,
    set (HAProxy's runtime API) after every change the fleet publishes and after
    `move_control_plane`: so it follows the fleet while the version is within the control
    plane's skew, and keeps its stale list outside it. One proxy per version, not per pod:
    a mesh pushes one list to every sidecar of a version (the emulated side keeps one view
    per version too), and a fleet of N pods needs two or three processes, not N more.
    """

    def __init__(
        self,
        *,
        pods: int,
        version: str,
        profiles: ProfileSet | None = None,
        base_host: str = "127.0.0.2",
        http_port: int = 0,
        grpc_port: int | None = 0,
        namespace: str = "default",
        service: str = "target",
        endpoints_file: str | Path | None = None,
        seed: int | None = None,
        drain_s: float = 1.0,
        notice_s: float = 0.0,
        keep_alive_s: float = 30.0,
        wall_clock: Callable[[], float] = time.time,
        sidecar: SidecarFactory | None = None,
        bad_nodes: Mapping[int, float] | None = None,
        relay: RelayConfig | None = None,
        mesh: EmulatedMesh | None = None,
        slow_nodes: Mapping[int, float] | None = None,
    ):
        if pods < 1:
            raise BadInput("a fleet needs at least one pod")
        if sidecar is not None and profiles is not None:
            raise BadInput("fault profiles (--profiles) are for the emulated sidecar; a real "
                           "sidecar's versions come from its own file (--haproxy-profiles)")
        self._sidecar = sidecar
        if (bad_nodes or slow_nodes) and sidecar is not None:
            raise BadInput("bad nodes are emulated by the fault profiles, not a real sidecar")
        if any(not 0.0 <= rate <= 1.0 for rate in (bad_nodes or {}).values()):
            raise BadInput("a bad node's error rate lies in [0, 1]")
        if any(not delay >= 0.0 for delay in (slow_nodes or {}).values()):
            raise BadInput("a slow node's delay must not be negative")
        self._bad_nodes = dict(bad_nodes or {})
        if relay is not None and sidecar is not None:
            others = sorted({d.service for d in relay.destinations.values()
                             if d.service and d.service != service})
            if others:
                raise BadInput(f"the relay's destinations name service(s) {', '.join(others)}; "
                               f"the fleet's outbound HAProxy balances over {service} only")
            if any(d.service and d.kind == "grpc" for d in relay.destinations.values()):
                raise BadInput("the fleet's outbound HAProxy proxies HTTP destinations only; "
                               "a gRPC destination cannot name the service")
        self._relay = relay
        self._outbounds: dict[str, OutboundProxy] = {}
        self._outbound_lock = asyncio.Lock()
        self.mesh = mesh if mesh is not None or relay is None else EmulatedMesh(version)
        self._slow_nodes = dict(slow_nodes or {})
        self.namespace = namespace
        self.service = service
        self.drain_s = drain_s
        self.notice_s = notice_s
        self._profiles = profiles
        self._base_host = base_host
        self._hosts = pod_hosts(base_host, pods)
        self._ordinals = list(range(pods))  # names and seeds: a new pod never takes an old name
        self._http_port = http_port
        self._grpc_port = grpc_port
        self._endpoints_file = Path(endpoints_file) if endpoints_file is not None else None
        self._seed = seed
        self._keep_alive_s = keep_alive_s
        self._wall = wall_clock
        self._initial = self.profile(version)
        self._template = version  # what a scale-up starts: the last rollout's version
        self._servers: list[Pod] = []
        self._published: list[bool] = []
        self._start_times: list[str] = []  # each pod's start, as Kubernetes' status.startTime
        self._generation = 0
        self._history: list[FleetEvent] = []
        self._changed = asyncio.Condition()
        self._restarting: set[int] = set()
        self._closing = asyncio.Event()
        self._started = False

    # --- state ---

    @property
    def pods(self) -> tuple[Pod, ...]:
        """The current server of every pod, in ordinal order."""
        return tuple(self._servers)

    @property
    def generation(self) -> int:
        """Bumped on every published change."""
        return self._generation

    def profile(self, version: str) -> VersionProfile:
        if self._sidecar is not None:
            return self._sidecar.app_profile(version)
        if self._profiles is None:
            return VersionProfile(version)
        return self._profiles.profile(version)

    def endpoints(self) -> list[PodEndpoint]:
        """The endpoints as last published (pods being restarted are absent)."""
        return [self._endpoint(s, started) for s, started, shown
                in zip(self._servers, self._start_times, self._published, strict=True) if shown]

    def version_counts(self) -> dict[str, int]:
        """Pods per proxy version (a pod being restarted counts as its old version)."""
        counts: dict[str, int] = {}
        for server in self._servers:
            counts[server.version] = counts.get(server.version, 0) + 1
        return counts

    def history(self) -> tuple[FleetEvent, ...]:
        return tuple(self._history)

    def _endpoint(self, server: Pod, started: str) -> PodEndpoint:
        # start_time, as discovery labels a Kubernetes pod: a pod restarted under its own name
        # (as a StatefulSet's are) warms up again in the verdict.
        return PodEndpoint(
            name=server.pod, host=server.host, http_port=server.http_port,
            grpc_port=server.grpc_port,
            labels={"pod": server.pod, "namespace": self.namespace, "service": self.service,
                    "proxy_version": server.version, "start_time": started},
        )

    def _started_now(self) -> str:
        # RFC 3339 to the millisecond: a pod restarted within a second still starts anew.
        return datetime.fromtimestamp(self._wall(), tz=UTC).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")

    # --- lifecycle ---

    async def start(self) -> None:
        """Start every pod; pod 0 picks the ports when they are 0, the others reuse them."""
        if self._started:
            raise RuntimeError("fleet already started")
        self._started = True
        http_port, grpc_port = self._http_port, self._grpc_port
        try:
            await self._outbound_for(self._initial.version)
            for i, host in zip(self._ordinals, self._hosts, strict=True):
                server = self._new_server(i, host, self._initial, http_port, grpc_port)
                await server.start()
                self._servers.append(server)
                self._start_times.append(self._started_now())
                self._published.append(True)
                http_port, grpc_port = server.http_port, server.grpc_port
            self._publish()
            await self.sync_outbounds()
        except BaseException:
            await asyncio.gather(*(s.stop(0.0) for s in self._servers))
            await self._stop_outbounds()
            raise

    def _new_server(
        self, i: int, host: str, profile: VersionProfile, http_port: int, grpc_port: int | None
    ) -> Pod:
        if self._sidecar is not None:
            relay = None
            if self._relay is not None:
                relay = _through(self._relay, self.service,
                                 self._outbounds[profile.version].address)
            return self._sidecar.pod(
                profile, host=host, http_port=http_port, grpc_port=grpc_port,
                pod=f"{self.service}-{i}",
                seed=None if self._seed is None else self._seed * 1_000_003 + i,
                keep_alive_s=self._keep_alive_s, drain_s=self.drain_s, notice_s=self.notice_s,
                namespace=self.namespace if relay is not None else "", relay=relay,
            )
        if i in self._bad_nodes:
            profile = on_bad_node(profile, self._bad_nodes[i])
        if i in self._slow_nodes:
            profile = on_slow_node(profile, self._slow_nodes[i])
        return TargetServer(
            profile, host=host, http_port=http_port, grpc_port=grpc_port,
            pod=f"{self.service}-{i}",
            seed=None if self._seed is None else self._seed * 1_000_003 + i,
            keep_alive_s=self._keep_alive_s,
            # A relay pod says who it is (its answer's `caller`), and routes by its view.
            namespace=self.namespace if self._relay is not None else "", relay=self._relay,
            relay_view=None if self.mesh is None else self.mesh.view(profile.version),
        )

    async def stop(self, drain_s: float = 0.0) -> None:
        """End any rollout after its current batch, then drain and close every pod."""
        self._closing.set()
        async with self._changed:
            await self._changed.wait_for(lambda: not self._restarting)
        try:
            await asyncio.gather(*(s.stop(drain_s) for s in self._servers))
        finally:
            await self._stop_outbounds()
        self._published = [False] * len(self._servers)
        if self._started:
            self._publish()

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- restarts ---

    async def restart(self, index: int, version: str) -> None:
        """Restart pod `index` as `version`: unpublish, drain, close, rebind, republish."""
        if self._closing.is_set():
            raise RuntimeError("fleet is stopping")
        if index in self._restarting:
            raise RuntimeError(f"pod {index} is already restarting")
        profile = self.profile(version)
        old = self._servers[index]
        self._restarting.add(index)
        try:
            await self._emit(EventKind.RESTART_STARTED, old.pod, old.version, version)
            self._published[index] = False
            self._publish()
            await self.sync_outbounds()
            await old.stop(self.drain_s, notice_s=self.notice_s)
            await self._outbound_for(version)
            new = self._new_server(self._ordinals[index], old.host, profile, old.http_port,
                                   old.grpc_port)
            await new.start()
            self._servers[index] = new
            self._start_times[index] = self._started_now()
            self._published[index] = True
            self._publish()
            await self.sync_outbounds()
            await self._emit(EventKind.RESTART_FINISHED, new.pod, old.version, version)
        finally:
            async with self._changed:
                self._restarting.discard(index)
                self._changed.notify_all()

    async def rollout(
        self,
        to_version: str,
        *,
        interval_s: float,
        batch_size: int = 1,
        order: str = "ordinal",
        seed: int | None = None,
        limit: int | None = None,
    ) -> None:
        """Restart every pod not on `to_version`, `batch_size` at a time, a batch starting
        every `interval_s` (or when the previous one ends, if later). Stops early, after
        the current batch, when the fleet stops. `limit` restarts at most that many pods and
        then holds, as a staged rollout pauses at a step for its gate."""
        if order not in ORDERS:
            raise BadInput(f"unknown rollout order {order!r} (one of {', '.join(ORDERS)})")
        if batch_size < 1:
            raise BadInput("batch size must be at least 1")
        self.profile(to_version)  # an unknown version fails before anything restarts
        self._template = to_version
        todo = [i for i, s in enumerate(self._servers) if s.version != to_version]
        if order == "reverse":
            todo.reverse()
        elif order == "random":
            random.Random(seed).shuffle(todo)
        if limit is not None:
            todo = todo[: max(0, limit)]
        from_versions = sorted({self._servers[i].version for i in todo})
        await self._emit(EventKind.ROLLOUT_STARTED, None, ",".join(from_versions), to_version)
        loop = asyncio.get_running_loop()
        for start in range(0, len(todo), batch_size):
            if self._closing.is_set():
                break
            began = loop.time()
            batch = todo[start:start + batch_size]
            await asyncio.gather(*(self.restart(i, to_version) for i in batch))
            if start + batch_size < len(todo):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(),
                                           max(0.0, began + interval_s - loop.time()))
        await self._emit(EventKind.ROLLOUT_FINISHED, None, None, to_version)

    # --- scale ---

    async def scale(self, pods: int, *, version: str | None = None) -> None:
        """Scale the service to `pods`: the newest pods go first (unpublished, drained,
        closed: their addresses are then held by nobody), new ones start on new addresses
        under new names, on `version` (default: the last rollout's, or the first version)."""
        if pods < 1:
            raise BadInput("a fleet needs at least one pod")
        if self._closing.is_set() or self._restarting:
            raise RuntimeError("cannot scale while pods restart or the fleet stops")
        while len(self._servers) > pods:
            server = self._servers[-1]
            self._published[-1] = False
            self._publish()
            await self.sync_outbounds()
            await server.stop(self.drain_s, notice_s=self.notice_s)
            for column in (self._servers, self._published, self._start_times, self._ordinals,
                           self._hosts):
                column.pop()
            await self._emit(EventKind.POD_REMOVED, server.pod, server.version, None)
        if len(self._servers) < pods:
            profile = self.profile(version or self._template)
            await self._outbound_for(profile.version)
            first = self._servers[0]
            ordinal = max(self._ordinals, default=-1) + 1
            used = pod_hosts(self._base_host, ordinal)  # every address a pod ever held
            for host in pod_hosts(self._base_host, ordinal + pods - len(self._servers))[
                    len(used):]:
                server = self._new_server(ordinal, host, profile, first.http_port,
                                          first.grpc_port)
                await server.start()
                self._servers.append(server)
                self._published.append(True)
                self._start_times.append(self._started_now())
                self._ordinals.append(ordinal)
                self._hosts.append(host)
                self._publish()
                await self.sync_outbounds()
                await self._emit(EventKind.POD_ADDED, server.pod, None, server.version)
                ordinal += 1

    # --- the relay's real outbound side ---

    @property
    def outbounds(self) -> Mapping[str, OutboundProxy]:
        """The outbound proxy of each caller version (with a relay and a real sidecar)."""
        return MappingProxyType(self._outbounds)

    async def move_control_plane(self, version: str) -> None:
        """Move the emulated control plane (`mesh.move_control_plane`) and bring the real
        outbound proxies to what it now gives each caller version."""
        if self.mesh is None:
            raise RuntimeError("the fleet has no relay, so no emulated control plane")
        self.mesh.move_control_plane(version)
        await self.sync_outbounds()

    async def sync_outbounds(self) -> None:
        """Give each real outbound proxy its version's list from the mesh's view (which the
        mesh changes only while that version is within the control plane's skew)."""
        if self.mesh is None:
            return
        async with self._outbound_lock:
            for version, proxy in self._outbounds.items():
                await proxy.set_upstreams(self.mesh.view(version).addresses(self.service))

    async def _outbound_for(self, version: str) -> None:
        """Start `version`'s outbound proxy if the fleet needs one and has none yet."""
        if self._sidecar is None or self._relay is None or self.mesh is None:
            return
        async with self._outbound_lock:
            if version in self._outbounds:
                return
            view = self.mesh.view(version)  # a new version's view starts from the lists now
            proxy = self._sidecar.outbound(
                version, name=f"{self.service}-outbound-{version}",
                upstreams=view.addresses(self.service),
                slots=max(_MIN_SLOTS, _SLOTS_PER_POD * len(self._hosts)))
            await proxy.start()
            self._outbounds[version] = proxy

    async def _stop_outbounds(self) -> None:
        proxies, self._outbounds = list(self._outbounds.values()), {}
        await asyncio.gather(*(p.stop() for p in proxies))

    # --- events ---

    async def _emit(
        self, kind: str, pod: str | None, from_version: str | None, to_version: str | None
    ) -> None:
        async with self._changed:
            self._history.append(FleetEvent(
                seq=len(self._history), kind=kind, at=self._wall(), pod=pod,
                from_version=from_version, to_version=to_version,
            ))
            self._changed.notify_all()

    async def wait_for(
        self, predicate: Callable[[FleetEvent], bool], *, start: int = 0
    ) -> FleetEvent:
        """The first event from index `start` on that satisfies `predicate`, waiting for it."""
        async with self._changed:
            while True:
                for event in self._history[start:]:
                    if predicate(event):
                        return event
                start = len(self._history)
                await self._changed.wait()

    async def events(self, start: int = 0) -> AsyncIterator[FleetEvent]:
        """Every event from index `start` on, as it happens (runs until cancelled)."""
        while True:
            async with self._changed:
                while len(self._history) <= start:
                    await self._changed.wait()
                fresh = self._history[start:]
            for event in fresh:
                yield event
            start += len(fresh)

    # --- publishing ---

    def _publish(self) -> None:
        self._generation += 1
        if self.mesh is not None:
            self.mesh.set_endpoints(self.service, [hostport(e.host, e.http_port)
                                                   for e in self.endpoints()])
        if self._endpoints_file is None:
            return
        # One endpoint per line: readable, and small for thousands of pods.
        lines = ",\n  ".join(json.dumps(e.to_json()) for e in self.endpoints())
        text = f'{{"generation": {self._generation}, "endpoints": [\n  {lines}\n]}}\n'
        try:
            write_atomically(self._endpoints_file, text)
        except OSError as exc:
            raise BadInput(f"cannot write endpoints file {self._endpoints_file}: "
                           f"{exc.strerror or exc}") from exc


# Server slots of an outbound proxy: its list may grow to this many pods (scale-ups).
_MIN_SLOTS, _SLOTS_PER_POD = 64, 4


def _through(relay: RelayConfig, service: str, proxy: str) -> RelayConfig:
    """`relay` with every destination of `service` sent to the outbound proxy at `proxy`
    (host:port), as a mesh app names a service and its sidecar picks the pod."""
    destinations = {
        name: dataclasses.replace(
            d, url=urlunsplit(urlsplit(d.url)._replace(netloc=proxy)), service="")
        if d.service == service and d.kind == "http" else d
        for name, d in relay.destinations.items()}
    return dataclasses.replace(relay, destinations=destinations)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` so a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide it from a reader in a sidecar
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

