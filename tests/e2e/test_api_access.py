"""Who may read the probe's API: TLS, mTLS and the bearer token, on a real running probe.

A ProbeRunner (or `skewprobe run`, a real process) probes a loopback target and serves its
API; the tests call it with httpx over TLS with and without the CA, a client certificate and
the token. The last test runs the probe at debug level with every kind of secret configured
and looks for them in everything it printed and served.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from probes.cli import main as skewprobe_main
from probes.config import parse_config
from probes.errors import BadInput, ConfigError
from probes.run import TOKEN_ENV, resolve_access
from probes.run.runner import ProbeRunner, RunOptions
from probes.spec import ApiSpec, ApiTlsSpec
from tests.servers.grpc_health import grpc_health_server
from tests.servers.h2drain import H2DrainServer
from tests.servers.hostile import HostileServer
from tests.servers.ports import free_port
from tests.servers.tls import SERVER_NAME, Pki, TlsFront

CONFIG = """\
targets:
  static:
    - address: 127.0.0.1:{port}
      labels: {{pod: checkout-0, proxy_version: "1.20.3"}}
window: 1s
paths:
  - name: checkout
    http: {{path: /status/200}}
    rate: 5/s
    timeout: 1s
"""


def client_context(pki: Pki, client: Pki | None = None) -> ssl.SSLContext:
    """Trust the probe's CA; present `client`'s client certificate when given."""
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if client is not None:
        ctx.load_cert_chain(client.client.cert, client.client.key)
    return ctx


async def _listening(port: int, run: asyncio.Task[None]) -> None:
    """Until the API accepts connections (bounded); a runner that died says why."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if run.done():
            run.result()
            raise AssertionError("the probe stopped before its API came up")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the probe's API never came up")


@contextlib.asynccontextmanager
async def running_probe(tmp_path: Path, **options: Any) -> AsyncIterator[str]:
    """A ProbeRunner probing a loopback target; yields the API's host:port."""
    async with HostileServer() as target:
        port = free_port()
        runner = ProbeRunner(
            parse_config(CONFIG.format(port=target.port)),
            RunOptions(store_path=str(tmp_path / "probe.db"), listen=f"127.0.0.1:{port}",
                       **options),
        )
        run = asyncio.create_task(runner.run())
        try:
            await _listening(port, run)
            yield f"127.0.0.1:{port}"
        finally:
            runner.stopping.set()
            await asyncio.wait_for(run, 10)


# --- TLS and mTLS ----------------------------------------------------------------------------


async def test_api_over_tls(pki: Pki, tmp_path: Path) -> None:
    tls = ApiTlsSpec(cert=str(pki.server.cert), key=str(pki.server.key))
    async with running_probe(tmp_path, api_tls=tls) as address:
        async with httpx.AsyncClient(verify=client_context(pki)) as client:
            verdict = await client.get(f"https://{address}/verdict")
            assert verdict.status_code == 200
            assert verdict.json()["verdict"] in ("pass", "fail", "inconclusive")
            assert (await client.get(f"https://{address}/healthz")).status_code == 200
        # Plain HTTP to the TLS port gets no answer at all.
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://{address}/verdict")
        # A client that does not trust the probe's CA refuses the handshake itself.
        async with httpx.AsyncClient(verify=ssl.create_default_context()) as untrusting:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.get(f"https://{address}/verdict")


async def test_api_over_mtls_needs_a_client_certificate_the_ca_signed(
    pki: Pki, stranger: Pki, tmp_path: Path
) -> None:
    tls = ApiTlsSpec(cert=str(pki.server.cert), key=str(pki.server.key), client_ca=str(pki.ca))
    async with running_probe(tmp_path, api_tls=tls) as address:
        for refused in (client_context(pki), client_context(pki, stranger)):
            async with httpx.AsyncClient(verify=refused) as client:
                with pytest.raises(httpx.TransportError):
                    await client.get(f"https://{address}/verdict")
        async with httpx.AsyncClient(verify=client_context(pki, pki)) as client:
            verdict = await client.get(f"https://{address}/verdict")
            assert verdict.status_code == 200 and "verdict" in verdict.json()
            metrics = await client.get(f"https://{address}/metrics")
            assert metrics.status_code == 200 and "skewprobe_requests_total" in metrics.text


