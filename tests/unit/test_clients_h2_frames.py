"""`_h2frames`: the request's header block encoded once, and answers' header blocks decoded
once per table state: the results always equal hpack's own decoding, block after block."""

from __future__ import annotations

import hpack

from probes.clients._h2frames import BlockDecoder, encode_block


def test_the_request_block_decodes_to_the_headers_given() -> None:
    headers = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"10.0.0.1:80"),
               (b":path", b"/"), (b"user-agent", b"skewprobe/0.1"),
               (b"x-" + b"p" * 200, b"v" * 300)]
    assert hpack.Decoder().decode(encode_block(headers), raw=True) == headers


def test_decoded_blocks_equal_hpacks_through_table_changes() -> None:
    decoder = BlockDecoder(max_header_list_size=65536)
    encoder, reference = hpack.Encoder(), hpack.Decoder()
    answers = [
        [(b":status", b"200"), (b"content-type", b"application/grpc")],  # inserts
        [(b":status", b"200"), (b"content-type", b"application/grpc")],  # indexed: cached
        [(b":status", b"200"), (b"content-type", b"application/grpc")],
        [(b":status", b"200"), (b"x-pod", b"pod-1")],                    # inserts: a new state
        [(b":status", b"200"), (b"content-type", b"application/grpc")],  # same bytes, new indices
        [(b":status", b"503"), (b"x-pod", b"pod-1")],
    ]
    encoder.header_table_size = 64  # a small table: insertions evict, indices shift
    hits = 0
    for headers in answers:
        block = encoder.encode(headers)
        hits += block in decoder._decoded
        assert decoder.decode(block) == reference.decode(block, raw=True) == headers
    assert hits >= 1
