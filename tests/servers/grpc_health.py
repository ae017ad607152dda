"""A grpc.aio server with only the standard health service (SERVING): the smallest real
gRPC target, plaintext or with the given server credentials."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2_grpc


@contextlib.asynccontextmanager
async def grpc_health_server(
    credentials: grpc.ServerCredentials | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[int]:
    """Yields the port; the server stops (without grace) when the block ends."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    if credentials is None:
        port = server.add_insecure_port(f"{host}:0")
    else:
        port = server.add_secure_port(f"{host}:0", credentials)
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)
