"""What the raw asyncio test servers share: listen on loopback as an async context manager,
run a task per connection, and on exit stop listening and cancel every connection's task;
`served_apart` runs one on a thread and event loop of its own.

A subclass is a dataclass with `host`, `_server` and `_tasks` fields (see `RawH2Server`), may
have `bind_port` and `ssl_context`, implements `_accept`, and may override `_closing_now`
to wake what waits for the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Self, TypeVar


class LoopbackServer:
    host: str
    _server: asyncio.Server | None
    _tasks: set[asyncio.Task[None]]

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Self:
        port: int = getattr(self, "bind_port", 0)
        context: ssl.SSLContext | None = getattr(self, "ssl_context", None)
        self._server = await asyncio.start_server(self._accept, self.host, port, ssl=context)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._closing_now()
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _closing_now(self) -> None:
        """Called first on exit, before the connections' tasks are cancelled."""

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `coro` as a connection task that exit cancels."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


_Server = TypeVar("_Server", bound=LoopbackServer)


@contextlib.asynccontextmanager
async def served_apart(server: _Server) -> AsyncIterator[_Server]:
    """`server` served on a thread and event loop of its own: a test may hold its own loop
    (as a busy probe's is held) while the server goes on."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="served-apart", daemon=True)
    thread.start()
    try:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(server.__aenter__(), loop))
        try:
            yield server
        finally:
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop)
            )
    finally:
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)
        loop.close()
