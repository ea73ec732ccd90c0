"""The pure parts of naiad's gRPC transport: HTTP/2 frames, HPACK with its cache, gRPC message
framing and compression, keepalive policies."""

from __future__ import annotations

import zlib

import grpc
import hpack
import pytest

from naiad.config.options import GrpcOptions
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.framing import CallError, MessageReader, pack
from naiad.frontends.grpc.wire.headers import HeaderDecoder, literal, percent_encode, response_headers, trailers
from naiad.frontends.grpc.wire.keepalive import PingPolicy, PingSchedule

# ----------------------------------------------------------------------------------- frames


def test_frames_round_trip_through_the_reader_in_any_pieces() -> None:
    wire = (f.frame(f.HEADERS, f.END_HEADERS, 1, b"abc") + f.settings({f.MAX_FRAME_SIZE: 20000})
            + f.window_update(3, 7) + f.rst_stream(5, f.CANCEL) + f.goaway(9, f.NO_ERROR, b"bye"))
    reader = f.FrameReader(f.DEFAULT_MAX_FRAME)
    got = [frame for i in range(0, len(wire), 7) for frame in reader.feed(wire[i:i + 7])]
    assert [(x.kind, x.flags, x.stream_id) for x in got] == [
        (f.HEADERS, f.END_HEADERS, 1), (f.SETTINGS, 0, 0), (f.WINDOW_UPDATE, 0, 3), (f.RST_STREAM, 0, 5),
        (f.GOAWAY, 0, 0)]
    assert got[0].payload == b"abc"
    assert f.parse_settings(got[1].payload) == {f.MAX_FRAME_SIZE: 20000}
    assert f.parse_u32(got[2].payload, "x") == 7


def test_frame_errors() -> None:
    with pytest.raises(f.ProtocolError) as caught:
        f.FrameReader(16).feed(f.frame(f.DATA, 0, 1, b"x" * 17))
    assert caught.value.code == f.FRAME_SIZE_ERROR
    with pytest.raises(f.ProtocolError):
        f.parse_settings(b"\x00" * 5)
    with pytest.raises(f.ProtocolError):
        f.unpad(f.PADDED, b"\x05ab")
    assert f.unpad(f.PADDED, b"\x02data\x00\x00") == b"data"
    assert f.unpad(0, b"\x02data") == b"\x02data"


# ------------------------------------------------------------------------------------- HPACK


