"""The public surface of probes.clients: exports, the registry, the Prober protocol."""

from __future__ import annotations

import pytest

import probes.clients as clients
from probes.clients import (
    PROBERS,
    GrpcProber,
    HttpProber,
    Prober,
    RelayProber,
    build_prober,
)
from probes.errors import BadInput
from probes.spec import GrpcSpec, HttpSpec, PathSpec, StreamSpec
from tests.reference import GRPCIO, HTTPCORE, OWN, GrpcioProber, HttpcoreProber


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


def test_the_product_has_one_client_per_protocol():
    """No option picks another client: the library ones are test references only."""
    assert not hasattr(clients, "registry_for")
    h2 = PathSpec("h", 1.0, 1.0, http=HttpSpec(version="2"))
    with pytest.raises(TypeError):
        HttpProber(h2, h2_client="httpcore")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        GrpcProber(PathSpec("g", 1.0, 1.0, grpc=GrpcSpec()), client="grpcio")  # type: ignore[call-arg]


def test_each_reference_takes_the_place_of_one_of_the_products_clients():
    """The conformance suite's references (tests/reference/) differ from the product's
    registry in the one client each is the reference for; the relay asks on the probe's own."""
    h2 = PathSpec("h", 1.0, 1.0, http=HttpSpec(version="2"))
    unary = PathSpec("g", 1.0, 1.0, grpc=GrpcSpec())
    built = {c.name: (type(c.build(h2)), type(c.build(unary))) for c in (OWN, HTTPCORE, GRPCIO)}
    assert built == {
        "lean": (HttpProber, GrpcProber),
        "httpcore": (HttpcoreProber, GrpcProber),
        "grpcio": (HttpProber, GrpcioProber),
    }
    assert OWN.probers is PROBERS
    assert {c.probers["relay"] for c in (HTTPCORE, GRPCIO)} == {RelayProber}
