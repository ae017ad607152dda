"""An h2c server (the `h2` library) that can drain a connection the way real servers do.

With `drain_after=N` its *first* connection holds requests until N have arrived, then does
what nginx does when a connection reaches `keepalive_requests` (or Envoy on a drain): it sends
GOAWAY with a `last_stream_id` below some of the streams in flight, answers the streams up to
that id, and closes. Streams above the id are never processed (RFC 9113 §6.8), so a correct
client may retry them; `processed` records which requests the server really handled.
`goaway_first` puts the GOAWAY before the answers (nginx's order, which trips h2's client state
machine); `refuse=True` instead resets the streams above the id with REFUSED_STREAM (§8.7)
and keeps serving. Later connections answer every request at once.

HTTP paths: `/status/<code>` answers that status, `/big/<bytes>` sends that much body (as far
as flow control lets it, never ending the stream if the window runs out); query parameters
become response headers. Give it an `ssl.SSLContext` (with ALPN `h2`) to serve HTTP/2 over
TLS instead of h2c. It speaks just enough gRPC (an `application/grpc` request gets one
empty message and `grpc-status: 0`) to exercise grpc.aio as well as httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events

from tests.servers._loopback import LoopbackServer


@dataclass(frozen=True)
class Processed:
    request_id: str
    connection: int
    stream_id: int


@dataclass
class _Request:
    headers: dict[str, str]
    complete: bool = False


@dataclass
class H2DrainServer(LoopbackServer):
    host: str = "127.0.0.1"
    ssl_context: ssl.SSLContext | None = None
    drain_after: int = 0
    last_stream_id: int = 0
    goaway_first: bool = True
    refuse: bool = False
    processed: list[Processed] = field(default_factory=list)
    connections: int = 0
    open_connections: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_open_connections(self, count: int) -> None:
        """Until exactly `count` client connections are open (the caller bounds the wait)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.open_connections == count)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._spawn(self._serve_counted(reader, writer))

    async def _serve_counted(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        async with self._changed:
            self.open_connections += 1
            self._changed.notify_all()
        try:
            await self._serve(reader, writer)
        finally:
            async with self._changed:
                self.open_connections -= 1
                self._changed.notify_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        draining = self.drain_after > 0 and index == 0
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        requests: dict[int, _Request] = {}
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        assert event.headers is not None
                        requests[event.stream_id] = _Request(
                            {str(k): str(v) for k, v in event.headers}
                        )
                    elif isinstance(event, h2.events.DataReceived):
                        assert event.flow_controlled_length is not None
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded):
                        request = requests[event.stream_id]
                        request.complete = True
                        if not draining:
                            self._answer(conn, index, event.stream_id, request)
                writer.write(conn.data_to_send())
                if draining and sum(r.complete for r in requests.values()) >= self.drain_after:
                    await self._drain(conn, index, requests, writer)
                    if not self.refuse:
                        break
                    draining = False  # refusing streams does not end the connection
            await writer.drain()
            # Half-close and let the client hang up first, so our last frames are not lost
            # to a RST caused by unread client bytes.
            if writer.can_write_eof():
                writer.write_eof()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    while await reader.read(65536):
                        pass
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _drain(
        self,
        conn: h2.connection.H2Connection,
        index: int,
        requests: dict[int, _Request],
        writer: asyncio.StreamWriter,
    ) -> None:
        for stream_id in sorted(requests):
            if stream_id <= self.last_stream_id:
                self._answer(conn, index, stream_id, requests[stream_id])
            elif self.refuse:
                conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        answers = conn.data_to_send()
        if self.refuse:
            writer.write(answers)
            return
        # h2 refuses to send frames after its own GOAWAY, so encode the answers first and put
        # the GOAWAY in front of them on the wire when asked to (both orders are legal).
        conn.close_connection(error_code=0, last_stream_id=self.last_stream_id)
        goaway = conn.data_to_send()
        writer.write(goaway + answers if self.goaway_first else answers + goaway)

    def _answer(
        self, conn: h2.connection.H2Connection, index: int, stream_id: int, request: _Request
    ) -> None:
        self.processed.append(Processed(request.headers.get("x-request-id", ""), index, stream_id))
        if request.headers.get("content-type", "").startswith("application/grpc"):
            conn.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])
            conn.send_data(stream_id, b"\x00\x00\x00\x00\x00")
            conn.send_headers(
                stream_id, [("grpc-status", "0"), ("x-app-attempts", "1")], end_stream=True
            )
            return
        url = urlsplit(request.headers.get(":path", "/"))
        parts = url.path.strip("/").split("/")
        extra = [(k.lower(), v) for k, v in parse_qsl(url.query)]
        if parts[0] == "big":
            conn.send_headers(stream_id, [(":status", "200"), *extra])
            size = int(parts[1])
            while size > 0:
                step = min(
                    size, conn.max_outbound_frame_size, conn.local_flow_control_window(stream_id)
                )
                if step <= 0:
                    return  # window exhausted: the rest would wait for the client
                conn.send_data(stream_id, b"x" * step, end_stream=step == size)
                size -= step
            return
        status = parts[1] if parts[0] == "status" else "200"
        if status in ("204", "304"):
            conn.send_headers(stream_id, [(":status", status), *extra], end_stream=True)
            return
        body = f"stream {stream_id} on connection {index}".encode()
        conn.send_headers(
            stream_id,
            [(":status", status), ("content-length", str(len(body))), *extra],
        )
        conn.send_data(stream_id, body, end_stream=True)
