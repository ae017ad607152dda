"""The relay: a reference-target pod calls an allowed destination for the probe, as a caller.

The probe sits outside the mesh; its calls enter a pod's sidecar on the inbound side and never
pass a caller's. The relay closes that gap: the probe asks a relay pod (over HTTP,
`GET /relay/<name>`, or gRPC, `Target/Relay`) to call a destination named in its allowlist
(`targets.relay_config`) through the pod's own outbound sidecar, and gets back a
`RelayAnswer`: the destination's outcome, the relay's latency for it, the attempts the
outbound proxy made, and which pod answered (pod, namespace and proxy version, as the
destination reference target reports them in `x-pod-name`, `x-pod-namespace` and
`x-proxy-version`).

Attempts come, in this order, from `x-seen-attempt-count` (the `x-envoy-attempt-count` the
destination *received*: Envoy puts it on each upstream request when the caller's route sets
`include_request_attempt_count`) or from `x-envoy-attempt-count` on the response (the proxy's
`include_attempt_count_in_response`); with neither, attempts are not measured (None, never 1).

In the local fleet there is no real outbound sidecar: a version profile's `outbound` policy
(`targets.profile.OutboundPolicy`) is applied here instead, retries and request attempt count
as Envoy's outbound route would. With a real mesh, leave it out: the sidecar does it.

Behind a real outbound proxy (the fleet's HAProxy mode, `targets.haproxy_outbound`) the relay
connects to the proxy, not to the pod; the proxy's own answers say what it did, as Envoy's
response flags (`x-response-flags`): `UF`, its connection to the endpoint it picked
(`x-upstream-host`) failed, is reported as the relay's own refused connection to that
address would be (`connect_refused`, `address` the endpoint's), so the probe judges stale
routing alike; `UH`, no endpoint to pick, stays the proxy's 503. An answer that reached a pod
names that pod's address from `x-upstream-host`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import grpc
import httpx

from probes.clients import classify_exception, classify_grpc_code, classify_status
from probes.types import Outcome
from targets.profile import OutboundPolicy, RetryPolicy
from targets.proto import target_pb2
from targets.relay_config import RelayConfig, RelayDestination
from targets.sidecar import (
    ATTEMPT_COUNT_HEADER,
    NAMESPACE_HEADER,
    NO_HEALTHY_UPSTREAM,
    POD_HEADER,
    RESPONSE_FLAGS_HEADER,
    SEEN_ATTEMPTS_HEADER,
    UPSTREAM_CONNECT_FAILURE,
    UPSTREAM_HOST_HEADER,
    VERSION_HEADER,
    grpc_code_for_http,
)

__all__ = [
    "ATTEMPTS_FROM_DESTINATION",
    "ATTEMPTS_FROM_RESPONSE",
    "EndpointView",
    "PodIdentity",
    "Relay",
    "RelayAnswer",
    "RoundRobinView",
    "UnknownDestination",
]

ATTEMPTS_FROM_DESTINATION = "destination"
ATTEMPTS_FROM_RESPONSE = "response_header"
_NO_RETRIES = RetryPolicy(num_retries=0)
# What the relay counts as the destination's success: any final answer below 400 (the probe
# re-judges the status against its own path's `expect`), and gRPC OK.
_HTTP_OK = range(100, 400)
_GRPC_OK = ("OK",)


class UnknownDestination(LookupError):
    """The name is not in the relay's allowlist (HTTP 403, gRPC PERMISSION_DENIED)."""

    def __init__(self, name: str):
        super().__init__(f"destination {name!r} is not in the relay's allowlist")
        self.name = name


class EndpointView(Protocol):
    """The outbound side's endpoint list (what Envoy's EDS gives a sidecar), emulated: the
    address a call to `service` goes to, or None when the view holds no endpoint for it."""

    def pick(self, service: str) -> str | None: ...


