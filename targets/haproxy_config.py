"""Emulated proxy versions as real HAProxy settings, and the HAProxy configuration of one pod.

In the fleet's HAProxy mode (`targets.haproxy`) every pod's sidecar is a real HAProxy process,
and what differs between "proxy versions" is its configuration. A versions file names the
settings of each version, and the app's own behaviour behind every sidecar (the same on every
version: an upgrade changes the proxy, not the app):

    app:                                   # faults of the app itself, identical on every pod
      routes:
        /api/checkout: {error_rate: 0.1}   # the app answers 503 to 10 % of request ids
    versions:
      "1.20.3": {retries: 0, hard_stop_after: 10s}
      "1.21.0":
        retries: 2
        retry_on: [all-retryable-errors]   # HAProxy's L7 retries: real retry amplification
        attempt_count_header: true         # x-envoy-attempt-count, as Envoy can send it
        timeouts: {server: 10s}            # gRPC streams idle longer than this are cut
        hard_stop_after: 1s                # the drain on a restart: streams still open are cut
        grpc: tcp                          # the gRPC port proxied as opaque TCP (tunnel timeout)

A key a version leaves out is not written, so HAProxy's own default applies (e.g. `retries 3`
with `retry-on conn-failure`). Errors are `ConfigError`s naming file, line and key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from probes.errors import ConfigError
from targets._yaml import LineMap, LineParser, load_yaml, read_yaml_file
from targets.profile import Faults, Latency, VersionProfile
from targets.sidecar import (
    ATTEMPT_COUNT_HEADER,
    NO_HEALTHY_UPSTREAM,
    RESPONSE_FLAGS_HEADER,
    UPSTREAM_CONNECT_FAILURE,
    UPSTREAM_HOST_HEADER,
)

# HAProxy 2.6's `retry-on` keywords (configuration.txt, "retry-on") and statuses.
RETRY_ON_KEYWORDS = frozenset({
    "none", "conn-failure", "empty-response", "junk-response", "response-timeout",
    "0rtt-rejected", "all-retryable-errors",
})
RETRY_ON_STATUSES = frozenset({401, 403, 404, 408, 425, 500, 501, 502, 503, 504})
# `timeouts` keys → HAProxy `timeout` names.
TIMEOUTS = MappingProxyType({
    "connect": "connect", "client": "client", "server": "server", "tunnel": "tunnel",
    "client_fin": "client-fin", "server_fin": "server-fin",
    "http_keep_alive": "http-keep-alive", "http_request": "http-request",
})
GRPC_MODES = ("http", "tcp")
# Safe inside HAProxy config words and header values without quoting rules.
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
_VERSION_KEYS = {
    "retries", "retry_on", "attempt_count_header", "timeouts", "hard_stop_after",
    "close_spread_time", "grpc",
}
_APP_FAULT_KEYS = {"error_rate", "error_status", "transient_error_rate", "latency"}


@dataclass(frozen=True, slots=True)
class HaproxyVersion:
    """The HAProxy settings of one emulated proxy version (None: HAProxy's default)."""

    version: str
    retries: int | None = None
    retry_on: tuple[str, ...] = ()
    attempt_count_header: bool = False
    timeouts: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    hard_stop_after_s: float | None = None
    close_spread_time_s: float | None = None
    grpc: str = "http"

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeouts", MappingProxyType(dict(self.timeouts)))


@dataclass(frozen=True, slots=True)
class HaproxyVersions:
    """Every version of one versions file, and the app behind them."""

    versions: Mapping[str, HaproxyVersion]
    app_defaults: Faults = Faults()
    app_routes: Mapping[str, Faults] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "versions", MappingProxyType(dict(self.versions)))
        object.__setattr__(self, "app_routes", MappingProxyType(dict(self.app_routes)))

    def version(self, name: str) -> HaproxyVersion:
        """The settings of `name`; ConfigError if the file does not define it."""
        try:
            return self.versions[name]
        except KeyError:
            known = ", ".join(sorted(self.versions)) or "none"
            raise ConfigError(f"version {name!r} is not defined (defined: {known})",
                              file=self.source, key=f"versions[{name!r}]") from None

    def app_profile(self, name: str) -> VersionProfile:
        """The app's profile on a pod of version `name`: the app's faults only (no emulated
        sidecar: no retries, header rules or attempt-count header), labelled with the version
        so the app's answers name it."""
        self.version(name)
        return VersionProfile(name, defaults=self.app_defaults, routes=self.app_routes)


