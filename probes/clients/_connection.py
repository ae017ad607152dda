"""What the probe's connections are opened with: TLS material from a TlsSpec (an
`ssl.SSLContext` for HTTP, channel credentials for gRPC), and a held stream's grpc.aio
channel options.

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

import ssl
from pathlib import Path

import certifi
import grpc

from probes.clients._base import USER_AGENT
from probes.errors import BadInput
from probes.spec import GrpcSpec, TlsSpec


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
