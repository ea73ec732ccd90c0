"""Fuzz naiad's own HTTP/2 transport for gRPC: the gRPC message reader (5-byte prefix,
reassembly across DATA frames, gzip / deflate), the HTTP/2 frame reader and payload parsers,
and the HPACK header decoder. Valid streams split anywhere give back what was sent; broken ones
end in the transport's own errors (CallError for a call, ProtocolError for the connection) —
never another exception."""

from __future__ import annotations

import zlib

import hpack
from hypothesis import given
from hypothesis import strategies as st

from fuzz.strategies import fuzz_settings, mutated
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.framing import CallError, MessageReader, pack
from naiad.frontends.grpc.wire.headers import HeaderDecoder

_MAX_MESSAGE = 64


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)], strict=True)]


def _read_messages(reader: MessageReader, chunks: list[bytes]) -> list[bytes]:
    return [bytes(message) for chunk in chunks for message in reader.feed(chunk)]


@given(st.lists(st.binary(max_size=_MAX_MESSAGE), max_size=4), st.sampled_from([None, "gzip", "deflate"]),
       st.lists(st.integers(0, 10_000), max_size=6))
@fuzz_settings(300)
def test_messages_split_anywhere(messages: list[bytes], encoding: str | None, cuts: list[int]) -> None:
    stream = b"".join(part for message in messages for part in pack(message, encoding))
    reader = MessageReader(_MAX_MESSAGE, encoding)
    assert _read_messages(reader, _split(stream, cuts)) == messages


@given(st.lists(st.binary(max_size=_MAX_MESSAGE), max_size=3)
       .flatmap(lambda messages: mutated(b"".join(part for m in messages for part in pack(m, "gzip")))),
       st.sampled_from([None, "gzip", "deflate", "snappy"]), st.lists(st.integers(0, 10_000), max_size=4))
@fuzz_settings(300)
def test_broken_message_streams(stream: bytes, encoding: str | None, cuts: list[int]) -> None:
    reader = MessageReader(_MAX_MESSAGE, encoding)
    try:
        messages = _read_messages(reader, _split(stream, cuts))
    except CallError as error:
        assert error.message
        return
    assert all(len(message) <= _MAX_MESSAGE for message in messages)


@given(st.integers(1, 100), st.binary(max_size=200))
@fuzz_settings(100)
def test_zip_bomb_is_cut_at_the_limit(factor: int, seed: bytes) -> None:
    # A small compressed message that inflates past the limit is refused, not inflated whole.
    body = zlib.compress(seed * factor * 100 + b"\0" * 10_000)
    reader = MessageReader(_MAX_MESSAGE, "deflate")
    try:
        reader.feed(b"\x01" + len(body).to_bytes(4, "big") + body)
    except CallError as error:
        assert "larger than max" in error.message
    else:
        raise AssertionError("an oversized inflated message was accepted")


_frames = st.builds(
    lambda kind, flags, stream, payload: f.frame(kind, flags, stream, payload),
    st.integers(0, 12), st.integers(0, 255), st.integers(0, 2**32 - 1), st.binary(max_size=40),
)


@given(st.lists(_frames, max_size=5), st.lists(st.integers(0, 10_000), max_size=6))
@fuzz_settings(200)
def test_frames_split_anywhere(encoded: list[bytes], cuts: list[int]) -> None:
    reader = f.FrameReader(f.DEFAULT_MAX_FRAME)
    got = [frame for chunk in _split(b"".join(encoded), cuts) for frame in reader.feed(chunk)]
    assert [f.frame(frame.kind, frame.flags, frame.stream_id, frame.payload) for frame in got] == [
        item[:5] + (int.from_bytes(item[5:9], "big") & f.MAX_WINDOW).to_bytes(4, "big") + item[9:]
        for item in encoded
    ]


@given(st.lists(_frames, max_size=4).flatmap(lambda encoded: mutated(b"".join(encoded))))
@fuzz_settings(200)
def test_broken_frame_streams(stream: bytes) -> None:
    reader = f.FrameReader(64)
    try:
        frames = reader.feed(stream)
    except f.ProtocolError as error:
        assert error.code == f.FRAME_SIZE_ERROR
        return
    assert sum(9 + len(frame.payload) for frame in frames) <= len(stream)


@given(st.integers(0, 255), st.binary(max_size=40))
@fuzz_settings(200)
def test_frame_payloads(flags: int, payload: bytes) -> None:
    for parse in (lambda: f.unpad(flags, payload), lambda: f.parse_settings(payload),
                  lambda: f.parse_u32(payload, "WINDOW_UPDATE")):
        try:
            value = parse()
        except f.ProtocolError as error:
            assert str(error)
            continue
        if isinstance(value, bytes):
            assert len(value) <= len(payload)


_header_lists = st.lists(st.tuples(st.binary(min_size=1, max_size=12), st.binary(max_size=12)), max_size=5)


@given(_header_lists, st.booleans())
@fuzz_settings(200)
def test_header_blocks_round_trip(headers: list[tuple[bytes, bytes]], huffman: bool) -> None:
    block = hpack.Encoder().encode(headers, huffman=huffman)
    decoder = HeaderDecoder(1 << 16)
    assert decoder.decode(block) == headers
    # Decoded again (the cached path for all-indexed blocks) the answer stays the same.
    assert decoder.decode(block) == decoder.decode(block)


@given(_header_lists.flatmap(lambda headers: mutated(hpack.Encoder().encode(headers))) | st.binary(max_size=40))
@fuzz_settings(300)
def test_broken_header_blocks(block: bytes) -> None:
    decoder = HeaderDecoder(1 << 12)
    try:
        headers = decoder.decode(block)
    except f.ProtocolError as error:
        assert error.code == f.COMPRESSION_ERROR
        return
    assert all(isinstance(name, bytes) and isinstance(value, bytes) for name, value in headers)
