"""How a stream ended, from a status code and grpc core's detail text (pure).

The texts are what grpcio 1.85 reported against real servers (the reference target and the
raw HTTP/2 server in tests/servers/h2raw.py; tests/integration/test_streams_prober.py and
tests/integration/test_hostile_grpc.py check the same classes end to end).
"""

from __future__ import annotations

import pytest

from probes.clients import EndReason, classify_stream_end

CASES = [
    ("OK", "", EndReason.SERVER_CLOSED_OK),
    # A server drained the connection: GOAWAY, then the socket closed under the stream.
    ("UNAVAILABLE", "Stream removed (Socket closed (GOAWAY received; Error code: 0; Debug "
                    "Text: ))", EndReason.GOAWAY),
    ("UNAVAILABLE", "Stream removed (GOAWAY received; Error code: 0; Debug Text: )",
     EndReason.GOAWAY),
    # grpc core servers: max_connection_age_grace over / shutdown grace over, after GOAWAY.
    ("UNAVAILABLE", "max connection age", EndReason.GOAWAY),
    ("UNAVAILABLE", "Cancelling all calls", EndReason.GOAWAY),
    # RST_STREAM maps to a status by its error code; the class is the frame's.
    ("INTERNAL", "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))",
     EndReason.RST_STREAM),
    ("INTERNAL", "Received RST_STREAM with error code 0", EndReason.RST_STREAM),
    ("CANCELLED", "Stream removed (RST_STREAM (Received RST_STREAM with error code 8))",
     EndReason.RST_STREAM),
    ("UNAVAILABLE", "Stream removed (RST_STREAM (Received RST_STREAM with error code 7))",
     EndReason.RST_STREAM),
    ("UNAVAILABLE", "Stream removed (recvmsg:Connection reset by peer (104))",
     EndReason.CONNECTION_RESET),
    ("UNAVAILABLE", "Stream removed (Socket closed)", EndReason.CONNECTION_RESET),
    ("UNAVAILABLE", "keepalive watchdog timeout", EndReason.CONNECTION_RESET),
    ("UNKNOWN", "Stream removed", EndReason.CONNECTION_RESET),
    # The server sent HTTP/2 grpc core could not parse; it tore the connection down.
    ("UNKNOWN", "Stream removed (Failed parsing HTTP/2 (Frame size 16777215 is larger than "
                "max frame size 4194304))", EndReason.PROTOCOL_ERROR),
    ("INTERNAL", "Stream removed (Failed parsing HTTP/2 (Illegal hpack op code))",
     EndReason.PROTOCOL_ERROR),
    # A message over the client's receive limit.
    ("RESOURCE_EXHAUSTED", "Stream removed (CLIENT: Received message larger than max "
                           "(52428800 vs. 4194304))", "grpc_RESOURCE_EXHAUSTED"),
    ("DEADLINE_EXCEEDED", "Deadline Exceeded", EndReason.DEADLINE),
    ("CANCELLED", "stream cancelled by ingress", EndReason.CANCELLED),
    ("INTERNAL", "max_stream_duration reached (emulated stream reset)", "grpc_INTERNAL"),
    ("UNAVAILABLE", "upstream connect error or disconnect/reset before headers",
     "grpc_UNAVAILABLE"),
    ("unimplemented", "Method not found!", "grpc_UNIMPLEMENTED"),
]

REFUSED = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
           "Failed to connect to remote host: Connection refused")
DNS = ("errors resolving nohost.invalid:80: [field:hostname lookup error:address lookup "
       "failed for nohost.invalid:80: Domain name not found]")


@pytest.mark.parametrize(("code", "details", "reason"), CASES)
def test_classes(code, details, reason):
    assert classify_stream_end(code, details) == reason


def test_refused_is_for_streams_that_never_opened():
    assert classify_stream_end("UNAVAILABLE", REFUSED, established=False) == EndReason.REFUSED
    assert classify_stream_end("UNAVAILABLE", REFUSED) == EndReason.CONNECTION_RESET


def test_a_name_that_does_not_resolve_is_refused():
    assert classify_stream_end("UNAVAILABLE", DNS, established=False) == EndReason.REFUSED


def test_which_reasons_are_resets():
    resets = {EndReason.GOAWAY, EndReason.RST_STREAM, EndReason.CONNECTION_RESET,
              EndReason.PROTOCOL_ERROR, EndReason.DEADLINE, EndReason.CANCELLED, "grpc_INTERNAL"}
    others = {EndReason.SERVER_CLOSED_OK, EndReason.CLIENT_ROTATED, EndReason.CLIENT_STOPPED,
              EndReason.REFUSED, EndReason.PROBE_ERROR}
    assert all(EndReason.is_reset(r) for r in resets)
    assert not any(EndReason.is_reset(r) for r in others)


def test_the_streams_package_exports_what_it_names():
    import probes.streams as streams

    for name in streams.__all__:
        assert hasattr(streams, name), name
        assert not name.startswith("_")
    assert sorted(streams.__all__) == sorted(set(streams.__all__))
