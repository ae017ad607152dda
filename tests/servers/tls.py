"""A throw-away self-signed certificate for TLS tests, made with the openssl CLI.

`cryptography` is not a dependency, so the certificate comes from `openssl req`; tests that
need it skip with a clear reason where openssl is absent.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_NAME = "target.skewprobe.test"


@dataclass(frozen=True)
class Cert:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def make_cert(directory: Path) -> Cert:
    """A P-256 certificate valid for SERVER_NAME and 127.0.0.1, valid for one day."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl CLI not installed: cannot make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", "/CN=skewprobe-test",
            "-addext", f"subjectAltName=DNS:{SERVER_NAME},IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return Cert(cert, key)
