"""HTTP/2 framing of the probe's own, for the lean client: what h2 does for a client that
sends small requests and reads answers, at a fraction of its CPU (BENCHMARKS.md D15).

h2 is a general state machine: for every call it HPACK-encodes every request header in
Python (searching its dynamic table), builds frame objects for every frame in and out, and
checks each against its stream state machine. A probe sends the same request to an
endpoint every second, so here the request's header block is encoded once per endpoint
(HPACK without the dynamic table: static-table indices and plain literals), and per call
only the request id (and gRPC's deadline) are appended as literals; incoming frames are
read from their 9-byte headers in one loop. Answers are decoded with `hpack`'s decoder (the
one h2 uses), so the server's dynamic table is followed exactly.

What is checked, as h2 checks it for a client (RFC 9113), each a connection error that
ends every stream on the connection as `MalformedAnswer` (`protocol_error`): the server's
first frame is SETTINGS; frames above the max frame size (at their header, before their
body arrives); a header block that does not decode (COMPRESSION_ERROR) or is interrupted
before END_HEADERS; PUSH_PROMISE (push is off); frames on stream 0 that need a stream and
the reverse; flow-control windows overrun; SETTINGS and PING of the wrong length. A
response without a valid `:status` is a protocol error of that stream. Streams, GOAWAY,
RST_STREAM, deadlines and cancellation behave as in `_h2lean` (same errors, same replay
rules), which this module's connection stands in for.
"""

from __future__ import annotations

import asyncio
from typing import cast

import hpack
from hpack.table import HeaderTable

from probes.clients._h2base import (
    REFUSED_STREAM,
    WINDOW,
    DeadlineExceeded,
    Disconnected,
    H2Answer,
    H2Error,
    H2Settings,
    Header,
    MalformedAnswer,
    ReadTimedOut,
    StreamReset,
    code_name,
)
from probes.clients._wire import Replay

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _PRIORITY, _RST, _SETTINGS, _PUSH, _PING, _GOAWAY, _WINDOW, _CONT = range(10)
_END_STREAM = 0x1
_ACK = 0x1
_END_HEADERS = 0x4
_PADDED = 0x8
_PRIORITY_FLAG = 0x20
_MAX_FRAME = 16384
_DEFAULT_WINDOW = 65535
_CANCEL = 0x8
_PROTOCOL_ERROR = 0x1
# SETTINGS identifiers (RFC 9113 §6.5.2)
_S_HEADER_TABLE, _S_PUSH, _S_MAX_STREAMS, _S_WINDOW, _S_MAX_FRAME, _S_MAX_LIST = range(1, 7)

_STATIC = {pair: i for i, pair in reversed(list(enumerate(HeaderTable.STATIC_TABLE, 1)))}
_STATIC_NAMES = {name: i for (name, _), i in reversed(list(_STATIC.items()))}


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with `first`'s high bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _int(len(data), 7, 0) + data  # not Huffman-coded


def encode_block(headers: list[Header]) -> bytes:
    """HPACK for a request, without the dynamic table: an exact static-table match as an
    index, otherwise a literal without indexing (its name indexed when the static table
    has it)."""
    out = bytearray()
    for name, value in headers:
        index = _STATIC.get((name, value))
        if index is not None:
            out += _int(index, 7, 0x80)
            continue
        name_index = _STATIC_NAMES.get(name)
        if name_index is not None:
            out += _int(name_index, 4, 0x00) + _string(value)
        else:
            out += b"\x00" + _string(name) + _string(value)
    return bytes(out)


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags))
            + stream_id.to_bytes(4, "big") + payload)


class _Stream:
    __slots__ = ("answered", "body", "deadline", "ended", "head_only", "headers", "received",
                 "recv_window", "reused", "send_window", "sent", "status", "trailers", "waiter")

    def __init__(self, waiter: asyncio.Future[H2Answer], *, reused: bool, head_only: bool,
                 sent: float, recv_window: int, send_window: int, deadline: float) -> None:
        self.waiter = waiter
        self.deadline = deadline
        self.reused = reused
        self.head_only = head_only
        self.sent = sent
        self.recv_window = recv_window
        self.send_window = send_window
        self.status = 0
        self.answered = False
        self.ended = False
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.received = 0
        self.body: list[bytes] = []


_DECODED_MAX = 8