@dataclass(frozen=True, slots=True)
class PodWiring:
    """Where one pod's HAProxy listens (inherited, already bound sockets) and proxies to."""

    pod: str
    http_fd: int
    grpc_fd: int | None
    app_host: str
    app_http_port: int
    app_grpc_port: int | None
    grace_s: float = 0.0
    default_hard_stop_after_s: float = 1.0
    maxconn: int = 4096
    # An outbound proxy (the relay's): the servers its HTTP backend balances over round robin
    # instead of the one app (`app_host`/`app_http_port` then unused), in `slots` server
    # slots (`up0`, `up1`, ...; at least one per upstream, the rest disabled until the
    # runtime API gives them an address), and the admin socket that runtime API listens on.
    upstreams: tuple[tuple[str, int], ...] = ()
    slots: int = 0
    admin_socket: str = ""

    @property
    def outbound(self) -> bool:
        return bool(self.upstreams) or self.slots > 0


def render_config(version: HaproxyVersion, wiring: PodWiring) -> str:
    """The HAProxy configuration of one pod running `version`.

    Listeners are `fd@N` sockets bound by the parent, so connections queue in the kernel
    while HAProxy starts (none is refused) and a restart can rebind the same address.
    `grace` keeps serving for the fleet's notice time after SIGUSR1, with `/healthz`
    answering 503 (HAProxy's `stopping`), then the soft-stop unbinds and drains until
    `hard-stop-after` cuts what is left.
    """
    hard_stop = version.hard_stop_after_s or wiring.default_hard_stop_after_s
    lines = [
        f"# skewprobe fleet pod {wiring.pod}: emulated proxy version {version.version}",
        "# generated by targets/haproxy_config.py",
        "global",
        "    nbthread 1",
        f"    maxconn {wiring.maxconn}",
        f"    hard-stop-after {_ms(hard_stop)}",
        "    log stdout format raw local0",
    ]
    if wiring.grace_s > 0:
        lines.append(f"    grace {_ms(wiring.grace_s)}")
    if wiring.admin_socket:
        # The runtime API (`set server ... addr`, `... state`): the outbound's endpoint list.
        lines.append(f"    stats socket {wiring.admin_socket} mode 600 level admin")
    if version.close_spread_time_s is not None:
        lines.append(f"    close-spread-time {_ms(version.close_spread_time_s)}")
    lines += ["", "defaults", "    mode http", "    log global", "    option httplog",
              "    option dontlognull"]
    for key, name in TIMEOUTS.items():
        value = version.timeouts.get(key, _DEFAULT_TIMEOUTS.get(key))
        if value is not None:
            lines.append(f"    timeout {name} {_ms(value)}")
    if version.retries is not None:
        lines.append(f"    retries {version.retries}")
    if version.retry_on:
        lines.append(f"    retry-on {' '.join(version.retry_on)}")
    marks = [f'    http-response set-header x-sidecar "haproxy/{version.version}"']
    if version.attempt_count_header:
        # %rc is the stream's retry count (connection and L7 retries alike).
        marks += ['    http-response set-var-fmt(txn.retries) "%rc"',
                  '    http-response set-header x-envoy-attempt-count '
                  '"%[var(txn.retries),add(1)]"']
    elif wiring.outbound:
        # The callee's inbound sidecar may count its own attempts: never pass that off as
        # this caller's.
        marks.append(f"    http-response del-header {ATTEMPT_COUNT_HEADER}")
    if wiring.outbound:
        marks += _OUTBOUND_MARKS
    lines += [
        "", "frontend http",
        f"    bind fd@{wiring.http_fd}",
        '    http-request return status 503 content-type text/plain string "draining" '
        "if { path /healthz } { stopping }",
        *marks,
        "    default_backend app_http",
        "", "backend app_http",
    ]
    if wiring.outbound:
        # No health checks: a caller's proxy routes by the list it was given, stale or not.
        lines.append("    balance roundrobin")
        lines += [f"    server up{i} {_addr(h, p)}" for i, (h, p) in enumerate(wiring.upstreams)]
        lines += [f"    server up{i} {_SPARE} disabled"
                  for i in range(len(wiring.upstreams), wiring.slots)]
    else:
        lines.append(f"    server app {_addr(wiring.app_host, wiring.app_http_port)}")
    if wiring.grpc_fd is not None and wiring.app_grpc_port is not None:
        app_grpc = _addr(wiring.app_host, wiring.app_grpc_port)
        if version.grpc == "tcp":
            lines += ["", "frontend grpc", "    mode tcp", "    option tcplog",
                      f"    bind fd@{wiring.grpc_fd}", "    default_backend app_grpc",
                      "", "backend app_grpc", "    mode tcp", f"    server app {app_grpc}"]
        else:
            lines += ["", "frontend grpc", f"    bind fd@{wiring.grpc_fd} proto h2", *marks,
                      "    default_backend app_grpc",
                      "", "backend app_grpc", f"    server app {app_grpc} proto h2"]
    return "\n".join(lines) + "\n"


