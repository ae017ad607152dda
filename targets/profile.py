"""Fault profiles: how each emulated proxy version misbehaves, loaded from YAML.

A profile file maps proxy versions to the faults their sidecar injects; the reference target
(`targets.server`) looks up its own version and applies them per request. Faults are set for
all routes (`defaults`) and overridden per route (`routes`, keyed by HTTP path or full gRPC
method name; a route's keys replace the defaults' keys of the same name):

    versions:
      "1.20.3": {attempt_count_header: true}
      "1.21.0":
        attempt_count_header: true            # x-envoy-attempt-count on responses
        max_connection_age: 30m               # gRPC port: real GOAWAYs
        outbound:                             # the relay's calls: the caller's sidecar
          retries: {num_retries: 2, retry_on: [503]}
        defaults: {latency: {fixed: 2ms}}
        routes:
          /api/checkout:
            error_rate: 0.01                  # persistent: every attempt of that request fails
            transient_error_rate: 1.0         # first attempts fail, a retry succeeds
            retries: {num_retries: 1, retry_on: [503]}

Everything here is frozen data; errors are `ConfigError`s naming file, line and key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc

from probes.errors import ConfigError
from targets._yaml import LineMap, LineParser, load_yaml, read_yaml_file

_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
GRPC_CODES = frozenset(c.name for c in grpc.StatusCode)


@dataclass(frozen=True, slots=True)
class Latency:
    """Delay the sidecar adds per request: `fixed_s` always, plus `tail_s` with probability."""

    fixed_s: float = 0.0
    tail_s: float = 0.0
    tail_probability: float = 0.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The sidecar re-tries the app up to `num_retries` times when it answers a `retry_on`
    status (gRPC calls use the HTTP status the app failed with, before mapping)."""

    num_retries: int = 0
    retry_on: frozenset[int] = frozenset({503})
    backoff_s: float = 0.0


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    """The emulated sidecar's outbound side, for the calls the pod itself makes (the relay's):
    it retries per `retries` as a caller's Envoy does toward a dependency, and with
    `attempt_count_header` sends `x-envoy-attempt-count` on every upstream attempt (Envoy's
    `include_request_attempt_count`). In a real mesh the pod's own sidecar does this and the
    profile leaves `outbound` out."""

    retries: RetryPolicy = RetryPolicy()
    attempt_count_header: bool = True


@dataclass(frozen=True, slots=True)
class HeaderRules:
    """Header handling of one proxy version. Response rules apply to HTTP response headers
    and to gRPC trailing metadata; a request carrying a `reject_requests_with` header is
    answered 400 (gRPC INTERNAL, the standard HTTP-to-gRPC mapping) without reaching the app."""

    add: tuple[tuple[str, str], ...] = ()
    remove: frozenset[str] = frozenset()
    rename: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    reject_requests_with: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "rename", MappingProxyType(dict(self.rename)))

    @property
    def rewrites_response(self) -> bool:
        return bool(self.add or self.remove or self.rename)


@dataclass(frozen=True, slots=True)
class Faults:
    """What happens to one request on one route of one proxy version."""

    error_rate: float = 0.0
    error_status: int = 503
    transient_error_rate: float = 0.0
    latency: Latency = Latency()
    retries: RetryPolicy = RetryPolicy()
    max_stream_duration_s: float | None = None
    # How a stream cut by max_stream_duration ends (a gRPC status: grpc.aio cannot send a
    # bare RST_STREAM; INTERNAL is what gRPC clients report for a non-CANCEL RST_STREAM).
    stream_reset_code: str = "INTERNAL"
    headers: HeaderRules = HeaderRules()


@dataclass(frozen=True, slots=True)
class VersionProfile:
    """One emulated proxy version: connection-level settings and faults per route."""

    version: str
    defaults: Faults = Faults()
    routes: Mapping[str, Faults] = field(default_factory=lambda: MappingProxyType({}))
    attempt_count_header: bool = False
    max_connection_age_s: float | None = None
    max_connection_age_grace_s: float | None = None
    outbound: OutboundPolicy | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", MappingProxyType(dict(self.routes)))

    def faults_for(self, route: str) -> Faults:
        """The faults of an HTTP path or full gRPC method name (exact match, else defaults)."""
        return self.routes.get(route, self.defaults)


@dataclass(frozen=True, slots=True)
class ProfileSet:
    """All versions of one profile file."""

    versions: Mapping[str, VersionProfile]
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "versions", MappingProxyType(dict(self.versions)))

    def profile(self, version: str) -> VersionProfile:
        """The profile of `version`; ConfigError if the file does not define it."""
        try:
            return self.versions[version]
        except KeyError:
            known = ", ".join(sorted(self.versions)) or "none"
            raise ConfigError(
                f"version {version!r} is not defined (defined: {known})",
                file=self.source, key=f"versions[{version!r}]",
            ) from None