async def test_tls_and_token_together(pki: Pki, tmp_path: Path) -> None:
    tls = ApiTlsSpec(cert=str(pki.server.cert), key=str(pki.server.key))
    async with (running_probe(tmp_path, api_tls=tls, token="t0ken-over-tls") as address,
                httpx.AsyncClient(verify=client_context(pki)) as client):
        assert (await client.get(f"https://{address}/verdict")).status_code == 401
        ok = await client.get(f"https://{address}/verdict",
                              headers={"authorization": "Bearer t0ken-over-tls"})
        assert ok.status_code == 200


# --- the token, from a file, in a real `skewprobe run` ------------------------------------------


async def _start(tmp_path: Path, config: str, *args: str) -> tuple[
        asyncio.subprocess.Process, str]:
    path = tmp_path / "probe.yaml"
    path.write_text(config)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "probes.cli", *args, "run", "--config", str(path),
        "--store", str(tmp_path / "probe.db"), "--listen", f"127.0.0.1:{port}",
        "--duration", "30s", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    return process, f"127.0.0.1:{port}"


async def _up(client: httpx.AsyncClient, url: str, process: asyncio.subprocess.Process) -> None:
    """Until `url` (/healthz) answers 200; a bounded poll, as for any external process (the
    bound only catches a hang: a loaded machine starts the probe more slowly, not wrongly)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if process.returncode is not None:
            _, err = await process.communicate()
            raise AssertionError(f"the probe exited: {err.decode()}")
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(url)).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered 200")


async def _stop(process: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    out, err = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 0, err.decode()
    return out, err


@pytest.mark.slow
async def test_token_file_in_the_config_protects_a_running_probe(tmp_path: Path) -> None:
    token = "file-t0ken-5e1f"
    (tmp_path / "token").write_text(f"{token}\n")  # the newline is stripped
    async with HostileServer() as target:
        config = CONFIG.format(port=target.port) + f"api: {{token_file: {tmp_path / 'token'}}}\n"
        process, address = await _start(tmp_path, config)
        try:
            async with httpx.AsyncClient(base_url=f"http://{address}") as client:
                await _up(client, "/healthz", process)  # /healthz stays open for probes
                for route in ("/verdict", "/metrics", "/inventory"):
                    denied = await client.get(route)
                    assert denied.status_code == 401, route
                    assert denied.headers["www-authenticate"].startswith("Bearer")
                wrong = await client.get("/verdict", headers={"authorization": "Bearer nope"})
                assert wrong.status_code == 401
                assert (await client.post("/gate", json={})).status_code == 401
                auth = {"authorization": f"Bearer {token}"}
                assert (await client.get("/verdict", headers=auth)).status_code == 200
                assert (await client.get("/metrics", headers=auth)).status_code == 200
        finally:
            await _stop(process)


def test_the_api_block_parses_and_its_mistakes_name_the_line() -> None:
    base = CONFIG.format(port=1)
    api = parse_config(base + "api:\n  token_file: /run/t\n  tls: {cert: c, key: k}\n").api
    assert api == ApiSpec(token_file="/run/t", tls=ApiTlsSpec(cert="c", key="k"))
    assert parse_config(base).api == ApiSpec()
    with pytest.raises(ConfigError, match=r":12: api\.tls: key is a required") as caught:
        parse_config(base + "api:\n  tls:\n    cert: c\n")
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"api\.token.*unknown key"):
        parse_config(base + "api: {token: s3cret}\n")  # the token itself never goes here


def test_token_precedence_flag_then_env_then_config(tmp_path: Path) -> None:
    for name in ("flag", "config"):
        (tmp_path / name).write_text(f"{name}-token\n")
    api = ApiSpec(token_file=str(tmp_path / "config"))
    env = {TOKEN_ENV: " env-token "}
    assert resolve_access(api, environ={}).token == "config-token"
    assert resolve_access(api, environ=env).token == "env-token"
    assert resolve_access(api, token_file=str(tmp_path / "flag"), environ=env).token == (
        "flag-token")
    assert resolve_access(ApiSpec(), environ={}).token is None
    # The token stays out of reprs (and so out of any log line that prints the options).
    assert "flag-token" not in repr(resolve_access(api, token_file=str(tmp_path / "flag")))
    assert "env-token" not in repr(RunOptions(store_path="x", token="env-token"))


def test_tls_flags_override_the_config_file_by_file(pki: Pki) -> None:
    api = ApiSpec(tls=ApiTlsSpec(cert=str(pki.server.cert), key=str(pki.server.key)))
    access = resolve_access(api, client_ca=str(pki.ca), environ={})
    assert access.tls == ApiTlsSpec(str(pki.server.cert), str(pki.server.key), str(pki.ca))
    assert resolve_access(ApiSpec(), environ={}).tls is None


@pytest.mark.parametrize(
    ("make", "kwargs", "message"),
    [
        (None, {"token_file": "missing"}, "--token-file: cannot read .*missing: No such file"),
        ("\n  \n", {"token_file": "f"}, "--token-file: .*f is empty"),
        ("two words", {"token_file": "f"}, "not a bearer token"),
        ("x", {"cert": "f"}, "both a certificate and a key"),
        ("x", {"client_ca": "f"}, "both a certificate and a key"),
        ("not a pem", {"cert": "f", "key": "f"}, "API TLS: cannot load"),
        (None, {"cert": "missing", "key": "missing"}, "certificate: cannot read .*missing"),
    ],
)
def test_bad_access_settings_are_one_line_bad_input(
    tmp_path: Path, make: str | None, kwargs: dict[str, str], message: str
) -> None:
    if make is not None:
        (tmp_path / "f").write_text(make)
    paths = {k: str(tmp_path / v) for k, v in kwargs.items()}
    with pytest.raises(BadInput, match=message) as caught:
        resolve_access(ApiSpec(), environ={}, **paths)
    assert "\n" not in str(caught.value)
    assert "two words" not in str(caught.value)  # never the file's content


def test_empty_env_token_is_bad_input() -> None:
    with pytest.raises(BadInput, match=f"{TOKEN_ENV} is empty"):
        resolve_access(ApiSpec(), environ={TOKEN_ENV: ""})


def test_cli_unreadable_token_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "probe.yaml"
    config.write_text(CONFIG.format(port=9) + f"api: {{token_file: {tmp_path / 'gone'}}}\n")
    assert skewprobe_main(["run", "--config", str(config), "--store",
                           str(tmp_path / "p.db"), "--duration", "1s"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "api.token_file: cannot read" in err
    (tmp_path / "token").write_text("fine")
    assert skewprobe_main(["run", "--config", str(config), "--store", str(tmp_path / "p.db"),
                           "--token-file", str(tmp_path / "token"), "--api-key", str(config)]) == 2
    assert "both a certificate and a key" in capsys.readouterr().err


# --- no secret in logs, /metrics or any other answer --------------------------------------------

LEAK_CONFIG = """\
targets:
  static:
    - address: 127.0.0.1:{plain}
      labels: {{pod: checkout-0, proxy_version: "1.20.3"}}
      ports: {{h2: {h2}, grpc: {grpc}}}
