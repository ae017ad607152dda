"""The relay's allowlist: the only destinations a reference-target pod will call for the probe.

The relay (`targets.relay`) calls a destination by *name*; the name is looked up here and
nothing else is ever called, so the relay is never an open proxy. The file is YAML:

    relay:
      timeout: 2s              # the relay's own limit on one destination call (default 2s)
      max_body: 65536          # bytes of the destination's answer read at most (default 64 KiB)
      destinations:
        catalog:               # the name the probe asks for
          http:
            url: http://catalog.shop.svc.cluster.local:8080/api/items
            method: GET        # GET HEAD POST PUT PATCH DELETE OPTIONS (default GET)
            headers: {x-tenant: probe}
        catalog-echo:
          grpc:
            target: catalog.shop.svc.cluster.local:9090
            method: /skewprobe.target.v1.Target/Echo
            request: ""        # base64 protobuf; empty = every field at its default

Errors are `ConfigError`s naming file, line and key, as for the fault profiles.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit

from targets._yaml import LineMap, LineParser, load_yaml, read_yaml_file

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_TIMEOUT_S",
    "RelayConfig",
    "RelayDestination",
    "load_relay",
    "parse_relay",
]

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_BODY = 64 << 10
MAX_MAX_BODY = 16 << 20
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_HEADER = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
_GRPC_METHOD = re.compile(r"^/[A-Za-z0-9_.]+/[A-Za-z0-9_]+$")


@dataclass(frozen=True, slots=True)
class RelayDestination:
    """One allowed destination: an HTTP URL, or a gRPC unary method on a host:port."""

    name: str
    kind: Literal["http", "grpc"]
    url: str = ""  # http: the full URL
    method: str = "GET"  # http: the HTTP method; grpc: the full method name
    target: str = ""  # grpc: host:port
    request: bytes = b""  # grpc: the serialized request
    headers: tuple[tuple[str, str], ...] = ()
    # Emulation only: the service whose pods an outbound endpoint view balances over (the
    # address in `url` / `target` is then replaced by the one the view picks).
    service: str = ""

    @property
    def address(self) -> str:
        """host:port the destination names (a service's name, before any proxy resolves it)."""
        if self.kind == "grpc":
            return self.target
        parts = urlsplit(self.url)
        return f"{parts.hostname}:{parts.port or 80}"


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """The allowlist and the relay's own limits."""

    destinations: Mapping[str, RelayDestination] = field(
        default_factory=lambda: MappingProxyType({}))
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_body: int = DEFAULT_MAX_BODY

    def __post_init__(self) -> None:
        object.__setattr__(self, "destinations", MappingProxyType(dict(self.destinations)))


def load_relay(path: str | Path) -> RelayConfig:
    """Read and validate a relay config file."""
    text, source = read_yaml_file(path, "relay config")
    return parse_relay(text, source=source)


def parse_relay(text: str, *, source: str = "<relay>") -> RelayConfig:
    """Validate YAML text into a RelayConfig; `source` names the file in errors."""
    return _Parser(source).config(load_yaml(text, source))


class _Parser(LineParser):
    def config(self, data: Any) -> RelayConfig:
        top = self.mapping(data, "(top level)", None, None, {"relay"})
        if "relay" not in top:
            raise self.fail("missing (timeout, max_body and destinations)", "relay", top)
        m = self.mapping(top["relay"], "relay", top, "relay",
                         {"timeout", "max_body", "destinations"})
        timeout = self.duration(m, "timeout", "relay", positive=True)
        max_body = m.get("max_body", DEFAULT_MAX_BODY)
        if not isinstance(max_body, int) or isinstance(max_body, bool) or not (
            0 < max_body <= MAX_MAX_BODY
        ):
            raise self.fail(f"must be a number of bytes, 1-{MAX_MAX_BODY}", "relay.max_body",
                            m, "max_body")
        raw = m.get("destinations")
        if not isinstance(raw, dict) or not raw:
            raise self.fail("must be a non-empty mapping of name to destination",
                            "relay.destinations", m, "destinations")
        out = {}
        for name, value in raw.items():
            key = f"relay.destinations.{name}"
            if not isinstance(name, str) or not _NAME.match(name):
                raise self.fail("a name is lower-case letters, digits, '.', '_' and '-'",
                                key, raw, name)
            out[name] = self.destination(name, value, key, raw)
        return RelayConfig(out, timeout_s=timeout or DEFAULT_TIMEOUT_S, max_body=max_body)

    def destination(self, name: str, value: Any, key: str, parent: Any) -> RelayDestination:
        m = self.mapping(value, key, parent, name, {"http", "grpc", "service"})
        service = m.get("service", "")
        if not isinstance(service, str) or (service and not _NAME.match(service)):
            raise self.fail("must be a service name", f"{key}.service", m, "service")
        if len(set(m) - {"service"}) != 1:
            raise self.fail("needs exactly one of http, grpc", key, parent, name)
        if "http" in m:
            dest = self.http(name, self.mapping(m["http"], f"{key}.http", m, "http",
                                                {"url", "method", "headers"}), f"{key}.http")
        else:
            dest = self.grpc(name, self.mapping(m["grpc"], f"{key}.grpc", m, "grpc",
                                                {"target", "method", "request", "headers"}),
                             f"{key}.grpc")
        return replace(dest, service=service)

    def http(self, name: str, m: LineMap, key: str) -> RelayDestination:
        url = m.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme != "http" or not parts.hostname:
            raise self.fail("must be an http:// URL with a host (the sidecar does TLS)",
                            f"{key}.url", m, "url")
        try:
            parts.port  # noqa: B018 (a bad port raises here)
        except ValueError:
            raise self.fail("has a bad port", f"{key}.url", m, "url") from None
        method = m.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
            raise self.fail(f"must be one of {', '.join(sorted(HTTP_METHODS))}",
                            f"{key}.method", m, "method")
        return RelayDestination(name, "http", url=str(url), method=method.upper(),
                                headers=self.headers(m, key))

    def grpc(self, name: str, m: LineMap, key: str) -> RelayDestination:
        target = m.get("target")
        host, sep, port = target.rpartition(":") if isinstance(target, str) else ("", "", "")
        if not sep or not host or not port.isdigit():
            raise self.fail("must be host:port", f"{key}.target", m, "target")
        method = m.get("method")
        if not isinstance(method, str) or not _GRPC_METHOD.match(method):
            raise self.fail("must be a full method name, /package.Service/Method",
                            f"{key}.method", m, "method")
        request = m.get("request", "")
        try:
            if not isinstance(request, str):
                raise ValueError
            body = base64.b64decode(request, validate=True)
        except (ValueError, binascii.Error):
            raise self.fail("must be base64 protobuf bytes", f"{key}.request", m,
                            "request") from None
        return RelayDestination(name, "grpc", method=method, target=str(target), request=body,
                                headers=self.headers(m, key))

    def headers(self, m: LineMap, key: str) -> tuple[tuple[str, str], ...]:
        raw = m.get("headers", {})
        if not isinstance(raw, dict):
            raise self.fail("must be a mapping of header name to value", f"{key}.headers", m,
                            "headers")
        out = []
        for h, v in raw.items():
            hk = f"{key}.headers.{h}"
            if not isinstance(h, str) or not _HEADER.match(h.lower()):
                raise self.fail(f"{h!r} is not a valid header name", hk, raw, h)
            if not isinstance(v, str) or not (v.isprintable() and v.isascii()):
                raise self.fail("must be a printable ASCII string", hk, raw, h)
            out.append((h.lower(), v))
        return tuple(out)
