"""The JSON Schema of skewprobe's YAML config: the one source of truth for its keys.

`skewprobe validate --schema` prints it; `probes.config` validates against it with jsonschema
and then applies the checks a schema cannot express (duplicate names, ports that exist).
"""

from __future__ import annotations

from typing import Any

DURATION = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$"
DAYS = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)$"
RATE = r"^[0-9]+(\.[0-9]+)?/(s|m|min|h)$"

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
        "method": {"enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]},
        "path": {"type": "string", "pattern": "^/"},
        "version": {"enum": ["1.1", "2"], "description": "HTTP/1.1, or HTTP/2 (h2c on http)"},
        "scheme": {"enum": ["http", "https"]},
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
        "per_endpoint": {"type": "integer", "minimum": 1, "maximum": 1000},
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
                    "description": "HTTP version the relay pods are asked in (h2c for 2)"},
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
                "behind": {"type": "integer", "minimum": 0},
                "ahead": {"type": "integer", "minimum": 0},
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
        },
        "timeout": _duration,
        "expect": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "status": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "integer", "minimum": 100, "maximum": 599},
                },
                "grpc_codes": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            },
        },
        "port": _port,
        "selector": _str_map,
        "attempts_header": {"type": "string", "minLength": 1},
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
                    "description": "the first restart tier (default: [platform-test], where"
                    " the reference target is installed)",
                },
                "tier_label": {
                    "type": "string", "minLength": 1,
                    "description": "namespace label or annotation ordering the tiers"
                    " (default skewprobe.io/restart-tier)",
                },
                "max_pod_age": {"type": "string", "pattern": DAYS,
                                "description": "older pods are the long tail (default 30d)"},
                "tier_every": {"type": "string", "pattern": DAYS,
                               "description": "one tier restarted per (default 1d)"},
                "soak": {"type": "string", "pattern": DAYS,
                         "description": "wait after each fleet restart (default 1d)"},
            },
        },
        "inventory": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "snapshot_every": {
                    **_duration,
                    "description": "how often the pod inventory is written to the store",
                },
            },
        },
        "cohort": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "by": {"type": "string", "minLength": 1},
                "baseline": {"type": "string"},
                "canary": {"type": "string"},
            },
        },
        "paths": {"type": "array", "minItems": 1, "items": _path},
        "window": _duration,
        "verdict": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "alpha": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
                "min_samples": {"type": "integer", "minimum": 1},
                "warmup": _duration,
                "tolerances": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "success_rate_drop_pp": {"type": "number", "minimum": 0},
                        "latency_p99_ratio": {"type": "number", "minimum": 1},
                        "latency_p99_margin_ms": {"type": "number", "minimum": 0},
                        "attempts_ratio": {"type": "number", "minimum": 1},
                        "stream_resets_ratio": {"type": "number", "minimum": 1},
                        "stream_resets_margin_per_hour": {"type": "number", "minimum": 0},
                    },
                },
            },
        },
        "probe": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_in_flight": {"type": "integer", "minimum": 1},
                "max_rate": {"type": "string", "pattern": RATE},
                "cohort_balance_max": {"type": "number", "minimum": 1},
            },
        },
        "store": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"path": {"type": "string", "minLength": 1}},
        },
        "listen": {"type": "string", "pattern": r"^[^\s]+:[0-9]{1,5}$"},
        "api": _api,
        "source": {"enum": ["store", "prometheus"]},
        "prometheus": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url"],
            "properties": {
                "url": {"type": "string", "pattern": "^https?://"},
                "selector": {"type": "string"},
                "step": {"type": "string", "pattern": DURATION},
                "timeout": {"type": "string", "pattern": DURATION},
                "lookback": {"type": "string", "pattern": DURATION},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    },
    "if": {"properties": {"source": {"const": "prometheus"}}, "required": ["source"]},
    "then": {"required": ["prometheus"]},
}
