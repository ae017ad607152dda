"""The validated configuration as plain frozen data.

`probes.config` parses and validates YAML into these; everything downstream (engine,
clients, verdict) reads only these types, never raw YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from probes.types import Endpoint

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_ATTEMPTS_MAX",
    "DEFAULT_COHORT_BALANCE_MAX",
    "DEFAULT_LISTEN",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_MAX_RATE_PER_S",
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_STORE_PATH",
    "DEFAULT_WARMUP_S",
    "DEFAULT_WINDOW_S",
    "ApiSpec",
    "ApiTlsSpec",
    "CohortSpec",
    "Config",
    "ExpectSpec",
    "FileTargetsSpec",
    "GrpcSpec",
    "HttpSpec",
    "JudgingSettings",
    "KubernetesSpec",
    "PathSpec",
    "PlanSpec",
    "PrometheusSettings",
    "RelaySpec",
    "SkewPolicy",
    "StreamSpec",
    "TlsSpec",
    "Tolerances",
    "VersionSource",
]

def _ro(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class TlsSpec:
    """TLS towards the target. `ca`, `cert` and `key` are file paths (mTLS when cert is set)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False


@dataclass(frozen=True, slots=True)
class HttpSpec:
    """One HTTP call. `version` is "1.1" or "2" (h2c prior knowledge on http://, ALPN on https://)."""

    method: str = "GET"
    path: str = "/"
    version: str = "1.1"
    scheme: str = "http"
    headers: Mapping[str, str] = field(default_factory=lambda: _ro(None))
    body: bytes | None = None
    tls: TlsSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", _ro(self.headers))


@dataclass(frozen=True, slots=True)
class GrpcSpec:
    """One gRPC unary call.

    `method` is a full method name (`/pkg.Service/Method`); the request is sent as raw
    protobuf bytes (`request`; empty bytes encode a message with every field at its default,
    valid for any message type), so the probe needs no generated code for the callee.
    `health_service` set (possibly "") means the standard `grpc.health.v1.Health/Check`.
    """

    method: str = "/grpc.health.v1.Health/Check"
    request: bytes = b""
    metadata: Mapping[str, str] = field(default_factory=lambda: _ro(None))
    health_service: str | None = None
    tls: TlsSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", _ro(self.metadata))


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """Long-lived server-streaming gRPC calls held open per endpoint (issue: streams)."""

    method: str = "/grpc.health.v1.Health/Watch"
    request: bytes = b""
    per_endpoint: int = 1
    metadata: Mapping[str, str] = field(default_factory=lambda: _ro(None))
    health_service: str | None = None
    max_lifetime_s: float | None = None
    tls: TlsSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", _ro(self.metadata))


@dataclass(frozen=True, slots=True)
class RelaySpec:
    """A call made *through* a relay pod (the reference target's `/relay/<destination>`):
    the endpoints probed are the relay pods, `destination` a name in their allowlist.
    `callees` (labels) picks the destination's pods in discovery: an answer from one of them
    that discovery removed, or a refused connection to an address only a removed one held,
    is `stale_endpoint`. Empty: staleness is not judged. `version`: the HTTP version the
    relay pods are asked in ("1.1", or "2": h2c, which the reference target also speaks)."""

    destination: str
    callees: Mapping[str, str] = field(default_factory=lambda: _ro(None))
    version: str = "1.1"

    def __post_init__(self) -> None:
        object.__setattr__(self, "callees", _ro(self.callees))


@dataclass(frozen=True, slots=True)
class ExpectSpec:
    """What counts as success. HTTP statuses outside `status` are http_4xx / http_5xx /
    unexpected_status; gRPC codes outside `grpc_codes` are grpc_<CODE>."""

    status: tuple[int, ...] = (200,)
    grpc_codes: tuple[str, ...] = ("OK",)


