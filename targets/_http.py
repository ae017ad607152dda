"""The pod's HTTP API: a raw ASGI app, and the listener that serves it (HTTP/1.1 and h2c on
one port) on a socket the target owns, with its own drain.

Any path answers 200 with a small JSON body naming pod, version and path, unless the
version's faults say otherwise. Knobs in the query string, for tests and demos:
`delay_ms=N` (app-side delay), `status=N` (the app answers N), `bytes=N` (N bytes of filler);
`/api/slow?ms=N` is `delay_ms`. `/healthz` answers 200, or 503 once the pod drains, and
bypasses the sidecar's faults (as a kubelet probe bypasses the mesh's routes).
`/relay/<name>` asks the pod's relay (`targets.relay`) to call the allowlisted destination
`name`: 200 with the `RelayAnswer` as JSON whatever the destination did, 403 for a name not
in the allowlist, 404 when the pod has no relay. Per-request work is kept small: a fleet
process serves thousands of these.

The listener (`HttpListener`): hypercorn's `serve()` binds its own sockets (no port 0
read-back), starts a lifespan task per server and, when its graceful timeout expires,
*cancels* connection tasks, which on Python 3.11 makes asyncio log a traceback for every
connection cut. A fleet restarts thousands of these, so the listener runs hypercorn's
per-connection `TCPServer` directly (HTTP/1.1, and h2c by prior knowledge or upgrade, on one
port). A drain starts with a GOAWAY on every HTTP/2 connection, as Envoy's does, and ends by
aborting what is left: transports are closed and in-flight app calls cancelled, so every
connection task finishes on its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import h2.connection
import h2.exceptions
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config
from hypercorn.utils import wrap_app

from targets.relay import Relay, UnknownDestination
from targets.sidecar import ATTEMPT_COUNT_HEADER, REJECT_STATUS, Forwarded, Sidecar

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 1 << 20
MAX_DELAY_S = 60.0
MAX_FILLER = 1 << 20
_JSON = (b"content-type", b"application/json")
_TEXT = (b"content-type", b"text/plain")
_SERVER = (b"server", b"envoy")
_RELAY = "/relay/"
_ATTEMPT_COUNT = ATTEMPT_COUNT_HEADER.encode()


class HttpApp:
    """One pod's HTTP side. `draining` is flipped by the server when it starts to drain."""

    def __init__(
        self, sidecar: Sidecar, *, relay: Relay | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sidecar = sidecar
        self.relay = relay
        self.draining = False
        self._clock = clock
        self._inflight: set[asyncio.Task[object]] = set()
        self._waiters: list[asyncio.Future[None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            task = asyncio.current_task()
            if task is not None:
                self._inflight.add(task)
            if self._waiters:
                self._wake()
            try:
                await self._http(scope, receive, send)
            finally:
                self._inflight.discard(task)  # type: ignore[arg-type]
        elif kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1003})

    @property
    def inflight(self) -> int:
        """HTTP requests being answered now."""
        return len(self._inflight)

    async def wait_inflight(self, count: int) -> None:
        """Return once at least `count` requests are being answered (for tests and demos)."""
        while len(self._inflight) < count:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def cut_inflight(self) -> None:
        """Cancel every request still being answered: the end of a drain."""
        for task in list(self._inflight):
            task.cancel()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if path == "/healthz":
            status = 503 if self.draining else 200
            await _respond(send, status, [_TEXT, _SERVER, *self._version_header()],
                           b"draining\n" if self.draining else b"ok\n")
            return
        if not await _drain_body(receive):
            await _respond(send, 413, [_TEXT, _SERVER, *self._version_header()],
                           b"body too large\n")
            return
        started = self._clock()
        sidecar = self.sidecar
        faults = sidecar.faults(path)
        given = arrived_attempts = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = value.decode("latin-1")
            elif name == _ATTEMPT_COUNT:
                arrived_attempts = value.decode("latin-1")
        if path.startswith(_RELAY):
            await self._relay(send, path[len(_RELAY):], given)
            return
        request_id = sidecar.request_id(given)
        app_headers = _encode(sidecar.app_headers(arrived_attempts))

        if faults.headers.reject_requests_with:
            rejected = sidecar.rejects(
                faults, (n.decode("latin-1") for n, _ in scope["headers"])
            )
            if rejected is not None:
                headers = sidecar.response_headers(faults, None, request_id, 0.0)
                body = _json({"error": f"request header {rejected} not allowed",
                              "pod": sidecar.pod, "version": sidecar.version})
                await _respond(send, REJECT_STATUS,
                               [_JSON, _SERVER, *_encode(headers), *app_headers], body)
                return

        delay = sidecar.delay(faults)
        if delay > 0:
            await asyncio.sleep(delay)
        forwarded = await sidecar.forward(faults, request_id)
        status = forwarded.status
        filler = 0
        query = scope.get("query_string", b"")
        if query or path == "/api/slow":
            knob_status, app_delay, filler = _knobs(path, query)
            if forwarded.ok and knob_status is not None:
                status = knob_status
            if app_delay > 0:
                limit = faults.max_stream_duration_s
                if limit is not None and app_delay > limit:
                    # Envoy's max_stream_duration before the response started: a 408.
                    await asyncio.sleep(limit)
                    forwarded = Forwarded(408, forwarded.attempts, forwarded.app_attempts)
                    status = 408
                else:
                    await asyncio.sleep(app_delay)

        doc: dict[str, Any] = {
            "pod": sidecar.pod, "version": sidecar.version, "path": path,
            "request_id": request_id, "attempts": forwarded.attempts,
            "app_attempts": forwarded.app_attempts,
        }
        if status != 200:
            doc["error"] = f"app answered {status}"
        if filler:
            doc["filler"] = "x" * filler
        headers = sidecar.response_headers(faults, forwarded, request_id,
                                           self._clock() - started)
        body = b"" if scope.get("method") == "HEAD" else _json(doc)
        await _respond(send, status, [_JSON, _SERVER, *_encode(headers), *app_headers], body)

    async def _relay(self, send: Send, name: str, request_id: str | None) -> None:
        headers = [_JSON, _SERVER, *self._version_header()]
        if self.relay is None:
            await _respond(send, 404, headers, _json({"error": "this pod has no relay"}))
            return
        try:
            answer = await self.relay.call(name, request_id)
        except UnknownDestination as exc:
            await _respond(send, 403, headers, _json({"error": str(exc)}))
            return
        await _respond(send, 200, headers, _json(answer.to_json()))

    def _version_header(self) -> list[tuple[bytes, bytes]]:
        return [(b"x-proxy-version", self.sidecar.version.encode("latin-1"))]


async def _drain_body(receive: Receive) -> bool:
    """Read the request body; False if it is larger than MAX_BODY."""
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return True  # disconnected: the response will go nowhere, that is fine
        size += len(message.get("body", b""))
        if size > MAX_BODY:
            return False
        if not message.get("more_body", False):
            return True


def _knobs(path: str, query: bytes) -> tuple[int | None, float, int]:
    """(status, app delay in s, filler bytes) from the query string; bad values are ignored."""
    status: int | None = None
    delay_s = 0.0
    filler = 0
    for key, value in parse_qsl(query.decode("latin-1")):
        try:
            number = float(value)
        except ValueError:
            continue
        if key == "status" and 200 <= number <= 599:
            status = int(number)
        elif key == "delay_ms" or (key == "ms" and path == "/api/slow"):
            delay_s = min(max(number, 0.0) / 1000.0, MAX_DELAY_S)
        elif key == "bytes":
            filler = int(min(max(number, 0), MAX_FILLER))
    return status, delay_s, filler


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# hypercorn logs app errors here; nothing at INFO, so a fleet of thousands stays quiet.
_LOG = logging.getLogger("targets.hypercorn")
# After a drain's deadline, how long aborted connections get to unwind.
_UNWIND_S = 2.0
# Loop iterations from an accepted socket to its transport's end, with one to spare:
# asyncio's accept task makes the transport, connection_made starts `_on_connection`, which
# aborts it (draining), and the abort's connection_lost closes the socket.
_ACCEPT_STEPS = 5


class HttpListener:
    """Serves `app` on an already listening socket until `drain()`."""

    def __init__(self, app: HttpApp, sock: socket.socket, *, keep_alive_s: float, backlog: int):
        self._app = app
        self._sock = sock
        self._backlog = backlog
        config = Config()
        config.errorlog = _LOG
        config.keep_alive_timeout = keep_alive_s
        config.include_server_header = False
        self._config = config
        self._wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
        self._context = WorkerContext(None)
        self._state: dict[str, object] = {}
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], tuple[TCPServer, asyncio.StreamWriter]] = {}
        self._draining = False

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connection, sock=self._sock, backlog=self._backlog
        )

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._draining:
            # Accepted just before `drain()` stopped accepting, handed to us after it took
            # its list of connections: nobody else would close it (and Python 3.11's
            # Server.wait_closed does not wait for it). A closed listener refuses it.
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        connection = TCPServer(
            self._wrapped, asyncio.get_running_loop(), self._config, self._context,
            self._state, reader, writer,  # type: ignore[arg-type]
        )
        self._connections[task] = (connection, writer)
        try:
            await connection
        finally:
            self._connections.pop(task, None)

    async def drain(self, drain_s: float) -> None:
        """Stop accepting; let busy connections finish up to `drain_s`; cut the rest."""
        self._draining = True
        if self._server is not None:
            # Stop accepting first, and close the server only once the sockets already
            # accepted have become transports: Python 3.11's Server._attach asserts once the
            # server is closed, so a transport made after close() fails half-built, is never
            # closed, and its ResourceWarning surfaces in whichever later test the collector
            # runs in. Those connections reach `_on_connection`, which aborts them.
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            for _ in range(_ACCEPT_STEPS):
                await asyncio.sleep(0)
            self._server.close()
        for connection, writer in self._connections.values():
            _goaway(connection, writer)
        # hypercorn closes idle keep-alive connections at once, answers in-flight HTTP/1.1
        # requests with `connection: close` and sends HTTP/2 GOAWAY once a connection idles.
        await self._context.terminated.set()
        pending = set(self._connections)
        if pending and drain_s > 0:
            _, pending = await asyncio.wait(pending, timeout=drain_s)
        if pending:
            self._app.cut_inflight()
            for task in pending:
                if task in self._connections:
                    self._connections[task][1].transport.abort()
            _, pending = await asyncio.wait(pending, timeout=_UNWIND_S)
            for task in pending:  # last resort; should not happen
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()


def _goaway(connection: TCPServer, writer: asyncio.StreamWriter) -> None:
    """Send GOAWAY (last stream id = the highest the server has seen) on an HTTP/2
    connection, as Envoy does when it drains; hypercorn alone would close idle HTTP/2
    connections without one. HTTP/1.1 connections get `connection: close` from hypercorn."""
    try:
        h2_connection = connection.protocol.protocol.connection  # type: ignore[union-attr]
    except AttributeError:
        return  # not started yet, or an HTTP/1.1 connection
    if not isinstance(h2_connection, h2.connection.H2Connection):
        return
    try:
        h2_connection.close_connection()
    except h2.exceptions.ProtocolError:
        return  # already closed
    writer.write(h2_connection.data_to_send())
