"""Which prober runs which kind of path: a registry dict, passed in, never global state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from probes._exceptions import BadInput
from probes._spec import PathSpec
from probes.clients._base import Prober
from probes.clients._grpc import GrpcProber
from probes.clients._http import HttpProber
from probes.clients._relay import RelayProber

ProberFactory = Callable[[PathSpec], Prober]

# Keyed by PathSpec.kind. Long-lived streams ("stream") get their own module and entry.
PROBERS: Mapping[str, ProberFactory] = MappingProxyType(
    {"http": HttpProber, "grpc": GrpcProber, "relay": RelayProber})


def registry_for(*, http2_client: str, grpc_client: str) -> Mapping[str, ProberFactory]:
    """The default registry with the HTTP/2 and gRPC unary clients a config picked."""

    def http(path: PathSpec) -> Prober:
        return HttpProber(path, h2_client=http2_client)

    def grpc(path: PathSpec) -> Prober:
        return GrpcProber(path, client=grpc_client)

    # The relay always asks on the probe's own clients (httpcore's pool is what it left).
    return MappingProxyType({"http": http, "grpc": grpc, "relay": RelayProber})


def build_prober(path: PathSpec, registry: Mapping[str, ProberFactory] = PROBERS) -> Prober:
    """The prober for a path, from `registry` (default: HTTP, gRPC unary and relay)."""
    try:
        factory = registry[path.kind]
    except KeyError:
        raise BadInput(f"path {path.name}: no prober for {path.kind!r} paths") from None
    return factory(path)
