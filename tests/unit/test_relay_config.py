"""The relay's allowlist: what parses, and one clear error per mistake."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from probes.errors import ConfigError
from targets.relay_config import DEFAULT_MAX_BODY, DEFAULT_TIMEOUT_S, load_relay, parse_relay

EXAMPLES = Path(__file__).resolve().parents[2] / "targets" / "examples"


def test_http_and_grpc_destinations_with_defaults() -> None:
    request = base64.b64encode(b"\x08\x01").decode()
    config = parse_relay(f"""
relay:
  destinations:
    cat: {{http: {{url: "http://catalog.shop:8080/api/items?x=1", method: post,
                   headers: {{X-Tenant: probe}}}}, service: catalog}}
    echo: {{grpc: {{target: "catalog.shop:9090", method: /p.S/M, request: "{request}"}}}}
""")
    assert (config.timeout_s, config.max_body) == (DEFAULT_TIMEOUT_S, DEFAULT_MAX_BODY)
    cat, echo = config.destinations["cat"], config.destinations["echo"]
    assert (cat.kind, cat.method, cat.address) == ("http", "POST", "catalog.shop:8080")
    assert cat.headers == (("x-tenant", "probe"),) and cat.service == "catalog"
    assert echo.service == ""
    assert (echo.kind, echo.method, echo.address, echo.request) == (
        "grpc", "/p.S/M", "catalog.shop:9090", b"\x08\x01")


def test_the_shipped_example_loads() -> None:
    config = load_relay(EXAMPLES / "relay-allowlist.yaml")
    assert config.destinations and config.timeout_s > 0


_DEST = "relay:\n  destinations:\n    d: "


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        ("relay: {}\n", 1, "relay.destinations", "non-empty mapping"),
        ("other: {}\n", 1, "(top level).other", "unknown key"),
        ("relay:\n  timeout: 0s\n  destinations: {d: {}}\n", 2, "relay.timeout", "> 0"),
        ("relay:\n  max_body: 0\n  destinations: {d: {}}\n", 2, "relay.max_body", "bytes"),
        ("relay:\n  destinations:\n    Bad Name: {}\n", 3, "relay.destinations.Bad Name",
         "lower-case"),
        (_DEST + "{}\n", 3, "relay.destinations.d", "exactly one"),
        (_DEST + "{http: {url: 'https://x:1/'}}\n", 3, "relay.destinations.d.http.url",
         "http://"),
        (_DEST + "{http: {url: 'http:///nohost'}}\n", 3, "relay.destinations.d.http.url",
         "http://"),
        (_DEST + "{http: {url: 'http://x/', method: BREW}}\n", 3,
         "relay.destinations.d.http.method", "one of"),
        (_DEST + "{grpc: {target: x, method: /a.B/C}}\n", 3,
         "relay.destinations.d.grpc.target", "host:port"),
        (_DEST + "{grpc: {target: 'x:1', method: Echo}}\n", 3,
         "relay.destinations.d.grpc.method", "full method name"),
        (_DEST + "{grpc: {target: 'x:1', method: /a.B/C, request: '!!'}}\n", 3,
         "relay.destinations.d.grpc.request", "base64"),
        (_DEST + "{http: {url: 'http://x/', headers: {'bad header': v}}}\n", 3,
         "relay.destinations.d.http.headers.bad header", "not a valid header name"),
        ("relay:\n  destinations:\n    d: {}\n    d: {}\n", 4, "d", "duplicate"),
        (_DEST + "{http: {url: 'http://x/'}, service: 'Not One'}\n", 3,
         "relay.destinations.d.service", "service name"),
    ],
)
def test_errors_name_file_line_and_key(text: str, line: int, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_relay(text, source="relay.yaml")
    assert (err.value.file, err.value.line, err.value.key) == ("relay.yaml", line, key)
    assert words in str(err.value)
