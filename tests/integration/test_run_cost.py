"""`skewprobe run` says once at start what its paths will cost (`probes.measure.cost`), as a
real process against real servers on loopback, and warns before the overload rule when that
is more than one probe can use."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from probes.config import parse_config
from probes.measure.cost import CPU_S_PER_CALL, CPU_S_PER_STREAM_HOUR, SHARD_CORES
from probes.run.runner import ProbeRunner, RunOptions
from tests.servers.asgi import serve_app
from tests.servers.grpc_health import grpc_health_server

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def _ok(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _config(http_port: int, grpc_port: int, *, rate: str) -> str:
    endpoints = "\n".join(
        f"    - {{address: '127.0.0.1:{http_port}', name: pod-{i}, ports: {{grpc: {grpc_port}}},"
        " labels: {proxy_version: '1.20.3'}}" for i in range(3))
    return (
        f"targets:\n  static:\n{endpoints}\n"
        "window: 1s\n"
        "paths:\n"
        f"  - {{name: h1, http: {{path: /}}, rate: {rate}, timeout: 500ms}}\n"
        f"  - {{name: h2, http: {{path: /, version: '2'}}, rate: {rate}, timeout: 500ms}}\n"
        "  - {name: health, grpc: {health: ''}, port: grpc, rate: 2/s, timeout: 500ms}\n"
        "  - {name: watch, stream: {health: '', per_endpoint: 2}, port: grpc}\n"
    )


async def test_run_logs_its_cost_once_at_start(tmp_path: Path) -> None:
    async with serve_app(_ok) as base, grpc_health_server() as grpc_port:
        config = tmp_path / "probe.yaml"
        config.write_text(_config(int(base.rsplit(":", 1)[1]), grpc_port, rate="5/s"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "probes.cli", "run", "--config", str(config),
            "--store", str(tmp_path / "probe.db"), "--listen", "none", "--duration", "3s",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().splitlines()
    assert proc.returncode == 0, lines
    cost = [line for line in lines if "skewprobe.cost" in line]
    assert len(cost) == 1, lines  # once, and no warning
    (line,) = cost
    assert line.startswith("skewprobe: INFO skewprobe.cost: expected cost on this machine: ")
    # 3 endpoints × 5/s per HTTP path, 3 × 2/s health checks, 3 × 2 held streams.
    assert f"HTTP/1.1 15 calls/s × {CPU_S_PER_CALL['HTTP/1.1'] * 1e3:.3f} ms = 0.00 core" in line
    assert f"HTTP/2 15 calls/s × {CPU_S_PER_CALL['HTTP/2'] * 1e3:.3f} ms = 0.01 core" in line
    health = CPU_S_PER_CALL["gRPC health"] * 1e3
    assert f"gRPC health 6 calls/s × {health:.3f} ms = 0.00 core" in line
    assert "6 held streams = 0.00 core" in line
    assert "total 0.01 of the 1 core one probe can use" in line


async def test_run_warns_above_one_core_before_the_overload_rule(tmp_path: Path) -> None:
    """3 endpoints × 700/s over HTTP/1.1 and HTTP/2 intend 1.31 cores: warned as the first
    endpoints are scheduled, and the run stopped right there, so the machine never carries it
    and the overload rule, which needs closed windows, has said nothing yet."""
    records: list[logging.LogRecord] = []
    runner: ProbeRunner | None = None

    class Stop(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
            if record.levelno >= logging.WARNING and runner is not None:
                runner.stopping.set()

    handler = Stop()
    logger = logging.getLogger("skewprobe.cost")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        async with serve_app(_ok) as base, grpc_health_server() as grpc_port:
            text = _config(int(base.rsplit(":", 1)[1]), grpc_port, rate="700/s")
            runner = ProbeRunner(parse_config(text), RunOptions(
                store_path=str(tmp_path / "probe.db"), listen=None))
            await asyncio.wait_for(runner.run(), 60)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert [r.levelname for r in records] == ["INFO", "WARNING"], records
    info, warning = (r.getMessage() for r in records)
    assert "HTTP/1.1 2,100 calls/s" in info and "HTTP/2 2,100 calls/s" in info
    want = (2100 * (CPU_S_PER_CALL["HTTP/1.1"] + CPU_S_PER_CALL["HTTP/2"])
            + 6 * CPU_S_PER_CALL["gRPC health"] + 6 * CPU_S_PER_STREAM_HOUR / 3600)
    assert warning.startswith(f"expected {want:.2f} cores, above the 1 one probe can use")
    shards = math.ceil(want / SHARD_CORES)
    assert f"--shard i/{shards}" in warning and f"shards: {shards}" in warning
    assert runner is not None and runner.overload.reason is None
