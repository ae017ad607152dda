"""The public surface of probes.clients: exports, the registry, the Prober protocol."""

from __future__ import annotations

import pytest

import probes.clients as clients
from probes._exceptions import BadInput
from probes._spec import GrpcSpec, HttpSpec, PathSpec, StreamSpec
from probes.clients import (
    PROBERS,
    GrpcProber,
    HttpProber,
    Prober,
    RelayProber,
    build_prober,
    registry_for,
)


def test_all_names_exist_and_nothing_private_is_exported():
    for name in clients.__all__:
        assert hasattr(clients, name), name
        assert not name.startswith("_")
    assert sorted(clients.__all__) == sorted(set(clients.__all__))


def test_registry_maps_path_kinds_to_probers():
    assert set(PROBERS) == {"http", "grpc", "relay"}
    assert PROBERS["relay"] is RelayProber
    http = build_prober(PathSpec("h", 1.0, 1.0, http=HttpSpec()))
    grpc = build_prober(PathSpec("g", 1.0, 1.0, grpc=GrpcSpec()))
    assert isinstance(http, HttpProber) and isinstance(http, Prober)
    assert isinstance(grpc, GrpcProber) and isinstance(grpc, Prober)


def test_registry_is_read_only_and_can_be_replaced_per_call():
    with pytest.raises(TypeError):
        PROBERS["x"] = HttpProber  # type: ignore[index]
    path = PathSpec("h", 1.0, 1.0, http=HttpSpec())
    built = build_prober(path, {"http": GrpcProberFromHttp})
    assert isinstance(built, GrpcProberFromHttp)


class GrpcProberFromHttp(HttpProber):
    """A stand-in factory, to show the registry is a parameter."""


def test_a_kind_without_a_prober_is_bad_input():
    with pytest.raises(BadInput, match="no prober for 'stream'"):
        build_prober(PathSpec("s", 1.0, 1.0, stream=StreamSpec()))


def test_wrong_spec_for_the_prober_is_bad_input():
    with pytest.raises(BadInput):
        HttpProber(PathSpec("g", 1.0, 1.0, grpc=GrpcSpec()))
    with pytest.raises(BadInput):
        GrpcProber(PathSpec("h", 1.0, 1.0, http=HttpSpec()))


def test_registry_for_picks_the_http2_and_grpc_clients():
    registry = registry_for(http2_client="httpcore", grpc_client="grpcio")
    assert isinstance(registry["http"](PathSpec("h", 1.0, 1.0, http=HttpSpec())), HttpProber)
    assert isinstance(registry["grpc"](PathSpec("g", 1.0, 1.0, grpc=GrpcSpec())), GrpcProber)
    with pytest.raises(BadInput, match="HTTP/2 client"):
        HttpProber(PathSpec("h", 1.0, 1.0, http=HttpSpec()), h2_client="curl")
    with pytest.raises(BadInput, match="gRPC client"):
        GrpcProber(PathSpec("g", 1.0, 1.0, grpc=GrpcSpec()), client="curl")
