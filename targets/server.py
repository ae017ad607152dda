"""The reference target: one "pod" with an emulated sidecar of a given proxy version.

`TargetServer` listens on a loopback (or any) host with two ports: HTTP/1.1 and h2c prior
knowledge on one (hypercorn, raw ASGI), gRPC on the other (grpc.aio: the `Target` service
plus the standard `grpc.health.v1.Health`). Every answer carries the emulated version in
`x-proxy-version` (HTTP header, gRPC trailing metadata). Faults come from a
`targets.profile.VersionProfile`.

Stopping is a drain, as Envoy drains on a restart: health turns NOT_SERVING (and `/healthz`
503), the pod keeps serving for `notice_s` (the time a real endpoint removal takes to
propagate), then the listeners close, in-flight requests get up to `drain_s` to finish, and
whatever is still open (held streams, slow requests) is cut.

The command line below; `run_command` and `exit_with` are what the targets' commands (this
one and `python -m targets.fleet`) share: a SkewprobeError said in one line with its exit
code, never a traceback, and ^C ending quietly.

    python -m targets.server --http 127.0.0.1:18080 --grpc 127.0.0.1:19090 \\
        --version 1.20.3 --profiles targets/examples/profiles.yaml --pod checkout-0 \\
        --namespace shop --relay targets/examples/relay-allowlist.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from probes._parsing import parse_duration
from probes.errors import BadInput, SkewprobeError
from targets._grpc import SERVICE, TargetService
from targets._http import HttpApp, HttpListener
from targets.profile import VersionProfile, load_profiles
from targets.proto import target_pb2_grpc
from targets.relay import EndpointView, PodIdentity, Relay
from targets.relay_config import RelayConfig, load_relay
from targets.sidecar import AttemptCounter, Sidecar

DEFAULT_KEEP_ALIVE_S = 30.0
LISTEN_BACKLOG = 1024


def hostport(host: str, port: int) -> str:
    """"host:port", bracketing IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_hostport(text: str) -> tuple[str, int]:
    """("127.0.0.1", 18080) from "127.0.0.1:18080"; BadInput when malformed."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadInput(f"bad address {text!r} (want host:port, e.g. 127.0.0.1:18080)")
    return host, int(port)


class TargetServer:
    """One pod: HTTP and gRPC listeners behind an emulated sidecar.

    `grpc_port=None` serves HTTP only (big fleets). Ports 0 pick free ports; read the
    chosen ones from `http_port` / `grpc_port` after `start()`. With `relay`, the pod also
    calls that allowlist's destinations for the probe (`/relay/<name>`, `Target/Relay`).
    """

    def __init__(
        self,
        profile: VersionProfile,
        *,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int | None = 0,
        pod: str = "target",
        namespace: str = "",
        relay: RelayConfig | None = None,
        relay_view: EndpointView | None = None,
        seed: int | None = None,
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        attempts_ttl_s: float = 60.0,
        attempts_capacity: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.profile = profile
        self.host = host
        self.pod = pod
        self.namespace = namespace
        self._want_http = http_port
        self._want_grpc = grpc_port
        self._keep_alive_s = keep_alive_s
        counter = AttemptCounter(ttl_s=attempts_ttl_s, capacity=attempts_capacity, clock=clock)
        self.sidecar = Sidecar(profile, pod=pod, namespace=namespace, seed=seed,
                               counter=counter, clock=clock)
        self.relay = None if relay is None else Relay(
            relay, caller=PodIdentity(pod, namespace, profile.version), outbound=profile.outbound,
            view=relay_view)
        self._http_app = HttpApp(self.sidecar, relay=self.relay, clock=clock)
        self._service = TargetService(self.sidecar, relay=self.relay, clock=clock)
        self._health = health_aio.HealthServicer()
        self._http_port: int | None = None
        self._grpc_port: int | None = None
        self._http: HttpListener | None = None
        self._grpc: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        self._stopping = False

    @property
    def version(self) -> str:
        return self.profile.version

    @property
    def http_port(self) -> int:
        if self._http_port is None:
            raise RuntimeError("server not started")
        return self._http_port

    @property
    def grpc_port(self) -> int | None:
        return self._grpc_port

    @property
    def http_address(self) -> str:
        return hostport(self.host, self.http_port)

    @property
    def grpc_address(self) -> str | None:
        return None if self._grpc_port is None else hostport(self.host, self._grpc_port)

    @property
    def draining(self) -> bool:
        return self._http_app.draining

    @property
    def inflight(self) -> int:
        """HTTP requests being answered now."""
        return self._http_app.inflight

    async def wait_inflight(self, count: int) -> None:
        """Return once at least `count` HTTP requests are being answered."""
        await self._http_app.wait_inflight(count)

    @property
    def open_streams(self) -> int:
        """Subscribe streams currently held open."""
        return self._service.open_streams

    async def start(self) -> None:
        """Bind and serve; returns once both ports accept connections."""
        sock = _listen_socket(self.host, self._want_http)
        self._http_port = sock.getsockname()[1]
        self._http = HttpListener(self._http_app, sock, keep_alive_s=self._keep_alive_s,
                                  backlog=LISTEN_BACKLOG)
        await self._http.start()
        if self._want_grpc is not None:
            try:
                await self._start_grpc(self._want_grpc)
            except BaseException:
                await self._stop_http(0.0)
                raise

    async def _start_grpc(self, port: int) -> None:
        options: list[tuple[str, int]] = [("grpc.so_reuseport", 0)]
        if self.profile.max_connection_age_s is not None:
            options.append(("grpc.max_connection_age_ms",
                            int(self.profile.max_connection_age_s * 1000)))
        if self.profile.max_connection_age_grace_s is not None:
            options.append(("grpc.max_connection_age_grace_ms",
                            int(self.profile.max_connection_age_grace_s * 1000)))
        server = grpc.aio.server(options=options)
        target_pb2_grpc.add_TargetServicer_to_server(self._service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = hostport(self.host, port)
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            await server.stop(None)
            raise BadInput(f"cannot listen on {address} (gRPC): {exc}") from exc
        self._grpc = server
        self._grpc_port = bound
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await server.start()

    async def stop(self, drain_s: float = 5.0, *, notice_s: float = 0.0) -> None:
        """Drain and close: NOT_SERVING, keep serving `notice_s`, close listeners, give
        in-flight work `drain_s`, then cut what is left. Safe to call twice."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            self._http_app.draining = True
            await self._health.enter_graceful_shutdown()
            if notice_s > 0:
                await asyncio.sleep(notice_s)
            await asyncio.gather(self._stop_http(drain_s), self._stop_grpc(drain_s))
            if self.relay is not None:
                await self.relay.aclose()
        finally:
            self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _stop_http(self, drain_s: float) -> None:
        if self._http is not None:
            await self._http.drain(drain_s)

    async def _stop_grpc(self, drain_s: float) -> None:
        if self._grpc is not None:
            await self._grpc.stop(drain_s)

    async def __aenter__(self) -> TargetServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop(0.0)


