"""The gRPC prober: one unary call with raw bytes in and out, classified.

The probe needs no generated code for the callee: the request is the path's raw protobuf
bytes and the answer is only counted. With `health_service` set the call is the standard
`grpc.health.v1.Health/Check`; SERVING is ok, any other serving status is
`unexpected_status` (the RPC worked, the answer was not the expected one) with the status in
the detail, and a status code other than OK is `grpc_<CODE>` as for any call.

Each call is one HTTP/2 POST on the probe's own client (`_grpc_lean` over `_h2lean`), one
connection per endpoint, reused and closed on `forget`/`aclose` (BENCHMARKS.md, D15). Its
outcomes are named as grpc core names them, so a path reads the same as on grpc.aio. A call
the server provably never saw (a stream above a GOAWAY's last-stream-id, REFUSED_STREAM) is
re-sent once, on a new connection, and counted as churn: the same rule as for HTTP/2.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Sequence
from typing import TypeAlias

from grpc_health.v1 import health_pb2

from probes.clients import _grpc_lean, _h2base, _h2lean
from probes.clients._base import USER_AGENT, host_port, inner_budget_s, keepalive_s
from probes.clients._classify import classify_exception, classify_grpc_code, parse_count
from probes.clients._connection import (
    MAX_RECEIVE_BYTES,
    EndpointPool,
    grpc_credentials,
    ssl_context,
)
from probes.errors import BadInput
from probes.spec import GrpcSpec, PathSpec
from probes.types import CallOutcome, Endpoint, Outcome

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_SERVING = health_pb2.HealthCheckResponse(
    status=health_pb2.HealthCheckResponse.SERVING
).SerializeToString()
APP_ATTEMPTS_KEY = "x-app-attempts"

_Metadata = Sequence[tuple[str, str | bytes]]
# Initial or trailing metadata as a client library hands it back (None: none arrived).
_AnyMetadata: TypeAlias = "Iterable[tuple[str, str | bytes]] | None"


class GrpcProber:
    """gRPC unary calls (or health checks) for one path, one connection per endpoint."""

    def __init__(self, path: PathSpec) -> None:
        spec = path.grpc
        if spec is None:
            raise BadInput(f"path {path.name}: not a gRPC path")
        self._path = path
        self._spec = spec
        self._health = spec.health_service is not None
        self._method = HEALTH_CHECK if self._health else spec.method
        if not self._method.startswith("/") or self._method.count("/") != 2:
            raise BadInput(f"path {path.name}: grpc.method must look like /pkg.Service/Method")
        self._request = (
            health_pb2.HealthCheckRequest(service=spec.health_service).SerializeToString()
            if spec.health_service is not None
            else spec.request
        )
        self._expected = frozenset(c.upper() for c in path.expect.grpc_codes)
        self._budget = inner_budget_s(path.timeout_s)
        self._metadata = tuple((k.lower(), v) for k, v in spec.metadata.items())
        self._attempt_keys = tuple(dict.fromkeys((path.attempts_header.lower(), APP_ATTEMPTS_KEY)))
        self._cohort_key = path.cohort_header.lower() if path.cohort_header else None
        if spec.tls is not None:
            # The TLS rules of a gRPC path are grpc.aio's, as for its held streams: a path
            # means the same on either (insecure_skip_verify is refused).
            grpc_credentials(spec.tls, where=f"path {path.name}")
        self._scheme = "https" if spec.tls else "http"
        self._ssl = ssl_context(spec.tls, where=f"path {path.name}") if spec.tls else None
        if self._ssl is not None:
            self._ssl.set_alpn_protocols(["h2"])
        self._server_name = spec.tls.server_name if spec.tls else None
        self._h2 = _h2base.H2Settings(
            connect_budget_s=self._budget,
            read_budget_s=self._budget,
            keepalive_s=keepalive_s(path.rate_per_s),
            body_limit=MAX_RECEIVE_BYTES + 6,
            wanted=frozenset(
                (*_grpc_lean.STATUS_KEYS,
                 *(k.encode("latin-1") for k in (*self._attempt_keys, self._cohort_key) if k))
            ),
            keep_body=True,
        )
        self._body = _grpc_lean.frame(self._request)
        self._lean_headers("localhost")  # a metadata entry that cannot be sent: bad input
        self._pool: EndpointPool[_h2lean.H2Client] = EndpointPool(self._connect, self._disconnect)

    @property
    def spec(self) -> GrpcSpec:
        return self._spec

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        try:
            endpoint.port_for(self._path.port)
        except LookupError as exc:
            return CallOutcome(Outcome.PROBE_ERROR, detail=str(exc))
        metadata = (*self._metadata, ("x-request-id", request_id))
        deadline = asyncio.get_running_loop().time() + self._budget
        async with self._pool.use(endpoint) as lease:
            first = await self._once(lease.client, metadata, deadline)
            if not isinstance(first, Unprocessed):
                return first
            # Never seen by the server: re-send once, on a connection of its own.
            self._pool.retire(lease)
        async with self._pool.use(endpoint) as lease:
            again = await self._once(lease.client, metadata, deadline)
        if isinstance(again, Unprocessed):
            again = again.outcome
        note = f"re-sent on a fresh connection: {first.outcome.detail}"
        return dataclasses.replace(
            again, churn=1, detail=f"{note}; {again.detail}" if again.detail else note
        )

    def forget(self, endpoint: Endpoint) -> None:
        self._pool.forget(endpoint)

    async def aclose(self) -> None:
        await self._pool.aclose()

    def _connect(self, endpoint: Endpoint) -> _h2lean.H2Client:
        port = endpoint.port_for(self._path.port)
        return _h2lean.H2Client(
            endpoint.host, port, self._lean_headers(host_port(endpoint.host, port)),
            self._body, self._h2, ssl_context=self._ssl, server_name=self._server_name,
        )

    def _lean_headers(self, authority: str) -> list[_h2base.Header]:
        try:
            return _grpc_lean.request_headers(
                self._scheme, authority, self._method, self._metadata, USER_AGENT
            )
        except (ValueError, UnicodeEncodeError) as exc:
            raise BadInput(f"path {self._path.name}: grpc: {exc}") from exc

    @staticmethod
    async def _disconnect(client: _h2lean.H2Client) -> None:
        await client.aclose()

    async def _once(
        self, client: _h2lean.H2Client, metadata: _Metadata, deadline: float
    ) -> CallOutcome | Unprocessed:
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.001)
        request_id = metadata[-1][1]
        rid = request_id if isinstance(request_id, bytes) else request_id.encode("latin-1")
        extra = [_grpc_lean.timeout_header(remaining), (b"x-request-id", rid)]
        try:  # the connection's timer carries the deadline
            answer = await client.request(extra, deadline=deadline)
            reply = _grpc_lean.reply(answer, MAX_RECEIVE_BYTES)
        except _h2base.H2Error as exc:
            reply = _grpc_lean.error_reply(exc)
        except Exception as exc:
            kind, detail = classify_exception(exc)
            return CallOutcome(kind, detail=detail)
        attempts = self._attempts(reply.initial, reply.trailing)
        cohort = self._cohort(reply.initial, reply.trailing)
        code, detail = reply.code, reply.detail
        if code == "OK" and reply.message is None:
            code, detail = "INTERNAL", "status OK without a message"
        outcome = reply.outcome or classify_grpc_code(code, self._expected, detail)
        if code == "OK" and self._health and outcome == Outcome.OK:
            assert reply.message is not None
            serving = _serving_status(reply.message)
            if serving != "SERVING":
                outcome, detail = Outcome.UNEXPECTED_STATUS, f"health status {serving}"
        result = CallOutcome(outcome, status=_grpc_lean.CODES[code], attempts=attempts,
                             cohort_hint=cohort, detail=detail)
        return Unprocessed(result) if reply.unprocessed else result

    def _attempts(self, *metadata: _AnyMetadata) -> int | None:
        for key in self._attempt_keys:
            count = parse_count(_lookup(key, metadata))
            if count is not None:
                return count
        return None

    def _cohort(self, *metadata: _AnyMetadata) -> str | None:
        return _lookup(self._cohort_key, metadata) if self._cohort_key else None


@dataclasses.dataclass(frozen=True, slots=True)
class Unprocessed:
    """A call the server provably never saw: re-sent once, on a fresh connection."""

    outcome: CallOutcome


def _lookup(key: str, metadata: Sequence[_AnyMetadata]) -> str | None:
    """The first text value of `key` in initial, then trailing metadata."""
    for md in metadata:
        if md is None:
            continue
        for name, value in md:
            if name == key:
                return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def _serving_status(response: bytes) -> str:
    if response == _SERVING:
        return "SERVING"
    try:
        status = health_pb2.HealthCheckResponse.FromString(response).status
    except Exception:  # a malformed answer is an answer we did not expect
        return "UNPARSEABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))