def test_response_blocks_decode_with_a_standard_decoder() -> None:
    decoder = hpack.Decoder()
    assert decoder.decode(response_headers()) == [(":status", "200"), ("content-type", "application/grpc")]
    assert decoder.decode(response_headers(b"gzip"))[-1] == ("grpc-encoding", "gzip")
    assert decoder.decode(trailers(0)) == [("grpc-status", "0")]
    assert decoder.decode(trailers(5, "no 'x' here: 100%", headers_too=True)) == [
        (":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "5"),
        ("grpc-message", "no 'x' here: 100%25")]
    long_value = b"v" * 300  # lengths past the 7-bit prefix
    assert decoder.decode(literal(b"k" * 200, long_value)) == [("k" * 200, "v" * 300)]


def test_grpc_message_is_percent_encoded_and_capped() -> None:
    assert percent_encode("caf\u00e9 \n%") == b"caf%C3%A9 %0A%25"
    (_, message), = hpack.Decoder().decode(trailers(13, "\u00e9" * 5000))[-1:]
    assert len(message) <= 4096 and message.endswith("%C3%A9")
    assert trailers(13, "x" * 5000).endswith(b"x" * 10)


def test_decoder_cache_follows_the_dynamic_table() -> None:
    encoder, decoder = hpack.Encoder(), HeaderDecoder(1 << 16)
    first = [(":path", "/a/B"), ("x-tenant", "blue")]
    block1 = encoder.encode(first)  # adds both to the dynamic tables
    assert decoder.decode(block1) == [(b":path", b"/a/B"), (b"x-tenant", b"blue")]
    block2 = encoder.encode(first)  # now all indexed: cached
    assert decoder.decode(block2) == decoder.decode(block2) == [(b":path", b"/a/B"), (b"x-tenant", b"blue")]
    # New entries shift the dynamic indexes: the same bytes must not come from the cache.
    decoder.decode(encoder.encode([("x-other", "1"), ("x-more", "2")]))
    assert decoder.decode(block2) != [(b":path", b"/a/B"), (b"x-tenant", b"blue")]
    with pytest.raises(f.ProtocolError):
        HeaderDecoder(1 << 16).decode(b"\xff\xff\xff\xff\x0f")


# -------------------------------------------------------------------------------- messages


def _message(body: bytes, compressed: bool = False) -> bytes:
    return bytes((int(compressed),)) + len(body).to_bytes(4, "big") + body


def test_messages_whole_or_in_any_pieces() -> None:
    wire = _message(b"one") + _message(b"") + _message(b"three" * 100)
    assert [bytes(m) for m in MessageReader(1 << 20, None).feed(wire)] == [b"one", b"", b"three" * 100]
    reader = MessageReader(1 << 20, None)
    got = [bytes(m) for i in range(0, len(wire), 3) for m in reader.feed(wire[i:i + 3])]
    assert got == [b"one", b"", b"three" * 100]


def test_compressed_messages_and_their_errors() -> None:
    body = b"x" * 1000
    gzip_body = zlib.compressobj(wbits=31)
    gzipped = gzip_body.compress(body) + gzip_body.flush()
    assert MessageReader(1 << 20, "gzip").feed(_message(gzipped, True)) == [body]
    assert MessageReader(1 << 20, "deflate").feed(_message(zlib.compress(body), True)) == [body]
    with pytest.raises(CallError) as caught:
        MessageReader(1 << 20, None).feed(_message(b"x", True))
    assert caught.value.code is grpc.StatusCode.INTERNAL
    with pytest.raises(CallError) as caught:
        MessageReader(100, "deflate").feed(_message(zlib.compress(body), True))  # inflates past the limit
    assert caught.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(CallError, match=r"received message larger than max \(101 vs. 100\)"):
        MessageReader(100, None).feed(_message(b"y" * 101)[:20])  # refused as soon as the length is known


def test_pack_is_what_the_reader_reads() -> None:
    for encoding in (None, "gzip", "deflate"):
        wire = b"".join(pack(b"payload" * 50, encoding))
        assert [bytes(m) for m in MessageReader(1 << 20, encoding).feed(wire)] == [b"payload" * 50]
    assert pack(b"p")[0] == b"\x00\x00\x00\x00\x01"


# ------------------------------------------------------------------------------- keepalive


def test_ping_policy_counts_strikes_like_grpc() -> None:
    options = GrpcOptions(http2_min_recv_ping_interval_without_data_ms=1000, http2_max_ping_strikes=2,
                          keepalive_permit_without_calls=True)
    policy = PingPolicy(options)
    assert [policy.received_ping(t, idle=False) for t in (0.0, 0.1, 0.2)] == [False, False, False]
    assert policy.received_ping(0.3, idle=False)  # the third strike
    policy.sent_data()
    assert not policy.received_ping(0.4, idle=False)
    assert not policy.received_ping(1.5, idle=False)  # after the interval: fine
    strict = PingPolicy(GrpcOptions(http2_max_ping_strikes=0))
    assert not any(strict.received_ping(t / 10, idle=True) for t in range(10))  # 0 strikes: unlimited


def test_idle_connections_may_not_ping_unless_permitted() -> None:
    policy = PingPolicy(GrpcOptions(http2_min_recv_ping_interval_without_data_ms=10, http2_max_ping_strikes=1))
    policy.received_ping(0.0, idle=True)
    assert not policy.received_ping(60.0, idle=True)  # 2 h between pings without calls: a strike
    assert policy.received_ping(120.0, idle=True)


def test_ping_schedule() -> None:
    schedule = PingSchedule(GrpcOptions(keepalive_time_ms=1000, http2_max_pings_without_data=2))
    assert schedule.interval_s == 1.0
    assert not schedule.should_ping(idle=True)
    assert [schedule.should_ping(idle=False) for _ in range(3)] == [True, True, False]
    schedule.sent_data()
    assert schedule.should_ping(idle=False)


def test_accept_encoding_values_are_parsed_once_and_a_client_cannot_grow_the_cache() -> None:
    from naiad.frontends.grpc.wire import call

    value = b"identity, deflate,gzip"
    first = call._accepted(value)
    assert first == {"identity", "deflate", "gzip"}
    assert call._accepted(bytes(value)) is first  # the same value: parsed once
    long = b",".join(b"x%d" % i for i in range(100))
    assert len(long) > call._ACCEPTED_LENGTH and "x99" in call._accepted(long)
    assert long not in call._ACCEPTED  # answered, not kept
    for i in range(3 * call._ACCEPTED_LIMIT):
        assert call._accepted(b"gzip,e%d" % i) == {"gzip", f"e{i}"}
    assert len(call._ACCEPTED) <= call._ACCEPTED_LIMIT