# An outbound proxy's own answers say why (`targets.sidecar`, as Envoy's response flags):
# UF when the connection to the server it picked never got established (%Tc is -1; that
# server's address in the upstream host header), UH when it had no server to pick. Every
# answer that reached a server names it in the upstream host header.
_OUTBOUND_MARKS = [
    "    http-response set-var(txn.from_server) bool(true)",
    '    http-after-response set-var-fmt(txn.connect_ms) "%Tc"',
    f"    http-after-response set-header {RESPONSE_FLAGS_HEADER} {UPSTREAM_CONNECT_FAILURE} "
    "if !{ var(txn.from_server) -m bool } { bc_dst -m found } "
    "{ var(txn.connect_ms) -m str -- -1 }",
    f"    http-after-response set-header {RESPONSE_FLAGS_HEADER} {NO_HEALTHY_UPSTREAM} "
    "if !{ var(txn.from_server) -m bool } !{ bc_dst -m found }",
    f'    http-after-response set-header {UPSTREAM_HOST_HEADER} "%[bc_dst]:%[bc_dst_port]" '
    "if { bc_dst -m found }",
]
# A server slot without an address yet (disabled: never picked).
_SPARE = "127.0.0.1:1"

# Written when a version does not say: without client/server timeouts HAProxy warns and
# keeps dead sessions forever.
_DEFAULT_TIMEOUTS = {"connect": 1.0, "client": 30.0, "server": 30.0}


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- loading ----------------------------------------------------------------------------------


def load_haproxy_versions(path: str | Path) -> HaproxyVersions:
    """Read and validate a versions file."""
    text, source = read_yaml_file(path, "HAProxy versions file")
    return parse_haproxy_versions(text, source=source)


def parse_haproxy_versions(text: str, *, source: str = "<haproxy versions>") -> HaproxyVersions:
    """Validate YAML text into HaproxyVersions; `source` names the file in errors."""
    return _Parser(source).top(load_yaml(text, source))


