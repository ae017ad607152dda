"""mTLS towards targets: the client certificate and key come from files (`tls: {ca, cert,
key}`), over HTTP/1.1, HTTP/2 and gRPC, against targets that require a certificate their CA
signed.

The targets sit behind `TlsFront` (tests/servers/tls.py), which terminates TLS as a mesh
sidecar does and, like nginx, Envoy or HAProxy, sends the TLS alert when it refuses a
handshake; that alert is what lets the probe say `tls_error` rather than `reset`. grpc.aio's
own TLS with `require_client_auth` is tested too: it closes without an alert.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from probes.spec import GrpcSpec, HttpSpec, PathSpec, TlsSpec
from probes.types import CallOutcome, Endpoint, Outcome
from tests.reference import GRPCIO, HTTPCORE, OWN
from tests.servers.engine import engine_call
from tests.servers.grpc_health import grpc_health_server
from tests.servers.h2drain import H2DrainServer
from tests.servers.hostile import HostileServer
from tests.servers.tls import SERVER_NAME, Pki, TlsFront

# HTTP/2 and gRPC on the probe's own client and on the library reference ("-httpcore",
# "-grpcio").
KINDS = {"1.1": OWN, "2": OWN, "2-httpcore": HTTPCORE, "grpc": OWN, "grpc-grpcio": GRPCIO}


def client_tls(pki: Pki, client: Pki | None) -> TlsSpec:
    """Trust the target's CA; present `client`'s certificate (None: no certificate)."""
    if client is None:
        return TlsSpec(ca=str(pki.ca), server_name=SERVER_NAME)
    return TlsSpec(ca=str(pki.ca), cert=str(client.client.cert), key=str(client.client.key),
                   server_name=SERVER_NAME)


@contextlib.asynccontextmanager
async def mtls_target(kind: str, pki: Pki) -> AsyncIterator[TlsFront]:
    """A plaintext server of `kind` behind TLS that requires client certificates."""
    alpn = ["h2"] if kind != "1.1" else []
    if kind.startswith("grpc"):
        async with grpc_health_server() as port, TlsFront(pki.server_context(alpn=alpn),
                                                          port) as front:
            yield front
        return
    backend = HostileServer() if kind == "1.1" else H2DrainServer()
    async with backend, TlsFront(pki.server_context(alpn=alpn), backend.port) as front:
        yield front


def path_for(kind: str, tls: TlsSpec) -> PathSpec:
    if kind.startswith("grpc"):
        return PathSpec("p", 1.0, 2.0, grpc=GrpcSpec(health_service="", tls=tls))
    return PathSpec("p", 1.0, 2.0,
                    http=HttpSpec(path="/status/200", version=kind[0] if kind != "1.1" else kind,
                                  scheme="https", tls=tls))


async def call(kind: str, tls: TlsSpec, port: int) -> CallOutcome:
    path = path_for(kind, tls)
    prober = KINDS[kind].build(path)
    try:
        outcome, _ = await engine_call(prober, Endpoint("pod-0", "127.0.0.1", port, {}), 3.0)
    finally:
        await prober.aclose()
    return outcome


@pytest.mark.parametrize("kind", KINDS)
async def test_client_certificate_from_files_is_accepted(pki: Pki, kind: str) -> None:
    async with mtls_target(kind, pki) as front:
        outcome = await call(kind, client_tls(pki, pki), front.port)
    assert outcome.outcome == Outcome.OK, outcome.detail
    assert front.handshake_errors == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("client", "refusal"),
    [("none", "PEER_DID_NOT_RETURN_A_CERTIFICATE"), ("stranger", "CERTIFICATE_VERIFY_FAILED")],
)
async def test_missing_or_untrusted_client_certificate_is_a_tls_error(
    pki: Pki, stranger: Pki, kind: str, client: str, refusal: str
) -> None:
    async with mtls_target(kind, pki) as front:
        outcome = await call(kind, client_tls(pki, stranger if client == "stranger" else None),
                             front.port)
    assert outcome.outcome == Outcome.TLS_ERROR, outcome.detail
    # The target refused the handshake for that reason (the probe did not just give up).
    assert front.handshake_errors and set(front.handshake_errors) == {refusal}


async def test_grpc_own_tls_with_require_client_auth(pki: Pki) -> None:
    credentials = grpc.ssl_server_credentials(
        [(pki.server.key.read_bytes(), pki.server.cert.read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    async with grpc_health_server(credentials) as port:
        assert (await call("grpc", client_tls(pki, pki), port)).outcome == Outcome.OK
        # grpc core's server hangs up without a TLS alert under TLS 1.3, so the client sees a
        # closed socket: never ok, and a TLS error only when the wire says so.
        refused = await call("grpc", client_tls(pki, None), port)
        assert refused.outcome in (Outcome.TLS_ERROR, Outcome.grpc("UNAVAILABLE"))

