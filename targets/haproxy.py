"""Real HAProxy sidecars for the local fleet: one HAProxy process per pod, in front of the app.

The fleet's default sidecar is emulated in Python (`targets.sidecar`). In HAProxy mode each pod
is a `HaproxyPod`: the reference target app (a `TargetServer` whose profile holds only the app's
own faults, so nothing but HAProxy retries, times out or drains) on private ports of the pod's
address, and a real HAProxy listening on the pod's published HTTP (HTTP/1.1 and h2c) and gRPC
(h2) ports. What differs between emulated proxy versions is HAProxy's configuration
(`targets.haproxy_config`): retries, timeouts, drain.

A restart is a pod restart, as a sidecar upgrade does it: HAProxy gets SIGUSR1, serves for the
fleet's notice time (`grace`, with `/healthz` answering 503), unbinds, drains until
`hard-stop-after` cuts the streams still open, and exits; then the app stops, and a new app and
a new HAProxy with the new version's configuration start on the same address. The app restarts
too so that everything the pod answers names its new version.

Robustness, because these are processes and not tasks:
- listeners are bound here and inherited (`bind fd@N`): a connection made while HAProxy starts
  waits in the kernel's backlog instead of being refused, and readiness is one real request
  through HAProxy to the app (`/healthz`), raced against HAProxy exiting — no sleeps;
- HAProxy runs in its own session (a Ctrl-C on the fleet's terminal reaches the fleet, which
  stops its pods in order) and, through `setpriv --pdeathsig KILL`, is killed by the kernel if
  the fleet dies without stopping it: no orphans;
- a stop that HAProxy does not finish is escalated: SIGTERM after hard-stop-after plus a
  margin, SIGKILL after that;
- each pod's HAProxy log (requests, retries, timeouts, stop notices) goes to `<pod>.log` in a
  work directory, with the configuration of each version as `<pod>-<version>.cfg`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from targets.haproxy_config import (
    HaproxyVersion,
    HaproxyVersions,
    PodWiring,
    load_haproxy_versions,
    render_config,
)
from targets.haproxy_outbound import HaproxyOutbound
from targets.haproxy_process import (
    TERM_WAIT_S,
    HaproxyProcess,
    HaproxyUnavailable,
    check_config,
    find_haproxy,
    listen_socket,
)
from targets.profile import VersionProfile
from targets.relay_config import RelayConfig
from targets.server import TargetServer, hostport, parse_hostport

DEFAULT_READY_TIMEOUT_S = 10.0
# After hard-stop-after HAProxy itself may take up to a second to exit ("Some tasks resisted
# to hard-stop, exiting now"); beyond this margin the fleet escalates.
_EXIT_MARGIN_S = 2.5
# The app behind HAProxy never closes HAProxy's idle connections first: a keep-alive race
# would turn into spurious 502s on versions without retries. HAProxy owns connection lifetime.
_APP_KEEP_ALIVE_S = 3600.0


def default_versions_file() -> Path:
    """targets/examples/haproxy-profiles.yaml."""
    return Path(__file__).parent / "examples" / "haproxy-profiles.yaml"


class HaproxyPod:
    """One fleet pod in HAProxy mode: the app and a real HAProxy sidecar of one version.

    Same surface as `TargetServer` for the fleet (`pod`, `host`, `version`, `http_port`,
    `grpc_port`, `start()`, `stop()`); ports 0 pick free ports, read back after `start()`.
    `notice_s` becomes HAProxy's `grace` and `drain_s` its `hard-stop-after` when the
    version sets none: they are written into the configuration when the pod starts.
    """

    def __init__(
        self,
        settings: HaproxyVersion,
        app_profile: VersionProfile,
        *,
        binary: str,
        workdir: Path,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int | None = 0,
        pod: str = "target",
        seed: int | None = None,
        drain_s: float = 1.0,
        notice_s: float = 0.0,
        keep_alive_s: float = 30.0,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        namespace: str = "",
        relay: RelayConfig | None = None,
    ):
        if app_profile.version != settings.version:
            raise ValueError("app profile and HAProxy settings name different versions")
        self.settings = settings
        self.host = host
        self.pod = pod
        # With `relay` the app is a relay pod; its allowlist names the outbound proxy of its
        # version (`targets.haproxy_outbound`), which makes the retries: the app makes none.
        self.app = TargetServer(app_profile, host=host, http_port=0,
                                grpc_port=None if grpc_port is None else 0, pod=pod, seed=seed,
                                keep_alive_s=_APP_KEEP_ALIVE_S, namespace=namespace,
                                relay=relay)
        self._binary = binary
        self._workdir = workdir
        self._want = (http_port, grpc_port)
        self._ports: tuple[int, int | None] | None = None
        self._drain_s = drain_s
        self._notice_s = notice_s
        self._keep_alive_s = keep_alive_s
        self._ready_timeout_s = ready_timeout_s
        self.process: HaproxyProcess | None = None
        self._stopping: asyncio.Task[None] | None = None

    @property
    def version(self) -> str:
        return self.settings.version

    @property
    def http_port(self) -> int:
        if self._ports is None:
            raise RuntimeError("pod not started")
        return self._ports[0]

    @property
    def grpc_port(self) -> int | None:
        return None if self._ports is None else self._ports[1]

    @property
    def log_path(self) -> Path:
        return self._workdir / f"{self.pod}.log"

    @property
    def config_path(self) -> Path:
        return self._workdir / f"{self.pod}-{self.version}.cfg"

    @property
    def hard_stop_after_s(self) -> float:
        return self.settings.hard_stop_after_s or self._drain_s

    def config_text(self, http_fd: int, grpc_fd: int | None) -> str:
        """This pod's HAProxy configuration, listening on the inherited `http_fd`/`grpc_fd`
        and proxying to the app (which must be started)."""
        return pod_config(
            self.settings, pod=self.pod, fds=(http_fd, grpc_fd), app_host=self.host,
            app_ports=(self.app.http_port, self.app.grpc_port), notice_s=self._notice_s,
            drain_s=self._drain_s, keep_alive_s=self._keep_alive_s,
        )

    async def start(self) -> None:
        """Bind the pod's ports, start the app, start HAProxy; return once a request through
        HAProxy reaches the app. On failure everything started is stopped again."""
        http_port, grpc_port = self._want
        # The pod's own ports first: the app's ephemeral ports can then never take them.
        socks = [listen_socket(self.host, http_port)]
        try:
            if grpc_port is not None:
                socks.append(listen_socket(self.host, grpc_port))
            self._ports = (socks[0].getsockname()[1],
                           socks[1].getsockname()[1] if len(socks) > 1 else None)
            await self.app.start()
            fds = tuple(s.fileno() for s in socks)
            self.config_path.write_text(
                self.config_text(fds[0], fds[1] if len(fds) > 1 else None), encoding="utf-8")
            self.process = HaproxyProcess(self._binary, self.config_path, self.log_path, fds)
            await self.process.start()
        except BaseException:
            for sock in socks:
                sock.close()
            await self.app.stop(0.0)
            raise
        for sock in socks:
            sock.close()  # HAProxy holds them now; its unbind on soft-stop really closes them
        try:
            await self._ready()
        except BaseException:
            await self.process.stop(soft=False, limit_s=TERM_WAIT_S)
            await self.app.stop(0.0)
            raise

    async def _ready(self) -> None:
        assert self.process is not None
        exited = self.process.exited
        check = asyncio.create_task(_healthz(self.host, self.http_port))
        try:
            done, _ = await asyncio.wait({check, exited}, timeout=self._ready_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            check.cancel()
        answer = check.result() if check in done else "no answer in time"
        if answer == "200" and not exited.done():
            return
        # A failed check mostly means HAProxy is exiting: then report HAProxy's own words.
        await asyncio.wait({exited}, timeout=TERM_WAIT_S)
        if exited.done():
            raise HaproxyUnavailable(
                f"HAProxy of pod {self.pod} exited with {exited.result()} at start: "
                f"{_alerts(self.log_path)} (config {self.config_path})")
        raise HaproxyUnavailable(f"HAProxy of pod {self.pod} not ready: {answer}; "
                                 f"log {self.log_path}")

    async def stop(self, drain_s: float = 1.0, *, notice_s: float = 0.0) -> None:
        """Stop the sidecar, then the app. With `drain_s` or `notice_s` > 0 it is HAProxy's
        soft-stop (SIGUSR1: grace, unbind, drain until hard-stop-after, as configured at
        start); with both 0 a hard stop (SIGTERM). Safe to call twice."""
        if self._stopping is None:
            soft = drain_s > 0 or notice_s > 0
            self._stopping = asyncio.create_task(self._stop(soft))
        await asyncio.shield(self._stopping)

    async def _stop(self, soft: bool) -> None:
        try:
            if self.process is not None:
                limit = self._notice_s + self.hard_stop_after_s + _EXIT_MARGIN_S
                await self.process.stop(soft=soft, limit_s=limit if soft else TERM_WAIT_S)
        finally:
            await self.app.stop(0.0)

    async def __aenter__(self) -> HaproxyPod:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop(0.0)


class HaproxySidecars:
    """The fleet's sidecar factory in HAProxy mode (see `targets.fleet.Fleet(sidecar=...)`).

    Owns the work directory (a fresh temporary one, removed by `aclose()`, unless `workdir`
    is given, which is kept) and the versions; `pod()` builds one `HaproxyPod`.
    """

    def __init__(
        self, versions: HaproxyVersions, *, binary: str | None = None,
        workdir: str | Path | None = None,
    ):
        found = binary or find_haproxy()
        if found is None:
            raise HaproxyUnavailable(
                "haproxy is not installed (Debian/Ubuntu: apt-get install haproxy)")
        self.binary = found
        self.versions = versions
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="skewprobe-haproxy-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)

    @classmethod
    async def for_fleet(
        cls, versions_file: str | Path | None, *, workdir: str | Path | None,
        versions: tuple[str | None, ...], drain_s: float, notice_s: float,
    ) -> HaproxySidecars:
        """For `python -m targets.fleet --sidecar haproxy`: the versions file (default: the
        example), and the configs of the versions the fleet will run checked by `haproxy -c`
        before any pod starts."""
        sidecars = cls(load_haproxy_versions(versions_file or default_versions_file()),
                       workdir=workdir)
        try:
            for version in filter(None, versions):
                await sidecars.check(version, drain_s=drain_s, notice_s=notice_s)
        except BaseException:
            await sidecars.aclose()
            raise
        return sidecars

    def app_profile(self, version: str) -> VersionProfile:
        """The app's profile for a pod of `version` (ConfigError for an unknown version)."""
        return self.versions.app_profile(version)

    def pod(
        self, profile: VersionProfile, *, host: str, http_port: int, grpc_port: int | None,
        pod: str, seed: int | None, keep_alive_s: float, drain_s: float, notice_s: float,
        namespace: str = "", relay: RelayConfig | None = None,
    ) -> HaproxyPod:
        return HaproxyPod(
            self.versions.version(profile.version), profile, binary=self.binary,
            workdir=self.workdir, host=host, http_port=http_port, grpc_port=grpc_port,
            pod=pod, seed=seed, drain_s=drain_s, notice_s=notice_s, keep_alive_s=keep_alive_s,
            namespace=namespace, relay=relay,
        )

    def outbound(self, version: str, *, name: str, upstreams: Sequence[str],
                 slots: int) -> HaproxyOutbound:
        """The outbound proxy of callers on `version` (not started): a real HAProxy with
        that version's retries, balancing over `upstreams` (host:port) in `slots` server
        slots, its list changed at run time (`HaproxyOutbound.set_upstreams`)."""
        return HaproxyOutbound(self.binary, self.versions.version(version),
                               [parse_hostport(a) for a in upstreams], self.workdir,
                               name=name, slots=slots)

    async def check(self, version: str, *, drain_s: float = 1.0, notice_s: float = 0.0) -> str:
        """Render `version`'s configuration as a pod would run it and validate it with
        `haproxy -c`; returns the text. HaproxyUnavailable if HAProxy rejects it."""
        settings = self.versions.version(version)
        # Real listening sockets (HAProxy checks `fd@N`); the app ports only have to be
        # valid numbers: `haproxy -c` does not connect to servers.
        socks = [listen_socket("127.0.0.1", 0), listen_socket("127.0.0.1", 0)]
        try:
            fds = (socks[0].fileno(), socks[1].fileno())
            text = pod_config(settings, pod="check", fds=fds, app_host="127.0.0.1",
                              app_ports=(1, 2), notice_s=notice_s, drain_s=drain_s,
                              keep_alive_s=30.0)
            await check_config(self.binary, text, fds=fds)
        finally:
            for sock in socks:
                sock.close()
        return text

    async def aclose(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> HaproxySidecars:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _healthz(host: str, port: int) -> str:
    """The status of one `GET /healthz` (HTTP/1.1, connection: close), e.g. "200", or what
    went wrong instead: a readiness check reports, it does not raise."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return f"connect failed: {exc.strerror or exc}"
    try:
        writer.write(f"GET /healthz HTTP/1.1\r\nhost: {hostport(host, port)}\r\n"
                     "connection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
    except OSError as exc:
        return f"request failed: {exc.strerror or exc}"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        return f"not an HTTP answer: {status_line[:80]!r}"
    return parts[1].decode()


def _alerts(path: Path, limit: int = 3) -> str:
    """HAProxy's ALERT lines since the last start in a pod's log (else its last lines)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    lines = text[text.rfind("--- "):].splitlines()[1:]
    alerts = [line.strip() for line in lines if "ALERT" in line] or lines[-limit:]
    return " | ".join(alerts[:limit])


def pod_config(
    settings: HaproxyVersion, *, pod: str, fds: tuple[int, int | None], app_host: str,
    app_ports: tuple[int, int | None], notice_s: float, drain_s: float, keep_alive_s: float,
) -> str:
    """A pod's HAProxy configuration: the version's settings, with the fleet's notice as
    `grace`, its drain as `hard-stop-after` and its keep-alive as `timeout http-keep-alive`
    where the version does not set them."""
    timeouts = dict(settings.timeouts)
    timeouts.setdefault("http_keep_alive", keep_alive_s)
    wiring = PodWiring(
        pod=pod, http_fd=fds[0], grpc_fd=fds[1], app_host=app_host, app_http_port=app_ports[0],
        app_grpc_port=app_ports[1], grace_s=notice_s, default_hard_stop_after_s=drain_s,
    )
    return render_config(dataclasses.replace(settings, timeouts=timeouts), wiring)