class RoundRobinView:
    """An endpoint view that balances round robin over a list per service; `update` replaces
    a service's list (the fleet calls it while the caller's proxy takes configuration)."""

    def __init__(self, endpoints: Mapping[str, Sequence[str]] | None = None):
        self._lists: dict[str, tuple[str, ...]] = {
            k: tuple(v) for k, v in (endpoints or {}).items()}
        self._next: dict[str, int] = {}

    def update(self, service: str, addresses: Sequence[str]) -> None:
        self._lists[service] = tuple(addresses)

    def addresses(self, service: str) -> tuple[str, ...]:
        return self._lists.get(service, ())

    def pick(self, service: str) -> str | None:
        found = self._lists.get(service)
        if not found:
            return None
        i = self._next.get(service, 0)
        self._next[service] = i + 1
        return found[i % len(found)]


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod as it reports itself; empty strings for what it did not say."""

    pod: str = ""
    namespace: str = ""
    proxy_version: str = ""

    def to_json(self) -> dict[str, str]:
        return {"pod": self.pod, "namespace": self.namespace,
                "proxy_version": self.proxy_version}

    def to_proto(self) -> target_pb2.PodIdentity:
        return target_pb2.PodIdentity(pod=self.pod, namespace=self.namespace,
                                      proxy_version=self.proxy_version)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> PodIdentity:
        return cls(headers.get(POD_HEADER, ""), headers.get(NAMESPACE_HEADER, ""),
                   headers.get(VERSION_HEADER, ""))


@dataclass(frozen=True, slots=True)
class RelayAnswer:
    """What one relayed call did at the destination, as the relay saw it."""

    destination: str
    outcome: str
    latency_s: float
    caller: PodIdentity
    status: int | None = None
    grpc_code: str = ""
    attempts: int | None = None
    attempts_from: str = ""
    answered_by: PodIdentity = field(default_factory=PodIdentity)
    address: str = ""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "destination": self.destination, "outcome": self.outcome,
            "status": self.status, "grpc_code": self.grpc_code or None,
            "latency_ms": round(self.latency_s * 1000.0, 3),
            "attempts": self.attempts, "attempts_from": self.attempts_from or None,
            "answered_by": self.answered_by.to_json(), "caller": self.caller.to_json(),
            "address": self.address, "detail": self.detail,
        }

    def to_proto(self) -> target_pb2.RelayReply:
        reply = target_pb2.RelayReply(
            destination=self.destination, outcome=self.outcome, status=self.status or 0,
            grpc_code=self.grpc_code, latency_us=int(self.latency_s * 1e6),
            attempts_from=self.attempts_from, answered_by=self.answered_by.to_proto(),
            caller=self.caller.to_proto(), address=self.address, detail=self.detail,
        )
        if self.attempts is not None:
            reply.attempts = self.attempts
        return reply


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One upstream attempt's answer: HTTP status or gRPC code, and the headers seen."""

    status: int | None
    grpc_code: str
    headers: Mapping[str, str]
    address: str
    detail: str = ""


