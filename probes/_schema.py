"""The JSON Schema of skewprobe's YAML config: the one source of truth for its keys.

`skewprobe validate --schema` prints it; `probes.config` validates against it with jsonschema
and then applies the checks a schema cannot express (duplicate names, ports that exist).
Its `default`s are read from the dataclasses of `probes.spec` (what a key left out becomes),
written as the YAML would write them, never typed again here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from probes import spec

DURATION = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$"
DAYS = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)$"
RATE = r"^[0-9]+(\.[0-9]+)?/(s|m|min|h)$"


def _default(cls: type, name: str) -> Any:
    """The default of `cls`'s field `name`, as JSON (a tuple as a list)."""
    (field,) = [f for f in dataclasses.fields(cls) if f.name == name]
    value = field.default
    return list(value) if isinstance(value, tuple) else value


def _seconds(seconds: float, units: tuple[tuple[str, float], ...]) -> str:
    """Seconds as the config writes a duration: in the largest unit that divides them."""
    for unit, size in units:
        if seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms"


_CLOCK = (("h", 3600.0), ("m", 60.0), ("s", 1.0))
_CALENDAR = (("d", 86400.0), *_CLOCK)


def _duration_of(cls: type, name: str, units: tuple[tuple[str, float], ...] = _CLOCK) -> str:
    return _seconds(float(_default(cls, name)), units)


def _with(schema: dict[str, Any], default: Any) -> dict[str, Any]:
    return {**schema, "default": default}


_str_map: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}

_duration: dict[str, Any] = {
    "type": "string",
    "pattern": DURATION,
    "description": "a duration: 250ms, 1s, 1.5m, 2h",
}

_tls: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "TLS towards the target; cert and key make it mTLS",
    "properties": {
        "ca": {"type": "string", "description": "CA bundle file"},
        "cert": {"type": "string", "description": "client certificate file"},
        "key": {"type": "string", "description": "client key file"},
        "server_name": {"type": "string"},
        "insecure_skip_verify": {"type": "boolean"},
    },
    "dependentRequired": {"cert": ["key"], "key": ["cert"]},
}

_api: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "who may read the probe's API (it binds 127.0.0.1 by default)",
    "properties": {
        "token_file": {
            "type": "string",
            "minLength": 1,
            "description": "file holding the bearer token every route but /healthz requires",
        },
        "tls": {
            "type": "object",
            "additionalProperties": False,
            "required": ["cert", "key"],
            "description": "serve the API over TLS; client_ca makes it mTLS",
            "properties": {
                "cert": {"type": "string", "minLength": 1, "description": "certificate file"},
                "key": {"type": "string", "minLength": 1, "description": "private key file"},
                "client_ca": {
                    "type": "string",
                    "minLength": 1,
                    "description": "CA bundle: require client certificates it signed",
                },
            },
        },
    },
}

_port: dict[str, Any] = {
    "description": "a port number, or the name of one of the endpoint's named ports",
    "oneOf": [
        {"type": "integer", "minimum": 1, "maximum": 65535},
        {"type": "string", "minLength": 1},
    ],
}

_static_target: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["address"],
    "properties": {
        "address": {"type": "string", "pattern": r"^[^\s:]+:[0-9]{1,5}$"},
        "name": {"type": "string"},
        "labels": _str_map,
        "ports": {
            "type": "object",
            "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 65535},
        },
    },
}

_http: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "method": {"enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                   "default": _default(spec.HttpSpec, "method")},
        "path": {"type": "string", "pattern": "^/", "default": _default(spec.HttpSpec, "path")},
        "version": {"enum": ["1.1", "2"], "description": "HTTP/1.1, or HTTP/2 (h2c on http)",
                    "default": _default(spec.HttpSpec, "version")},
        "scheme": {"enum": ["http", "https"], "default": _default(spec.HttpSpec, "scheme")},
        "headers": _str_map,
        "body": {"type": "string"},
        "tls": _tls,
    },
}

_grpc: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "method": {"type": "string", "pattern": r"^/[^/]+/[^/]+$"},
        "request": {"type": "string", "description": "the request message, base64 protobuf"},
        "metadata": _str_map,
        "health": {
            "type": "string",
            "description": "standard grpc.health.v1 Check of this service ('' = whole server)",
        },
        "tls": _tls,
    },
}

_stream: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "method": {"type": "string", "pattern": r"^/[^/]+/[^/]+$"},
        "request": {"type": "string"},
        "per_endpoint": {"type": "integer", "minimum": 1, "maximum": 1000,
                         "default": _default(spec.StreamSpec, "per_endpoint")},
        "metadata": _str_map,
        "health": {"type": "string"},
        "max_lifetime": _duration,
        "tls": _tls,
    },
}

