"""The benchmarks' gRPC target: one grpc.aio server with the standard health service on
many addresses (`capacity.py --grpc --target haproxy`, `prober_cost.py`).

`start` launches it as a child process pinned to a core and returns once it listens; run
alone it is that child (`python benchmarks/_health_server.py HOSTS PORT [--no-reuseport]`,
HOSTS comma-separated), printing `ready` when it serves. Not a benchmark itself (the leading
underscore keeps `run_all.py` from running it).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import _harness as h
import grpc.aio
from grpc_health.v1 import health, health_pb2_grpc

__all__ = ["start"]


def start(
    hosts: list[str], port: int, *, core: int | None, log: Path, reuseport: bool = True,
    timeout_s: float = 60.0,
) -> h.Child:
    """The server on `port` of every host, pinned to `core`. `reuseport=False` sets
    `grpc.so_reuseport` 0, so a port another process holds fails the bind instead of being
    shared with it."""
    cmd = [h.PYTHON, str(Path(__file__).resolve()), ",".join(hosts), str(port)]
    if not reuseport:
        cmd.append("--no-reuseport")
    child = h.Child("grpc", h.pinned(core, cmd), log=log)
    child.wait_line("ready", timeout_s=timeout_s)
    return child


async def _serve(hosts: list[str], port: int, reuseport: bool) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuseport))])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    for host in hosts:
        server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hosts", type=lambda s: s.split(","))
    ap.add_argument("port", type=int)
    ap.add_argument("--no-reuseport", dest="reuseport", action="store_false")
    args = ap.parse_args()
    asyncio.run(_serve(args.hosts, args.port, args.reuseport))


if __name__ == "__main__":
    main()
