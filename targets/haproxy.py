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
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from probes._exceptions import BadInput, SkewprobeError
from targets.haproxy_config import (
    HaproxyVersion,
    HaproxyVersions,
    PodWiring,
    load_haproxy_versions,
    render_config,
)
from targets.profile import VersionProfile
from targets.relay_config import RelayConfig
from targets.server import LISTEN_BACKLOG, TargetServer, hostport, parse_hostport

if TYPE_CHECKING:
    from targets.haproxy_outbound import HaproxyOutbound

DEFAULT_READY_TIMEOUT_S = 10.0
# After hard-stop-after HAProxy itself may take up to a second to exit ("Some tasks resisted
# to hard-stop, exiting now"); beyond this margin the fleet escalates.
_EXIT_MARGIN_S = 2.5
_TERM_WAIT_S = 2.0
# The app behind HAProxy never closes HAProxy's idle connections first: a keep-alive race
# would turn into spurious 502s on versions without retries. HAProxy owns connection lifetime.
_APP_KEEP_ALIVE_S = 3600.0


class HaproxyUnavailable(SkewprobeError):
    """HAProxy is not installed, or could not start or validate a configuration."""


def default_versions_file() -> Path:
    """targets/examples/haproxy-profiles.yaml."""
    return Path(__file__).parent / "examples" / "haproxy-profiles.yaml"


def find_haproxy() -> str | None:
    """The haproxy binary: on PATH, else Debian's /usr/sbin/haproxy (sbin is not on every PATH)."""
    found = shutil.which("haproxy")
    if found is None and os.access("/usr/sbin/haproxy", os.X_OK):
        found = "/usr/sbin/haproxy"
    return found


async def haproxy_version(binary: str) -> str:
    """"2.6.12-1+deb12u4" from `haproxy -v`."""
    _, out = await _run_once(binary, "-v")
    words = out.split()
    return words[2] if len(words) > 2 and words[:2] == ["HAProxy", "version"] else "unknown"


async def check_config(binary: str, text: str, *, fds: tuple[int, ...] = ()) -> None:
    """Validate a configuration with `haproxy -c`; HaproxyUnavailable with HAProxy's alerts.
    `fds` are the listening sockets its `bind fd@N` lines name (HAProxy checks them)."""
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", prefix="skewprobe-check-") as cfg:
        cfg.write(text)
        cfg.flush()
        code, out = await _run_once(binary, "-c", "-f", cfg.name, fds=fds)
    if code != 0:
        alerts = [line.strip() for line in out.splitlines() if "ALERT" in line]
        raise HaproxyUnavailable("haproxy -c rejected the configuration: "
                                 + (" | ".join(alerts[:3]) or f"exit {code}"))


async def _run_once(binary: str, *args: str, fds: tuple[int, ...] = ()) -> tuple[int, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            binary, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, pass_fds=fds)
    except OSError as exc:
        raise HaproxyUnavailable(f"cannot run {binary}: {exc.strerror or exc}") from exc
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening socket for HAProxy to inherit (`pass_fds`), with SO_REUSEADDR so a
    restarted pod binds the address its predecessor just closed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {hostport(host, port)}: {exc.strerror}") from exc
    return sock


class HaproxyProcess:
    """One HAProxy child process (foreground, `-db`), stopped by signals.

    `fds` are inherited listening sockets; the caller closes its copies once `start()`
    returns, so that HAProxy's unbind on soft-stop really closes them.
    """

    def __init__(self, binary: str, config: Path, log: Path, fds: tuple[int, ...]):
        self.binary = binary
        self.config = config
        self.log = log
        self._fds = fds
        self._proc: asyncio.subprocess.Process | None = None
        self._exited: asyncio.Task[int] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    async def start(self) -> None:
        binary = shutil.which(self.binary)
        if binary is None:  # checked here: behind setpriv it would only be an exit status
            raise HaproxyUnavailable(f"cannot run {self.binary}: not an executable")
        argv = [binary, "-db", "-f", str(self.config)]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            # The kernel kills HAProxy when the fleet dies, even by SIGKILL.
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        log = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            os.write(log, f"--- {stamp} skewprobe: starting {self.config.name}\n".encode())
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=self._fds, start_new_session=True,
            )
        except OSError as exc:
            raise HaproxyUnavailable(f"cannot run {self.binary}: {exc.strerror or exc}") from exc
        finally:
            os.close(log)
        self._exited = asyncio.create_task(self._proc.wait())

    async def wait(self) -> int:
        """Wait for HAProxy to exit; its exit status."""
        assert self._exited is not None, "not started"
        return await asyncio.shield(self._exited)

    @property
    def exited(self) -> asyncio.Task[int]:
        assert self._exited is not None, "not started"
        return self._exited

    def signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    async def stop(self, *, soft: bool, limit_s: float) -> int:
        """SIGUSR1 (soft) or SIGTERM, then wait up to `limit_s` for the exit; escalate to
        SIGTERM, then SIGKILL, if HAProxy does not go. Returns the exit status."""
        if self._exited is None:
            return 0
        self.signal(signal.SIGUSR1 if soft else signal.SIGTERM)
        for sig, wait_s in ((signal.SIGTERM, limit_s), (signal.SIGKILL, _TERM_WAIT_S)):
            done, _ = await asyncio.wait({self._exited}, timeout=wait_s)
            if done:
                break
            self.signal(sig)
        return await self.wait()


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
            await self.process.stop(soft=False, limit_s=_TERM_WAIT_S)
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
        await asyncio.wait({exited}, timeout=_TERM_WAIT_S)
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
                await self.process.stop(soft=soft, limit_s=limit if soft else _TERM_WAIT_S)
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
        from targets.haproxy_outbound import HaproxyOutbound  # imports this module

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
