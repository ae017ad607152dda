"""Which prober runs which kind of path: a registry dict, passed in, never global state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from probes.clients._base import Prober
from probes.clients._grpc import GrpcProber
from probes.clients._http import HttpProber
from probes.clients._relay import RelayProber
from probes.errors import BadInput
from probes.spec import PathSpec

ProberFactory = Callable[[PathSpec], Prober]

# Keyed by PathSpec.kind. Long-lived streams ("stream") get their own module and entry.
PROBERS: Mapping[str, ProberFactory] = MappingProxyType(
    {"http": HttpProber, "grpc": GrpcProber, "relay": RelayProber})


def build_prober(path: PathSpec, registry: Mapping[str, ProberFactory] = PROBERS) -> Prober:
    """The prober for a path, from `registry` (default: HTTP, gRPC unary and relay)."""
    try:
        factory = registry[path.kind]
    except KeyError:
        raise BadInput(f"path {path.name}: no prober for {path.kind!r} paths") from None
    return factory(path)
