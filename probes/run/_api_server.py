"""Serving the probe's API (`probes.api.ApiApp`) from `skewprobe run`.

The listening socket is bound before anything else starts, so a port another process holds
is bad input (exit 2) before the store is created; hypercorn then takes it over by its
descriptor and shuts down gracefully when the run stops: the requests still waiting are
answered 503 at once.
"""

from __future__ import annotations

import asyncio
import socket
from http import HTTPStatus

import h11
import hypercorn.protocol
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.typing import H11SendableEvent

from probes.api import ApiApp
from probes.api_access import apply_tls
from probes.errors import BadInput
from probes.spec import ApiTlsSpec

__all__ = ["bind_api", "parse_listen", "serve_api"]


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise BadInput(f"--listen {listen!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def bind_api(listen: str) -> socket.socket:
    """The API's listening socket, with the options hypercorn sets on sockets it binds."""
    host, port = parse_listen(listen)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        problem = (exc.strerror or str(exc)).lower()
        raise BadInput(
            f"cannot listen on {listen}: {problem} (set another address with --listen or the"
            " config's listen:, or --listen none)"
        ) from None
    return sock


class _ReasonedH11(H11Protocol):
    """hypercorn's HTTP/1.1 with a reason phrase on the status line (`HTTP/1.1 200 OK`):
    hypercorn sends none, and some clients (h2load) count `HTTP/1.1 200 ` as a failure."""

    async def _send_h11_event(self, event: H11SendableEvent) -> None:
        if isinstance(event, h11.Response | h11.InformationalResponse) and not event.reason:
            try:
                reason = HTTPStatus(event.status_code).phrase.encode()
            except ValueError:
                reason = b""
            event = type(event)(status_code=event.status_code, headers=event.headers,
                                http_version=event.http_version, reason=reason)
        await super()._send_h11_event(event)


def _reason_phrases() -> None:
    # hypercorn picks its HTTP/1.1 protocol by this name at each connection; it offers no
    # other way to change the status line.
    hypercorn.protocol.H11Protocol = _ReasonedH11  # type: ignore[misc]


async def serve_api(sock: socket.socket, app: ApiApp, tls: ApiTlsSpec | None,
                    stopping: asyncio.Event) -> None:
    """Serve `app` on `sock` (hypercorn takes the socket over and closes it) until
    `stopping` is set."""
    hconfig = HypercornConfig()
    hconfig.bind = [f"fd://{sock.detach()}"]
    hconfig.accesslog = None
    hconfig.errorlog = None
    hconfig.graceful_timeout = 1.0
    apply_tls(hconfig, tls)
    _reason_phrases()

    async def shutdown() -> None:
        await stopping.wait()
        # Requests still in flight answer now: hypercorn cancels those that outlast its
        # grace, and on Python 3.11 each cancelled connection logs a CancelledError traceback.
        app.stop()

    await serve(app, hconfig, shutdown_trigger=shutdown)  # type: ignore[arg-type]