class Relay:
    """Calls the allowlisted destinations of one pod (`caller`), bounded in time and size."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        caller: PodIdentity,
        outbound: OutboundPolicy | None = None,
        view: EndpointView | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.config = config
        self.caller = caller
        self._outbound = outbound
        self._view = view
        self._clock = clock
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_s), follow_redirects=False, trust_env=False,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._ids = itertools.count(1)

    async def call(self, name: str, request_id: str | None = None) -> RelayAnswer:
        """Call destination `name` once (with the outbound retries, if emulated)."""
        dest = self.config.destinations.get(name)
        if dest is None:
            raise UnknownDestination(name)
        rid = request_id or f"relay-{self.caller.pod}-{next(self._ids)}"
        started = self._clock()
        if self._view is not None and dest.service:
            picked = self._view.pick(dest.service)
            if picked is None:  # Envoy's "no healthy upstream": a local 503, nothing sent
                grpc_dest = dest.kind == "grpc"
                return RelayAnswer(
                    name, Outcome.grpc("UNAVAILABLE") if grpc_dest else Outcome.HTTP_5XX,
                    self._clock() - started, self.caller, status=None if grpc_dest else 503,
                    grpc_code="UNAVAILABLE" if grpc_dest else "",
                    detail=f"no endpoint for {dest.service} in the view")
            dest = _at(dest, picked)
        attempts = 0
        last: _Attempt | None = None
        outcome: str | None = None
        detail = ""
        try:
            async with asyncio.timeout(self.config.timeout_s):
                policy = self._outbound.retries if self._outbound else _NO_RETRIES
                while True:
                    attempts += 1
                    headers = self._headers(dest, rid, attempts)
                    if dest.kind == "http":
                        last = await self._http_once(dest, headers)
                    else:
                        last = await self._grpc_once(dest, headers)
                    if attempts > policy.num_retries or not _retryable(last, policy):
                        break
                    if policy.backoff_s > 0:
                        await asyncio.sleep(policy.backoff_s)
        except TimeoutError:
            outcome, detail = Outcome.TIMEOUT, f"no answer within {self.config.timeout_s:g}s"
        except (httpx.HTTPError, OSError) as exc:
            outcome, detail = classify_exception(exc)
        latency = self._clock() - started
        if outcome is not None or last is None:
            return RelayAnswer(name, outcome or Outcome.PROBE_ERROR, latency, self.caller,
                               address=dest.address, detail=detail)
        flags = last.headers.get(RESPONSE_FLAGS_HEADER, "").split(",")
        if UPSTREAM_CONNECT_FAILURE in flags:
            # The outbound proxy could not connect to the endpoint it picked: as if the relay
            # had been refused there itself.
            return RelayAnswer(
                name, Outcome.CONNECT_REFUSED, latency, self.caller, address=last.address,
                detail=f"outbound proxy: connection to {last.address} failed "
                       f"({UPSTREAM_CONNECT_FAILURE})")
        if NO_HEALTHY_UPSTREAM in flags and not last.detail:
            last = replace(last, detail=f"outbound proxy: no endpoint for "
                                        f"{dest.service or dest.address} ({NO_HEALTHY_UPSTREAM})")
        counted, source = _attempts(last.headers)
        if counted is None and self._outbound is not None and self._outbound.attempt_count_header:
            # The emulated outbound side counted them itself, as the proxy's response header.
            counted, source = attempts, ATTEMPTS_FROM_RESPONSE
        return RelayAnswer(
            name, _outcome(last), latency, self.caller, status=last.status,
            grpc_code=last.grpc_code, attempts=counted, attempts_from=source,
            answered_by=PodIdentity.from_headers(last.headers), address=last.address,
            detail=last.detail,
        )

    def _headers(self, dest: RelayDestination, rid: str, attempt: int) -> list[tuple[str, str]]:
        headers = [*dest.headers, ("x-request-id", rid)]
        if self._outbound is not None and self._outbound.attempt_count_header:
            headers.append((ATTEMPT_COUNT_HEADER, str(attempt)))
        return headers

    async def _http_once(self, dest: RelayDestination, headers: list[tuple[str, str]]) -> _Attempt:
        async with self._http.stream(dest.method, dest.url, headers=headers) as response:
            read = 0
            truncated = False
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read > self.config.max_body:
                    truncated = True
                    break
            seen = {k.lower(): v for k, v in response.headers.items()}
            address = (seen.get(UPSTREAM_HOST_HEADER)  # the pod behind an outbound proxy
                       or _peer(response.extensions.get("network_stream")) or dest.address)
            return _Attempt(
                response.status_code, "", seen, address,
                f"body cut at {self.config.max_body} bytes" if truncated else "",
            )

    async def _grpc_once(self, dest: RelayDestination, headers: list[tuple[str, str]]) -> _Attempt:
        channel = self._channel(dest.target)
        method = channel.unary_unary(dest.method)  # bytes in, bytes out
        call = method(dest.request, metadata=tuple(headers))
        detail = ""
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            detail = exc.details() or ""
        code = await call.code()
        seen = _metadata(await call.initial_metadata(), await call.trailing_metadata())
        return _Attempt(None, code.name, seen, dest.target, detail)

    def _channel(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = grpc.aio.insecure_channel(target, options=[
                ("grpc.max_receive_message_length", self.config.max_body),
                ("grpc.enable_retries", 0),
            ])
            self._channels[target] = channel
        return channel

    async def aclose(self) -> None:
        await self._http.aclose()
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)


def _at(dest: RelayDestination, address: str) -> RelayDestination:
    """The destination with its address replaced by `address` (host:port)."""
    if dest.kind == "grpc":
        return replace(dest, target=address)
    parts = urlsplit(dest.url)
    return replace(dest, url=urlunsplit(parts._replace(netloc=address)))


def _outcome(attempt: _Attempt) -> str:
    if attempt.status is not None:
        return classify_status(attempt.status, _HTTP_OK)
    return classify_grpc_code(attempt.grpc_code, _GRPC_OK, attempt.detail)


def _retryable(attempt: _Attempt, policy: RetryPolicy) -> bool:
    if attempt.status is not None:
        return attempt.status in policy.retry_on
    return attempt.grpc_code in {grpc_code_for_http(s) for s in policy.retry_on}


def _attempts(headers: Mapping[str, str]) -> tuple[int | None, str]:
    for name, source in ((SEEN_ATTEMPTS_HEADER, ATTEMPTS_FROM_DESTINATION),
                         (ATTEMPT_COUNT_HEADER, ATTEMPTS_FROM_RESPONSE)):
        value = headers.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value), source
    return None, ""


def _metadata(*parts: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in parts:
        for key, value in part or ():
            if not key.endswith("-bin"):
                out[key.lower()] = value if isinstance(value, str) else value.decode("latin-1")
    return out


def _peer(stream: Any) -> str:
    try:
        addr = stream.get_extra_info("server_addr") if stream is not None else None
    except Exception:  # a transport without the info
        return ""
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = str(addr[0])
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return ""
