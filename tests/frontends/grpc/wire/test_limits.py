"""The hardening limits of naiad's HTTP/2 connection, frame by frame with a fake transport (the
attack suite, tests/frontends/grpc/test_attacks.py, drives the same against a real server)."""

from __future__ import annotations

import asyncio

from frontends.grpc.wire.test_connection import ROUTES, Client, FakeTransport, Request, run, settle

from naiad.config.options import GrpcOptions
from naiad.frontends.connections import ConnectionLimit
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.connection import Connection
from naiad.frontends.grpc.wire.router import Route


class LimitClient(Client):
    def goaway(self) -> f.Frame | None:
        self.received()
        return next((x for x in reversed(self.connection_frames) if x.kind == f.GOAWAY), None)


def _message(request: Request) -> bytes:
    body = request.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def test_a_unary_call_fails_at_the_first_byte_of_a_second_message() -> None:
    async def body() -> None:
        client = LimitClient()
        client.send(client.headers(1, "/t.S/Echo") + f.frame(f.DATA, 0, 1, _message(Request(id="one"))))
        client.send(f.frame(f.DATA, 0, 1, b"\x00"))  # a second message begins
        await settle()
        stream = client.received()[1]
        assert stream.trailers["grpc-status"] == "13"
        assert stream.trailers["grpc-message"] == "grpc: Too many request messages for a unary call"
        assert stream.reset == f.NO_ERROR and not client.connection.calls

    run(body)


def test_streams_past_the_limit_are_refused_and_the_limit_is_announced() -> None:
    async def body() -> None:
        client = LimitClient(GrpcOptions(max_concurrent_streams=2))
        client.received()
        announced = f.parse_settings(client.connection_frames[0].payload)
        assert announced[f.MAX_CONCURRENT_STREAMS] == 2
        for stream_id in (1, 3, 5):
            client.send(client.headers(stream_id, "/t.S/Echo"))
        streams = client.received()
        assert streams[5].reset == f.REFUSED_STREAM and 1 not in streams and 3 not in streams

    run(body)


def test_an_unfinished_header_block_is_timed_out() -> None:
    async def body() -> None:
        client = LimitClient(GrpcOptions(handshake_timeout_secs=0.05))
        block = client.encoder.encode([(":method", "POST"), (":path", "/t.S/Echo")])
        client.send(f.frame(f.HEADERS, 0, 1, block))  # no END_HEADERS, and no CONTINUATION ever
        await asyncio.sleep(0.1)
        goaway = client.goaway()
        assert goaway is not None and goaway.payload[8:] == b"frame not completed in time"
        assert client.transport.closed

    run(body)


def test_a_full_socket_pauses_reading_and_holds_data_until_it_drains() -> None:
    async def body() -> None:
        client = LimitClient()
        client.connection.pause_writing()
        assert not client.transport.reading
        client.call(1, "/t.S/Echo", Request(id="held"))
        await settle()
        assert not client.received()[1].data  # the headers may go, the DATA waits
        client.connection.resume_writing()
        await settle()
        stream = client.received()[1]
        assert stream.data and stream.trailers == {"grpc-status": "0"}
        assert client.transport.reading

    run(body)


def test_a_response_past_the_unsent_limit_fails_and_a_stalled_one_is_reset() -> None:
    async def body() -> None:
        client = LimitClient(GrpcOptions(max_unsent_bytes=100, send_timeout_secs=0.1))
        client.send(f.settings({f.INITIAL_WINDOW_SIZE: 0}))  # the client reads nothing
        client.call(1, "/t.S/Echo", Request(model_version="200"))  # ~200 bytes: waits unsent
        await settle()
        client.call(3, "/t.S/Echo", Request(model_version="10"))  # small, but the connection is full
        await settle()
        streams = client.received()
        assert streams[3].trailers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
        assert "--grpc-max-unsent-bytes" in streams[3].trailers["grpc-message"]
        assert streams[1].reset is None
        await asyncio.sleep(0.2)
        assert client.received()[1].reset == f.CANCEL and not client.connection.calls
        assert client.connection.outbox.unsent == 0

    run(body)


def test_a_connection_idle_past_its_limit_gets_goaway() -> None:
    async def body() -> None:
        client = LimitClient(GrpcOptions(max_connection_idle_ms=50))
        client.call(1, "/t.S/Echo", Request())
        await asyncio.sleep(0.03)
        assert client.goaway() is None  # the call kept it busy, then it idles from its end
        await asyncio.sleep(0.1)
        goaway = client.goaway()
        assert goaway is not None and goaway.payload[8:] == b"max_idle" and client.transport.closed

    run(body)


