"""The library clients the probe's own are proven against: httpcore for HTTP/2
(`httpcore_h2`) and grpc.aio for gRPC unary (`grpcio_unary`).

The product has one client per protocol, its own (BENCHMARKS.md, D6 and D15): written by
hand only because no well-kept library keeps every outcome class honest at its cost. These
references are what "honest" is checked against: the conformance tests
(`tests/integration/conftest.py`) run every HTTP/2 and gRPC unary test on the probe's own
client and on the library's, on the same real loopback servers with the same assertions,
and the benchmarks measure both (`benchmarks/prober_cost.py --options`, `capacity.py
--client`, `fidelity.py --http2-client/--grpc-client`). `python -m tests.reference` runs
`skewprobe` with a reference in place of the probe's own client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from probes.clients import PROBERS, GrpcProber, HttpProber, Prober, ProberFactory, build_prober
from probes.spec import PathSpec
from tests.reference.grpcio_unary import GrpcioProber
from tests.reference.httpcore_h2 import HttpcoreProber

__all__ = [
    "GRPCIO", "GRPC_CLIENTS", "HTTP2_CLIENTS", "HTTPCORE", "OWN", "Clients", "GrpcioProber",
    "HttpcoreProber", "clients",
]


@dataclass(frozen=True, slots=True)
class Clients:
    """One implementation of the clients, named as the benchmarks' options name it: the
    product's registry, or the product's with one library client in place of its own."""

    name: str
    probers: Mapping[str, ProberFactory]

    def build(self, path: PathSpec) -> Prober:
        return build_prober(path, self.probers)


# Each protocol's clients by the name the benchmarks' options give them ("lean": the probe's own).
HTTP2_CLIENTS: Mapping[str, ProberFactory] = {"lean": HttpProber, "httpcore": HttpcoreProber}
GRPC_CLIENTS: Mapping[str, ProberFactory] = {"lean": GrpcProber, "grpcio": GrpcioProber}


def clients(*, http2: str = "lean", grpc: str = "lean") -> Clients:
    """The product's registry with the HTTP/2 and gRPC unary clients named; KeyError for a
    name that is not one."""
    registry = {**PROBERS, "http": HTTP2_CLIENTS[http2], "grpc": GRPC_CLIENTS[grpc]}
    name = "+".join(n for n in (http2, grpc) if n != "lean") or "lean"
    return Clients(name, MappingProxyType(registry))


OWN = Clients("lean", PROBERS)
HTTPCORE = clients(http2="httpcore")
GRPCIO = clients(grpc="grpcio")
