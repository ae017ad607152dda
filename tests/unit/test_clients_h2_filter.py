"""`_h2lean.FrameFilter`: GOAWAY frames leave the byte stream h2 sees, whatever the reads'
boundaries, and everything else passes through unchanged."""

from __future__ import annotations

import pytest

from probes.clients._h2lean import FrameFilter


def frame(kind: int, payload: bytes, stream: int = 0) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + stream.to_bytes(4, "big") + payload


HEADERS = frame(0x1, b"\x88", stream=1)
DATA = frame(0x0, b"hello", stream=1)
GOAWAY = frame(0x7, (3).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"debug")
WIRE = HEADERS + GOAWAY + DATA


@pytest.mark.parametrize("size", [1, 2, 5, 9, 13, 17, len(WIRE)])
def test_goaway_is_taken_out_at_any_read_size(size: int) -> None:
    scanner = FrameFilter()
    out = b"".join(scanner.feed(WIRE[i : i + size]) for i in range(0, len(WIRE), size))
    assert out == HEADERS + DATA
    assert scanner.goaways == [(3, 0)]


def test_a_read_without_goaway_is_the_same_bytes_object() -> None:
    data = HEADERS + DATA
    assert FrameFilter().feed(data) is data


def test_oversized_frame_and_http1_answer_are_noted() -> None:
    big = FrameFilter()
    big.feed(((1 << 24) - 1).to_bytes(3, "big") + b"\x00" * 6)
    assert big.oversized == (1 << 24) - 1
    http1 = FrameFilter()
    http1.feed(b"HTTP/1.1 400 Bad Request\r\n")
    assert http1.answered_http1
