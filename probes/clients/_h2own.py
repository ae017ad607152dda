"""The lean HTTP/2 client's connection: one TCP (or TLS) connection, an `asyncio.Protocol`,
and the streams in flight on it (the frames' bytes and HPACK are `_h2frames`'; the client
that picks connections is `_h2lean`). What h2 does for a client that sends small requests
and reads answers, at a fraction of its CPU (BENCHMARKS.md D15): frames are read from
their 9-byte headers in one loop, and the request's header block comes encoded.

What is checked, as h2 checks it for a client (RFC 9113), each a connection error that
ends every stream on the connection as `MalformedAnswer` (`protocol_error`): the server's
first frame is SETTINGS (an answer in HTTP/1.x is named as such at its first bytes); frames
above the max frame size (at their header, before their body arrives); a header block that
does not decode (COMPRESSION_ERROR) or is interrupted before END_HEADERS; PUSH_PROMISE
(push is off); frames on stream 0 that need a stream and the reverse; flow-control windows
overrun; SETTINGS and PING of the wrong length. A response without a valid `:status` is a
protocol error of that stream.

How streams end, kept more honest than through httpcore (the notes of its test reference,
`tests/reference/httpcore_h2.py`); the errors are `_h2base`'s, and their `replay` says
whether the request may be re-sent:

* GOAWAY: streams above last-stream-id fail at once as provably unprocessed
  (`Replay.UNPROCESSED`); the others are read to their end when the GOAWAY is graceful,
  and fail as `Replay.LOST` only if the connection closes first; a GOAWAY with an error
  code ends them all with that code (h2, and so httpcore, turn CLOSED on GOAWAY and lose
  the answers still coming);
* REFUSED_STREAM is unprocessed; any other RST_STREAM is the stream's reset, except a
  CANCEL read once the call's own deadline has passed: the server's end of the same
  deadline (its `grpc-timeout` ran out), so `DeadlineExceeded`, as grpc core names a
  CANCEL after the deadline (`grpc_http2_error_to_grpc_status`);
* a connection that answered before and closes without GOAWAY before a stream's answer
  lost that stream (`Replay.LOST`); an idle connection the server closed is seen closed at
  once and never used again (httpcore only learns it by sending on it);
* past `body_limit` the stream is reset (CANCEL) and the connection kept;
* a call cancelled by its caller (the engine's deadline) resets its stream, not the
  connection; a call's own deadline (gRPC's) is kept by the connection's one timer, as is
  the read budget.
"""

from __future__ import annotations

import asyncio

import hpack

from probes.clients._base import Replay
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
from probes.clients._h2frames import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    S_HEADER_TABLE,
    S_MAX_FRAME,
    S_MAX_LIST,
    S_MAX_STREAMS,
    S_PUSH,
    S_WINDOW,
    SETTINGS,
    WINDOW_UPDATE,
    BlockDecoder,
    encode_block,
    frame,
)

__all__ = ["OwnConnection"]


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


class _ConnectionError(Exception):
    """A connection error found while reading (becomes `MalformedAnswer` for every stream)."""


