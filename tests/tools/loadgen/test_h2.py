"""The lean gRPC-over-HTTP/2 client, against hand-made server frames: header blocks (a server
that indexes its headers), trailers, errors, PINGs, flow control for large requests."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack

from naiad.tools.loadgen import h2


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def write(self, data: Any) -> None:
        self.data += data

    def close(self) -> None:
        pass


def frames(raw: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame after the client preface."""
    out, i = [], len(h2.PREFACE) if raw.startswith(h2.PREFACE) else 0
    while i < len(raw):
        length = int.from_bytes(raw[i:i + 3], "big")
        out.append((raw[i + 3], raw[i + 4], struct.unpack(">I", raw[i + 5:i + 9])[0], raw[i + 9:i + 9 + length]))
        i += 9 + length
    return out


def connection() -> tuple[h2.H2Connection, FakeTransport, list[tuple[Any, bool, str, bytes]]]:
    done: list[tuple[Any, bool, str, bytes]] = []

    def on_done(owner: Any, ok: bool, error: str, message: bytes) -> None:
        done.append((owner, ok, error, message))

    async def make() -> h2.H2Connection:
        return h2.H2Connection("host:1", on_done)

    conn = asyncio.run(make())
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport, done


def test_request_block_decodes_and_leaves_the_servers_table_alone() -> None:
    decoder = hpack.Decoder()
    path = "/inference.GRPCInferenceService/ModelInfer"
    headers = decoder.decode(h2.request_block(path, "h:1", {"x-k": "v"}))
    assert headers == [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "h:1"),
                       ("content-type", "application/grpc"), ("te", "trailers"), ("x-k", "v")]
    assert len(decoder.header_table.dynamic_entries) == 0


def test_calls_complete_on_trailers_from_a_server_that_indexes_headers() -> None:
    conn, transport, done = connection()
    encoder = hpack.Encoder()  # indexes what it sends: later blocks refer to the dynamic table
    conn.data_received(h2.frame(h2.SETTINGS, 0, 0))
    for call in range(4):
        conn.call(f"call{call}", "/svc/M", h2.grpc_message(b"req"), keep=True)
        stream = 2 * call + 1
        reply = (h2.frame(h2.HEADERS, h2.END_HEADERS, stream,
                          encoder.encode([(":status", "200"), ("content-type", "application/grpc")]))
                 + h2.frame(h2.DATA, 0, stream, h2.grpc_message(b"answer"))
                 + h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream,
                            encoder.encode([("grpc-status", "0"), ("grpc-message", "")])))
        conn.data_received(reply[:7])  # frames split anywhere across reads
        conn.data_received(reply[7:])
    assert [(d[0], d[1]) for d in done] == [(f"call{i}", True) for i in range(4)]
    assert done[-1][3] == h2.grpc_message(b"answer")
    sent = frames(bytes(transport.data))
    assert any(kind == h2.SETTINGS and flags == h2.ACK for kind, flags, _, _ in sent)
    assert [s for kind, _, s, _ in sent if kind == h2.HEADERS] == [1, 3, 5, 7]


def test_errors_carry_the_status_and_message() -> None:
    conn, _, done = connection()
    conn.call("c", "/svc/M", h2.grpc_message(b"x"))
    trailers = hpack.Encoder().encode([(":status", "200"), ("grpc-status", "3"),
                                       ("grpc-message", "unexpected%20shape")])
    conn.data_received(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, trailers))
    assert done == [("c", False, "gRPC status 3: unexpected shape", b"")]
    conn.call("d", "/svc/M", h2.grpc_message(b"x"))
    conn.data_received(h2.frame(h2.RST_STREAM, 0, 3, struct.pack(">I", 8)))
    assert done[-1][1] is False and "reset" in done[-1][2]


def test_pings_are_answered() -> None:
    conn, transport, _ = connection()
    conn.data_received(h2.frame(h2.PING, 0, 0, b"12345678"))
    assert (h2.PING, h2.ACK, 0, b"12345678") in frames(bytes(transport.data))


def test_large_requests_wait_for_the_servers_window() -> None:
    conn, transport, _ = connection()
    conn.data_received(h2.frame(h2.SETTINGS, 0, 0))  # default windows: 65,535 bytes
    message = h2.grpc_message(b"\x01" * 100_000)
    conn.call("big", "/svc/M", message)
    data = [f for f in frames(bytes(transport.data)) if f[0] == h2.DATA]
    assert sum(len(f[3]) for f in data) == 65_535 and all(len(f[3]) <= 16_384 for f in data)
    assert not any(f[1] & h2.END_STREAM for f in data)
    increment = struct.pack(">I", 100_000)
    conn.data_received(h2.frame(h2.WINDOW_UPDATE, 0, 0, increment) + h2.frame(h2.WINDOW_UPDATE, 0, 1, increment))
    data = [f for f in frames(bytes(transport.data)) if f[0] == h2.DATA]
    assert b"".join(f[3] for f in data) == message
    assert data[-1][1] & h2.END_STREAM
