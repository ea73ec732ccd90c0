"""HPACK (RFC 7541) for gRPC: decode request header blocks, encode response headers and trailers.

Decoding uses the `hpack` library, with a cache: gRPC clients send the same header block for
every call once their dynamic table is warm, and a block made only of indexed fields decodes
to the same headers for as long as the table does not change. Responses are encoded as
literals that are never indexed, so the server keeps no encoder state.
"""

from __future__ import annotations

import hpack

from naiad.frontends.grpc.wire.frames import COMPRESSION_ERROR, ProtocolError

Headers = list[tuple[bytes, bytes]]

_CACHE_LIMIT = 256
_STATUS_200 = b"\x88"  # indexed field 8 of the static table
_MESSAGE_LIMIT = 4096  # bytes of percent-encoded grpc-message: keeps trailers within any frame size


class HeaderDecoder:
    """One connection's HPACK decoder, with a cache of all-indexed blocks."""

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, tuple[int, Headers]] = {}
        self._generation = 0  # bumped whenever a block may have changed the dynamic table

    def decode(self, block: bytes) -> Headers:
        cached = self._cache.get(block)
        if cached is not None and cached[0] == self._generation:
            return cached[1]
        try:
            headers = [(bytes(name), bytes(value)) for name, value in self._decoder.decode(block, raw=True)]
        except hpack.HPACKError as error:
            raise ProtocolError(f"bad header block: {error}", COMPRESSION_ERROR) from None
        if _all_indexed(block):
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[block] = (self._generation, headers)
        else:
            self._generation += 1
        return headers


def _all_indexed(block: bytes) -> bool:
    """Whether every field of the block is an indexed field (1xxxxxxx): such a block only reads
    the dynamic table; any other representation may add to it or resize it."""
    position, end = 0, len(block)
    while position < end:
        first = block[position]
        if not first & 0x80:
            return False
        position += 1
        if first & 0x7F == 0x7F:  # the index continues in 7-bit groups
            while position < end and block[position] & 0x80:
                position += 1
            position += 1
    return True


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A field as a literal without indexing, with a literal name and no Huffman coding."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


def response_headers(encoding: bytes | None = None) -> bytes:
    return _HEADERS + literal(b"grpc-encoding", encoding) if encoding else _HEADERS


def trailers(code: int, message: str = "", headers_too: bool = False) -> bytes:
    """The trailers of a call; `headers_too` for a trailers-only answer (no message was sent)."""
    if code == 0 and not message and not headers_too:
        return _TRAILERS_OK  # (almost every call's)
    block = _HEADERS if headers_too else b""
    block += literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", _grpc_message(message))
    return block


# Every response's headers and a successful call's trailers, encoded once.
_HEADERS = _STATUS_200 + literal(b"content-type", b"application/grpc")
_TRAILERS_OK = literal(b"grpc-status", b"0")


def _grpc_message(message: str) -> bytes:
    """The percent-encoded message, shortened (by whole characters) to _MESSAGE_LIMIT bytes."""
    encoded = percent_encode(message)
    while len(encoded) > _MESSAGE_LIMIT:
        message = message[:len(message) * _MESSAGE_LIMIT // len(encoded)]
        encoded = percent_encode(message)
    return encoded


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8 with bytes outside printable ASCII, and '%', as %XX."""
    out = bytearray()
    for byte in message.encode("utf-8", "replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)