_relay: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["destination"],
    "description": "a call through relay pods (the reference target's relay) to a destination"
    " in their allowlist; results keyed by caller and callee proxy version",
    "properties": {
        "destination": {
            "type": "string",
            "pattern": r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$",
            "description": "a destination name from the relay pods' allowlist",
        },
        "callees": {
            **_str_map,
            "description": "labels of the destination's pods in discovery: an answer from a"
            " removed one is stale_endpoint",
        },
        "version": {"enum": ["1.1", "2"],
                    "description": "HTTP version the relay pods are asked in (h2c for 2)",
                    "default": _default(spec.RelaySpec, "version")},
    },
}

_LABEL_KEY = r"^([A-Za-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$"

_kubernetes: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["mesh"],
    "description": "pods from the Kubernetes API (list + watch), each with its proxy version",
    "properties": {
        "namespaces": {
            "type": "array",
            "items": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
            "uniqueItems": True,
            "description": "namespaces to watch; absent or empty: every namespace",
        },
        "selector": {
            "type": "string",
            "description": "a Kubernetes label selector: 'app=checkout,tier in (web,api)'",
        },
        "port": {
            **_port,
            "description": "the pod port to probe: a number, or a named container port",
        },
        "labels": {
            "type": "array",
            "items": {"type": "string", "pattern": _LABEL_KEY},
            "uniqueItems": True,
            "description": "pod labels copied onto each endpoint (for path selectors, reports)",
        },
        "mesh": {
            "enum": ["istio", "linkerd", "generic"],
            "description": "how the callee's proxy version is read from its pod",
        },
        "version_from": {
            "type": "object",
            "additionalProperties": False,
            "description": "generic mesh: exactly one place that holds the proxy version",
            "properties": {
                "label": {"type": "string", "pattern": _LABEL_KEY},
                "annotation": {"type": "string", "pattern": _LABEL_KEY},
                "image": {
                    "type": "string",
                    "minLength": 1,
                    "description": "the tag of this container's image",
                },
                "header": {
                    "type": "string",
                    "pattern": r"^[A-Za-z0-9-]+$",
                    "description": "a response header (probing through a Service address)",
                },
            },
            "minProperties": 1,
            "maxProperties": 1,
        },
        "mesh_namespace": {
            "type": "string",
            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "description": "where istiod/ztunnel or linkerd-destination run"
            " (istio-system / linkerd)",
        },
        "control_plane_version": {
            "type": "string",
            "minLength": 1,
            "description": "judge skew against this version instead of the discovered one",
        },
        "supported_skew": {
            "type": "object",
            "additionalProperties": False,
            "description": "minor versions the data plane may be behind / ahead of the"
            " control plane (default 1 / 0)",
            "properties": {
                "behind": {"type": "integer", "minimum": 0,
                           "default": _default(spec.SkewPolicy, "behind")},
                "ahead": {"type": "integer", "minimum": 0,
                          "default": _default(spec.SkewPolicy, "ahead")},
            },
        },
        "kubeconfig": {"type": "string", "minLength": 1},
        "context": {"type": "string", "minLength": 1},
        "in_cluster": {
            "type": "boolean",
            "description": "use the pod's service account (default: when running in a pod)",
        },
    },
}

_KINDS = ("http", "grpc", "stream", "relay")

