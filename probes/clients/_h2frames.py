"""The lean HTTP/2 client's codec: frames as bytes, the request's HPACK block, answers'
header blocks decoded (BENCHMARKS.md D15).

h2 is a general state machine: for every call it HPACK-encodes every request header in
Python (searching its dynamic table) and builds frame objects for every frame in and out.
A probe sends the same request to an endpoint every second, so here the request's header
block is encoded once per endpoint (HPACK without the dynamic table: static-table indices
and plain literals), and per call only the request id (and gRPC's deadline) are appended as
literals. Answers are decoded with `hpack`'s decoder (the one h2 uses), so the server's
dynamic table is followed exactly; a block whose decoding leaves the table as it was is
kept by its bytes and reused while the table is unchanged (a server answers a probe with
the same block every second). No state of a connection or a stream lives here: that is
`_h2own`'s.
"""

from __future__ import annotations

from typing import cast

import hpack
from hpack.table import HeaderTable

from probes.clients._h2base import Header

__all__ = [
    "ACK",
    "CANCEL",
    "CONTINUATION",
    "DATA",
    "DEFAULT_WINDOW",
    "END_HEADERS",
    "END_STREAM",
    "GOAWAY",
    "HEADERS",
    "MAX_FRAME",
    "PADDED",
    "PING",
    "PREFACE",
    "PRIORITY_FLAG",
    "PROTOCOL_ERROR",
    "PUSH_PROMISE",
    "RST_STREAM",
    "SETTINGS",
    "S_HEADER_TABLE",
    "S_MAX_FRAME",
    "S_MAX_LIST",
    "S_MAX_STREAMS",
    "S_PUSH",
    "S_WINDOW",
    "WINDOW_UPDATE",
    "BlockDecoder",
    "encode_block",
    "frame",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types (RFC 9113 §6)
DATA, HEADERS, _PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
# Flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE as this client announces it (the default)
DEFAULT_WINDOW = 65535
# Error codes
PROTOCOL_ERROR = 0x1
CANCEL = 0x8
# SETTINGS identifiers (RFC 9113 §6.5.2)
S_HEADER_TABLE, S_PUSH, S_MAX_STREAMS, S_WINDOW, S_MAX_FRAME, S_MAX_LIST = range(1, 7)

_STATIC = {pair: i for i, pair in reversed(list(enumerate(HeaderTable.STATIC_TABLE, 1)))}
_STATIC_NAMES = {name: i for (name, _), i in reversed(list(_STATIC.items()))}


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with `first`'s high bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _int(len(data), 7, 0) + data  # not Huffman-coded


def encode_block(headers: list[Header]) -> bytes:
    """HPACK for a request, without the dynamic table: an exact static-table match as an
    index, otherwise a literal without indexing (its name indexed when the static table
    has it)."""
    out = bytearray()
    for name, value in headers:
        index = _STATIC.get((name, value))
        if index is not None:
            out += _int(index, 7, 0x80)
            continue
        name_index = _STATIC_NAMES.get(name)
        if name_index is not None:
            out += _int(name_index, 4, 0x00) + _string(value)
        else:
            out += b"\x00" + _string(name) + _string(value)
    return bytes(out)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags))
            + stream_id.to_bytes(4, "big") + payload)


_DECODED_MAX = 8


class _TableState:
    """What decides how a header block decodes: the dynamic table's length, its newest
    entry (held, compared by identity: a new entry is a new object) and its size limit."""

    __slots__ = ("length", "maxsize", "newest")

    def __init__(self, length: int, newest: object, maxsize: int) -> None:
        self.length = length
        self.newest = newest
        self.maxsize = maxsize

    def same(self, other: _TableState) -> bool:
        return (self.length == other.length and self.newest is other.newest
                and self.maxsize == other.maxsize)


class BlockDecoder:
    """The server's header blocks, decoded as hpack decodes them; raises `hpack.HPACKError`
    for a block that does not decode (the connection's COMPRESSION_ERROR)."""

    __slots__ = ("_decoded", "_decoded_at", "_decoder")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = max_header_list_size
        # Blocks decoded without changing the dynamic table, by their bytes.
        self._decoded: dict[bytes, list[Header]] = {}
        self._decoded_at: _TableState | None = None

    def decode(self, block: bytes) -> list[Header]:
        """hpack's decoding of `block`, or the same block's earlier result when the dynamic
        table is as it was then and that decoding left it unchanged (so the block refers to
        the same entries and inserts none)."""
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = _TableState(len(entries), entries[0] if entries else None, table.maxsize)
        if self._decoded_at is not None and before.same(self._decoded_at):
            hit = self._decoded.get(block)
            if hit is not None:
                return hit
        else:
            self._decoded.clear()
            self._decoded_at = None
        headers = cast(list[Header], self._decoder.decode(block, raw=True))
        after = _TableState(len(entries), entries[0] if entries else None, table.maxsize)
        if before.same(after):
            if len(self._decoded) < _DECODED_MAX:
                self._decoded[block] = headers
                self._decoded_at = after
        else:
            self._decoded.clear()
            self._decoded_at = None
        return headers
