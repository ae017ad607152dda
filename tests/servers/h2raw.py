"""A raw HTTP/2 server (the `h2` library) that answers every request the way the last segment
of its `:path` names: it ends gRPC streams in each way grpc core tells apart, and sends what
a broken or hostile gRPC peer sends.

The mode is `<name>` or `<name>-<n>`; `n` (default 1) is how many gRPC messages (DATA frames)
the answer carries after its headers, all written at once. Every answer starts with
`:status 200` and `content-type: application/grpc`, so the HTTP/2 prober sees a body cut the
same ways.

Ending a stream, `after_s` after its messages (or, with `hold` set, once `hold()` returns:
a test can end a stream only when the client has read what it carried):

    status<code>   trailers with grpc-status <code> (an orderly end)
    idleclose      trailers with grpc-status 0 at once; `after_s` later the connection is
                   closed with FIN and no GOAWAY (an idle keep-alive connection dropped)
    rst<code>      RST_STREAM with that HTTP/2 error code
    goaway         GOAWAY (last stream id = this stream), then FIN
    tcprst         the TCP connection closed with RST (SO_LINGER 0)
    fin            the TCP connection closed with FIN
    badframe       a frame longer than any maximum frame size (an HTTP/2 connection error)
    badhpack       a HEADERS frame whose HPACK block cannot be decoded (likewise)

Ending a stream when the request's `grpc-timeout` runs out, with nothing answered before
(what a gRPC server does to a call that outlives its deadline):

    deadline       RST_STREAM CANCEL

Malformed answers, at once (then trailers with grpc-status 0, as if all were well):

    badlength      a message whose length prefix promises more bytes than the stream carries
    huge           a message whose length prefix announces 50 MiB
    compressed     a message with the compressed flag set and no grpc-encoding header
    notproto       a well-framed message whose bytes are not protobuf
    slowheaders    the response HEADERS frame dripped one byte every `drip_s`, never finished

A path whose last segment is not a mode (`/grpc.health.v1.Health/Check`) is answered as
`fallback` says. Each stream is answered by a task of its own, so a slow answer does not
hold the others on the same connection (the connection-wide modes end every stream on it,
as they would). `on_request`, when set, is called with the mode (on the server's loop) when
a request arrives; `on_end` when a `deadline` stream has ended on the server's side (its
reset written, or the client's own reset read first).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from tests.servers._loopback import LoopbackServer
from tests.servers.hostile import abort_with_rst

MESSAGE = b"\x00\x00\x00\x00\x00"  # one empty gRPC message
_MODE = re.compile(r"(?P<name>[a-z]+)(?P<code>\d*)(?:-(?P<count>\d+))?")
# HPACK does not compress a literal this long well: the HEADERS frame stays ~4 KB, so the
# drip outlasts any probe timeout.
_PAD = ("x-pad", "p" * 4096)
# gRPC messages that are wrong (sent in proper HTTP/2 DATA frames; h2 does not look inside).
_BAD_MESSAGES = {
    # the length prefix says 64 bytes; 3 follow, then the stream ends
    "badlength": b"\x00\x00\x00\x00\x40abc",
    # the prefix announces 50 MiB, past any client's receive limit (3 bytes follow)
    "huge": b"\x00" + (50 << 20).to_bytes(4, "big") + b"abc",
    # the compressed flag is set, and the headers named no grpc-encoding
    "compressed": b"\x01\x00\x00\x00\x03abc",
    # well framed; field number 0 is not valid protobuf, and 0xff... never ends a varint
    "notproto": b"\x00\x00\x00\x00\x04\x00\xff\xff\xff",
}
# Frames written around h2 (which would refuse to send them) on the answer's stream:
# connection errors for the peer. (type, flags, payload); the length is the payload's, except
# for `badframe`, whose header claims 16 MiB.
_BAD_FRAMES = {
    # longer than any max frame size (RFC 9113 §4.2: FRAME_SIZE_ERROR)
    "badframe": (0x0, 0x0, b"x" * 16),
    # HEADERS (END_STREAM|END_HEADERS) whose HPACK block indexes entry 0, which does not
    # exist (RFC 7541 §6.1: COMPRESSION_ERROR)
    "badhpack": (0x1, 0x5, b"\x80\x80"),
}


_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def _timeout_s(value: str) -> float:
    """A `grpc-timeout` value (PROTOCOL-HTTP2.md: up to 8 digits and a unit) in seconds."""
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]


def _bad_frame(name: str, sid: int) -> bytes:
    kind, flags, payload = _BAD_FRAMES[name]
    length = 0xFFFFFF if name == "badframe" else len(payload)
    return length.to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


@dataclass(eq=False)
class _Connection:
    """One connection's h2 state and socket; `flush` sends what h2 queued, except while a
    HEADERS frame is being dripped (any other frame would land inside it)."""

    h2: h2.connection.H2Connection
    writer: asyncio.StreamWriter
    dripping: bool = False

    def flush(self) -> None:
        if not self.dripping and not self.writer.is_closing():
            self.writer.write(self.h2.data_to_send())


@dataclass
class RawH2Server(LoopbackServer):
    """The server (see the module docstring); `connections` counts those accepted."""

    host: str = "127.0.0.1"
    bind_port: int = 0
    after_s: float = 0.2
    drip_s: float = 0.05
    fallback: str = "status0"
    hold: Callable[[], Awaitable[None]] | None = None
    on_request: Callable[[str], None] | None = None
    on_end: Callable[[str], None] | None = None
    connections: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def _ended(self, mode: str) -> None:
        if self.on_end is not None:
            self.on_end(mode)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        # A task cancelled before its first step never runs its `finally`: close here too.
        self._spawn(self._serve(reader, writer)).add_done_callback(lambda _: writer.close())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(
            h2.connection.H2Connection(
                h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
            ),
            writer,
        )
        conn.h2.initiate_connection()
        conn.flush()
        answers: set[asyncio.Task[None]] = set()
        try:
            while data := await reader.read(65536):
                for event in conn.h2.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        headers = {str(k): str(v) for k, v in event.headers or ()}
                        mode = headers.get(":path", "/").rsplit("/", 1)[-1]
                        if self.on_request is not None:
                            self.on_request(mode)
                        task = self._spawn(self._answer(mode, event.stream_id, conn, headers))
                        answers.add(task)
                        task.add_done_callback(answers.discard)
                    elif isinstance(event, h2.events.DataReceived):
                        assert event.flow_controlled_length is not None
                        conn.h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                conn.flush()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            for task in answers:
                task.cancel()
            writer.close()

    async def _answer(
        self, mode: str, sid: int, conn: _Connection, request: dict[str, str]
    ) -> None:
        match = _MODE.fullmatch(mode) or _MODE.fullmatch(self.fallback)
        assert match is not None, self.fallback
        name, code, count = match["name"], match["code"], int(match["count"] or 1)
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        h2conn, writer = conn.h2, conn.writer
        try:
            if name == "deadline":
                await asyncio.sleep(_timeout_s(request["grpc-timeout"]))
                try:  # the client may have reset it first (its own deadline)
                    h2conn.reset_stream(sid, 8)  # CANCEL
                    conn.flush()
                    await writer.drain()
                finally:
                    self._ended(mode)
                return
            if name == "slowheaders":
                await self._drip(conn, sid, headers)
                return
            h2conn.send_headers(sid, headers)
            if name in _BAD_MESSAGES:
                h2conn.send_data(sid, _BAD_MESSAGES[name])
                h2conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
                conn.flush()
                return
            for _ in range(count):
                h2conn.send_data(sid, MESSAGE)
            if name == "idleclose":
                h2conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
            conn.flush()
            await writer.drain()
            await (asyncio.sleep(self.after_s) if self.hold is None else self.hold())
            if name == "idleclose":
                writer.close()
                return
            if name == "status":
                h2conn.send_headers(
                    sid, [("grpc-status", code), ("grpc-message", "cut")], end_stream=True
                )
            elif name == "rst":
                h2conn.reset_stream(sid, int(code))
            elif name == "goaway":
                h2conn.close_connection(error_code=0, last_stream_id=sid)
                conn.flush()
                await writer.drain()
                writer.close()
                return
            elif name == "tcprst":
                abort_with_rst(writer)
                return
            elif name == "fin":
                writer.close()
                return
            elif name in _BAD_FRAMES:
                conn.flush()
                writer.write(_bad_frame(name, sid))
                return
            else:
                raise ValueError(f"unknown mode {mode!r}")
            conn.flush()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass  # the client gave up on the stream or the connection first

    async def _drip(self, conn: _Connection, sid: int, headers: list[tuple[str, str]]) -> None:
        """Send the HEADERS frame one byte at a time and never its last byte: the frame (and,
        since HPACK state is per connection, the connection) never completes. Later
        requests on the connection are left unanswered: their frames could only land
        inside the dripping one."""
        if conn.dripping:
            return
        conn.flush()  # what h2 queued before this answer goes out whole
        conn.dripping = True
        conn.h2.send_headers(sid, [*headers, _PAD])
        frame = conn.h2.data_to_send()
        for byte in frame[:-1]:
            if conn.writer.is_closing():
                return
            conn.writer.write(bytes([byte]))
            await conn.writer.drain()
            await asyncio.sleep(self.drip_s)