class _Parser(LineParser):
    def top(self, data: Any) -> HaproxyVersions:
        top = self.mapping(data, "(top level)", None, None, {"app", "versions"})
        raw = top.get("versions")
        if not isinstance(raw, LineMap) or not raw:
            raise self.fail("must be a non-empty mapping of proxy version to HAProxy settings",
                            "versions", top, "versions")
        versions = {}
        for name, settings in raw.items():
            key = f"versions[{name!r}]"
            if not isinstance(name, str) or not _VERSION.match(name):
                raise self.fail("a version is a quoted string of letters, digits and . _ + -",
                                key, raw, name)
            versions[name] = self.version(name, settings, key, raw)
        app = self.mapping(top.get("app"), "app", top, "app", {"defaults", "routes"})
        defaults_raw = self.mapping(app.get("defaults"), "app.defaults", app, "defaults",
                                    _APP_FAULT_KEYS)
        routes_raw = app.get("routes") or LineMap()
        if not isinstance(routes_raw, LineMap):
            raise self.fail("must be a mapping of route to faults", "app.routes", app, "routes")
        routes = {}
        for route, faults in routes_raw.items():
            rkey = f"app.routes[{route!r}]"
            if not isinstance(route, str) or not route.startswith("/"):
                raise self.fail("a route is an HTTP path or a full gRPC method name",
                                rkey, routes_raw, route)
            rm = self.mapping(faults, rkey, routes_raw, route, _APP_FAULT_KEYS)
            merged = LineMap({**defaults_raw, **rm})
            merged.line, merged.lines = rm.line, {**defaults_raw.lines, **rm.lines}
            routes[route] = self.faults(merged, rkey)
        return HaproxyVersions(versions, app_defaults=self.faults(defaults_raw, "app.defaults"),
                               app_routes=routes, source=self.source)

    def version(self, name: str, raw: Any, key: str, parent: LineMap) -> HaproxyVersion:
        m = self.mapping(raw, key, parent, name, _VERSION_KEYS)
        retries = m.get("retries")
        if retries is not None and (
            not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 10
        ):
            raise self.fail("must be an integer 0-10", f"{key}.retries", m, "retries")
        retry_on = self.retry_on(m, key)
        header = m.get("attempt_count_header", False)
        if not isinstance(header, bool):
            raise self.fail("must be true or false", f"{key}.attempt_count_header", m,
                            "attempt_count_header")
        tm = self.mapping(m.get("timeouts"), f"{key}.timeouts", m, "timeouts", set(TIMEOUTS))
        timeouts = {k: self.duration(tm, k, f"{key}.timeouts", positive=True) for k in tm}
        grpc = m.get("grpc", "http")
        if grpc not in GRPC_MODES:
            raise self.fail("must be http (L7, h2 both sides) or tcp (opaque TCP)",
                            f"{key}.grpc", m, "grpc")
        return HaproxyVersion(
            version=name, retries=retries, retry_on=retry_on, attempt_count_header=header,
            timeouts={k: v for k, v in timeouts.items() if v is not None},
            hard_stop_after_s=self.duration(m, "hard_stop_after", key, positive=True),
            close_spread_time_s=self.duration(m, "close_spread_time", key, positive=True),
            grpc=str(grpc),
        )

    def retry_on(self, m: LineMap, key: str) -> tuple[str, ...]:
        raw = m.get("retry_on", [])
        ok = isinstance(raw, list) and all(
            (isinstance(v, str) and v in RETRY_ON_KEYWORDS)
            or (isinstance(v, int) and not isinstance(v, bool) and v in RETRY_ON_STATUSES)
            for v in raw
        )
        if not ok:
            allowed = sorted(RETRY_ON_KEYWORDS) + [str(s) for s in sorted(RETRY_ON_STATUSES)]
            raise self.fail(f"must be a list of HAProxy retry-on keywords or statuses "
                            f"({', '.join(allowed)})", f"{key}.retry_on", m, "retry_on")
        return tuple(str(v) for v in raw)

    def faults(self, m: LineMap, key: str) -> Faults:
        status = m.get("error_status", 503)
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
            raise self.fail("must be an HTTP status 400-599", f"{key}.error_status", m,
                            "error_status")
        return Faults(
            error_rate=self.rate(m, "error_rate", key),
            error_status=status,
            transient_error_rate=self.rate(m, "transient_error_rate", key),
            latency=self.latency(m, key),
        )

    def latency(self, m: LineMap, key: str) -> Latency:
        if "latency" not in m:
            return Latency()
        k = f"{key}.latency"
        lm = self.mapping(m["latency"], k, m, "latency", {"fixed", "tail", "tail_probability"})
        tail_p = self.rate(lm, "tail_probability", k)
        tail = self.duration(lm, "tail", k, positive=True) or 0.0
        if tail_p > 0 and tail == 0:
            raise self.fail("tail_probability needs a tail delay", f"{k}.tail", lm,
                            "tail_probability")
        return Latency(fixed_s=self.duration(lm, "fixed", k, positive=True) or 0.0, tail_s=tail,
                       tail_probability=tail_p)

    def rate(self, m: LineMap, name: str, key: str) -> float:
        value = m.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.fail("must be a probability between 0 and 1", f"{key}.{name}", m, name)
        return float(value)
