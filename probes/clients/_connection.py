"""The probe's connections: what they are opened with (TLS material from a TlsSpec: an
`ssl.SSLContext` for HTTP, channel credentials for gRPC; a held stream's grpc.aio channel
options), and how they are kept per endpoint and closed in order (`EndpointPool`).

Per-endpoint clients (an HTTP transport, a gRPC channel) with an orderly end: a client is
created on an endpoint's first call and reused (keep-alive per endpoint). When discovery
drops the endpoint (`forget`), or a prober decides a client must not be reused (`retire`),
the client is closed as soon as its last in-flight call has finished, so no call is cut
short by someone else's clean-up. Closing runs in tasks kept in a set and awaited by
`aclose`.

TLS material is built once per prober (loading a CA bundle costs milliseconds; doing it per
endpoint or per call would show in the probe's CPU). Unreadable files are bad input,
reported when the prober is built, not on the first call.

Channel options, and why:

* `grpc.enable_retries=0`. gRPC transparently re-sends an RPC the server provably did not
  see (stream above a GOAWAY's last-stream-id, REFUSED_STREAM), which is correct but makes
  connection churn invisible. With retries off those RPCs fail UNAVAILABLE with
  "GOAWAY received…" or "Received RST_STREAM with error code 7" (grpc core's chttp2
  transport), so what the probe reports is what one attempt did; no configured retry
  policy applies either.
* a local subchannel pool, so each path's channel owns its connection and closing it closes
  the connection (the global pool would share it across paths).
* reconnect backoff 100 ms to 1 s instead of 1 s to 120 s, so an endpoint that refused
  once (a restarting pod) is tried again at the probe's pace, not minutes later. The
  minimum (`grpc.min_reconnect_backoff_ms`) is left alone: grpc core also uses it as the
  connect timeout (20 s), and the RPC deadline should be what ends a hanging connect, as
  DEADLINE_EXCEEDED with "no connection yet" in the detail.
* 4 MiB receive limit (gRPC's default, made explicit): a bigger answer is
  RESOURCE_EXHAUSTED with bounded memory.
* no channelz: grpc core keeps a channelz node (and its trace) per channel and
  subchannel for the channelz service, which the probe never serves. Off, each channel
  costs ~3 KiB less: 8 MiB at 2,400 held streams (BENCHMARKS.md, "Memory").
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import certifi
import grpc

from probes.clients._base import USER_AGENT
from probes.errors import BadInput
from probes.spec import GrpcSpec, TlsSpec
from probes.types import Endpoint


def ssl_context(tls: TlsSpec | None, *, where: str) -> ssl.SSLContext:
    """A client context: the spec's CA (else certifi's bundle, as httpx uses), client
    certificate when given, verification off only when asked for."""
    tls = tls or TlsSpec()
    try:
        ctx = ssl.create_default_context(cafile=tls.ca or certifi.where())
        if tls.cert:
            ctx.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise BadInput(f"{where}: tls: cannot load certificates: {exc}") from exc
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def plaintext_context() -> ssl.SSLContext:
    """A context that is never used for a handshake (http:// paths); cheap to build."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def _read(path: str | None, what: str, where: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"{where}: tls: cannot read {what} {path}: {exc}") from exc


def grpc_credentials(tls: TlsSpec, *, where: str) -> grpc.ChannelCredentials:
    """Channel credentials for a TLS gRPC path.

    gRPC's Python API cannot switch certificate verification off, so
    `insecure_skip_verify` is rejected here rather than silently ignored.
    """
    if tls.insecure_skip_verify:
        raise BadInput(
            f"{where}: tls.insecure_skip_verify is not supported for gRPC; give tls.ca instead"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca, "ca", where),
        private_key=_read(tls.key, "key", where),
        certificate_chain=_read(tls.cert, "cert", where),
    )


# gRPC's default receive limit, made explicit; the unary prober keeps the same one.
MAX_RECEIVE_BYTES = 4 << 20


def channel_options(spec: GrpcSpec) -> list[tuple[str, str | int]]:
    """The options of a grpc.aio channel for a path with this gRPC spec (see above)."""
    options: list[tuple[str, str | int]] = [
        ("grpc.enable_retries", 0),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.primary_user_agent", USER_AGENT),
        ("grpc.enable_channelz", 0),
    ]
    if spec.tls is not None and spec.tls.server_name:
        options.append(("grpc.ssl_target_name_override", spec.tls.server_name))
    return options


C = TypeVar("C")


@dataclass(eq=False)
class Lease(Generic[C]):
    """One endpoint's client and the calls currently using it."""

    key: str
    client: C
    in_flight: int = 0
    retired: bool = False
    closing: bool = False


class EndpointPool(Generic[C]):
    def __init__(
        self, create: Callable[[Endpoint], C], close: Callable[[C], Awaitable[None]]
    ) -> None:
        self._create = create
        self._close = close
        self._leases: dict[str, Lease[C]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._leases)

    @contextlib.asynccontextmanager
    async def use(self, endpoint: Endpoint) -> AsyncIterator[Lease[C]]:
        lease = self.acquire(endpoint)
        try:
            yield lease
        finally:
            self.release(lease)

    def acquire(self, endpoint: Endpoint) -> Lease[C]:
        """The endpoint's client, counted as in use until `release`: `use` without the
        context manager, for a holder that keeps a lease for hours (a held stream), where
        the manager's generator and frame would be kept alive per stream."""
        if self._closed:
            raise RuntimeError("prober is closed")
        lease = self._leases.get(endpoint.key)
        if lease is None:
            lease = Lease(endpoint.key, self._create(endpoint))
            self._leases[endpoint.key] = lease
        lease.in_flight += 1
        return lease

    def release(self, lease: Lease[C]) -> None:
        lease.in_flight -= 1
        if lease.retired and lease.in_flight == 0:
            self._close_soon(lease)

    def retire(self, lease: Lease[C]) -> None:
        """Stop handing this client out; close it once its calls are done."""
        if self._leases.get(lease.key) is lease:
            del self._leases[lease.key]
        if not lease.retired:
            lease.retired = True
            if lease.in_flight == 0:
                self._close_soon(lease)

    def forget(self, endpoint: Endpoint) -> None:
        lease = self._leases.get(endpoint.key)
        if lease is not None:
            self.retire(lease)

    async def aclose(self) -> None:
        """Close every client now, in-flight or not, and wait for the closing to finish."""
        self._closed = True
        leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            lease.retired = True
            self._close_soon(lease)
        while self._closing:
            await asyncio.gather(*self._closing)

    def _close_soon(self, lease: Lease[C]) -> None:
        if lease.closing:
            return
        lease.closing = True
        task = asyncio.get_running_loop().create_task(self._close_quietly(lease.client))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, client: C) -> None:
        # A client being thrown away has nothing left to report; an error while closing
        # its sockets must not surface as an unretrieved task exception.
        with contextlib.suppress(Exception):
            await self._close(client)