def _listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and accepted sockets inherit proto 0 otherwise (then Nagle adds 40 ms per response).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # A restarted pod binds the address its predecessor just closed.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening before hypercorn starts means no connection is refused in between.
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {hostport(host, port)}: {exc.strerror}") from exc
    return sock


# --- command line ------------------------------------------------------------------------------


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m targets.server",
        description="Serve one reference target pod (HTTP + gRPC) emulating a proxy version.",
    )
    parser.add_argument("--http", default="127.0.0.1:18080", help="HTTP listen host:port")
    parser.add_argument("--grpc", default="127.0.0.1:19090",
                        help="gRPC listen host:port, or 'off'")
    parser.add_argument("--version", required=True, help="the proxy version to emulate")
    parser.add_argument("--profiles", help="fault profile YAML (default: no faults)")
    parser.add_argument("--pod", default=socket.gethostname(), help="pod name to report")
    parser.add_argument("--namespace", default="", help="namespace to report (default none)")
    parser.add_argument("--relay", help="relay config YAML: the destinations this pod may "
                        "call for the probe (default: no relay)")
    parser.add_argument("--seed", type=int, help="seed for the fault decisions")
    parser.add_argument("--drain", default="5s", help="drain time on SIGTERM (default 5s)")
    parser.add_argument("--drain-notice", default="0",
                        help="serve this long with health failing before closing (default 0)")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    try:
        drain_s = parse_duration(args.drain)
        notice_s = parse_duration(args.drain_notice)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if args.profiles:
        profile = load_profiles(args.profiles).profile(args.version)
    else:
        profile = VersionProfile(args.version)
    http_host, http_port = parse_hostport(args.http)
    grpc_port: int | None = None
    if args.grpc != "off":
        grpc_host, grpc_port = parse_hostport(args.grpc)
        if grpc_host != http_host:
            raise BadInput("--http and --grpc must use the same host")
    relay = load_relay(args.relay) if args.relay else None
    server = TargetServer(profile, host=http_host, http_port=http_port, grpc_port=grpc_port,
                          pod=args.pod, namespace=args.namespace, relay=relay, seed=args.seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        print(f"pod {server.pod} version {server.version} http={server.http_address} "
              f"grpc={server.grpc_address or 'off'}", flush=True)
        await stop.wait()
        await server.stop(drain_s, notice_s=notice_s)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("targets.server", _serve(_args(argv)))


def run_command(name: str, command: Coroutine[Any, Any, None]) -> int:
    """Run `command`; 0 when it ends, or a SkewprobeError's exit code after one line on
    stderr naming the command (never a traceback for bad input or a busy port)."""
    try:
        asyncio.run(command)
    except SkewprobeError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def exit_with(main: Callable[[], int]) -> NoReturn:
    """`sys.exit(main())`, with ^C ending quietly (the command's own shutdown has run)."""
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)


if __name__ == "__main__":
    exit_with(main)
