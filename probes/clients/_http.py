"""The HTTP prober: one request on the probe's own client for its HTTP version, classified.

HTTP/1.1 runs on the probe's own lean protocol over httptools' parser (`_h1`): the probe's
hot path at scale, where a general client's request and response objects cost more than
the rest of the prober (BENCHMARKS.md, D6). HTTP/2 runs on the probe's own protocol and
framing (`_h2lean`), which keeps the GOAWAY facts a library client loses (D15).

The body is read and discarded in chunks up to `body_limit` (1 MiB), so a 50 MB or endless
body costs bounded memory and time; the outcome still follows the status and the detail
says the body was cut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import httpx

from probes.clients import _h1, _h2base, _h2lean
from probes.clients._base import (
    IDEMPOTENT_METHODS,
    USER_AGENT,
    Replay,
    host_port,
    inner_budget_s,
    keepalive_s,
)
from probes.clients._classify import classify_exception, classify_status, parse_count
from probes.clients._connection import EndpointPool, Lease, plaintext_context, ssl_context
from probes.errors import BadInput
from probes.spec import HttpSpec, PathSpec
from probes.types import CallOutcome, Endpoint, Outcome

BODY_LIMIT = 1 << 20

# The reference target echoes the attempts it saw here when no proxy header is present.
APP_ATTEMPTS_HEADER = "x-app-attempts"

_Client = _h1.H1Client | _h2lean.H2Client
_Lease = Lease[_Client]


@dataclasses.dataclass(frozen=True, slots=True)
class _Resend:
    """A first attempt that failed in a way that allows one re-send."""

    reason: str
    # Re-sends its client made on its own before failing: counted as churn too.
    internal: int


_Attempt = CallOutcome | _Resend


class HttpProber:
    """HTTP/1.1 or HTTP/2 calls for one path, with connections kept per endpoint."""

    # Put before the detail of a call that failed on the wire (the relay says whose wire).
    _wire_prefix = ""

    def __init__(
        self, path: PathSpec, *, body_limit: int = BODY_LIMIT, keep_body: bool = False,
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
        self._ssl = (
            ssl_context(spec.tls, where=f"path {path.name}")
            if spec.scheme == "https"
            else plaintext_context()
        )
        self._keepalive_s = keepalive_s(path.rate_per_s)
        budget = inner_budget_s(path.timeout_s)
        self._server_name = (spec.tls.server_name or None) if spec.tls is not None else None
        self._headers = [("user-agent", USER_AGENT), *spec.headers.items()]
        self._body = spec.body or None
        # Lower-case: HTTP/1.1 answers are looked up by lower-case name (HTTP/2's always are).
        self._attempt_headers = tuple(
            dict.fromkeys((path.attempts_header.lower(), APP_ATTEMPTS_HEADER))
        )
        self._cohort_header = path.cohort_header.lower() if path.cohort_header else None
        self._replay_reason = _h2base.replay_reason if self._http2 else _h1.replay_reason
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
        if self._http2:
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

    def _url(self, endpoint: Endpoint) -> httpx.URL:
        """The path's URL on `endpoint`; LookupError when the endpoint has no usable address."""
        port = endpoint.port_for(self._path.port)
        try:
            return httpx.URL(
                f"{self._spec.scheme}://{host_port(endpoint.host, port)}{self._spec.path}"
            )
        except httpx.InvalidURL as exc:
            raise LookupError(f"endpoint {endpoint.name}: not a usable address: {exc}") from exc

    def _connect(self, endpoint: Endpoint) -> _Client:
        url = self._url(endpoint)
        port = endpoint.port_for(self._path.port)
        tls = self._ssl if self._spec.scheme == "https" else None
        authority = url.netloc.decode("ascii")
        if self._http2:
            return _h2lean.H2Client(
                endpoint.host, port, self._h2_request(authority), self._body, self._h2,
                ssl_context=tls, server_name=self._server_name,
            )
        return _h1.H1Client(
            endpoint.host, port, self._h1_request(authority), self._h1,
            ssl_context=tls, server_name=self._server_name,
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
        await client.aclose()

    async def _attempt(self, lease: _Lease, request_id: str, *, replayable: bool) -> _Attempt:
        """One send; a failure that may be re-sent comes back as a `_Resend`."""
        try:
            return await self._exchange(lease, request_id)
        except Exception as exc:
            return self._failed(exc, self._replay_reason(exc), replayable=replayable)

    def _failed(
        self, exc: Exception, replay: tuple[Replay, str] | None, *, replayable: bool,
        classified: tuple[str, str] | None = None,
    ) -> _Attempt:
        """A failed send: a `_Resend` when `replay` allows one, else its outcome, classified
        from `exc` (or `classified`, when the client knows better than its exception)."""
        allowed = replay is not None and (
            replay[0] is Replay.UNPROCESSED or self._method in IDEMPOTENT_METHODS
        )
        if replay is not None and allowed and replayable:
            return _Resend(replay[1], 0)
        kind, detail = classified or classify_exception(exc)
        if replay is not None and not allowed:
            # The connection closed under a request that may have been processed.
            kind = Outcome.RESET
            detail = f"{detail}; {replay[1]}; not re-sent: {self._method} is not idempotent"
        elif replay is not None:
            detail = f"{detail}; {replay[1]}"
        return CallOutcome(kind, detail=self._wire_prefix + detail)

    async def _exchange(self, lease: _Lease, request_id: str) -> CallOutcome:
        client = lease.client
        head_only = self._method == "HEAD"
        answer: _h1.H1Answer | _h2base.H2Answer
        if isinstance(client, _h1.H1Client):
            answer = await client.request(request_id, head_only=head_only)
        else:
            answer = await client.request(
                [(b"x-request-id", request_id.encode("latin-1"))], head_only=head_only
            )
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


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)
