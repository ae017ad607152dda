"""The HTTP prober: one request through an httpx transport, classified.

HTTP/2 uses the httpx API (`httpx.Request` in, `httpx.Response` out, a transport per
endpoint), calling the transport directly instead of going through `httpx.AsyncClient`: the
client's per-request machinery (cookies, auth, redirects, event hooks, header merging) is
unused here and cost about 40 % of the CPU per request in measurement. It runs on httpcore
with a GOAWAY observer (`_h2`). HTTP/1.1 runs on the probe's own lean protocol over
httptools' parser (`_h1`): the probe's hot path at scale, where a general client's request
and response objects cost more than the rest of the prober.

The body is read and discarded in chunks up to `body_limit` (1 MiB), so a 50 MB or endless
body costs bounded memory and time; the outcome still follows the status and the detail
says the body was cut.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import httpx

from probes._exceptions import BadInput
from probes._spec import HttpSpec, PathSpec
from probes._types import CallOutcome, Endpoint, Outcome
from probes.clients import _h1, _h2, _h2base, _h2lean
from probes.clients._base import USER_AGENT, host_port, inner_budget_s, keepalive_s
from probes.clients._classify import classify_exception, classify_status, parse_count
from probes.clients._pool import EndpointPool, Lease
from probes.clients._tls import plaintext_context, ssl_context
from probes.clients._wire import IDEMPOTENT_METHODS, Replay, WireRecord, recording

BODY_LIMIT = 1 << 20

# The HTTP/2 clients, by name: the probe's own ("lean", `_h2lean`) or httpcore's (`_h2`).
# One place picks; `HttpProber(h2_client=...)` overrides it (BENCHMARKS.md D15).
H2_CLIENTS = ("lean", "httpcore")
H2_CLIENT = "lean"

# The reference target echoes the attempts it saw here when no proxy header is present.
APP_ATTEMPTS_HEADER = "x-app-attempts"

_Client = tuple[httpx.AsyncBaseTransport, httpx.URL] | _h1.H1Client | _h2lean.H2Client
_Lease = Lease[_Client]
_ReplayReason = Callable[[BaseException, WireRecord], "tuple[Replay, str] | None"]


@dataclasses.dataclass(frozen=True, slots=True)
class _Resend:
    """A first attempt that failed in a way that allows one re-send."""

    reason: str
    internal: int


_Attempt = CallOutcome | _Resend


class HttpProber:
    """HTTP/1.1 or HTTP/2 calls for one path, with connections kept per endpoint."""

    # Put before the detail of a call that failed on the wire (the relay says whose wire).
    _wire_prefix = ""

    def __init__(
        self, path: PathSpec, *, body_limit: int = BODY_LIMIT, h2_client: str | None = None,
        keep_body: bool = False,
    ) -> None:
        spec = path.http
        if spec is None:
            raise BadInput(f"path {path.name}: not an HTTP path")
        if spec.version not in ("1.1", "2"):
            raise BadInput(f"path {path.name}: http.version must be 1.1 or 2, not {spec.version}")
        if spec.scheme not in ("http", "https"):
            raise BadInput(f"path {path.name}: http.scheme must be http or https")
        if not spec.path.startswith("/"):
            raise BadInput(f"path {path.name}: http.path must start with /, not {spec.path!r}")
        self._path = path
        self._spec = spec
        self._method = spec.method.upper()
        self._expected = frozenset(path.expect.status)
        self._body_limit = body_limit
        self._http2 = spec.version == "2"
        self._h2_client = h2_client or H2_CLIENT
        if self._h2_client not in H2_CLIENTS:
            raise BadInput(f"HTTP/2 client must be one of {', '.join(H2_CLIENTS)}")
        self._lean = self._http2 and self._h2_client != "httpcore"
        if keep_body and self._http2 and not self._lean:
            raise BadInput(f"path {path.name}: only the lean HTTP/2 client keeps answer bodies")
        self._ssl = (
            ssl_context(spec.tls, where=f"path {path.name}")
            if spec.scheme == "https"
            else plaintext_context()
        )
        self._keepalive_s = keepalive_s(path.rate_per_s)
        budget = inner_budget_s(path.timeout_s)
        self._extensions: dict[str, Any] = {
            "timeout": {"connect": budget, "read": budget, "write": budget, "pool": budget}
        }
        if spec.tls is not None and spec.tls.server_name:
            self._extensions["sni_hostname"] = spec.tls.server_name
        self._headers = [("user-agent", USER_AGENT), *spec.headers.items()]
        self._body = spec.body or None
        # Lower-case: HTTP/1.1 answers are looked up by lower-case name (HTTP/2's always are).
        self._attempt_headers = tuple(
            dict.fromkeys((path.attempts_header.lower(), APP_ATTEMPTS_HEADER))
        )
        self._cohort_header = path.cohort_header.lower() if path.cohort_header else None
        self._replay_reason: _ReplayReason = (
            _h2lean_replay if self._lean
            else _h2.replay_reason if self._http2 else _h1.replay_reason
        )
        self._h1 = _h1.H1Settings(
            connect_budget_s=budget,
            read_budget_s=budget,
            keepalive_s=self._keepalive_s,
            body_limit=body_limit,
            wanted=frozenset(
                h.encode("latin-1", "replace")
                for h in (*self._attempt_headers, self._cohort_header) if h
            ),
            keep_body=keep_body,
        )
        self._h2 = _h2base.H2Settings(
            connect_budget_s=budget,
            read_budget_s=budget,
            keepalive_s=self._keepalive_s,
            body_limit=body_limit,
            wanted=self._h1.wanted,
            keep_body=keep_body,
        )
        self._h1_request("localhost")  # a header that cannot be sent is bad input, now
        if self._lean:
            self._h2_request("localhost")
            if spec.scheme == "https":
                self._ssl.set_alpn_protocols(["h2"])
        self._pool: EndpointPool[_Client] = EndpointPool(self._connect, self._disconnect)

    @property
    def spec(self) -> HttpSpec:
        return self._spec

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        try:
            async with self._pool.use(endpoint) as lease:
                first = await self._attempt(lease, request_id, replayable=True)
                if isinstance(first, CallOutcome):
                    return first
                # The connection went away under the request: never hand it out again.
                self._pool.retire(lease)
        except LookupError as exc:  # no such port name, or an address that is not one
            return CallOutcome(Outcome.PROBE_ERROR, detail=str(exc))
        async with self._pool.use(endpoint) as lease:
            again = await self._attempt(lease, request_id, replayable=False)
        assert isinstance(again, CallOutcome)
        return dataclasses.replace(
            again,
            churn=again.churn + first.internal + 1,
            detail=_join(f"re-sent on a fresh connection: {first.reason}", again.detail),
        )

    def forget(self, endpoint: Endpoint) -> None:
        self._pool.forget(endpoint)

    async def aclose(self) -> None:
        await self._pool.aclose()

    def _connect(self, endpoint: Endpoint) -> _Client:
        port = endpoint.port_for(self._path.port)
        try:
            url = httpx.URL(
                f"{self._spec.scheme}://{host_port(endpoint.host, port)}{self._spec.path}"
            )
        except httpx.InvalidURL as exc:
            raise LookupError(f"endpoint {endpoint.name}: not a usable address: {exc}") from exc
        if self._lean:
            return _h2lean.H2Client(
                endpoint.host, port, self._h2_request(url.netloc.decode("ascii")),
                self._body, self._h2,
                ssl_context=self._ssl if self._spec.scheme == "https" else None,
                server_name=self._extensions.get("sni_hostname"),
            )
        if self._http2:
            transport = _h2.H2Transport(ssl_context=self._ssl, keepalive_s=self._keepalive_s)
            return transport, url
        return _h1.H1Client(
            endpoint.host, port, self._h1_request(url.netloc.decode("ascii")), self._h1,
            ssl_context=self._ssl if self._spec.scheme == "https" else None,
            server_name=self._extensions.get("sni_hostname"),
        )

    def _h1_request(self, host: str) -> tuple[bytes, bytes]:
        try:
            return _h1.frame_request(
                self._method, self._spec.path, host, self._headers, self._body
            )
        except ValueError as exc:
            raise BadInput(f"path {self._path.name}: http: {exc}") from exc

    def _h2_request(self, authority: str) -> list[_h2base.Header]:
        try:
            return _h2base.request_headers(
                self._method, self._spec.scheme, authority, self._spec.path, self._headers
            )
        except (ValueError, UnicodeEncodeError) as exc:
            raise BadInput(f"path {self._path.name}: http: {exc}") from exc

    @staticmethod
    async def _disconnect(client: _Client) -> None:
        if isinstance(client, _h1.H1Client | _h2lean.H2Client):
            await client.aclose()
        else:
            await client[0].aclose()

    async def _attempt(self, lease: _Lease, request_id: str, *, replayable: bool) -> _Attempt:
        """One send; a failure that may be re-sent comes back as a `_Resend`."""
        with recording() as record:
            try:
                outcome = await self._exchange(lease, request_id, record)
            except Exception as exc:
                internal = _internal_resends(record)
                replay = self._replay_reason(exc, record)
                allowed = replay is not None and (
                    replay[0] is Replay.UNPROCESSED or self._method in IDEMPOTENT_METHODS
                )
                if replay is not None and allowed and replayable:
                    return _Resend(replay[1], internal)
                kind, detail = classify_exception(exc)
                if self._http2 and (wrong := _h2.misread(record)) is not None:
                    kind, detail = Outcome.PROTOCOL_ERROR, f"{wrong}; {detail}"
                if replay is not None and not allowed:
                    # The connection closed under a request that may have been processed.
                    kind = Outcome.RESET
                    detail = f"{detail}; {replay[1]}; not re-sent: {self._method} is not idempotent"
                elif replay is not None:
                    detail = f"{detail}; {replay[1]}"
                return CallOutcome(
                    kind, churn=internal,
                    detail=_join(_internal_note(internal), self._wire_prefix + detail),
                )
        internal = _internal_resends(record)
        if internal:
            outcome = dataclasses.replace(
                outcome, churn=internal, detail=_join(_internal_note(internal), outcome.detail)
            )
        return outcome

    async def _exchange(
        self,
        lease: _Lease,
        request_id: str,
        record: WireRecord,
    ) -> CallOutcome:
        client = lease.client
        if isinstance(client, _h1.H1Client):
            return await self._exchange_h1(client, request_id)
        if isinstance(client, _h2lean.H2Client):
            answer = await client.request(
                [(b"x-request-id", request_id.encode("latin-1"))],
                head_only=self._method == "HEAD",
            )
            return self._answer(answer.status, answer.headers.get, answer.received, answer.body)
        transport, url = client
        request = httpx.Request(
            self._method,
            url,
            headers=[*self._headers, ("x-request-id", request_id)],
            content=self._spec.body,
            extensions={**self._extensions, "trace": record.trace},
        )
        response = await transport.handle_async_request(request)
        status = response.status_code
        headers = response.headers
        try:
            received: int | BaseException = await self._discard_body(response)
        except Exception as exc:
            received = exc
        finally:
            await response.aclose()
        if isinstance(received, int) and received >= self._body_limit:
            # httpcore cannot reset one stream; the unread rest would hold the connection's
            # flow-control window, so the connection is not reused.
            self._pool.retire(lease)
        return self._answer(status, headers.get, received, b"")

    async def _exchange_h1(self, client: _h1.H1Client, request_id: str) -> CallOutcome:
        answer = await client.request(request_id, head_only=self._method == "HEAD")
        return self._answer(answer.status, answer.headers.get, answer.received, answer.body)

    def _answer(
        self, status: int, header: Callable[[str], str | None], received: int | BaseException,
        body: bytes,
    ) -> CallOutcome:
        """The outcome from the status, the attempts and cohort headers, and the body read
        (its length, or the error that cut it; `body` is kept only with `keep_body`)."""
        attempts = next(
            (n for h in self._attempt_headers if (n := parse_count(header(h))) is not None),
            None,
        )
        cohort = header(self._cohort_header) if self._cohort_header else None
        outcome = classify_status(status, self._expected)
        detail = ""
        if isinstance(received, BaseException):
            # The status arrived but the body did not: the answer is broken, whatever it said.
            outcome, body_detail = classify_exception(received)
            detail = f"body: {body_detail}"
        elif received >= self._body_limit:
            detail = f"body truncated at {received} bytes"
        if outcome != Outcome.OK and not detail:
            detail = f"HTTP {status}"
        return CallOutcome(
            outcome, status=status, attempts=attempts, cohort_hint=cohort, detail=detail
        )

    async def _discard_body(self, response: httpx.Response) -> int:
        received = 0
        parts = cast(AsyncGenerator[bytes, None], response.aiter_raw())
        async with contextlib.aclosing(parts):
            async for part in parts:
                received += len(part)
                if received >= self._body_limit:
                    break
        return received


def _h2lean_replay(exc: BaseException, record: WireRecord) -> tuple[Replay, str] | None:
    return _h2base.replay_reason(exc)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _internal_resends(record: WireRecord) -> int:
    """How often httpcore itself re-sent the request (it does so, silently, for a stream
    above a GOAWAY's last-stream-id that it had not yet read from)."""
    return max(len(record.stream_ids) - 1, 0)


def _internal_note(count: int) -> str:
    return f"re-sent {count}x on another connection by httpcore after GOAWAY" if count else ""