window: 1s
paths:
  - name: plain
    http:
      path: /status/200
      headers: {{authorization: "Bearer {secret}", x-api-key: "{secret}"}}
    rate: 10/s
  - name: broken
    http: {{path: /reset, headers: {{authorization: "Bearer {secret}"}}}}
    rate: 5/s
  - name: h2-mtls
    http: {{path: /status/503, version: "2", scheme: https,
           headers: {{authorization: "Bearer {secret}", x-api-key: "{secret}"}}, tls: {tls}}}
    port: h2
    rate: 10/s
    expect: {{status: [200]}}
  - name: grpc-mtls
    grpc: {{health: "", metadata: {{authorization: "Bearer {secret}"}}, tls: {tls}}}
    port: grpc
    rate: 10/s
api:
  token_file: {token_file}
  tls: {{cert: {api_cert}, key: {api_key}, client_ca: {ca}}}
"""


def _pem_body(path: Path) -> list[str]:
    """The base64 lines of a PEM file: what would show if its content leaked."""
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("-----")]


@pytest.mark.slow
async def test_no_secret_in_logs_metrics_or_answers(pki: Pki, tmp_path: Path) -> None:
    token, secret, wrong = "api-t0ken-9b3c1d", "s3cr3t-h34der-77aa", "wr0ng-t0ken-4f4f"
    (tmp_path / "token").write_text(token)
    tls = (f"{{ca: {pki.ca}, cert: {pki.client.cert}, key: {pki.client.key},"
           f" server_name: {SERVER_NAME}}}")
    async with contextlib.AsyncExitStack() as stack:
        plain = await stack.enter_async_context(HostileServer())
        h2 = await stack.enter_async_context(H2DrainServer())
        grpc_port = await stack.enter_async_context(grpc_health_server())
        context = pki.server_context(alpn=["h2"])
        h2_front = await stack.enter_async_context(TlsFront(context, h2.port))
        grpc_front = await stack.enter_async_context(TlsFront(context, grpc_port))
        config = LEAK_CONFIG.format(
            plain=plain.port, h2=h2_front.port, grpc=grpc_front.port, secret=secret, tls=tls,
            token_file=tmp_path / "token", api_cert=pki.server.cert, api_key=pki.server.key,
            ca=pki.ca,
        )
        process, address = await _start(tmp_path, config, "-v")  # debug logging
        served: list[str] = []
        try:
            auth = {"authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=f"https://{address}",
                                         verify=client_context(pki, pki)) as client:
                await _up(client, "/healthz", process)
                # Two windows of every path: their outcomes (and error details) are logged
                # and exported before the scrape.
                await asyncio.sleep(2.5)
                for route in ("/metrics", "/verdict", "/inventory", "/healthz"):
                    served.append((await client.get(route, headers=auth)).text)
                denied = await client.get("/verdict", headers={"authorization": f"Bearer {wrong}"})
                assert denied.status_code == 401
                served.append(denied.text)
        finally:
            out, err = await _stop(process)
    assert h2_front.handshake_errors == [] and grpc_front.handshake_errors == []
    metrics = served[0]
    for path, outcome in (("plain", "ok"), ("broken", "reset"), ("h2-mtls", "http_5xx"),
                          ("grpc-mtls", "ok")):
        # Every path really ran, with its headers and client certificate.
        assert f'outcome="{outcome}",path="{path}"' in metrics, path
    logs = out.decode() + err.decode()
    assert "DEBUG" in logs  # debug logging was on and wrote something
    # No wire-level header logging at all: an HPACK block would hold the headers encoded.
    assert "hpack" not in logs
    store = (tmp_path / "probe.db").read_bytes()
    secrets = [token, secret, wrong,
               *_pem_body(pki.client.key), *_pem_body(pki.server.key)]
    for text, where in ((logs, "logs"), ("\n".join(served), "answers")):
        leaked = [s for s in secrets if s in text]
        assert not leaked, f"{where} show {leaked}"
    assert not [s for s in secrets if s.encode() in store], "the store holds a secret"
