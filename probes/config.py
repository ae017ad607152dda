"""Load and validate skewprobe's YAML config.

Validation is the JSON Schema in `probes._schema` (checked with jsonschema), then the few
checks a schema cannot express. Every error is one `ConfigError` naming file, line and key,
found by walking the YAML node tree that PyYAML composes (it keeps each node's position).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from probes._parsing import (
    BoundedSafeLoader,
    YamlLimitError,
    parse_days,
    parse_duration,
    read_bounded,
)
from probes._schema import SCHEMA
from probes.errors import ConfigError
from probes.spec import (
    ApiSpec,
    ApiTlsSpec,
    CohortSpec,
    Config,
    ExpectSpec,
    FileTargetsSpec,
    GrpcSpec,
    HttpSpec,
    JudgingSettings,
    KubernetesSpec,
    PathSpec,
    PlanSpec,
    PrometheusSettings,
    RelaySpec,
    SkewPolicy,
    StreamSpec,
    TlsSpec,
    Tolerances,
    VersionSource,
)
from probes.types import Endpoint

__all__ = ["load_config", "parse_config", "parse_duration", "parse_rate"]

_RATE_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_RATE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)/(s|m|min|h)$")
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
_ERRORS_RANKED = 50
# A value quoted in an error: enough to recognise it, never the whole of a large one.
_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 80


def parse_rate(text: str) -> float:
    """'5/s' → 5.0, '30/min' → 0.5 (calls per second). Raises ValueError."""
    match = _RATE_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a rate like 5/s, 30/min, 1/h")
    value = float(match.group(1)) / _RATE_UNITS[match.group(2)]
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive rate")
    return value


def load_config(path: str | Path) -> Config:
    """Read, parse and validate a config file; every failure is a one-line ConfigError."""
    file = str(path)
    return parse_config(read_bounded(path, "config"), file=file)


def parse_config(text: str, *, file: str = "<config>") -> Config:
    # Composed once and built from the nodes, within the loader's bounds (probes._parsing).
    loader = BoundedSafeLoader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        line = mark.line + 1 if mark is not None else None
        # Past a bound the YAML is valid, only too big for a config.
        what = problem if isinstance(exc, YamlLimitError) else f"invalid YAML: {problem}"
        raise ConfigError(what, file=file, line=line) from exc
    finally:
        loader.dispose()
    if node is None or data is None:
        raise ConfigError("the config is empty", file=file)
    _reject_duplicate_keys(node, file)
    # The first errors found are enough to pick the most specific: sorting all of them would
    # cost a jsonschema error per item of a list of thousands of junk values.
    errors = sorted(itertools.islice(_VALIDATOR.iter_errors(data), _ERRORS_RANKED),
                    key=_error_rank)
    if errors:
        raise _to_config_error(errors[0], node, file)
    return _build(data, node, file)


# -- locating and explaining errors -----------------------------------------------------


def _reject_duplicate_keys(node: yaml.Node, file: str, where: str = "") -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            dotted = f"{where}.{key}" if where else key
            if key in seen:
                raise ConfigError(
                    "duplicate key", file=file, line=key_node.start_mark.line + 1, key=dotted
                )
            seen.add(key)
            _reject_duplicate_keys(value_node, file, dotted)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _reject_duplicate_keys(item, file, f"{where}[{index}]")


def _find(node: yaml.Node, path: Iterable[str | int]) -> tuple[yaml.Node, yaml.Node | None]:
    """The node at `path` and, for a mapping entry, its key node (whose line is the key's)."""
    key_node: yaml.Node | None = None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    key_node, node = k, v
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            key_node, node = None, node.value[part]
        else:
            break
    return node, key_node


def _dotted(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error_rank(error: jsonschema.ValidationError) -> tuple[int, int]:
    # Deepest first (most specific), then schema order, so one stable error is reported.
    return (-len(error.absolute_path), 0 if error.validator != "oneOf" else 1)


def _to_config_error(error: jsonschema.ValidationError, root: yaml.Node, file: str) -> ConfigError:
    path = list(error.absolute_path)
    node, key_node = _find(root, path)
    line_node = key_node if key_node is not None else node
    line = line_node.start_mark.line + 1
    key = _dotted(path) or "(top level)"
    validator = error.validator
    if validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - allowed)
        if unknown:
            bad_node, bad_key = _find(root, [*path, unknown[0]])
            bad_line = (bad_key or bad_node).start_mark.line + 1
            hint = ", ".join(sorted(allowed))
            return ConfigError(
                f"unknown key (expected one of: {hint})",
                file=file,
                line=bad_line,
                key=_dotted([*path, unknown[0]]),
            )
    if validator == "oneOf" and path and path[0] == "paths" and len(path) == 2:
        return ConfigError(
            "a path needs exactly one of http, grpc, stream or relay", file=file, line=line,
            key=key
        )
    if validator == "oneOf" and path and path[-1] == "port":
        return ConfigError(
            f"{_BRIEF.repr(error.instance)} is not a port number or port name", file=file,
            line=line, key=key
        )
    if validator in ("minProperties", "maxProperties") and path and path[-1] == "version_from":
        return ConfigError(
            "give exactly one of label, annotation, image or header", file=file, line=line,
            key=key,
        )
    if validator == "pattern":
        pattern = error.schema.get("pattern", "")
        if "ms|s|m|h" in pattern:
            message = f"{_BRIEF.repr(error.instance)} is not a duration like 500ms, 1s, 2m, 1h"
        elif "s|m|min|h" in pattern:
            message = f"{_BRIEF.repr(error.instance)} is not a rate like 5/s, 30/min, 1/h"
        else:
            message = f"{_BRIEF.repr(error.instance)} is not in the expected form"
        return ConfigError(message, file=file, line=line, key=key)
    if validator == "enum":
        choices = ", ".join(repr(c) for c in error.schema["enum"])
        return ConfigError(
            f"{_BRIEF.repr(error.instance)} is not one of {choices}", file=file, line=line,
            key=key
        )
    if validator == "type":
        expected = error.schema.get("type")
        return ConfigError(
            f"expected {expected}, got {type(error.instance).__name__} "
            f"{_BRIEF.repr(error.instance)}",
            file=file,
            line=line,
            key=key,
        )
    if validator == "required":
        return ConfigError(error.message.replace("'", ""), file=file, line=line, key=key)
    return ConfigError(error.message.splitlines()[0], file=file, line=line, key=key)


# -- building the typed config ----------------------------------------------------------


class _Builder:
    """Turns validated data into the frozen specs, raising ConfigError with positions."""

    def __init__(self, root: yaml.Node, file: str) -> None:
        self.root = root
        self.file = file

    def fail(self, message: str, path: list[str | int]) -> ConfigError:
        node, key_node = _find(self.root, path)
        line = (key_node or node).start_mark.line + 1
        return ConfigError(message, file=self.file, line=line, key=_dotted(path))

    def duration(self, value: str, path: list[str | int], *, zero: bool = False) -> float:
        """Seconds; `zero`: 0 is allowed (it turns the setting off)."""
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise self.fail(str(exc), path) from None
        if seconds < 0 or (seconds == 0 and not zero):
            raise self.fail(f"{value!r} must be longer than zero", path)
        return seconds

    def rate(self, value: str, path: list[str | int]) -> float:
        try:
            return parse_rate(value)
        except ValueError as exc:
            raise self.fail(str(exc), path) from None

    def b64(self, value: str, path: list[str | int]) -> bytes:
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise self.fail("not valid base64", path) from None

    def tls(self, data: Mapping[str, Any] | None, path: list[str | int]) -> TlsSpec | None:
        if data is None:
            return None
        for key in ("ca", "cert", "key"):
            if key in data and not Path(data[key]).is_file():
                raise self.fail(f"no such file: {data[key]}", [*path, key])
        return TlsSpec(**data)


def _build(data: Mapping[str, Any], root: yaml.Node, file: str) -> Config:
    b = _Builder(root, file)
    targets = data.get("targets") or {}
    static = tuple(_static_endpoint(t, i, b) for i, t in enumerate(targets.get("static") or []))
    file_targets = FileTargetsSpec(**targets["file"]) if "file" in targets else None
    kubernetes = _kubernetes(targets["kubernetes"], b) if "kubernetes" in targets else None
    if not static and file_targets is None and kubernetes is None:
        raise b.fail(
            "no targets: give targets.static, targets.file or targets.kubernetes", ["targets"]
        )

    paths: list[PathSpec] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(data["paths"]):
        where: list[str | int] = ["paths", index]
        if raw["name"] in seen:
            raise b.fail(
                f"duplicate path name {raw['name']!r} (first at paths[{seen[raw['name']]}])",
                [*where, "name"],
            )
        seen[raw["name"]] = index
        paths.append(_path(raw, where, b))
    header = kubernetes.version_from.header if kubernetes and kubernetes.version_from else None
    if header:
        # The version is only known from the response: every path reads it unless told.
        paths = [
            p if p.cohort_header else dataclasses.replace(p, cohort_header=header.lower())
            for p in paths
        ]

    for index, endpoint in enumerate(static):
        for path in paths:
            named = isinstance(path.port, str)
            if named and path.matches(endpoint) and path.port not in endpoint.ports:
                raise b.fail(
                        f"path {path.name!r} uses port {path.port!r} that this target lacks",
                        ["targets", "static", index],
                    )

    verdict = data.get("verdict") or {}
    probe = data.get("probe") or {}
    inventory = data.get("inventory") or {}
    prom = data.get("prometheus")
    # Only the keys given are passed: every default is the dataclass's own (`probes.spec`).
    settings = _given(
        tolerances=Tolerances(**(verdict.get("tolerances") or {})),
        cohort=CohortSpec(**(data.get("cohort") or {})),
        alpha=_maybe(verdict, "alpha", float),
        min_samples=_maybe(verdict, "min_samples", int),
        warmup_s=_maybe(verdict, "warmup",
                        lambda v: b.duration(v, ["verdict", "warmup"], zero=True)),
        window_s=_maybe(data, "window", lambda v: b.duration(v, ["window"])),
    )
    return Config(**_given(
        source=data.get("source"),
        prometheus=None if prom is None else PrometheusSettings(**_given(
            url=prom["url"],
            selector=prom.get("selector"),
            step_s=_maybe(prom, "step", lambda v: b.duration(v, ["prometheus", "step"])),
            timeout_s=_maybe(prom, "timeout", lambda v: b.duration(v, ["prometheus", "timeout"])),
            lookback_s=_maybe(prom, "lookback",
                              lambda v: b.duration(v, ["prometheus", "lookback"])),
            headers=prom.get("headers"),
        )),
        paths=tuple(paths),
        static_targets=static,
        file_targets=file_targets,
        kubernetes=kubernetes,
        judging=JudgingSettings(**settings),
        max_in_flight=_maybe(probe, "max_in_flight", int),
        cohort_balance_max=_maybe(probe, "cohort_balance_max", float),
        max_rate_per_s=_maybe(probe, "max_rate", lambda v: b.rate(v, ["probe", "max_rate"])),
        store=(data.get("store") or {}).get("path"),
        listen=data.get("listen"),
        api=_api(data.get("api") or {}),
        plan=_plan(data.get("plan") or {}, b),
        inventory_every_s=_maybe(
            inventory, "snapshot_every",
            lambda v: b.duration(v, ["inventory", "snapshot_every"])),
    ))


def _maybe(raw: Mapping[str, Any], key: str, convert: Callable[[Any], Any]) -> Any:
    """`raw[key]` converted, or None when the key is absent (then `_given` drops it)."""
    return convert(raw[key]) if key in raw else None


def _given(**values: Any) -> dict[str, Any]:
    """The keyword arguments that were given, so the dataclass's default applies to the rest.
    None stands for a key left out: the schema lets none of these keys be written as null."""
    return {k: v for k, v in values.items() if v is not None}


def _plan(raw: Mapping[str, Any], b: _Builder) -> PlanSpec:
    base = PlanSpec()

    def days(key: str, default: float) -> float:
        if key not in raw:
            return default
        try:
            seconds = parse_days(raw[key])
        except ValueError as exc:
            raise b.fail(str(exc), ["plan", key]) from None
        if seconds <= 0 and key != "soak":
            raise b.fail(f"{raw[key]!r} must be longer than zero", ["plan", key])
        return seconds

    return PlanSpec(
        first_namespaces=tuple(raw.get("first_namespaces", base.first_namespaces)),
        tier_label=raw.get("tier_label", base.tier_label),
        max_pod_age_s=days("max_pod_age", base.max_pod_age_s),
        tier_every_s=days("tier_every", base.tier_every_s),
        soak_s=days("soak", base.soak_s),
    )


def _api(raw: Mapping[str, Any]) -> ApiSpec:
    tls = raw.get("tls")
    return ApiSpec(
        token_file=raw.get("token_file"),
        tls=ApiTlsSpec(**tls) if tls is not None else None,
    )


def _kubernetes(raw: Mapping[str, Any], b: _Builder) -> KubernetesSpec:
    where: list[str | int] = ["targets", "kubernetes"]
    mesh = raw["mesh"]
    source = raw.get("version_from")
    if mesh == "generic" and source is None:
        raise b.fail("a generic mesh needs version_from (label, annotation, image or header)",
                     [*where, "mesh"])
    if mesh != "generic" and source is not None:
        raise b.fail(f"version_from is for mesh: generic ({mesh} has its own)",
                     [*where, "version_from"])
    if raw.get("in_cluster") and "kubeconfig" in raw:
        raise b.fail("give kubeconfig or in_cluster: true, not both", [*where, "kubeconfig"])
    kubeconfig = raw.get("kubeconfig")
    if kubeconfig is not None and not Path(kubeconfig).expanduser().is_file():
        raise b.fail(f"no such file: {kubeconfig}", [*where, "kubeconfig"])
    if "selector" in raw:
        problem = _selector_problem(raw["selector"])
        if problem:
            raise b.fail(problem, [*where, "selector"])
    return KubernetesSpec(
        mesh=mesh,
        namespaces=tuple(raw.get("namespaces") or ()),
        selector=raw.get("selector", "").strip(),
        port=raw.get("port"),
        labels=tuple(raw.get("labels") or ()),
        version_from=VersionSource(**source) if source is not None else None,
        mesh_namespace=raw.get("mesh_namespace"),
        control_plane_version=raw.get("control_plane_version"),
        supported_skew=SkewPolicy(**(raw.get("supported_skew") or {})),
        kubeconfig=kubeconfig,
        context=raw.get("context"),
        in_cluster=raw.get("in_cluster"),
    )


_SELECTOR_TERM = re.compile(
    r"^\s*(!?[A-Za-z0-9./_-]+|[A-Za-z0-9./_-]+\s*(==?|!=)\s*[A-Za-z0-9._-]*"
    r"|[A-Za-z0-9./_-]+\s+(in|notin)\s+\([A-Za-z0-9._,\s-]*\))\s*$"
)


def _selector_problem(selector: str) -> str | None:
    """A label selector's syntax, checked here so a typo fails validation, not the API call."""
    # Split on commas outside parentheses: "a in (x,y),b" is two terms.
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    if not selector.strip():
        return None
    for term in terms:
        if not term.strip():
            return "empty term in the label selector (a stray comma?)"
        if not _SELECTOR_TERM.match(term):
            return f"{term.strip()!r} is not a label selector term (k=v, k!=v, k in (a,b), !k)"
    return None


def _static_endpoint(raw: Mapping[str, Any], index: int, b: _Builder) -> Endpoint:
    host, _, port = raw["address"].rpartition(":")
    if not 0 < int(port) < 65536:
        raise b.fail(f"port {port} out of range", ["targets", "static", index, "address"])
    labels = raw.get("labels") or {}
    name = raw.get("name") or labels.get("pod") or raw["address"]
    ports = raw.get("ports") or {}
    return Endpoint(name=name, host=host, port=int(port), labels=labels, ports=ports)


def _health_service(raw: Mapping[str, Any]) -> str | None:
    """`health: svc` names a service; no method at all means the whole server's health."""
    if "health" in raw:
        return str(raw["health"])
    return "" if "method" not in raw else None


def _path(raw: Mapping[str, Any], where: list[str | int], b: _Builder) -> PathSpec:
    http = grpc = stream = None
    if "http" in raw:
        h = raw["http"]
        http = HttpSpec(**_given(
            method=h.get("method"),
            path=h.get("path"),
            version=h.get("version"),
            scheme=h.get("scheme"),
            headers=h.get("headers"),
            body=_maybe(h, "body", str.encode),
            tls=b.tls(h.get("tls"), [*where, "http", "tls"]),
        ))
    if "grpc" in raw:
        g = raw["grpc"]
        grpc = GrpcSpec(**_given(
            method=g.get("method"),
            request=_maybe(g, "request",
                           lambda x: b.b64(x, [*where, "grpc", "request"])),
            metadata=g.get("metadata"),
            health_service=_health_service(g),
            tls=b.tls(g.get("tls"), [*where, "grpc", "tls"]),
        ))
    if "stream" in raw:
        s = raw["stream"]
        stream = StreamSpec(**_given(
            method=s.get("method"),
            request=_maybe(s, "request",
                           lambda x: b.b64(x, [*where, "stream", "request"])),
            per_endpoint=_maybe(s, "per_endpoint", int),
            metadata=s.get("metadata"),
            health_service=_health_service(s),
            max_lifetime_s=_maybe(s, "max_lifetime",
                                  lambda v: b.duration(v, [*where, "stream", "max_lifetime"])),
            tls=b.tls(s.get("tls"), [*where, "stream", "tls"]),
        ))
    relay = (RelaySpec(**_given(destination=raw["relay"]["destination"],
                                callees=raw["relay"].get("callees"),
                                version=raw["relay"].get("version")))
             if "relay" in raw else None)
    expect = raw.get("expect") or {}
    path = PathSpec(**_given(
        name=raw["name"],
        rate_per_s=_maybe(raw, "rate", lambda v: b.rate(v, [*where, "rate"])),
        timeout_s=_maybe(raw, "timeout", lambda v: b.duration(v, [*where, "timeout"])),
        http=http,
        grpc=grpc,
        stream=stream,
        relay=relay,
        expect=ExpectSpec(**_given(
            status=_maybe(expect, "status", tuple),
            grpc_codes=_maybe(expect, "grpc_codes", lambda v: tuple(c.upper() for c in v)),
        )),
        port=raw.get("port"),
        selector=raw.get("selector"),
        attempts_header=_maybe(raw, "attempts_header", str.lower),
        cohort_header=_maybe(raw, "cohort_header", str.lower),
    ))
    if stream is None and path.timeout_s * path.rate_per_s > 10_000:
        raise b.fail("rate × timeout allows over 10,000 calls in flight per endpoint", where)
    return path