class _TableState:
    """What decides how a header block decodes: the dynamic table's length, its newest
    entry (held, compared by identity: a new entry is a new object) and its size limit."""

    __slots__ = ("length", "maxsize", "newest")

    def __init__(self, length: int, newest: object, maxsize: int) -> None:
        self.length = length
        self.newest = newest
        self.maxsize = maxsize

    def same(self, other: _TableState) -> bool:
        return (self.length == other.length and self.newest is other.newest
                and self.maxsize == other.maxsize)


class _ConnectionError(Exception):
    """A connection error found while reading (becomes `MalformedAnswer` for every stream)."""


class OwnConnection(asyncio.Protocol):
    """One TCP (or TLS) connection and the streams in flight on it."""

    __slots__ = (
        "_block",
        "_buf",
        "_decoded",
        "_decoded_at",
        "_decoder",
        "_last_read",
        "_loop",
        "_next_id",
        "_out",
        "_peer_frame",
        "_peer_window",
        "_recv_window",
        "_seen_settings",
        "_send_window",
        "_settings",
        "_stream_window",
        "_timer",
        "_transport",
        "_unacked",
        "_window_waiters",
        "answered_before",
        "closed",
        "goaway",
        "idle_since",
        "max_streams",
        "silent",
        "streams",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: H2Settings) -> None:
        self._loop = loop
        self._settings = settings
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._buf = b""
        self._out: list[bytes] = []
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 65536
        # Header blocks decoded without changing the server's dynamic table, by their
        # bytes: a server answers a probe with the same block every second (see `_decode`).
        self._decoded: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._decoded_at: _TableState | None = None
        self._block: tuple[int, bool, bytearray] | None = None  # a header block in pieces
        self._next_id = 1
        self._seen_settings = False
        # What the server may send us: each stream's window is the body limit (announced in
        # our SETTINGS), the connection's 16 MiB more than the default.
        self._stream_window = min(max(settings.body_limit, _DEFAULT_WINDOW), WINDOW)
        self._recv_window = _DEFAULT_WINDOW + WINDOW
        self._unacked = 0
        # What we may send the server (request bodies).
        self._peer_window = _DEFAULT_WINDOW  # its SETTINGS_INITIAL_WINDOW_SIZE
        self._send_window = _DEFAULT_WINDOW
        self._peer_frame = _MAX_FRAME
        self._window_waiters: list[asyncio.Future[None]] = []
        self.streams: dict[int, _Stream] = {}
        self.goaway: tuple[int, int] | None = None
        self.closed = False
        self.silent = False
        self.answered_before = False
        self.idle_since = loop.time()
        self.max_streams = 100

    @property
    def usable(self) -> bool:
        return (not self.closed and self.goaway is None and not self.silent
                and len(self.streams) < self.max_streams and self._next_id < 0x7FFFFFFF)

    # -- the caller's side -----------------------------------------------------------------

    async def exchange(self, block: bytes, extra: list[Header], body: bytes | None, *,
                       head_only: bool, deadline: float = 0.0) -> H2Answer:
        """One request; `deadline` (loop time, 0: none) ends it as `DeadlineExceeded` on the
        connection's own timer (gRPC's deadline, without a timer of its own per call)."""
        transport = self._transport
        if transport is None or self.closed:
            raise Disconnected("connection closed before the request was sent")
        stream_id = self._next_id
        self._next_id += 2
        waiter: asyncio.Future[H2Answer] = self._loop.create_future()
        stream = _Stream(waiter, reused=self.answered_before, head_only=head_only,
                         sent=self._loop.time(), recv_window=self._stream_window,
                         send_window=self._peer_window, deadline=deadline)
        self.streams[stream_id] = stream
        try:
            payload = block + encode_block(extra) if extra else block
            flags = _END_HEADERS if body else _END_HEADERS | _END_STREAM
            if len(payload) <= self._peer_frame:
                transport.write(_frame(_HEADERS, flags, stream_id, payload))
            else:
                self._write_long_headers(stream_id, payload, flags & _END_STREAM)
            if body:
                await self._send_body(stream_id, stream, body)
            due = stream.sent + self._settings.read_budget_s
            if deadline and deadline < due:
                due = deadline
            if self._timer is None or self._timer.when() > due:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._loop.call_at(due, self._check_read)
            return await waiter
        except BaseException:
            if not stream.ended and not self.closed and self._transport is not None:
                stream.ended = True
                self._transport.write(_frame(_RST, 0, stream_id, _CANCEL.to_bytes(4, "big")))
            raise
        finally:
            del self.streams[stream_id]
            if not self.streams:
                self.idle_since = self._loop.time()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if self.goaway is not None or self.silent:
                    self.abort()
            del waiter, stream

    def _write_long_headers(self, stream_id: int, payload: bytes, end_stream: int) -> None:
        assert self._transport is not None
        size = self._peer_frame
        pieces = [payload[i : i + size] for i in range(0, len(payload), size)]
        frames = [_frame(_HEADERS, end_stream, stream_id, pieces[0])]
        for i, piece in enumerate(pieces[1:], 2):
            frames.append(_frame(_CONT, _END_HEADERS if i == len(pieces) else 0, stream_id, piece))
        self._transport.write(b"".join(frames))

    async def _send_body(self, stream_id: int, stream: _Stream, body: bytes) -> None:
        view = memoryview(body)
        while view:
            assert self._transport is not None
            if self.closed:
                raise Disconnected("connection closed while sending the body")
            window = min(self._send_window, stream.send_window, self._peer_frame)
            if window <= 0:
                waiter: asyncio.Future[None] = self._loop.create_future()
                self._window_waiters.append(waiter)
                await waiter
                continue
            chunk, view = view[:window], view[window:]
            self._send_window -= len(chunk)
            stream.send_window -= len(chunk)
            flags = 0 if view else _END_STREAM
            self._transport.write(_frame(_DATA, flags, stream_id, chunk.tobytes()))

    def abort(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.abort()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        settings = b"".join(
            key.to_bytes(2, "big") + value.to_bytes(4, "big")
            for key, value in ((_S_PUSH, 0), (_S_MAX_STREAMS, 100), (_S_MAX_LIST, 65536),
                               (_S_WINDOW, self._stream_window))
        )
        transport.write(PREFACE + _frame(_SETTINGS, 0, 0, settings)
                        + _frame(_WINDOW, 0, 0, WINDOW.to_bytes(4, "big")))

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        buf = self._buf + data if self._buf else data
        if not self._seen_settings and buf[:5] == b"HTTP/":
            self._fail_all(MalformedAnswer(
                "the server answered in HTTP/1.x: it does not speak HTTP/2 on this port"
            ))
            return
        pos, end = 0, len(buf)
        try:
            while end - pos >= 9:
                length = int.from_bytes(buf[pos : pos + 3], "big")
                if length > _MAX_FRAME:
                    raise _ConnectionError(
                        f"frame of {length} bytes exceeds the max frame size {_MAX_FRAME} "
                        "(FRAME_SIZE_ERROR)"
                    )
                if end - pos - 9 < length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                stream_id = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                payload = buf[pos + 9 : pos + 9 + length]
                pos += 9 + length
                self._on_frame(kind, flags, stream_id, payload)
                if self.closed:
                    return
        except _ConnectionError as exc:
            self._fail_all(MalformedAnswer(str(exc)))
            return
        self._buf = buf[pos:]
        if self._out and self._transport is not None and not self.closed:
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for waiter in self._window_waiters:
            if not waiter.done():
                waiter.set_result(None)  # the sender sees `closed`
        if not self.streams:
            return
        message = "server disconnected before answering"
        if exc is not None:
            message = f"{message} ({type(exc).__name__}: {exc})"
        goaway = self.goaway
        for stream_id, stream in list(self.streams.items()):
            error = Disconnected(
                message.replace("before answering", "before the answer ended")
                if stream.answered else message
            )
            error.__cause__ = exc
            if stream.answered:
                pass
            elif goaway is not None and goaway[1] == 0 and stream_id <= goaway[0]:
                error.replay = (Replay.LOST, (
                    f"graceful GOAWAY (last_stream_id={goaway[0]}); stream {stream_id} lost "
                    "its answer when the connection closed"
                ))
            elif goaway is None and stream.reused:
                error.replay = (
                    Replay.LOST, "reused HTTP/2 connection closed without GOAWAY before an answer"
                )
            self._cut(stream, error)

    # -- frames ------------------------------------------------------------------------------

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != _CONT:
            raise _ConnectionError("a header block was interrupted before END_HEADERS")
        if not self._seen_settings:
            if kind != _SETTINGS:
                raise _ConnectionError("the server's first frame is not SETTINGS")
            self._seen_settings = True
        if kind == _DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == _HEADERS:
            if not stream_id:
                raise _ConnectionError("HEADERS on stream 0")
            payload = self._unpad(flags, payload)
            if flags & _PRIORITY_FLAG:
                payload = payload[5:]
            if flags & _END_HEADERS:
                self._on_headers(stream_id, bool(flags & _END_STREAM), payload)
            else:
                self._block = (stream_id, bool(flags & _END_STREAM), bytearray(payload))
        elif kind == _CONT:
            block = self._block
            if block is None or block[0] != stream_id:
                raise _ConnectionError("CONTINUATION without a header block to continue")
            block[2].extend(payload)
            if flags & _END_HEADERS:
                self._block = None
                self._on_headers(stream_id, block[1], bytes(block[2]))
        elif kind == _SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == _RST:
            if not stream_id or len(payload) != 4:
                raise _ConnectionError("malformed RST_STREAM")
            stream = self.streams.get(stream_id)
            if stream is not None and not stream.ended:
                stream.ended = True
                self._on_reset(stream, stream_id, int.from_bytes(payload, "big"))
        elif kind == _PING:
            if stream_id or len(payload) != 8:
                raise _ConnectionError("malformed PING")
            if not flags & _ACK:
                self._out.append(_frame(_PING, _ACK, 0, payload))
        elif kind == _GOAWAY:
            if stream_id or len(payload) < 8:
                raise _ConnectionError("malformed GOAWAY")
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self._on_goaway(last, int.from_bytes(payload[4:8], "big"))
        elif kind == _WINDOW:
            self._on_window_update(stream_id, payload)
        elif kind == _PUSH:
            raise _ConnectionError("PUSH_PROMISE although push is off (PROTOCOL_ERROR)")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §4.1, §5.5).

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & _PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise _ConnectionError("padding longer than the frame (PROTOCOL_ERROR)")
        return payload[1 : len(payload) - payload[0]]

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError("DATA on stream 0")
        size = len(payload)  # flow control counts the padding too
        self._recv_window -= size
        if self._recv_window < 0:
            raise _ConnectionError("the server overran the connection's window")
        self._unacked += size
        if self._unacked >= WINDOW // 2:
            self._out.append(_frame(_WINDOW, 0, 0, self._unacked.to_bytes(4, "big")))
            self._recv_window += self._unacked
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            return  # a stream already ended here (reset or cut): its bytes are dropped
        stream.recv_window -= size
        if stream.recv_window < 0:
            raise _ConnectionError(f"the server overran stream {stream_id}'s window")
        data = self._unpad(flags, payload)
        stream.received += len(data)
        if self._settings.keep_body:
            stream.body.append(data)
        if flags & _END_STREAM:
            stream.ended = True
            self._finish(stream)
        elif stream.received >= self._settings.body_limit:
            stream.ended = True
            self._finish(stream)
            self._out.append(_frame(_RST, 0, stream_id, _CANCEL.to_bytes(4, "big")))

    def _on_headers(self, stream_id: int, end_stream: bool, block: bytes) -> None:
        try:
            headers = self._decode(block)
        except hpack.HPACKError as exc:
            raise _ConnectionError(
                f"header block cannot be decoded (hpack: {type(exc).__name__}: {exc}) "
                "(COMPRESSION_ERROR)"
            ) from None
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            return
        wanted = self._settings.wanted
        if stream.answered:  # trailers
            for name, value in headers:
                if name in wanted:
                    stream.trailers[name.decode("latin-1")] = value.decode("latin-1")
        else:
            status = 0
            for name, value in headers:
                if name == b":status":
                    status = int(value) if value.isdigit() and len(value) == 3 else -1
                elif name in wanted:
                    stream.headers[name.decode("latin-1")] = value.decode("latin-1")
            if status <= 0:
                stream.ended = True
                self._out.append(_frame(_RST, 0, stream_id,
                                        _PROTOCOL_ERROR.to_bytes(4, "big")))
                self._cut(stream, MalformedAnswer("an answer without a valid :status"))
                return
            if 100 <= status < 200 and not end_stream:
                stream.headers.clear()  # informational: the answer follows
                return
            stream.status = status
            stream.answered = True
            self.answered_before = True
        if end_stream:
            stream.ended = True
            self._finish(stream)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """hpack's decoding of `block`, or the same block's earlier result when the dynamic
        table is as it was then and that decoding left it unchanged (so the block refers to
        the same entries and inserts none). The table's state is its length, its newest
        entry (the object, held, so compared by identity) and its size limit."""
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = _TableState(len(entries), entries[0] if entries else None, table.maxsize)
        if self._decoded_at is not None and before.same(self._decoded_at):
            hit = self._decoded.get(block)
            if hit is not None:
                return hit
        else:
            self._decoded.clear()
            self._decoded_at = None
        headers = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
        after = _TableState(len(entries), entries[0] if entries else None, table.maxsize)
        if before.same(after):
            if len(self._decoded) < _DECODED_MAX:
                self._decoded[block] = headers
                self._decoded_at = after
        else:
            self._decoded.clear()
            self._decoded_at = None
        return headers

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError("SETTINGS on a stream")
        if flags & _ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError("SETTINGS of a length not a multiple of 6 (FRAME_SIZE_ERROR)")
        for i in range(0, len(payload), 6):
            key = int.from_bytes(payload[i : i + 2], "big")
            value = int.from_bytes(payload[i + 2 : i + 6], "big")
            if key == _S_MAX_STREAMS:
                self.max_streams = value
            elif key == _S_WINDOW:
                if value > 0x7FFFFFFF:
                    raise _ConnectionError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self._peer_window
                self._peer_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                self._wake_senders()
            elif key == _S_MAX_FRAME:
                if not _MAX_FRAME <= value <= 0xFFFFFF:
                    raise _ConnectionError("SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_frame = value
        self._out.append(_frame(_SETTINGS, _ACK, 0))

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError("WINDOW_UPDATE of a length other than 4 (FRAME_SIZE_ERROR)")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise _ConnectionError("WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
        else:
            stream = self.streams.get(stream_id)
            if stream is not None:
                stream.send_window += increment
        self._wake_senders()

    def _wake_senders(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- streams ending ---------------------------------------------------------------------

    def _on_reset(self, stream: _Stream, stream_id: int, code: int) -> None:
        error = StreamReset(f"stream {stream_id} reset by the server ({code_name(code)})", code)
        if code == REFUSED_STREAM and not stream.answered:
            error.replay = (Replay.UNPROCESSED, f"stream {stream_id} refused (REFUSED_STREAM)")
        self._cut(stream, error)

    def _on_goaway(self, last: int, code: int) -> None:
        self.goaway = (last, code)
        for stream_id, stream in list(self.streams.items()):
            if stream_id > last:
                stream.ended = True
                error = Disconnected(f"GOAWAY ({code_name(code)}) with last_stream_id={last}")
                error.replay = (
                    Replay.UNPROCESSED, f"GOAWAY last_stream_id={last} below stream {stream_id}"
                )
                self._cut(stream, error)
            elif code != 0:
                stream.ended = True
                self._cut(stream, StreamReset(
                    f"connection ended by GOAWAY ({code_name(code)}, last_stream_id={last})",
                    code,
                ))
        if not self.streams or all(s.waiter.done() for s in self.streams.values()):
            self.abort()

    def _finish(self, stream: _Stream, received: BaseException | None = None) -> None:
        if not stream.waiter.done():
            stream.waiter.set_result(H2Answer(
                stream.status, stream.headers, received or stream.received, stream.trailers,
                b"".join(stream.body) if stream.body else b"",
            ))

    def _cut(self, stream: _Stream, error: H2Error) -> None:
        if stream.waiter.done():
            return
        if stream.answered:
            self._finish(stream, error)
        else:
            stream.waiter.set_exception(error)

    def _fail_all(self, error: H2Error) -> None:
        for stream in self.streams.values():
            stream.ended = True
            self._cut(stream, error)
        self.abort()

    def _check_read(self) -> None:
        self._timer = None
        if not self.streams or self.closed:
            return
        budget = self._settings.read_budget_s
        now = self._loop.time()
        next_due = 0.0
        for stream in list(self.streams.values()):
            if stream.waiter.done():
                continue
            due = max(self._last_read, stream.sent) + budget
            if stream.deadline and now >= stream.deadline:
                self._cut(stream, DeadlineExceeded("Deadline Exceeded"))
            elif now >= due:
                self.silent = True
                self._cut(stream, ReadTimedOut(f"no byte from the server for {budget:g}s"))
            else:
                if stream.deadline and stream.deadline < due:
                    due = stream.deadline
                if not next_due or due < next_due:
                    next_due = due
        if next_due:
            self._timer = self._loop.call_at(next_due, self._check_read)
