"""The probe's HTTP API: /metrics, /healthz, /verdict, /gate, /inventory.

A raw ASGI app served by hypercorn (the same server the reference target uses), read-only:
every route answers GET except Flagger's `POST /gate`. The verdict itself is computed by a
function passed in, so this module knows HTTP and the gates' contracts, not statistics:

- `GET /verdict` answers 200 with the verdict JSON for any computed verdict, pass, fail or
  inconclusive alike: Argo Rollouts' `web` provider treats a non-2xx answer as a measurement
  error, and evaluates `successCondition`/`failureCondition` on the JSON. Only an unreadable
  store (no verdict could be computed) answers 503, with a JSON error.
- `POST /gate` answers 200 only on pass and 409 otherwise: Flagger treats any status above
  202 as a failed check, so fail and inconclusive both hold the canary.
- `POST /gate/rollback` answers 200 only on fail and 409 otherwise: Flagger's rollback hook
  rolls back at once on a 2xx. With `/gate` as the confirm-promotion hook, a fail rolls back
  within one interval while an undecided canary waits instead of counting failed checks.

The OpenAPI description of all this is `probes/openapi.yaml` (package data), served at
`GET /openapi.json`; tests/integration/test_openapi.py fuzzes the live API against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import importlib.metadata
import importlib.resources
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from probes.errors import BadInput, SkewprobeError

__all__ = [
    "ROUTES",
    "ApiApp",
    "VerdictQuery",
    "openapi_json",
    "openapi_spec",
]

log = logging.getLogger("skewprobe.api")

_MAX_BODY = 64 * 1024
# A body sent slower than this is a stalled client: 408, and the connection is closed.
BODY_READ_S = 10.0
# Requests answered per second at most, however many arrive: each answer costs the probing
# loop under a millisecond, and a flood answered flat out made the probe's sends late (D24).
MAX_ANSWERS_PER_S = 200.0
_GATE_KEYS = ("baseline", "canary", "path", "since")
# Every answer to a body the API will not read, or cannot, closes the connection: the
# rest of an unread body would otherwise be read as the next request.
_CLOSE = (b"connection", b"close")
# Every route and the methods it answers (HEAD wherever GET is), for 405's Allow header.
ROUTES = {
    "/metrics": ("GET", "HEAD"),
    "/healthz": ("GET", "HEAD"),
    "/verdict": ("GET", "HEAD"),
    "/gate": ("POST",),
    "/gate/rollback": ("POST",),
    "/inventory": ("GET", "HEAD"),
    "/openapi.json": ("GET", "HEAD"),
}


@dataclass(frozen=True, slots=True)
class VerdictQuery:
    """What a gate may narrow a verdict to. Every field is optional. `at` (the verdict as it
    stood then) is read from `GET /verdict` only: a gate judges the rollout now."""

    path: str | None = None
    baseline: str | None = None
    canary: str | None = None
    since: str | None = None
    at: str | None = None


_T = TypeVar("_T")
VerdictFn = Callable[[VerdictQuery], Awaitable[Mapping[str, Any]]]
HealthFn = Callable[[], tuple[bool, str]]
JsonFn = Callable[[], Awaitable[Mapping[str, Any]]]

ASGIScope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]


class ApiApp:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        verdict: VerdictFn,
        health: HealthFn,
        inventory: JsonFn | None = None,
        token: str | None = None,
        max_per_s: float = MAX_ANSWERS_PER_S,
        body_read_s: float = BODY_READ_S,
    ) -> None:
        self.registry = registry
        self.verdict = verdict
        self.health = health
        self.inventory = inventory
        self.token = token
        self._pace = _Pacer(max_per_s)
        self.body_read_s = body_read_s
        # Set by stop(): what requests wait on then is cancelled and they answer 503.
        self._stopped = False
        self._waiting: set[asyncio.Future[Any]] = set()

    def stop(self) -> None:
        """Answer every request still waiting (for its turn, for a verdict) and every new
        one with 503 at once: the server then closes each connection after its answer
        instead of cancelling it mid-request when its grace runs out."""
        self._stopped = True
        for waiting in self._waiting:
            waiting.cancel()

    async def _unless_stopping(self, awaitable: Awaitable[_T]) -> _T:
        """`awaitable`'s result, or _Stopping as soon as `stop()` is called."""
        if self._stopped:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never started: nothing to wait for
            raise _Stopping
        work = asyncio.ensure_future(awaitable)
        self._waiting.add(work)
        try:
            return await work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._stopped and (current is None or not current.cancelling()):
                raise _Stopping from None
            raise  # the request itself was cancelled (its client went away)
        finally:
            self._waiting.discard(work)

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            status, headers, body = await self._route(scope, receive)
            # The answer waits its turn, not the request: the requests sharing a verdict
            # would otherwise all be answered in one turn of the probing loop.
            await self._unless_stopping(self._pace.wait())
        except _Stopping:
            status, headers, body = _json(503, {"error": "the probe is stopping"})
        except Exception:
            # A bug must still answer JSON, and a 5xx never passes a gate.
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            status, headers, body = _json(500, {"error": "internal error (see the probe's log)"})
        # A length, not chunks: a client reads exactly the answer, then the next one.
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _route(
        self, scope: ASGIScope, receive: Receive
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        method, route = scope["method"], scope["path"]
        if self.token is not None and route != "/healthz" and not self._authorised(scope):
            status, headers, body = _json(401, {"error": "missing or wrong bearer token"})
            return status, [*headers, (b"www-authenticate", b'Bearer realm="skewprobe"')], body
        if method in ROUTES.get(route, ()) and method != "POST" and _has_body(scope):
            # Only the gates read a body: any other request's is refused unread (and on
            # /verdict, as any bad query there, reads as inconclusive).
            refusal = {"error": f"{method} {route} takes no body"}
            if route == "/verdict":
                refusal = {"verdict": "inconclusive", **refusal}
            status, headers, body = _json(400, refusal)
            return status, [*headers, _CLOSE], body
        if route == "/metrics" and method in ("GET", "HEAD"):
            return 200, [(b"content-type", CONTENT_TYPE_LATEST.encode())], generate_latest(
                self.registry
            )
        if route == "/healthz" and method in ("GET", "HEAD"):
            ok, reason = self.health()
            return _json(200 if ok else 503, {"ok": ok, "reason": reason})
        if route == "/verdict" and method in ("GET", "HEAD"):
            return await self._verdict(_query(scope), gate=None)
        if route in ("/gate", "/gate/rollback") and method == "POST":
            try:
                query = _gate_query(await _read_body(scope, receive, self.body_read_s))
            except BadInput as exc:
                # The API answers what it cannot read (400, 408, 413) and closes.
                status = exc.status if isinstance(exc, _BodyRefused) else 400
                status, headers, body = _json(status, {"error": str(exc)})
                return status, [*headers, _CLOSE], body
            return await self._verdict(query, gate="pass" if route == "/gate" else "fail")
        if route == "/inventory" and method in ("GET", "HEAD"):
            if self.inventory is None:
                return _json(404, {"error": "this probe keeps no inventory"})
            try:
                return _json(200, await self.inventory())
            except SkewprobeError as exc:
                return _json(503, {"error": str(exc)})
        if route == "/openapi.json" and method in ("GET", "HEAD"):
            return 200, [(b"content-type", b"application/json")], _openapi_bytes()
        if route in ROUTES:
            status, headers, body = _json(405, {"error": f"{method} not allowed on {route}"})
            return status, [*headers, (b"allow", ", ".join(ROUTES[route]).encode())], body
        return _json(404, {"error": f"no route {route}"})

    def _authorised(self, scope: ASGIScope) -> bool:
        assert self.token is not None
        expected = self.token.encode()
        for k, v in scope["headers"]:
            scheme, _, credentials = bytes(v).strip().partition(b" ")
            # The scheme is case-insensitive (RFC 7235); constant-time on the token: how
            # long a wrong one takes must not say how much of it was right.
            if (k == b"authorization" and scheme.lower() == b"bearer"
                    and hmac.compare_digest(credentials.strip(), expected)):
                return True
        return False

    async def _verdict(
        self, query: VerdictQuery | BadInput, *, gate: str | None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The verdict JSON; for a gate, 200 only when the verdict is `gate` (else 409)."""
        if isinstance(query, BadInput):
            return _json(409 if gate else 400, {"verdict": "inconclusive", "error": str(query)})
        try:
            result = await self._unless_stopping(self.verdict(query))
        except BadInput as exc:
            # A bad query is an error for the caller: never a pass, never a rollback.
            return _json(409 if gate else 400, {"verdict": "inconclusive", "error": str(exc)})
        except SkewprobeError as exc:
            return _json(503, {"error": str(exc)})
        if gate:
            return _json(200 if result.get("verdict") == gate else 409, result)
        return _json(200, result)


class _Stopping(Exception):
    """The API is stopping: the request is answered 503 at once."""


class _Pacer:
    """Spaces the answers `1 / per_s` apart: a request beyond the rate waits its turn, so
    a flood of them slows its own answers, not the probe's sends."""

    def __init__(self, per_s: float) -> None:
        self.interval = 1.0 / per_s
        self._next = 0.0

    async def wait(self) -> None:
        now = asyncio.get_running_loop().time()
        turn = max(now, self._next)
        self._next = turn + self.interval
        if turn > now:
            await asyncio.sleep(turn - now)


def _json(status: int, payload: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return status, [(b"content-type", b"application/json")], json.dumps(payload).encode()


def _query(scope: ASGIScope) -> VerdictQuery | BadInput:
    try:
        raw = parse_qs(scope.get("query_string", b"").decode("utf-8"), strict_parsing=False)
    except UnicodeDecodeError:
        return BadInput("query string is not UTF-8")
    unknown = set(raw) - {"path", "baseline", "canary", "since", "at"}
    if unknown:
        return BadInput(f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    if any(len(v) > 1 for v in raw.values()):
        return BadInput("each query parameter may be given once")
    return VerdictQuery(**{k: v[0] for k, v in raw.items()})


def _gate_query(body: bytes) -> VerdictQuery:
    """Flagger's webhook payload: name, namespace, phase, checksum, metadata{...}."""
    if not body:
        return VerdictQuery()
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"gate body is not JSON: {exc}") from exc
    except RecursionError:
        raise BadInput("gate body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise BadInput("gate body must be a JSON object")
    metadata = payload.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadInput("gate metadata must map strings to strings")
    # A misspelt key would otherwise be dropped and every path judged.
    if unknown := sorted(set(metadata) - set(_GATE_KEYS)):
        raise BadInput(f"unknown gate metadata key(s): {', '.join(unknown)} "
                       f"(valid: {', '.join(_GATE_KEYS)})")
    return VerdictQuery(
        path=metadata.get("path"),
        baseline=metadata.get("baseline"),
        canary=metadata.get("canary"),
        since=metadata.get("since"),
    )


class _BodyRefused(BadInput):
    """A body the API stops reading: answered with `status`, and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _header(scope: ASGIScope, name: bytes) -> bytes | None:
    return next((bytes(v) for k, v in scope["headers"] if k == name), None)


def _has_body(scope: ASGIScope) -> bool:
    length = _header(scope, b"content-length")
    return _header(scope, b"transfer-encoding") is not None or (
        length is not None and length.strip() not in (b"", b"0"))


async def _read_body(scope: ASGIScope, receive: Receive, within_s: float) -> bytes:
    """The request's body: 413 past `_MAX_BODY` (said by its length, or as it arrives),
    408 when it is not all in within `within_s`."""
    length = _header(scope, b"content-length")
    too_large = _BodyRefused(413, "gate body larger than 64 KiB")
    if length is not None and length.strip().isdigit() and int(length) > _MAX_BODY:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(within_s):
            while True:
                message = await receive()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > _MAX_BODY:
                    raise too_large
                chunks.append(chunk)
                if not message.get("more_body"):
                    return b"".join(chunks)
    except TimeoutError:
        raise _BodyRefused(408, f"gate body not received within {within_s:g} s") from None


@functools.cache
def openapi_spec() -> dict[str, Any]:
    """The API's OpenAPI 3.1 description (`probes/openapi.yaml`), with this package's
    version. Cached: callers must not change it (`openapi_json()` for a copy)."""
    text = importlib.resources.files("probes").joinpath("openapi.yaml").read_text("utf-8")
    spec: dict[str, Any] = yaml.safe_load(text)
    # Run from a source tree without installing: keep the file's version.
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        spec["info"]["version"] = importlib.metadata.version("skewprobe")
    return spec


def openapi_json(indent: int | None = None) -> str:
    """The OpenAPI description as JSON, what `GET /openapi.json` serves."""
    return json.dumps(openapi_spec(), indent=indent)


@functools.cache
def _openapi_bytes() -> bytes:
    return openapi_json().encode()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
