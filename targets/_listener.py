"""An HTTP listener: hypercorn's protocol handling on a socket we own, with our own drain.

hypercorn's `serve()` binds its own sockets (no port 0 read-back), starts a lifespan task
per server and, when its graceful timeout expires, *cancels* connection tasks, which on
Python 3.11 makes asyncio log a traceback for every connection cut. A fleet restarts
thousands of these, so this module runs hypercorn's per-connection `TCPServer` directly
(HTTP/1.1, and h2c by prior knowledge or upgrade, on one port). A drain starts with a
GOAWAY on every HTTP/2 connection, as Envoy's does, and ends by aborting what is left:
transports are closed and in-flight app calls cancelled, so every connection task
finishes on its own.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import h2.connection
import h2.exceptions
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config
from hypercorn.utils import wrap_app

from targets._http import HttpApp

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
