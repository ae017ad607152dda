"""Throw-away certificates for TLS tests, made with the openssl CLI.

`cryptography` is not a dependency, so certificates come from `openssl req`; tests that
need them skip with a clear reason where openssl is absent.

`make_cert` is one self-signed certificate. `make_pki` is a small CA with a server
certificate and a client certificate signed by it: what mTLS tests need on both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.servers._loopback import LoopbackServer

SERVER_NAME = "target.skewprobe.test"

# Every key is P-256 and every certificate lives one day: enough for a test run.
_NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
_SERVER_SAN = f"subjectAltName=DNS:{SERVER_NAME},DNS:localhost,IP:127.0.0.1"



@dataclass(frozen=True)
class Cert:
    cert: Path
    key: Path

    def server_context(
        self, *, client_ca: Path | None = None, alpn: Sequence[str] = ()
    ) -> ssl.SSLContext:
        """A server context; with `client_ca`, clients must present a certificate it signed."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        if client_ca is not None:
            ctx.load_verify_locations(client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx


@dataclass(frozen=True)
class Pki:
    """A CA (`ca`, its key `ca_key`), a server certificate for SERVER_NAME, localhost and
    127.0.0.1, and a client certificate (CN `client`), both signed by the CA."""

    ca: Path
    ca_key: Path
    server: Cert
    client: Cert

    def server_context(
        self, *, mtls: bool = True, alpn: Sequence[str] = ()
    ) -> ssl.SSLContext:
        return self.server.server_context(client_ca=self.ca if mtls else None, alpn=alpn)


def _openssl() -> str:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl CLI not installed: cannot make a test certificate")
    return openssl


def _run(*args: str) -> None:
    subprocess.run([_openssl(), *args], check=True, capture_output=True, timeout=30)


def make_cert(directory: Path) -> Cert:
    """A self-signed certificate valid for SERVER_NAME and 127.0.0.1, valid for one day."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    _run("req", "-x509", *_NEW_KEY, "-subj", "/CN=skewprobe-test", "-addext", _SERVER_SAN,
         "-keyout", str(key), "-out", str(cert))  # fmt: skip
    return Cert(cert, key)


def make_pki(directory: Path, name: str = "ca") -> Pki:
    """A CA and a server and a client certificate signed by it, in `directory`; files are
    prefixed with `name`, so two calls in one folder make two unrelated CAs."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / f"{name}.pem", directory / f"{name}.key"
    _run("req", "-x509", *_NEW_KEY, "-subj", f"/CN=skewprobe-test-{name}",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip

    def leaf(role: str, *extensions: str) -> Cert:
        cert, key = directory / f"{name}-{role}.pem", directory / f"{name}-{role}.key"
        extra = [arg for ext in extensions for arg in ("-addext", ext)]
        # `req -x509 -CA` signs with the CA directly (OpenSSL 3.0+), copying -addext.
        _run("req", "-x509", *_NEW_KEY, "-subj", f"/CN={role}", "-CA", str(ca),
             "-CAkey", str(ca_key), "-addext", "basicConstraints=critical,CA:FALSE", *extra,
             "-keyout", str(key), "-out", str(cert))  # fmt: skip
        return Cert(cert, key)

    server = leaf("server", _SERVER_SAN, "extendedKeyUsage=serverAuth")
    client = leaf("client", "extendedKeyUsage=clientAuth")
    return Pki(ca=ca, ca_key=ca_key, server=server, client=client)


@dataclass
class TlsFront(LoopbackServer):
    """TLS (mTLS with a context that requires client certificates) terminated in front of a
    plaintext server on `backend_port`, as a mesh sidecar or an ingress terminates it.

    Why not asyncio's own TLS: when a server-side handshake fails, asyncio closes the socket
    without sending the TLS alert OpenSSL wrote, so under TLS 1.3 a client that offered no
    certificate sees only a closed connection. nginx, Envoy and HAProxy send the alert
    (certificate_required, unknown_ca), which is what lets a client tell a TLS refusal from a
    reset. This front drives the TLS object over memory buffers and sends every byte OpenSSL
    produces, alerts included. `handshake_errors` lists each refused handshake's reason.
    """

    context: ssl.SSLContext
    backend_port: int
    host: str = "127.0.0.1"
    handshake_errors: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._spawn(self._serve(reader, writer))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.context.wrap_bio(incoming, outgoing, server_side=True)
        upstream: asyncio.StreamWriter | None = None
        try:
            if not await self._handshake(tls, incoming, outgoing, reader, writer):
                return
            up_reader, upstream = await asyncio.open_connection(self.host, self.backend_port)
            pumps = {
                asyncio.create_task(_to_backend(tls, incoming, outgoing, reader, writer, upstream)),
                asyncio.create_task(_to_client(tls, outgoing, up_reader, writer)),
            }
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            for side in (upstream, writer):
                if side is not None:
                    side.close()
                    with contextlib.suppress(ConnectionError):
                        await side.wait_closed()

    async def _handshake(
        self,
        tls: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        while True:
            try:
                tls.do_handshake()
            except ssl.SSLWantReadError:
                writer.write(outgoing.read())
                await writer.drain()
                data = await reader.read(65536)
                if not data:
                    return False
                incoming.write(data)
                continue
            except ssl.SSLError as exc:
                self.handshake_errors.append(exc.reason or str(exc))
                writer.write(outgoing.read())  # the alert: what asyncio would drop
                await _lingering_close(reader, writer)
                return False
            writer.write(outgoing.read())
            await writer.drain()
            return True


async def _lingering_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then read what the client still sends until it hangs up (as nginx's
    lingering close does): closing with unread bytes would send RST, and a client's kernel
    drops received data on RST, the alert with it."""
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(2.0):
            while await reader.read(65536):
                pass


async def _to_backend(
    tls: ssl.SSLObject,
    incoming: ssl.MemoryBIO,
    outgoing: ssl.MemoryBIO,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream: asyncio.StreamWriter,
) -> None:
    # The first request may have come with the handshake's last flight: read what the TLS
    # object already holds before waiting on the socket.
    while True:
        while True:
            try:
                plain = tls.read(65536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the client's close_notify
                return
            if not plain:
                return
            upstream.write(plain)
        writer.write(outgoing.read())  # reading may owe the client bytes (key updates)
        await upstream.drain()
        data = await reader.read(65536)
        if not data:
            return
        incoming.write(data)


async def _to_client(
    tls: ssl.SSLObject,
    outgoing: ssl.MemoryBIO,
    up_reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    while data := await up_reader.read(65536):
        tls.write(data)
        writer.write(outgoing.read())
        await writer.drain()
