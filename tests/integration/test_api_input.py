"""Hostile and careless input to the API, served as `skewprobe run` serves it (`serve_api`)
on loopback: every answer is a 4xx with a one-line JSON error, and a body the API will not
read closes the connection (issue 32, points 3 and 8)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from probes.api import ApiApp, VerdictQuery
from probes.run._api_server import bind_api, serve_api

TOKEN = "s3cret"
# Hang guards, not timings: a server that answers at all answers within these.
ANSWER_WITHIN_S = 60.0
# How long the app waits for a body here (the default is 10 s): a stalled body is refused
# after it.
BODY_READ_S = 0.5


class Verdicts:
    def __init__(self) -> None:
        self.queries: list[VerdictQuery] = []

    async def __call__(self, query: VerdictQuery) -> Mapping[str, Any]:
        self.queries.append(query)
        return {"verdict": "pass", "paths": [], "reasons": []}


@contextlib.asynccontextmanager
async def served(app: ApiApp) -> AsyncIterator[tuple[str, int]]:
    sock = bind_api("127.0.0.1:0")
    host, port = sock.getsockname()[:2]
    stop = asyncio.Event()
    task = asyncio.create_task(serve_api(sock, app, None, stop))
    try:
        yield host, port
    finally:
        stop.set()
        await asyncio.wait_for(task, ANSWER_WITHIN_S)


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, int, Verdicts]]:
    verdicts = Verdicts()
    app = ApiApp(CollectorRegistry(), verdict=verdicts, health=lambda: (True, "ok"),
                 body_read_s=BODY_READ_S)
    async with served(app) as (host, port):
        yield host, port, verdicts


async def exchange(host: str, port: int, head: bytes, body: bytes = b"") -> tuple[bytes, bool]:
    """Send `head` and `body` on a fresh connection; the first response's head and body, and
    whether the server then closed the connection (read to its end, or to the hang guard)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + body)
        await writer.drain()
        async with asyncio.timeout(ANSWER_WITHIN_S):
            response = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in response.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            response += await reader.readexactly(length)
            closed = await reader.read(1) == b""
        return response, closed
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def json_of(response: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(response.partition(b"\r\n\r\n")[2])
    return out


async def test_status_lines_carry_reason_phrases(api: tuple[str, int, Verdicts]) -> None:
    host, port, _ = api
    for path, line in ((b"/healthz", b"HTTP/1.1 200 OK\r\n"),
                       (b"/nope", b"HTTP/1.1 404 Not Found\r\n")):
        response, _ = await exchange(host, port, b"GET " + path + b" HTTP/1.1\r\nhost: p\r\n"
                                     b"connection: close\r\n\r\n")
        assert response.startswith(line), response[:40]


async def test_deeply_nested_gate_body_is_400_and_closes(api: tuple[str, int, Verdicts]) -> None:
    host, port, verdicts = api
    body = b"[" * 60_000  # 60 KB, within the size cap: nested past Python's recursion limit
    response, closed = await exchange(
        host, port, b"POST /gate HTTP/1.1\r\nhost: p\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body), body)
    assert response.startswith(b"HTTP/1.1 400 ")
    assert json_of(response) == {"error": "gate body is nested too deeply"}
    assert b"connection: close" in response.lower() and closed
    assert verdicts.queries == []


async def test_a_body_on_get_is_refused_unread_and_closed(api: tuple[str, int, Verdicts]) -> None:
    host, port, verdicts = api
    # Says 10 MB, sends 64 KiB of it: the answer comes without the rest.
    response, closed = await exchange(
        host, port, b"GET /verdict HTTP/1.1\r\nhost: p\r\ncontent-length: 10485760\r\n\r\n",
        b"x" * 65536)
    assert response.startswith(b"HTTP/1.1 400 ")
    assert json_of(response) == {"verdict": "inconclusive",
                                 "error": "GET /verdict takes no body"}
    assert b"connection: close" in response.lower() and closed
    assert verdicts.queries == []


async def test_gate_bodies_too_large_or_too_slow_are_refused_and_closed(
    api: tuple[str, int, Verdicts],
) -> None:
    host, port, verdicts = api
    head = b"POST /gate HTTP/1.1\r\nhost: p\r\ncontent-length: %d\r\n\r\n"
    large, closed = await exchange(host, port, head % 10_485_760, b"{" * 65536)
    assert large.startswith(b"HTTP/1.1 413 ") and closed
    assert json_of(large) == {"error": "gate body larger than 64 KiB"}
    chunked, closed = await exchange(
        host, port, b"POST /gate HTTP/1.1\r\nhost: p\r\ntransfer-encoding: chunked\r\n\r\n",
        b"%x\r\n%s\r\n" % (70_000, b" " * 70_000))
    assert chunked.startswith(b"HTTP/1.1 413 ") and closed
    # Ten bytes of a hundred, then nothing: refused once BODY_READ_S has passed.
    stalled, closed = await exchange(host, port, head % 100, b'{"metadata"')
    assert stalled.startswith(b"HTTP/1.1 408 ") and closed
    assert json_of(stalled) == {"error": f"gate body not received within {BODY_READ_S:g} s"}
    assert verdicts.queries == []


async def test_a_misspelt_gate_metadata_key_is_named(api: tuple[str, int, Verdicts]) -> None:
    host, port, verdicts = api
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as client:
        for route in ("/gate", "/gate/rollback"):
            refused = await client.post(route, json={"name": "podinfo", "metadata": {
                "pth": "checkout", "canary": "1.21.0"}})
            assert refused.status_code == 400
            assert refused.json() == {"error": "unknown gate metadata key(s): pth "
                                      "(valid: baseline, canary, path, since)"}
        assert verdicts.queries == []
        ok = await client.post("/gate", json={"metadata": {"path": "checkout"}})
        assert ok.status_code == 200 and verdicts.queries == [VerdictQuery(path="checkout")]


async def test_the_bearer_scheme_is_case_insensitive() -> None:
    app = ApiApp(CollectorRegistry(), verdict=Verdicts(), health=lambda: (True, "ok"),
                 token=TOKEN)
    async with served(app) as (host, port), httpx.AsyncClient(
            base_url=f"http://{host}:{port}") as client:
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            ok = await client.get("/verdict", headers={"authorization": f"{scheme} {TOKEN}"})
            assert ok.status_code == 200, scheme
        for value in (f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer{TOKEN}", "bearer", TOKEN):
            refused = await client.get("/verdict", headers={"authorization": value})
            assert refused.status_code == 401, value