_path: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$",
            "description": "unique; letters, digits and _.:/- (a leading _ is reserved)",
        },
        "http": _http,
        "grpc": _grpc,
        "stream": _stream,
        "relay": _relay,
        "rate": {
            "type": "string",
            "pattern": RATE,
            "description": "calls per endpoint: 5/s, 30/min, 1/h",
            "default": f"{_default(spec.PathSpec, 'rate_per_s'):g}/s",
        },
        "timeout": _with(_duration, _duration_of(spec.PathSpec, "timeout_s")),
        "expect": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "status": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "integer", "minimum": 100, "maximum": 599},
                    "default": _default(spec.ExpectSpec, "status"),
                },
                "grpc_codes": {"type": "array", "minItems": 1, "items": {"type": "string"},
                               "default": _default(spec.ExpectSpec, "grpc_codes")},
            },
        },
        "port": _port,
        "selector": _str_map,
        "attempts_header": {"type": "string", "minLength": 1,
                            "default": _default(spec.PathSpec, "attempts_header")},
        "cohort_header": {"type": "string", "minLength": 1},
    },
    "oneOf": [
        {"required": [kind], "not": {"anyOf": [{"required": [o]} for o in _KINDS if o != kind]}}
        for kind in _KINDS
    ],
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "skewprobe config",
    "type": "object",
    "additionalProperties": False,
    "required": ["paths"],
    "properties": {
        "targets": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "static": {"type": "array", "items": _static_target},
                "file": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["path"],
                    "properties": {"path": {"type": "string", "minLength": 1}},
                },
                "kubernetes": _kubernetes,
            },
        },
        "plan": {
            "type": "object",
            "additionalProperties": False,
            "description": "skewprobe plan: tiers and pace of the restarts",
            "properties": {
                "first_namespaces": {
                    "type": "array", "items": {"type": "string", "minLength": 1},
                    "default": _default(spec.PlanSpec, "first_namespaces"),
                    "description": "the first restart tier (default: [platform-test], where"
                    " the reference target is installed)",
                },
                "tier_label": {
                    "type": "string", "minLength": 1,
                    "default": _default(spec.PlanSpec, "tier_label"),
                    "description": "namespace label or annotation ordering the tiers"
                    " (default skewprobe.io/restart-tier)",
                },
                "max_pod_age": {"type": "string", "pattern": DAYS,
                                "description": "older pods are the long tail",
                                "default": _duration_of(spec.PlanSpec, "max_pod_age_s", _CALENDAR)},
                "tier_every": {"type": "string", "pattern": DAYS,
                               "description": "one tier restarted per",
                               "default": _duration_of(spec.PlanSpec, "tier_every_s", _CALENDAR)},
                "soak": {"type": "string", "pattern": DAYS,
                         "description": "wait after each fleet restart",
                         "default": _duration_of(spec.PlanSpec, "soak_s", _CALENDAR)},
            },
        },
        "inventory": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "snapshot_every": {
                    **_duration,
                    "description": "how often the pod inventory is written to the store",
                    "default": _duration_of(spec.Config, "inventory_every_s"),
                },
            },
        },
        "cohort": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "by": {"type": "string", "minLength": 1,
                       "default": _default(spec.CohortSpec, "by")},
                "baseline": {"type": "string"},
                "canary": {"type": "string"},
            },
        },
        "paths": {"type": "array", "minItems": 1, "items": _path},
        "window": _with(_duration, _duration_of(spec.JudgingSettings, "window_s")),
        "verdict": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "alpha": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5,
                          "default": _default(spec.JudgingSettings, "alpha")},
                "min_samples": {"type": "integer", "minimum": 1,
                                "default": _default(spec.JudgingSettings, "min_samples")},
                "warmup": _with(_duration, _duration_of(spec.JudgingSettings, "warmup_s")),
                "tolerances": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        name: {"type": "number", "minimum": minimum,
                               "default": _default(spec.Tolerances, name)}
                        for name, minimum in (
                            ("success_rate_drop_pp", 0), ("latency_p99_ratio", 1),
                            ("latency_p99_margin_ms", 0), ("attempts_ratio", 1),
                            ("stream_resets_ratio", 1), ("stream_resets_margin_per_hour", 0))
                    },
                },
            },
        },
        "probe": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_in_flight": {"type": "integer", "minimum": 1,
                                  "default": _default(spec.Config, "max_in_flight")},
                "max_rate": {"type": "string", "pattern": RATE,
                             "default": f"{_default(spec.Config, 'max_rate_per_s'):g}/s"},
                "cohort_balance_max": {"type": "number", "minimum": 1,
                                       "default": _default(spec.Config,
                                                           "cohort_balance_max")},
            },
        },
        "store": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"path": {"type": "string", "minLength": 1,
                                    "default": _default(spec.Config, "store")}},
        },
        "listen": {"type": "string", "pattern": r"^[^\s]+:[0-9]{1,5}$",
                   "default": _default(spec.Config, "listen")},
        "api": _api,
        "source": {"enum": ["store", "prometheus"], "default": _default(spec.Config, "source")},
        "prometheus": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url"],
            "properties": {
                "url": {"type": "string", "pattern": "^https?://"},
                "selector": {"type": "string",
                             "default": _default(spec.PrometheusSettings, "selector")},
                "step": {"type": "string", "pattern": DURATION},
                "timeout": {"type": "string", "pattern": DURATION,
                            "default": _duration_of(spec.PrometheusSettings, "timeout_s")},
                "lookback": {"type": "string", "pattern": DURATION,
                             "default": _duration_of(spec.PrometheusSettings, "lookback_s")},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    },
    "if": {"properties": {"source": {"const": "prometheus"}}, "required": ["source"]},
    "then": {"required": ["prometheus"]},
}
