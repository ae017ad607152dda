"""Prober cost: CPU seconds per 1,000 calls of each client option, side by side in one run.

On a shared 2-core machine absolute capacity runs are noisy; this compares the options by
process CPU time per call (`time.process_time()`: every thread of this process, so grpc
core's threads count) in one process, interleaved: each cycle runs every option once, in
turn, over the same endpoints, and the table gives the median over cycles. The targets run
in another process pinned to the other core: one HAProxy answering 200 on N loopback
addresses (HTTP/1.1 and h2c, detected from the preface) and one grpc.aio server with the
standard health service on N addresses. Each option keeps one connection (channel) per
endpoint, as the probe does, and sends one call per endpoint per round, `--in-flight` at a
time; a round's calls all must be `ok` (else the option's row says how many were not).

Options (`--options`, default all):

    h1            HttpProber, HTTP/1.1 (`_h1`, the probe's own protocol)
    h2-lean       HttpProber, HTTP/2 on the probe's own protocol and framing (`_h2lean`, `_h2own`)
    h2-httpcore   HTTP/2 through httpcore, the library reference (`tests/reference/`)
    grpc          gRPC unary on grpc.aio, the library reference (`tests/reference/`)
    grpc-lean     GrpcProber over the probe's own HTTP/2 client and framing
    grpc-bare     grpc.aio, the same channel options, only `await stub(req)`: no metadata
                  read back (the floor of grpc.aio's per-call cost)
    grpc-nocomp   the grpc.aio reference's call with compression explicitly off on the channel
    grpc-lat      the grpc.aio reference's call with `grpc.optimization_target: latency`
    relay         RelayProber, HTTP/1.1: `GET /relay/bench` to the same addresses, HAProxy
                  answering a relay's JSON answer (`targets.relay.RelayAnswer`, ~330 bytes)
    relay-h2      RelayProber asking in HTTP/2 (`relay.version: "2"`, the lean client)

The relay rows against `h1` are the relay's cost per call over a direct call to the same
pods (issue 33: at most 2x; BENCHMARKS.md D22).

    .venv/bin/python benchmarks/prober_cost.py                      # 200 endpoints, 5 cycles
    .venv/bin/python benchmarks/prober_cost.py --endpoints 600 --rounds 5 --cycles 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h
import _health_server as health_server
import grpc
import grpc.aio
from grpc_health.v1 import health_pb2

from probes.clients import Prober, RelayProber
from probes.clients._connection import channel_options
from probes.spec import GrpcSpec, HttpSpec, PathSpec, RelaySpec
from probes.types import Endpoint, Outcome
from tests.reference import GRPC_CLIENTS, HTTP2_CLIENTS

OPTIONS = ("h1", "h2-lean", "h2-httpcore", "grpc", "grpc-lean", "grpc-bare", "grpc-nocomp",
           "grpc-lat", "relay", "relay-h2")
HEALTH = "/grpc.health.v1.Health/Check"

def _hosts(n: int, base: str) -> list[str]:
    a, b, c, d = (int(x) for x in base.split("."))
    start = (b << 16) | (c << 8) | d
    return [f"{a}.{(start + i) >> 16 & 255}.{(start + i) >> 8 & 255}.{(start + i) & 255}"
            for i in range(n)]


def _haproxy(hosts: list[str], port: int, work: Path, core: int) -> h.Child:
    binary = shutil.which("haproxy")
    if binary is None:
        raise SystemExit("haproxy is not installed")
    cfg = work / "haproxy.cfg"
    cfg.write_text(
        "global\n    maxconn 8000\n    nbthread 1\n"
        "defaults\n    mode http\n    timeout client 60s\n    timeout server 60s\n"
        "    timeout connect 5s\n    timeout http-keep-alive 60s\n"
        "frontend pods\n" + "".join(f"    bind {host}:{port}\n" for host in hosts)
        + h.haproxy_relay_rule()
        + '    http-request return status 200 content-type text/plain string "ok\\n"\n',
        encoding="utf-8",
    )
    child = h.Child("haproxy", h.pinned(core, [binary, "-db", "-f", str(cfg)]),
                    log=work / "haproxy.err")
    h.wait_http(f"http://{hosts[-1]}:{port}/", "ok", timeout_s=60.0)
    return child


Call = Callable[[Endpoint, str], Awaitable[str]]


class _BareGrpc:
    """grpc.aio with the product's channel options; only the answer is awaited."""

    def __init__(self, extra: list[tuple[str, Any]]) -> None:
        spec = GrpcSpec(health_service="")
        self._options = [*channel_options(spec), *extra]
        self._request = health_pb2.HealthCheckRequest(service="").SerializeToString()
        self._stubs: dict[str, tuple[grpc.aio.Channel, Any]] = {}

    async def call(self, endpoint: Endpoint, request_id: str) -> str:
        entry = self._stubs.get(endpoint.key)
        if entry is None:
            channel = grpc.aio.insecure_channel(f"{endpoint.host}:{endpoint.port}",
                                                options=self._options)
            entry = self._stubs[endpoint.key] = (channel, channel.unary_unary(HEALTH))
        try:
            await entry[1](self._request, timeout=1.0,
                           metadata=(("x-request-id", request_id),))
        except grpc.aio.AioRpcError as err:
            return f"grpc_{err.code().name}"
        return Outcome.OK

    async def aclose(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close()


def _make(option: str, port: int, grpc_port: int) -> tuple[Callable[[], Any], int]:
    """A factory for the option's client, and the port its endpoints listen on."""
    def http(version: str, client: str = "lean") -> Prober:
        path = PathSpec("p", 1.0, 1.0, http=HttpSpec(path="/", version=version))
        return HTTP2_CLIENTS[client](path)

    def relay(version: str) -> Prober:
        return RelayProber(PathSpec("r", 1.0, 1.0, relay=RelaySpec("bench", version=version)))

    def grpc_prober(
        extra_options: list[tuple[str, Any]] | None = None, client: str = "grpcio"
    ) -> Prober:
        spec = PathSpec("g", 1.0, 1.0, grpc=GrpcSpec(health_service=""))
        prober = GRPC_CLIENTS[client](spec)
        if extra_options:  # an experiment on grpc.aio's channel options
            prober._options = [*prober._options, *extra_options]
        return prober

    table: dict[str, tuple[Callable[[], Any], int]] = {
        "h1": (lambda: http("1.1"), port),
        "h2-lean": (lambda: http("2", "lean"), port),
        "h2-httpcore": (lambda: http("2", "httpcore"), port),
        "grpc": (lambda: grpc_prober(client="grpcio"), grpc_port),
        "grpc-lean": (lambda: grpc_prober(client="lean"), grpc_port),
        "grpc-bare": (lambda: _BareGrpc([]), grpc_port),
        "grpc-nocomp": (lambda: grpc_prober(
            extra_options=[("grpc.default_compression_algorithm", 0)]), grpc_port),
        "grpc-lat": (lambda: grpc_prober(
            extra_options=[("grpc.optimization_target", "latency")]), grpc_port),
        "relay": (lambda: relay("1.1"), port),
        "relay-h2": (lambda: relay("2"), port),
    }
    return table[option]


async def _run_option(
    factory: Callable[[], Any], endpoints: list[Endpoint], rounds: int, in_flight: int
) -> tuple[float, int, Counter[str]]:
    client = factory()
    gate = asyncio.Semaphore(in_flight)
    outcomes: Counter[str] = Counter()
    counter = 0

    async def one(endpoint: Endpoint) -> None:
        nonlocal counter
        async with gate:
            counter += 1
            result = await client.call(endpoint, f"r{counter}")
            outcomes[result if isinstance(result, str) else result.outcome] += 1

    try:
        await asyncio.gather(*(one(e) for e in endpoints))  # connect: not measured
        outcomes.clear()
        cpu = time.process_time()
        for _ in range(rounds):
            await asyncio.gather(*(one(e) for e in endpoints))
        cpu = time.process_time() - cpu
    finally:
        await client.aclose()
    return cpu, rounds * len(endpoints), outcomes


async def _measure(args: argparse.Namespace, hosts: list[str]) -> dict[str, list[float]]:
    per_option: dict[str, list[float]] = {o: [] for o in args.options}
    bad: dict[str, Counter[str]] = {o: Counter() for o in args.options}
    for cycle in range(args.cycles):
        for option in args.options:
            factory, port = _make(option, args.port, args.grpc_port)
            endpoints = [Endpoint(f"pod-{i}", host, port) for i, host in enumerate(hosts)]
            cpu, calls, outcomes = await _run_option(factory, endpoints, args.rounds,
                                                     args.in_flight)
            per_option[option].append(cpu / calls * 1000)
            bad[option].update({k: v for k, v in outcomes.items() if k != Outcome.OK})
            print(f"cycle {cycle + 1} {option:12s} {cpu / calls * 1000:.3f} CPU-s per 1,000 "
                  f"calls ({calls} calls)", file=sys.stderr, flush=True)
    for option, counts in bad.items():
        if counts:
            print(f"{option}: not ok: {dict(counts)}", file=sys.stderr)
    return per_option


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoints", type=int, default=200, help="endpoints (connections), 200")
    ap.add_argument("--rounds", type=int, default=5, help="measured calls per endpoint (5)")
    ap.add_argument("--cycles", type=int, default=5, help="times every option runs (5)")
    ap.add_argument("--in-flight", type=int, default=50, help="concurrent calls (50)")
    ap.add_argument("--options", default=",".join(OPTIONS),
                    type=lambda s: [o for o in s.split(",") if o], help="comma-separated")
    ap.add_argument("--client-core", type=int, default=0)
    ap.add_argument("--server-core", type=int, default=1)
    ap.add_argument("--base-host", default="127.79.0.1")
    ap.add_argument("--port", type=int, default=18180)
    ap.add_argument("--grpc-port", type=int, default=19190)
    ap.add_argument("--json", help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    unknown = set(args.options) - set(OPTIONS)
    if unknown:
        ap.error(f"unknown options: {', '.join(sorted(unknown))}")
    if args.client_core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.client_core})
    hosts = _hosts(args.endpoints, args.base_host)
    speed = h.machine_speed_s()
    with tempfile.TemporaryDirectory(prefix="prober-cost-") as tmp, h.children() as kids:
        work = Path(tmp)
        if any(not o.startswith("grpc") for o in args.options):
            kids.append(_haproxy(hosts, args.port, work, args.server_core))
        if any(o.startswith("grpc") for o in args.options):
            kids.append(health_server.start(hosts, args.grpc_port, core=args.server_core,
                                            log=work / "grpc.err", reuseport=False))
        before = h.system_times()
        started = time.monotonic()
        per_option = asyncio.run(_measure(args, hosts))
        elapsed = time.monotonic() - started
        after = h.system_times()
    base = statistics.median(per_option["h1"]) if "h1" in per_option else None
    rows = []
    for option, values in per_option.items():
        med = statistics.median(values)
        rows.append([option, f"{med:.3f}", f"{min(values):.3f}–{max(values):.3f}",
                     f"{med / base:.2f}×" if base else ""])
    print(h.md_table(["option", "CPU-s per 1,000 calls (median)", "range over cycles",
                      "ratio to h1"], rows))
    busy = {k: (after[k] - before[k]) / elapsed for k in after if k in before}
    print(f"\n{args.endpoints} endpoints, {args.rounds} calls each per cycle, {args.cycles} "
          f"cycles, {args.in_flight} in flight; machine speed {speed:.3f} s; load "
          f"{h.loadavg()}; system {json.dumps({k: round(v, 2) for k, v in busy.items()})}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cpu_ms": per_option}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
