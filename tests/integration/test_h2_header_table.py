"""The lean HTTP/2 client announces an HPACK dynamic table of 0, so a server that indexes
its answer headers anew in every answer (HAProxy does) leaves the client's table as it was:
each answer's header block is decoded once per connection, not once per call (a call that
changes the table makes garbage the collector walks, BENCHMARKS.md D15). Against a real
HAProxy, h2c on loopback."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes.clients._h2base import H2Settings
from probes.clients._h2lean import H2Client
from targets.haproxy_process import find_haproxy

HOST = "127.86.0.7"
CALLS = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[int]:
    binary = find_haproxy()
    if binary is None:
        pytest.skip("haproxy is not installed")
    port = _free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        "global\n    maxconn 100\n    nbthread 1\n"
        "defaults\n    mode http\n    timeout client 30s\n    timeout server 30s\n"
        "    timeout connect 5s\n"
        f"frontend h2c\n    bind {HOST}:{port} proto h2\n"
        '    http-request return status 200 content-type text/plain string "ok\\n"\n',
        encoding="utf-8")
    proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("haproxy did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_server_that_indexes_every_answer_leaves_the_table_empty(haproxy: int) -> None:
    settings = H2Settings(connect_budget_s=5.0, read_budget_s=5.0, keepalive_s=30.0,
                          body_limit=65536, wanted=frozenset({b"content-type"}))
    block = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", HOST.encode()),
             (b":path", b"/")]

    async def calls() -> None:
        client = H2Client(HOST, haproxy, block, None, settings, ssl_context=None)
        try:
            for i in range(CALLS):
                answer = await client.request([(b"x-request-id", str(i).encode())])
                assert answer.status == 200 and answer.headers["content-type"] == "text/plain"
            assert client.connections == 1
            conn = client._conns[0]
            table = conn._decoder._decoder.header_table
            # HAProxy sends "content-type" and "content-length" as literals with incremental
            # indexing in every answer; with the table at 0 none is kept, so the same block
            # decodes the same way every time and is decoded once.
            assert table.maxsize == 0 and len(table.dynamic_entries) == 0
            assert len(conn._decoder._decoded) == 1
        finally:
            await client.aclose()

    asyncio.run(calls())