def test_a_call_refused_from_its_headers_reads_no_body() -> None:
    def admit(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
        token = dict(headers).get(b"authorization")
        return None if token == b"Bearer ok" else (16, "missing bearer token")

    guarded = {path: Route(r.name, r.request_type, r.handler, r.client_streaming, r.server_streaming, admit)
               for path, r in ROUTES.items()}

    async def body() -> None:
        client = LimitClient(routes=guarded)
        client.send(client.headers(1, "/t.S/Echo"))
        streams = client.received()
        assert streams[1].trailers == {"content-type": "application/grpc", "grpc-status": "16",
                                       "grpc-message": "missing bearer token"}
        assert streams[1].reset == f.NO_ERROR and not client.connection.calls
        client.send(f.frame(f.DATA, 0, 1, _message(Request())))  # dropped, never buffered
        client.call(3, "/t.S/Echo", Request(id="in"), authorization="Bearer ok")
        await settle()
        assert client.received()[3].trailers == {"grpc-status": "0"}

    run(body)


def test_floods_past_their_budget_get_goaway() -> None:
    async def body() -> None:
        for flood, options in ((f.frame(f.PRIORITY, 0, 1, b"\0" * 5), GrpcOptions(max_control_frames_per_sec=1)),
                               (f.settings({}), GrpcOptions(max_settings_per_sec=1))):
            client = LimitClient(options)
            client.send(flood * 11)  # bursts of ten seconds' worth: 10
            goaway = client.goaway()
            assert goaway is not None and goaway.payload[4:8] == f.ENHANCE_YOUR_CALM.to_bytes(4, "big")
        client = LimitClient(GrpcOptions(max_resets_per_sec=1))
        for stream_id in range(1, 23, 2):
            client.send(client.headers(stream_id, "/t.S/Echo") + f.rst_stream(stream_id, f.CANCEL))
        goaway = client.goaway()
        assert goaway is not None and b"rapid reset" in goaway.payload

    run(body)


def test_protocol_violations() -> None:
    async def body() -> None:
        for bad, code in ((f.frame(f.DATA, 0, 0, b"x"), f.PROTOCOL_ERROR),
                          (f.window_update(0, 0), f.PROTOCOL_ERROR),
                          (f.frame(f.DATA, 0, 9, b"x"), f.PROTOCOL_ERROR),  # a stream never opened
                          (f.frame(f.PUSH_PROMISE, 0, 1, b"\0" * 4), f.PROTOCOL_ERROR),
                          (f.settings({f.MAX_FRAME_SIZE: 100}), f.PROTOCOL_ERROR)):
            client = LimitClient()
            client.send(bad)
            goaway = client.goaway()
            assert goaway is not None and goaway.payload[4:8] == code.to_bytes(4, "big"), bad
        client = LimitClient()
        client.send(client.headers(1, "/t.S/Chat") + f.window_update(1, 0))
        assert client.received()[1].reset == f.PROTOCOL_ERROR
        client.send(client.headers(3, "/t.S/Chat") + f.window_update(3, f.MAX_WINDOW))
        assert client.received()[3].reset == f.FLOW_CONTROL_ERROR

    run(body)


def test_a_full_server_refuses_a_connection_with_goaway() -> None:
    async def body() -> None:
        limit = ConnectionLimit(1)
        first = LimitClient(limit=limit)
        first.send(first.headers(1, "/t.S/Chat"))  # a call open: busy, cannot make room
        second = LimitClient(limit=limit)
        goaway = second.goaway()
        assert goaway is not None and goaway.payload[4:8] == f.ENHANCE_YOUR_CALM.to_bytes(4, "big")
        assert second.transport.closed and not first.transport.closed

    run(body)


def test_a_frame_dribbled_after_the_handshake_is_timed_out() -> None:
    async def body() -> None:
        client = LimitClient(GrpcOptions(handshake_timeout_secs=0.05))
        client.send(b"\x00\x00")  # the start of a frame's head, in a read with no whole frame
        await asyncio.sleep(0.1)
        goaway = client.goaway()
        assert goaway is not None and goaway.payload[8:] == b"frame not completed in time"

    run(body)


def test_half_a_preface_is_timed_out() -> None:
    async def body() -> None:


        transport = FakeTransport()
        connection = Connection(ROUTES, GrpcOptions(handshake_timeout_secs=0.05), set())
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(f.PREFACE[:10])
        await asyncio.sleep(0.1)
        assert transport.closed and b"preface and first frame not received in time" in transport.data

    run(body)


def test_pings_between_the_messages_of_a_stream_are_not_strikes() -> None:
    """gRPC core clients ping as they receive data (BDP probes): DATA the server sends, not only
    headers, makes a ping welcome again (a long stream used to end in GOAWAY too_many_pings)."""
    async def body() -> None:
        client = LimitClient(GrpcOptions(http2_max_ping_strikes=1, keepalive_permit_without_calls=True))
        client.send(client.headers(1, "/t.S/Chat"))
        for index in range(6):
            client.send(f.frame(f.DATA, 0, 1, _message(Request(id=str(index)))))
            await settle()
            client.send(f.frame(f.PING, 0, 0, b"%08d" % index))
        assert client.goaway() is None and not client.transport.closed

    run(body)


def test_a_streaming_writer_that_waits_past_the_send_timeout_is_reset() -> None:
    async def body() -> None:
        client = LimitClient(GrpcOptions(send_timeout_secs=0.05))
        client.send(client.headers(1, "/t.S/Chat"))
        client.send(f.frame(f.DATA, 0, 1, _message(Request(id="first"))))
        await settle()
        client.connection.pause_writing()  # the client stops reading: its writer must wait
        client.send(f.frame(f.DATA, 0, 1, _message(Request(id="second"))))
        await asyncio.sleep(0.15)
        assert client.received()[1].reset == f.CANCEL and not client.connection.calls

    run(body)