class OwnConnection(asyncio.Protocol):
    """One TCP (or TLS) connection and the streams in flight on it."""

    __slots__ = ("_block", "_buf", "_decoder", "_last_read", "_loop", "_next_id", "_out",
                 "_peer_frame", "_peer_window", "_recv_window", "_seen_settings", "_send_window",
                 "_settings", "_stream_window", "_timer", "_transport", "_unacked",
                 "_window_waiters", "answered_before", "closed", "goaway", "idle_since",
                 "max_streams", "silent", "streams")

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: H2Settings) -> None:
        self._loop = loop
        self._settings = settings
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._buf = b""
        self._out: list[bytes] = []
        self._decoder = BlockDecoder(max_header_list_size=65536)
        self._block: tuple[int, bool, bytearray] | None = None  # a header block in pieces
        self._next_id = 1
        self._seen_settings = False
        # What the server may send us: each stream's window is the body limit (announced in
        # our SETTINGS), the connection's 16 MiB more than the default.
        self._stream_window = min(max(settings.body_limit, DEFAULT_WINDOW), WINDOW)
        self._recv_window = DEFAULT_WINDOW + WINDOW
        self._unacked = 0
        # What we may send the server (request bodies).
        self._peer_window = DEFAULT_WINDOW  # its SETTINGS_INITIAL_WINDOW_SIZE
        self._send_window = DEFAULT_WINDOW
        self._peer_frame = MAX_FRAME
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
            flags = END_HEADERS if body else END_HEADERS | END_STREAM
            if len(payload) <= self._peer_frame:
                transport.write(frame(HEADERS, flags, stream_id, payload))
            else:
                self._write_long_headers(stream_id, payload, flags & END_STREAM)
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
                self._transport.write(frame(RST_STREAM, 0, stream_id, CANCEL.to_bytes(4, "big")))
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
        frames = [frame(HEADERS, end_stream, stream_id, pieces[0])]
        for i, piece in enumerate(pieces[1:], 2):
            flags = END_HEADERS if i == len(pieces) else 0
            frames.append(frame(CONTINUATION, flags, stream_id, piece))
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
            flags = 0 if view else END_STREAM
            self._transport.write(frame(DATA, flags, stream_id, chunk.tobytes()))

    def abort(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.abort()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        settings = b"".join(
            key.to_bytes(2, "big") + value.to_bytes(4, "big")
            # A dynamic table of 0: a server that indexes its answer headers anew in every
            # answer (HAProxy does) would otherwise change the table, and so defeat the
            # decoded-block cache, on every call; answers to a probe gain nothing from it.
            for key, value in ((S_HEADER_TABLE, 0), (S_PUSH, 0), (S_MAX_STREAMS, 100),
                               (S_MAX_LIST, 65536),
                               (S_WINDOW, self._stream_window))
        )
        transport.write(PREFACE + frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, WINDOW.to_bytes(4, "big")))

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
                if length > MAX_FRAME:
                    raise _ConnectionError(
                        f"frame of {length} bytes exceeds the max frame size {MAX_FRAME} "
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
        if self._block is not None and kind != CONTINUATION:
            raise _ConnectionError("a header block was interrupted before END_HEADERS")
        if not self._seen_settings:
            if kind != SETTINGS:
                raise _ConnectionError("the server's first frame is not SETTINGS")
            self._seen_settings = True
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            if not stream_id:
                raise _ConnectionError("HEADERS on stream 0")
            payload = self._unpad(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._on_headers(stream_id, bool(flags & END_STREAM), payload)
            else:
                self._block = (stream_id, bool(flags & END_STREAM), bytearray(payload))
        elif kind == CONTINUATION:
            block = self._block
            if block is None or block[0] != stream_id:
                raise _ConnectionError("CONTINUATION without a header block to continue")
            block[2].extend(payload)
            if flags & END_HEADERS:
                self._block = None
                self._on_headers(stream_id, block[1], bytes(block[2]))
        elif kind == SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == RST_STREAM:
            if not stream_id or len(payload) != 4:
                raise _ConnectionError("malformed RST_STREAM")
            stream = self.streams.get(stream_id)
            if stream is not None and not stream.ended:
                stream.ended = True
                self._on_reset(stream, stream_id, int.from_bytes(payload, "big"))
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise _ConnectionError("malformed PING")
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            if stream_id or len(payload) < 8:
                raise _ConnectionError("malformed GOAWAY")
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self._on_goaway(last, int.from_bytes(payload[4:8], "big"))
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == PUSH_PROMISE:
            raise _ConnectionError("PUSH_PROMISE although push is off (PROTOCOL_ERROR)")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §4.1, §5.5).

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
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
            self._out.append(frame(WINDOW_UPDATE, 0, 0, self._unacked.to_bytes(4, "big")))
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
        if flags & END_STREAM:
            stream.ended = True
            self._finish(stream)
        elif stream.received >= self._settings.body_limit:
            stream.ended = True
            self._finish(stream)
            self._out.append(frame(RST_STREAM, 0, stream_id, CANCEL.to_bytes(4, "big")))

    def _on_headers(self, stream_id: int, end_stream: bool, block: bytes) -> None:
        try:
            headers = self._decoder.decode(block)
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
                self._out.append(frame(RST_STREAM, 0, stream_id,
                                        PROTOCOL_ERROR.to_bytes(4, "big")))
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

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError("SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError("SETTINGS of a length not a multiple of 6 (FRAME_SIZE_ERROR)")
        for i in range(0, len(payload), 6):
            key = int.from_bytes(payload[i : i + 2], "big")
            value = int.from_bytes(payload[i + 2 : i + 6], "big")
            if key == S_MAX_STREAMS:
                self.max_streams = value
            elif key == S_WINDOW:
                if value > 0x7FFFFFFF:
                    raise _ConnectionError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self._peer_window
                self._peer_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                self._wake_senders()
            elif key == S_MAX_FRAME:
                if not MAX_FRAME <= value <= 0xFFFFFF:
                    raise _ConnectionError("SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_frame = value
        self._out.append(frame(SETTINGS, ACK, 0))

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
        if code == CANCEL and stream.deadline and self._last_read >= stream.deadline:
            # The server's end of the call's own deadline, read before our timer ran.
            self._cut(stream, DeadlineExceeded(
                f"Deadline Exceeded (stream {stream_id} reset by the server after it: CANCEL)"
            ))
            return
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
