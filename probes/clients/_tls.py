"""TLS material from a TlsSpec: an `ssl.SSLContext` for HTTP, channel credentials for gRPC.

Built once per prober (loading a CA bundle costs milliseconds; doing it per endpoint or per
call would show in the probe's CPU). Unreadable files are bad input, reported when the
prober is built, not on the first call.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi
import grpc

from probes.errors import BadInput
from probes.spec import TlsSpec


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