def load_profiles(path: str | Path) -> ProfileSet:
    """Read and validate a profile file."""
    text, source = read_yaml_file(path, "profile file")
    return parse_profiles(text, source=source)


def parse_profiles(text: str, *, source: str = "<profiles>") -> ProfileSet:
    """Validate YAML text into a ProfileSet; `source` names the file in errors."""
    return _Parser(source).profiles(load_yaml(text, source))


# --- validation -------------------------------------------------------------------------------


class _Parser(LineParser):
    """Turns the loaded YAML into frozen profiles; every error names file, line and key."""

    def profiles(self, data: Any) -> ProfileSet:
        top = self.mapping(data, "(top level)", None, None, {"versions"})
        if "versions" not in top:
            raise self.fail("missing (a mapping of proxy version to faults)", "versions", top)
        versions_raw = top["versions"]
        if not isinstance(versions_raw, dict) or not versions_raw:
            raise self.fail("must be a non-empty mapping of proxy version to faults",
                            "versions", top, "versions")
        out: dict[str, VersionProfile] = {}
        for version, raw in versions_raw.items():
            key = f"versions[{version!r}]"
            if not isinstance(version, str):
                raise self.fail(
                    f"a version must be a quoted string (YAML read {version!r} as "
                    f"{type(version).__name__}; write \"{version}\")",
                    key, versions_raw, version,
                )
            out[version] = self.version(version, raw, key, versions_raw)
        return ProfileSet(out, source=self.source)

    def version(self, version: str, raw: Any, key: str, parent: dict[Any, Any]) -> VersionProfile:
        m = self.mapping(raw, key, parent, version, {
            "attempt_count_header", "max_connection_age", "max_connection_age_grace",
            "defaults", "routes", "outbound",
        })
        attempt_header = m.get("attempt_count_header", False)
        if not isinstance(attempt_header, bool):
            raise self.fail("must be true or false", f"{key}.attempt_count_header", m,
                            "attempt_count_header")
        age = self.duration(m, "max_connection_age", key)
        grace = self.duration(m, "max_connection_age_grace", key)
        defaults_raw = self.mapping(m.get("defaults"), f"{key}.defaults", m, "defaults",
                                    _FAULT_KEYS)
        defaults = self.faults(defaults_raw, f"{key}.defaults")
        routes_raw = m.get("routes") or {}
        if not isinstance(routes_raw, dict):
            raise self.fail("must be a mapping of route to faults", f"{key}.routes", m, "routes")
        routes: dict[str, Faults] = {}
        for route, route_raw in routes_raw.items():
            rkey = f"{key}.routes[{route!r}]"
            if not isinstance(route, str) or not route.startswith("/"):
                raise self.fail(
                    "a route is an HTTP path or a full gRPC method name, starting with /",
                    rkey, routes_raw, route,
                )
            rm = self.mapping(route_raw, rkey, routes_raw, route, _FAULT_KEYS)
            merged = LineMap({**defaults_raw, **rm})
            merged.line = rm.line
            merged.lines = {**defaults_raw.lines, **rm.lines}
            routes[route] = self.faults(merged, rkey)
        return VersionProfile(
            version=version, defaults=defaults, routes=routes,
            attempt_count_header=attempt_header,
            max_connection_age_s=age, max_connection_age_grace_s=grace,
            outbound=self.outbound(m, key),
        )

    def outbound(self, m: LineMap, key: str) -> OutboundPolicy | None:
        if "outbound" not in m:
            return None
        k = f"{key}.outbound"
        om = self.mapping(m["outbound"], k, m, "outbound", {"retries", "attempt_count_header"})
        header = om.get("attempt_count_header", True)
        if not isinstance(header, bool):
            raise self.fail("must be true or false", f"{k}.attempt_count_header", om,
                            "attempt_count_header")
        return OutboundPolicy(retries=self.retries(om, k), attempt_count_header=header)

    def faults(self, m: LineMap, key: str) -> Faults:
        error_status = m.get("error_status", 503)
        if not isinstance(error_status, int) or isinstance(error_status, bool) or not (
            400 <= error_status <= 599
        ):
            raise self.fail("must be an HTTP status 400-599", f"{key}.error_status", m,
                            "error_status")
        msd = m.get("max_stream_duration")
        msd_s: float | None = None
        reset_code = "INTERNAL"
        if isinstance(msd, dict):
            mm = self.mapping(msd, f"{key}.max_stream_duration", m, "max_stream_duration",
                              {"after", "code"})
            msd_s = self.duration(mm, "after", f"{key}.max_stream_duration", required=True)
            reset_code = self.grpc_code(mm, "code", f"{key}.max_stream_duration") or reset_code
        elif msd is not None:
            msd_s = self.duration(m, "max_stream_duration", key)
        if msd_s is not None and msd_s <= 0:
            raise self.fail("must be > 0", f"{key}.max_stream_duration", m, "max_stream_duration")
        return Faults(
            error_rate=self.rate(m, "error_rate", key),
            error_status=error_status,
            transient_error_rate=self.rate(m, "transient_error_rate", key),
            latency=self.latency(m, key),
            retries=self.retries(m, key),
            max_stream_duration_s=msd_s,
            stream_reset_code=reset_code,
            headers=self.headers(m, key),
        )

    def latency(self, m: LineMap, key: str) -> Latency:
        if "latency" not in m:
            return Latency()
        k = f"{key}.latency"
        lm = self.mapping(m["latency"], k, m, "latency", {"fixed", "tail", "tail_probability"})
        lat = Latency(
            fixed_s=self.duration(lm, "fixed", k) or 0.0,
            tail_s=self.duration(lm, "tail", k) or 0.0,
            tail_probability=self.rate(lm, "tail_probability", k),
        )
        if lat.tail_probability > 0 and lat.tail_s == 0:
            raise self.fail("tail_probability needs a tail delay", f"{k}.tail", lm,
                            "tail_probability")
        return lat

    def retries(self, m: LineMap, key: str) -> RetryPolicy:
        if "retries" not in m:
            return RetryPolicy()
        k = f"{key}.retries"
        rm = self.mapping(m["retries"], k, m, "retries", {"num_retries", "retry_on", "backoff"})
        n = rm.get("num_retries", 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 10:
            raise self.fail("must be an integer 0-10", f"{k}.num_retries", rm, "num_retries")
        on = rm.get("retry_on", [503])
        if not isinstance(on, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 400 <= s <= 599 for s in on
        ):
            raise self.fail("must be a list of HTTP statuses 400-599", f"{k}.retry_on", rm,
                            "retry_on")
        return RetryPolicy(num_retries=n, retry_on=frozenset(on),
                           backoff_s=self.duration(rm, "backoff", k) or 0.0)

    def headers(self, m: LineMap, key: str) -> HeaderRules:
        if "headers" not in m:
            return HeaderRules()
        k = f"{key}.headers"
        hm = self.mapping(m["headers"], k, m, "headers",
                          {"add", "remove", "rename", "reject_requests_with"})
        add = self.header_map(hm, "add", k, values_are_names=False)
        rename = self.header_map(hm, "rename", k, values_are_names=True)
        return HeaderRules(
            add=tuple(add.items()),
            remove=frozenset(self.header_list(hm, "remove", k)),
            rename=rename,
            reject_requests_with=tuple(self.header_list(hm, "reject_requests_with", k)),
        )

    # --- scalars ---

    def header_name(self, name: Any, key: str, where: dict[Any, Any], at: Any) -> str:
        if not isinstance(name, str) or not _HEADER_NAME.match(name.lower()):
            raise self.fail(f"{name!r} is not a valid header name", key, where, at)
        return name.lower()

    def header_list(self, m: LineMap, name: str, key: str) -> list[str]:
        raw = m.get(name, [])
        if not isinstance(raw, list):
            raise self.fail("must be a list of header names", f"{key}.{name}", m, name)
        return [self.header_name(h, f"{key}.{name}", m, name) for h in raw]

    def header_map(
        self, m: LineMap, name: str, key: str, *, values_are_names: bool
    ) -> dict[str, str]:
        raw = m.get(name, {})
        if not isinstance(raw, dict):
            raise self.fail("must be a mapping of header name to value", f"{key}.{name}", m, name)
        out: dict[str, str] = {}
        for h, v in raw.items():
            hk = f"{key}.{name}.{h}"
            hname = self.header_name(h, hk, raw, h)
            if values_are_names:
                out[hname] = self.header_name(v, hk, raw, h)
            elif isinstance(v, str | int | float) and not isinstance(v, bool) and (
                str(v).isprintable() and str(v).isascii()
            ):
                out[hname] = str(v)
            else:
                raise self.fail("must be a printable ASCII value", hk, raw, h)
        return out

    def rate(self, m: LineMap, name: str, key: str) -> float:
        value = m.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.fail("must be a probability between 0 and 1", f"{key}.{name}", m, name)
        return float(value)

    def grpc_code(self, m: LineMap, name: str, key: str) -> str | None:
        if name not in m:
            return None
        value = m[name]
        if not isinstance(value, str) or value.upper() not in GRPC_CODES - {"OK"}:
            raise self.fail("must be a gRPC status code name such as INTERNAL",
                            f"{key}.{name}", m, name)
        return value.upper()


_FAULT_KEYS = {
    "error_rate", "error_status", "transient_error_rate", "latency", "retries",
    "max_stream_duration", "headers",
}