@dataclass(frozen=True, slots=True)
class PathSpec:
    """A path: what to call, how often per endpoint, under which timeout, on which targets."""

    name: str
    rate_per_s: float = 1.0
    timeout_s: float = 1.0
    http: HttpSpec | None = None
    grpc: GrpcSpec | None = None
    stream: StreamSpec | None = None
    relay: RelaySpec | None = None
    expect: ExpectSpec = ExpectSpec()
    port: str | int | None = None
    selector: Mapping[str, str] = field(default_factory=lambda: _ro(None))
    attempts_header: str = "x-envoy-attempt-count"
    cohort_header: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "selector", _ro(self.selector))

    @property
    def kind(self) -> str:
        if self.http is not None:
            return "http"
        if self.grpc is not None:
            return "grpc"
        if self.relay is not None:
            return "relay"
        return "stream"

    def matches(self, endpoint: Endpoint) -> bool:
        return all(endpoint.labels.get(k) == v for k, v in self.selector.items())


@dataclass(frozen=True, slots=True)
class Tolerances:
    """How much worse the canary may be before a metric fails (verdict issue)."""

    success_rate_drop_pp: float = 0.1
    latency_p99_ratio: float = 1.2
    latency_p99_margin_ms: float = 5.0
    attempts_ratio: float = 1.1
    stream_resets_ratio: float = 1.5
    stream_resets_margin_per_hour: float = 1.0


@dataclass(frozen=True, slots=True)
class CohortSpec:
    by: str = "proxy_version"
    baseline: str | None = None
    canary: str | None = None


@dataclass(frozen=True, slots=True)
class FileTargetsSpec:
    """A file of endpoints (JSON or YAML), re-read when it changes; the local fleet writes one."""

    path: str


@dataclass(frozen=True, slots=True)
class VersionSource:
    """Where a generic mesh keeps the proxy version: exactly one of the four is set.

    `image` names a container whose image tag is the version; `header` names a response
    header, for probing through a Service address where only the response knows the pod.
    """

    label: str | None = None
    annotation: str | None = None
    image: str | None = None
    header: str | None = None


@dataclass(frozen=True, slots=True)
class SkewPolicy:
    """The supported version skew: minor versions the data plane may lag (`behind`) or lead
    (`ahead`) the control plane. The default, one behind and never ahead, is Istio's and
    Linkerd's published support policy for in-place upgrades."""

    behind: int = 1
    ahead: int = 0


@dataclass(frozen=True, slots=True)
class KubernetesSpec:
    """Pods from the Kubernetes API (`probes.discovery.kubernetes`).

    `namespaces` empty means every namespace. `port` is the pod port probed (a number, or
    the name of a container port); unset, the first port the first app container declares.
    `in_cluster` None means: the pod's service account when running in a pod
    (KUBERNETES_SERVICE_HOST set), else `kubeconfig` (default ~/.kube/config).
    """

    mesh: str
    namespaces: tuple[str, ...] = ()
    selector: str = ""
    port: str | int | None = None
    labels: tuple[str, ...] = ()
    version_from: VersionSource | None = None
    mesh_namespace: str | None = None
    control_plane_version: str | None = None
    supported_skew: SkewPolicy = SkewPolicy()
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool | None = None

    @property
    def system_namespace(self) -> str:
        """Where the mesh's control plane (and Istio's ztunnel) runs."""
        if self.mesh_namespace:
            return self.mesh_namespace
        return "linkerd" if self.mesh == "linkerd" else "istio-system"


@dataclass(frozen=True, slots=True)
class PlanSpec:
    """`skewprobe plan`'s choices (`probes.plan`): the first tier's namespaces, the namespace
    label or annotation that orders tiers, the pod age past which a workload is the long
    tail, and the pace of forced restarts (one tier every `tier_every_s`, then `soak_s`)."""

    first_namespaces: tuple[str, ...] = ("platform-test",)
    tier_label: str = "skewprobe.io/restart-tier"
    max_pod_age_s: float = 30 * 86400.0
    tier_every_s: float = 86400.0
    soak_s: float = 86400.0


