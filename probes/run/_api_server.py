"""Serving the probe's API (`probes.api.ApiApp`) from `skewprobe run`.

The listening socket is bound before anything else starts, so a port another process holds
is bad input (exit 2) before the store is created; hypercorn then takes it over by its
descriptor and shuts down gracefully when the run stops: the requests still waiting are
answered 503 at once.

Who may read the probe's API: the bearer token and TLS (or mTLS) it is served with.

Three places can say it, and the nearer wins: a `skewprobe run` flag (`--token-file`,
`--api-cert`, `--api-key`, `--api-client-ca`), then `SKEWPROBE_API_TOKEN` (the token only),
then the config's `api:` block. Every file is read or loaded here, before the probe starts,
so an unreadable token, certificate or key is one line and exit 2, not a traceback from
inside the server once probing has begun.

The token is a secret: it is never put in an error message, a log line or a repr, and the
config names only the file that holds it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

import h11
import hypercorn.protocol
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.typing import H11SendableEvent

from probes.api import ApiApp
from probes.errors import BadInput
from probes.spec import ApiSpec, ApiTlsSpec

__all__ = ["TOKEN_ENV", "ApiAccess", "apply_tls", "bind_api", "parse_listen", "read_token",
           "resolve_access", "serve_api"]

TOKEN_ENV = "SKEWPROBE_API_TOKEN"


@dataclass(frozen=True, slots=True)
class ApiAccess:
    """The token (None: the API is open) and the TLS files (None: plain HTTP)."""

    token: str | None = field(default=None, repr=False)
    tls: ApiTlsSpec | None = None


def read_token(path: str, *, what: str) -> str:
    """The bearer token in `path`, surrounding whitespace (the file's newline) stripped.

    `what` names where the path came from (`--token-file`, `api.token_file`) for the error.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise BadInput(f"{what}: cannot read {path}: {reason}") from None
    return _checked(text.strip(), f"{what}: {path}")


def _checked(token: str, where: str) -> str:
    if not token:
        raise BadInput(f"{where} is empty: an empty token would protect nothing")
    # RFC 6750's b64token: printable ASCII, no spaces. Anything else could never match the
    # Authorization header a client sends. The message says what is wrong, never the token.
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise BadInput(f"{where} holds more than one printable ASCII word: not a bearer token")
    return token


def resolve_access(
    api: ApiSpec,
    *,
    token_file: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    client_ca: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> ApiAccess:
    """The API's token and TLS from the flags, the environment and the config, in that
    order; every file read or loaded once, so a bad one is a BadInput now."""
    if token_file is not None:
        token: str | None = read_token(token_file, what="--token-file")
    elif TOKEN_ENV in environ:
        token = _checked(environ[TOKEN_ENV].strip(), TOKEN_ENV)
    elif api.token_file is not None:
        token = read_token(api.token_file, what="api.token_file")
    else:
        token = None
    base = api.tls
    cert = cert or (base.cert if base else None)
    key = key or (base.key if base else None)
    client_ca = client_ca or (base.client_ca if base else None)
    tls = None
    if cert or key or client_ca:
        if not (cert and key):
            raise BadInput("API TLS needs both a certificate and a key"
                           " (--api-cert and --api-key, or api.tls.cert and api.tls.key)")
        tls = ApiTlsSpec(cert=cert, key=key, client_ca=client_ca)
        apply_tls(HypercornConfig(), tls)  # loads every file: fail now, not when serving
    return ApiAccess(token=token, tls=tls)


def apply_tls(hconfig: HypercornConfig, tls: ApiTlsSpec | None) -> None:
    """Serve over TLS (and, with `client_ca`, require client certificates it signed).

    Loads the files the way hypercorn will (its own `create_ssl_context`), so what passes
    here is exactly what the server can use.
    """
    if tls is None:
        return
    hconfig.certfile = tls.cert
    hconfig.keyfile = tls.key
    if tls.client_ca is not None:
        hconfig.ca_certs = tls.client_ca
        hconfig.verify_mode = ssl.CERT_REQUIRED
    for what, path in (("certificate", tls.cert), ("key", tls.key), ("client CA", tls.client_ca)):
        if path is None:
            continue
        try:
            Path(path).open("rb").close()
        except OSError as exc:
            raise BadInput(f"API TLS {what}: cannot read {path}: {exc.strerror}") from None
    try:
        hconfig.create_ssl_context()
    except (OSError, ssl.SSLError) as exc:
        # ssl's messages name the failing step ("[SSL] PEM lib"), never key material.
        files = " / ".join(p for p in (tls.cert, tls.key, tls.client_ca) if p)
        raise BadInput(f"API TLS: cannot load {files}: {exc}") from None



def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise BadInput(f"--listen {listen!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def bind_api(listen: str) -> socket.socket:
    """The API's listening socket, with the options hypercorn sets on sockets it binds."""
    host, port = parse_listen(listen)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        problem = (exc.strerror or str(exc)).lower()
        raise BadInput(
            f"cannot listen on {listen}: {problem} (set another address with --listen or the"
            " config's listen:, or --listen none)"
        ) from None
    return sock


class _ReasonedH11(H11Protocol):
    """hypercorn's HTTP/1.1 with a reason phrase on the status line (`HTTP/1.1 200 OK`):
    hypercorn sends none, and some clients (h2load) count `HTTP/1.1 200 ` as a failure."""

    async def _send_h11_event(self, event: H11SendableEvent) -> None:
        if isinstance(event, h11.Response | h11.InformationalResponse) and not event.reason:
            try:
                reason = HTTPStatus(event.status_code).phrase.encode()
            except ValueError:
                reason = b""
            event = type(event)(status_code=event.status_code, headers=event.headers,
                                http_version=event.http_version, reason=reason)
        await super()._send_h11_event(event)


def _reason_phrases() -> None:
    # hypercorn picks its HTTP/1.1 protocol by this name at each connection; it offers no
    # other way to change the status line.
    hypercorn.protocol.H11Protocol = _ReasonedH11  # type: ignore[misc]


async def serve_api(sock: socket.socket, app: ApiApp, tls: ApiTlsSpec | None,
                    stopping: asyncio.Event) -> None:
    """Serve `app` on `sock` (hypercorn takes the socket over and closes it) until
    `stopping` is set."""
    hconfig = HypercornConfig()
    hconfig.bind = [f"fd://{sock.detach()}"]
    hconfig.accesslog = None
    hconfig.errorlog = None
    hconfig.graceful_timeout = 1.0
    apply_tls(hconfig, tls)
    _reason_phrases()

    async def shutdown() -> None:
        await stopping.wait()
        # Requests still in flight answer now: hypercorn cancels those that outlast its
        # grace, and on Python 3.11 each cancelled connection logs a CancelledError traceback.
        app.stop()

    await serve(app, hconfig, shutdown_trigger=shutdown)  # type: ignore[arg-type]
