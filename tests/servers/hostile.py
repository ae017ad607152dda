"""An HTTP/1.1 server whose request path picks how it misbehaves, plus raw-socket helpers.

Paths (query parameters become response headers, so `/status/200?x-envoy-attempt-count=3`
answers 200 with that header):

    /status/<code>   answer <code> with a short body (keep-alive)
    /big/<bytes>     200 with a Content-Length body of that size, streamed
    /endless         200 with a chunked body that never ends
    /slowheaders     a status line, then header bytes one every `drip_s`, never finished
    /resetbody/<n>   200 promising twice <n> bytes of body; after <n>, RST (SO_LINGER 0)
    /hang            read the request, never answer
    /reset           read the request, then RST (SO_LINGER 0)
    /close           read the request, then close without answering (FIN)
    /garbage         answer bytes that are not HTTP
    /eof/<n>         200 with no Content-Length, <n> bytes of body, then close (FIN)
    /eofreset/<n>    the same, then RST instead of FIN
    /early           103 Early Hints, then 200
    /chunked/<n>     200 with a chunked body of <n> bytes in 1,000-byte chunks (keep-alive)
    /extra           200 and then bytes nobody asked for, on a kept-alive connection
    /sleep/<ms>      200 after <ms> milliseconds (keep-alive)

A HEAD request is answered 200 with Content-Length: 6, the query's headers and no body.

Give it an `ssl.SSLContext` to serve the same over TLS. `request_ids` lists the
`x-request-id` of every request read, so a test can tell a retried request from a single
one. `drop_after=N` closes a keep-alive connection, without answering, when its request
number N+1 arrives: a server that timed the connection out as the client reused it.
`bind_port` binds a given port (0: any free one), so a server can be closed and opened again on
the same address (`flapping`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from tests.servers._loopback import LoopbackServer

_CHUNK = b"x" * 65536
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_NO_BODY = {"204", "304"}



@dataclass
class HostileServer(LoopbackServer):
    host: str = "127.0.0.1"
    ssl_context: ssl.SSLContext | None = None
    drop_after: int | None = None
    bind_port: int = 0
    drip_s: float = 0.05
    request_ids: list[str] = field(default_factory=list)
    connections: int = 0
    open_connections: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def requests(self) -> int:
        return len(self.request_ids)

    def _closing_now(self) -> None:
        self._closing.set()

    async def wait_open_connections(self, count: int) -> None:
        """Until exactly `count` client connections are open (the caller bounds the wait)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.open_connections == count)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = self._spawn(self._serve(reader, writer))
        # A task cancelled before its first step never runs its `finally`: close here too.
        task.add_done_callback(lambda _: writer.close())

    async def _count(self, delta: int) -> None:
        async with self._changed:
            self.open_connections += delta
            self._changed.notify_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._count(+1)
        served = 0
        try:
            while True:
                first = await reader.read(1)
                if not first:
                    return
                if first == b"\x16":
                    # A TLS ClientHello on a plaintext port: answer as nginx does.
                    writer.write(_BAD_REQUEST)
                    await writer.drain()
                    return
                try:
                    head = first + await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                request_line = lines[0].split(" ")
                if len(request_line) != 3 or not request_line[2].startswith("HTTP/1."):
                    writer.write(_BAD_REQUEST)
                    await writer.drain()
                    return
                method, target = request_line[0], request_line[1]
                length = 0
                request_id = ""
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    name = name.strip().lower()
                    if name == "content-length":
                        length = int(value)
                    elif name == "x-request-id":
                        request_id = value.strip()
                if length:
                    await reader.readexactly(length)
                self.request_ids.append(request_id)
                if self.drop_after is not None and served >= self.drop_after:
                    return
                served += 1
                if method == "HEAD":
                    extra = "".join(f"{k}: {v}\r\n" for k, v in parse_qsl(urlsplit(target).query))
                    writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n{extra}\r\n".encode())
                    await writer.drain()
                    continue
                if not await self._respond(target, reader, writer):
                    return
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()
            await self._count(-1)

    async def _respond(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False closes the connection."""
        url = urlsplit(target)
        parts = url.path.strip("/").split("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in parse_qsl(url.query))
        kind = parts[0]
        if kind == "status":
            body = b"" if parts[1] in _NO_BODY else b"status"
            length = "" if parts[1] in _NO_BODY else f"content-length: {len(body)}\r\n"
            writer.write(f"HTTP/1.1 {parts[1]} X\r\n{length}{extra}\r\n".encode() + body)
        elif kind == "big":
            size = int(parts[1])
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n{extra}\r\n".encode())
            while size > 0:
                writer.write(_CHUNK[: min(size, len(_CHUNK))])
                size -= len(_CHUNK)
                await writer.drain()
        elif kind == "endless":
            writer.write(f"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n{extra}\r\n".encode())
            frame = b"%x\r\n%s\r\n" % (len(_CHUNK), _CHUNK)
            while True:
                writer.write(frame)
                await writer.drain()
        elif kind == "slowheaders":
            # Each byte restarts a per-read timeout; only a deadline on the whole answer ends it.
            writer.write(b"HTTP/1.1 200 OK\r\n")
            while True:
                for byte in b"x-slow: y\r\n":
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(self.drip_s)
        elif kind == "resetbody":
            size = int(parts[1])
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {2 * size}\r\n{extra}\r\n".encode())
            writer.write(b"x" * size)
            await writer.drain()
            abort_with_rst(writer)
            return False
        elif kind == "hang":
            await self._closing.wait()
            return False
        elif kind == "reset":
            abort_with_rst(writer)
            return False
        elif kind == "close":
            return False
        elif kind in ("eof", "eofreset"):
            writer.write(f"HTTP/1.1 200 OK\r\n{extra}\r\n".encode() + b"x" * int(parts[1]))
            await writer.drain()
            if kind == "eofreset":
                abort_with_rst(writer)
            return False
        elif kind == "early":
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n")
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n{extra}\r\nok".encode())
        elif kind == "chunked":
            writer.write(f"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n{extra}\r\n".encode())
            left = int(parts[1])
            while left > 0:
                part = min(left, 1000)
                writer.write(b"%x\r\n%s\r\n" % (part, b"x" * part))
                left -= part
            writer.write(b"0\r\n\r\n")
        elif kind == "sleep":
            await asyncio.sleep(int(parts[1]) / 1000)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        elif kind == "extra":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
        elif kind == "garbage":
            writer.write(b"\x00\x01\x02 this is not http \xff\xfe\r\n\r\n")
            await writer.drain()
            return False
        await writer.drain()
        return True


def abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close so the kernel sends RST instead of FIN (SO_LINGER on, timeout 0)."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.contextmanager
def closed_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port nothing listens on: bound (so no one else takes it) but not listening."""
    sock = socket.socket()
    sock.bind((host, 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@contextlib.contextmanager
def full_backlog(host: str = "127.0.0.1") -> Iterator[int]:
    """A listening port whose accept queue is full, so the kernel drops new SYNs.

    `listen(0)` lets one connection complete into the queue; nothing ever accepts it, so the
    next client's SYN is dropped and its connect() hangs, as with an overloaded or
    black-holed pod.
    """
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection((host, port), timeout=1.0)
    try:
        yield port
    finally:
        filler.close()
        listener.close()


@contextlib.asynccontextmanager
async def accept_and_hang(host: str = "127.0.0.1") -> AsyncIterator[int]:
    """A server that accepts connections and never reads or answers."""
    held: list[asyncio.StreamWriter] = []

    def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, host, 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for writer in held:
            writer.close()
        await server.wait_closed()


class _Listener(Protocol):
    """A test server: an async context manager that listens on `port` while entered."""

    @property
    def port(self) -> int: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...


@dataclass
class Flapping:
    """What `flapping` did: the port, and how often the listener opened and closed."""

    port: int = 0
    opened: int = 0
    closed: int = 0


@contextlib.asynccontextmanager
async def flapping(
    period_s: float = 0.2,
    serve: Callable[[int], _Listener] = lambda port: HostileServer(bind_port=port),
) -> AsyncIterator[Flapping]:
    """A server that is up for `period_s`, then gone for `period_s`, on one port.

    `serve(port)` builds the server (port 0 the first time: any free one). Going down closes
    the listener and every connection, as a restarting pod does, so a client sees answers,
    then refused connects, then answers again.
    """
    state = Flapping()
    up = asyncio.Event()

    async def toggle() -> None:
        while True:
            async with serve(state.port) as server:
                state.port = server.port
                state.opened += 1
                up.set()
                await asyncio.sleep(period_s)
            state.closed += 1
            await asyncio.sleep(period_s)

    task = asyncio.get_running_loop().create_task(toggle())
    first_up = asyncio.ensure_future(up.wait())
    try:
        await asyncio.wait({first_up, task}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # it failed before the first open: say why
        yield state
    finally:
        first_up.cancel()
        task.cancel()
        await asyncio.gather(first_up, task, return_exceptions=True)
