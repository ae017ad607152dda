"""The lean HTTP/2 client (HTTP/2 and gRPC unary paths): one endpoint's request and its
connections (BENCHMARKS.md, D15).

As `_h1` did for HTTP/1.1 (D6): the request's header list is checked and HPACK-encoded once
per endpoint (`_h2frames`), and per call only the request id (and gRPC's deadline) is
appended. One connection per endpoint (`_h2own.OwnConnection`) carries every concurrent
call; a second opens only when the server's stream limit is reached, or the first has been
told to go away or has gone silent. Calls that arrive while a connection is being opened
share it, and one caller's deadline does not end the others' connect. An idle connection
is closed after the path's keep-alive.

The errors it raises are `_h2base`'s (`H2Error` and its tree, with the replay rule); how
each stream ends on a connection is `_h2own`'s.
"""

from __future__ import annotations

import asyncio
import ssl

from probes.clients._base import connect_protocol
from probes.clients._h2base import (
    ConnectFailed,
    ConnectTimedOut,
    Disconnected,
    H2Answer,
    H2Settings,
    Header,
)
from probes.clients._h2frames import encode_block
from probes.clients._h2own import OwnConnection

__all__ = ["H2Client"]


class H2Client:
    """One endpoint: its request headers and its connection(s)."""

    __slots__ = ("_block", "_body", "_closed", "_connecting", "_conns", "_host",
                 "_port", "_server_name", "_settings", "_ssl")

    def __init__(
        self,
        host: str,
        port: int,
        headers: list[Header],
        body: bytes | None,
        settings: H2Settings,
        *,
        ssl_context: ssl.SSLContext | None,
        server_name: str | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._body = body
        self._settings = settings
        self._ssl = ssl_context
        self._server_name = server_name if ssl_context is not None else None
        # The request's header block, HPACK-encoded once.
        self._block = encode_block(headers)
        self._conns: list[OwnConnection] = []
        # A connection being opened: calls that arrive meanwhile share it.
        self._connecting: asyncio.Task[OwnConnection] | None = None
        self._closed = False

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def request(
        self, extra: list[Header], *, head_only: bool = False, deadline: float = 0.0
    ) -> H2Answer:
        """One request on the endpoint's connection, or a new one; raises `H2Error`.
        `deadline` (loop time, 0: none) is the call's own (gRPC's), kept by the connection."""
        if self._closed:
            raise Disconnected("client closed")
        conn = self._take()
        if conn is None:
            connecting = self._connecting
            if connecting is None:
                connecting = self._connecting = asyncio.ensure_future(self._connect())
                connecting.add_done_callback(self._connected)
            # Shielded: one caller's deadline does not end the others' connection.
            conn = await asyncio.shield(connecting)
        return await conn.exchange(self._block, extra, self._body, head_only=head_only,
                                   deadline=deadline)

    async def aclose(self) -> None:
        self._closed = True
        for conn in self._conns:
            conn.abort()
        self._conns.clear()

    def _take(self) -> OwnConnection | None:
        conns = self._conns
        if not conns:
            return None
        now = asyncio.get_running_loop().time()
        keepalive = self._settings.keepalive_s
        for conn in list(conns):
            if conn.closed or (conn.goaway is not None and not conn.streams):
                conns.remove(conn)
            elif not conn.streams and now - conn.idle_since > keepalive:
                conn.abort()
                conns.remove(conn)
            elif conn.usable:
                return conn
        return None

    def _connected(self, task: asyncio.Task[OwnConnection]) -> None:
        self._connecting = None
        if not task.cancelled():
            task.exception()  # retrieved here too: every caller may have been cancelled

    async def _connect(self) -> OwnConnection:
        conn = OwnConnection(asyncio.get_running_loop(), self._settings)
        await connect_protocol(
            conn, self._host, self._port, ssl_context=self._ssl, server_name=self._server_name,
            budget_s=self._settings.connect_budget_s, failed=ConnectFailed,
            timed_out=ConnectTimedOut,
        )
        if self._closed:
            conn.abort()
            raise Disconnected("client closed")
        self._conns.append(conn)
        return conn