@dataclass(frozen=True, slots=True)
class ApiTlsSpec:
    """TLS for the probe's own API: `cert` and `key` files; with `client_ca`, only clients
    presenting a certificate it signed complete the handshake (mTLS)."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """Who may read the API. `token_file` holds the bearer token (the token itself never
    sits in the config); read when the probe starts, not at load, since secrets are often
    mounted only where the probe runs."""

    token_file: str | None = None
    tls: ApiTlsSpec | None = None


# The verdict's defaults, each written once: `JudgingSettings` below, the JSON Schema's
# `default`s (`probes._schema`) and every reader of a config take them from here.
DEFAULT_ALPHA = 0.01
DEFAULT_MIN_SAMPLES = 100
DEFAULT_WINDOW_S = 10.0
DEFAULT_WARMUP_S = 120.0
# Upstream attempts one call can make (the proxies' retries + 1): the bound behind the
# attempts-per-request test.
DEFAULT_ATTEMPTS_MAX = 5
DEFAULT_COHORT_BALANCE_MAX = 10.0
# The probe's own: the engine's limits, where it writes and where its API listens.
DEFAULT_MAX_IN_FLIGHT = 1000
DEFAULT_MAX_RATE_PER_S = 20000.0
DEFAULT_STORE_PATH = "skewprobe.db"
DEFAULT_LISTEN = "127.0.0.1:9464"


@dataclass(frozen=True, slots=True)
class JudgingSettings:
    """Everything a verdict judges with, and nothing else (a verdict needs no targets): the
    config's `verdict:` keys, its `window` and `cohort`. The live verdict, the gate, the
    report and the settings `run` records in the store all read this one bundle."""

    tolerances: Tolerances = Tolerances()
    alpha: float = DEFAULT_ALPHA
    min_samples: int = DEFAULT_MIN_SAMPLES
    window_s: float = DEFAULT_WINDOW_S
    cohort: CohortSpec = CohortSpec()
    # A pod's first seconds after it starts (restarted pods run cold): kept out of the
    # cohort comparison, shown apart in the report.
    warmup_s: float = DEFAULT_WARMUP_S
    attempts_max: int = DEFAULT_ATTEMPTS_MAX


@dataclass(frozen=True, slots=True)
class PrometheusSettings:
    """Where the probes' series are: the `prometheus:` keys of the config.

    `selector` is extra label matchers for every query (`job="skewprobe"`, braces optional);
    `step_s` is the window length (None: the config's `window`), at least the scrape
    interval; `lookback_s` is how far back the start of a rollout is looked for.
    `headers` go with every request (e.g. `X-Scope-OrgID` for Mimir, `Authorization`).
    """

    url: str
    selector: str = ""
    step_s: float | None = None
    timeout_s: float = 10.0
    lookback_s: float = 7 * 86400.0
    headers: Mapping[str, str] = field(default_factory=lambda: _ro(None))


@dataclass(frozen=True, slots=True)
class Config:
    source: str = "store"
    paths: tuple[PathSpec, ...] = ()
    static_targets: tuple[Endpoint, ...] = ()
    file_targets: FileTargetsSpec | None = None
    kubernetes: KubernetesSpec | None = None
    judging: JudgingSettings = JudgingSettings()
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    cohort_balance_max: float = DEFAULT_COHORT_BALANCE_MAX
    max_rate_per_s: float = DEFAULT_MAX_RATE_PER_S
    store: str = DEFAULT_STORE_PATH
    listen: str = DEFAULT_LISTEN
    inventory_every_s: float = 60.0
    plan: PlanSpec = PlanSpec()
    # `source: prometheus`: where `/verdict` reads every probe's series.
    prometheus: PrometheusSettings | None = None
    api: ApiSpec = ApiSpec()
