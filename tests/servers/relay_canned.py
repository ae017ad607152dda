"""A canned relay pod: `GET /relay/<name>` answered from a table, optionally after a delay,
over keep-alive HTTP/1.1 on loopback. In the test's process (`canned_relay`), or in its own
(`python -m tests.servers.relay_canned DELAY_MS`, which prints `port=N` and serves until its
stdin closes), so that a test can measure the prober's CPU apart from the server's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Mapping

# What a relay pod answers when its destination answered 200 (`targets.relay.RelayAnswer`).
ANSWER = json.dumps({"status": 200, "attempts": 1, "address": "10.0.0.1:8080",
                     "answered_by": {"pod": "catalog-0", "proxy_version": "callee"}}).encode()
OK = {b"catalog": (b"200 OK", ANSWER)}


@contextlib.asynccontextmanager
async def canned_relay(
    answers: Mapping[bytes, tuple[bytes, bytes]] = OK, delay_s: float = 0.0
) -> AsyncIterator[tuple[int, list[int]]]:
    """(port, [connections accepted]); `answers` maps a destination to (status, body)."""
    accepted = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                status, body = answers[head.split(b" ", 2)[1].rsplit(b"/", 1)[-1]]
                if delay_s:
                    await asyncio.sleep(delay_s)
                writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        await server.wait_closed()


async def _main(delay_s: float) -> None:
    async with canned_relay(delay_s=delay_s) as (port, _):
        print(f"port={port}", flush=True)
        # Until the test closes our stdin (or goes away).
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(_main(float(sys.argv[1]) / 1000))
