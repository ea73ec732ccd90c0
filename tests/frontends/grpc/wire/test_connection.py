"""naiad's HTTP/2 connection driven frame by frame (an hpack encoder plays the client, a fake
transport records what the server sends): calls, errors, flow control, streams, pings, GOAWAY."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import hpack
from tritonclient.grpc import service_pb2 as pb

from naiad.config.options import GrpcOptions
from naiad.frontends.connections import ConnectionLimit
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.connection import Connection
from naiad.frontends.grpc.wire.framing import CallError
from naiad.frontends.grpc.wire.router import Route

Request = pb.ModelInferRequest


async def echo(request: Request, context: Any) -> pb.ModelInferResponse:
    if request.model_name == "fail":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request: fail")
    if request.model_name == "wait":
        await asyncio.sleep(30)
    return pb.ModelInferResponse(id=request.id, model_name="x" * int(request.model_version or 0))


async def chat(requests: AsyncIterator[Request], context: Any) -> None:
    async for request in requests:
        await context.write(pb.ModelStreamInferResponse(error_message=request.id))


ROUTES = {b"/t.S/Echo": Route("Echo", Request, echo, False, False),
          b"/t.S/Chat": Route("Chat", Request, chat, True, True)}


class FakeTransport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def writelines(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.data += piece

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close


@dataclass
class Stream:
    headers: list[tuple[str, str]] = field(default_factory=list)
    data: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None
    frames: list[f.Frame] = field(default_factory=list)


class Client:
    """The client side: encodes requests, decodes what the connection answered."""

    def __init__(self, options: GrpcOptions | None = None, routes: dict[bytes, Route] | None = None,
                 limit: ConnectionLimit | None = None) -> None:
        self.transport = FakeTransport()
        self.connection = Connection(routes or ROUTES, options or GrpcOptions(), set(), limit)
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.reader = f.FrameReader(1 << 24)
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.send(f.PREFACE + f.settings({}))
        self.streams: dict[int, Stream] = {}
        self.connection_frames: list[f.Frame] = []

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    def headers(self, stream_id: int, path: str, end: bool = False, **extra: str) -> bytes:
        pairs = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                 ("content-type", "application/grpc"), ("te", "trailers"), *extra.items()]
        flags = f.END_HEADERS | (f.END_STREAM if end else 0)
        return f.frame(f.HEADERS, flags, stream_id, self.encoder.encode(pairs))

    def call(self, stream_id: int, path: str, request: Request, **extra: str) -> None:
        self.send(self.call_frames(stream_id, path, request, **extra))

    def call_frames(self, stream_id: int, path: str, request: Request, **extra: str) -> bytes:
        """A unary call's HEADERS and its one message, ending the stream."""
        body = request.SerializeToString()
        message = b"\x00" + len(body).to_bytes(4, "big") + body
        return self.headers(stream_id, path, **extra) + f.frame(f.DATA, f.END_STREAM, stream_id, message)

    def received(self) -> dict[int, Stream]:
        """Decode everything sent so far into per-stream results."""
        for frame in self.reader.feed(bytes(self.transport.data)):
            if frame.stream_id == 0:
                self.connection_frames.append(frame)
                continue
            stream = self.streams.setdefault(frame.stream_id, Stream())
            stream.frames.append(frame)
            if frame.kind == f.HEADERS:
                decoded = self.decoder.decode(frame.payload)
                if frame.flags & f.END_STREAM:
                    stream.trailers = {k: v for k, v in decoded if not k.startswith(":")}
                    if not stream.headers:
                        stream.headers = decoded
                else:
                    stream.headers = decoded
            elif frame.kind == f.DATA:
                stream.data += frame.payload
            elif frame.kind == f.RST_STREAM:
                stream.reset = f.parse_u32(frame.payload, "RST_STREAM")
        self.transport.data.clear()
        return self.streams


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _messages(data: bytes) -> list[bytes]:
    out = []
    while data:
        size = int.from_bytes(data[1:5], "big")
        out.append(data[5:5 + size])
        data = data[5 + size:]
    return out


# ------------------------------------------------------------------------------------- tests


def test_settings_are_exchanged() -> None:
    async def body() -> None:
        client = Client()
        client.received()
        kinds = [(x.kind, x.flags) for x in client.connection_frames]
        assert kinds == [(f.SETTINGS, 0), (f.WINDOW_UPDATE, 0), (f.SETTINGS, f.ACK)]
        assert f.parse_settings(client.connection_frames[0].payload)[f.INITIAL_WINDOW_SIZE] == 8 << 20

    run(body)


def test_unary_call_and_errors() -> None:
    async def body() -> None:
        client = Client()
        client.call(1, "/t.S/Echo", Request(id="one"))
        client.call(3, "/t.S/Echo", Request(model_name="fail"))
        client.call(5, "/t.S/Nope", Request())
        await settle()
        streams = client.received()
        assert streams[1].headers == [(":status", "200"), ("content-type", "application/grpc")]
        assert pb.ModelInferResponse.FromString(_messages(streams[1].data)[0]).id == "one"
        assert streams[1].trailers == {"grpc-status": "0"}
        assert streams[3].trailers == {"content-type": "application/grpc", "grpc-status": "3",
                                       "grpc-message": "bad request: fail"}
        assert streams[3].data == b""
        assert streams[5].trailers["grpc-status"] == "12"
        assert streams[5].trailers["grpc-message"] == "Method not found: /t.S/Nope"
        assert not client.connection.calls

    run(body)


def test_flow_control_holds_data_until_the_client_opens_its_window() -> None:
    async def body() -> None:
        client = Client()
        client.send(f.settings({f.INITIAL_WINDOW_SIZE: 10}))
        client.call(1, "/t.S/Echo", Request(model_version="100"))  # a ~110-byte answer
        await settle()
        stream = client.received()[1]
        assert len(stream.data) == 10 and not stream.trailers
        client.send(f.window_update(1, 40))
        assert len(client.received()[1].data) == 50
        client.send(f.settings({f.INITIAL_WINDOW_SIZE: 1000}))  # raises every stream's window
        stream = client.received()[1]
        assert stream.trailers == {"grpc-status": "0"}
        assert pb.ModelInferResponse.FromString(_messages(stream.data)[0]).model_name == "x" * 100

    run(body)


def test_data_frames_respect_the_clients_frame_size_and_connection_window() -> None:
    async def body() -> None:
        client = Client()
        client.call(1, "/t.S/Echo", Request(model_version="70000"))
        await settle()
        stream = client.received()[1]
        assert max(len(x.payload) for x in stream.frames if x.kind == f.DATA) <= f.DEFAULT_MAX_FRAME
        assert len(stream.data) == f.DEFAULT_WINDOW and not stream.trailers  # the connection window
        client.send(f.window_update(0, 100_000) + f.window_update(1, 100_000))
        stream = client.received()[1]
        assert stream.trailers == {"grpc-status": "0"}
        assert len(pb.ModelInferResponse.FromString(_messages(stream.data)[0]).model_name) == 70000

    run(body)


def test_headers_in_continuation_frames_and_padding() -> None:
    async def body() -> None:
        client = Client()
        block = client.encoder.encode([(":method", "POST"), (":path", "/t.S/Echo"), ("x-pad", "y" * 100)])
        body_ = Request(id="cont").SerializeToString()
        message = b"\x00" + len(body_).to_bytes(4, "big") + body_
        padded = bytes((3,)) + message + b"\x00" * 3
        client.send(f.frame(f.HEADERS, 0, 1, block[:10]) + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[10:])
                    + f.frame(f.DATA, f.END_STREAM | f.PADDED, 1, padded))
        await settle()
        assert client.received()[1].trailers == {"grpc-status": "0"}

    run(body)


def test_bidirectional_stream() -> None:
    async def body() -> None:
        client = Client()
        client.send(client.headers(1, "/t.S/Chat"))
        for name in ("a", "b"):
            data = Request(id=name).SerializeToString()
            client.send(f.frame(f.DATA, 0, 1, b"\x00" + len(data).to_bytes(4, "big") + data))
            await settle()
        stream = client.received()[1]
        assert [pb.ModelStreamInferResponse.FromString(m).error_message for m in _messages(stream.data)] == ["a", "b"]
        assert not stream.trailers
        client.send(f.frame(f.DATA, f.END_STREAM, 1, b""))
        await settle()
        assert client.received()[1].trailers == {"grpc-status": "0"}

    run(body)


def test_reset_cancels_the_call_and_deadlines_expire() -> None:
    async def body() -> None:
        client = Client()
        client.call(1, "/t.S/Echo", Request(model_name="wait"))
        await settle()
        (call,) = client.connection.calls.values()
        client.send(f.rst_stream(1, f.CANCEL))
        await settle()
        assert call.task is not None and call.task.done() and not client.connection.calls
        assert not client.received().get(1, Stream()).trailers  # nothing is sent on a reset stream
        client.call(3, "/t.S/Echo", Request(model_name="wait"), **{"grpc-timeout": "20m"})
        while not client.received().get(3, Stream()).trailers:  # the 20 ms, however late the loop runs
            await asyncio.sleep(0.01)
        assert client.received()[3].trailers["grpc-status"] == "4"  # DEADLINE_EXCEEDED

    run(body)


def test_message_size_limit() -> None:
    async def body() -> None:
        client = Client(GrpcOptions(max_message_size=50))
        client.call(1, "/t.S/Echo", Request(id="x" * 60))
        client.call(3, "/t.S/Echo", Request(model_version="100"))  # a small request, a big answer
        await settle()
        streams = client.received()
        assert streams[1].trailers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
        assert streams[1].trailers["grpc-message"] == "grpc: received message larger than max (62 vs. 50)"
        assert streams[3].trailers["grpc-status"] == "8"

    run(body)


def test_pings_are_answered_until_they_are_too_many() -> None:
    async def body() -> None:
        client = Client(GrpcOptions(http2_max_ping_strikes=1, keepalive_permit_without_calls=True))
        client.received()
        client.connection_frames.clear()
        client.send(f.frame(f.PING, 0, 0, b"12345678"))
        client.received()
        assert [(x.kind, x.flags, x.payload) for x in client.connection_frames] == [(f.PING, f.ACK, b"12345678")]
        client.send(f.frame(f.PING, 0, 0, b"2" * 8) + f.frame(f.PING, 0, 0, b"3" * 8))
        client.received()
        goaway = client.connection_frames[-1]
        assert goaway.kind == f.GOAWAY and goaway.payload[4:8] == f.ENHANCE_YOUR_CALM.to_bytes(4, "big")
        assert goaway.payload[8:] == b"too_many_pings" and client.transport.closed

    run(body)


def test_go_away_refuses_new_calls_and_protocol_errors_close() -> None:
    async def body() -> None:
        client = Client()
        client.call(1, "/t.S/Echo", Request(model_name="wait"))
        client.connection.go_away()
        client.call(3, "/t.S/Echo", Request())
        streams = client.received()
        assert streams[3].reset == f.REFUSED_STREAM
        assert client.connection_frames[-1].kind == f.GOAWAY and not client.transport.closed
        client.connection.calls[1].fail(CallError(grpc.StatusCode.UNAVAILABLE, "going away"))
        assert client.transport.closed  # the last call ended: the connection closes

        broken = Client()
        broken.send(f.frame(f.HEADERS, f.END_HEADERS, 2, b""))  # even stream ids are the server's
        broken.received()
        assert broken.connection_frames[-1].kind == f.GOAWAY and broken.transport.closed
        bad = Client.__new__(Client)
        bad.transport, bad.connection = FakeTransport(), Connection(ROUTES, GrpcOptions(), set())
        bad.connection.connection_made(bad.transport)  # type: ignore[arg-type]
        bad.connection.data_received(b"GET / HTTP/1.1\r\n\r\n")
        assert bad.transport.closed

    run(body)


def test_keepalive_pings_and_gives_up_without_an_answer() -> None:
    async def body() -> None:
        options = GrpcOptions(keepalive_time_ms=20, keepalive_timeout_ms=30, keepalive_permit_without_calls=True)
        client = Client(options)
        await asyncio.sleep(0.03)
        client.received()
        (ping,) = [x for x in client.connection_frames if x.kind == f.PING]
        assert not ping.flags & f.ACK
        client.send(f.frame(f.PING, f.ACK, 0, ping.payload))  # answered: the connection stays
        await asyncio.sleep(0.025)
        assert not client.transport.closed
        await asyncio.sleep(0.1)  # the next pings go unanswered
        assert client.transport.closed
        client.connection.connection_lost(None)

    run(body)


def test_keepalive_ticks_while_a_ping_is_unanswered_do_not_use_up_its_pings() -> None:
    """A client slower to answer than the keepalive interval: the ticks that find the first ping
    unanswered send nothing, so they must not count; once it is answered, the pings go on."""
    async def body() -> None:
        options = GrpcOptions(keepalive_time_ms=20, keepalive_timeout_ms=5000, keepalive_permit_without_calls=True)
        client = Client(options)
        await asyncio.sleep(0.1)  # the first ping at 20 ms; the ticks at 40, 60 and 80 ms find it unanswered
        client.received()
        (ping,) = [x for x in client.connection_frames if x.kind == f.PING and not x.flags & f.ACK]
        client.send(f.frame(f.PING, f.ACK, 0, ping.payload))
        for _ in range(100):  # the next tick, 20 ms on, pings again: a second (bounded) at most
            await asyncio.sleep(0.02)
            client.received()
            if len([x for x in client.connection_frames if x.kind == f.PING and not x.flags & f.ACK]) > 1:
                break
        assert len([x for x in client.connection_frames if x.kind == f.PING and not x.flags & f.ACK]) == 2
        client.connection.connection_lost(None)

    run(body)


def test_a_stream_whose_reader_falls_behind_gets_no_window_back_until_it_catches_up() -> None:
    """Back-pressure: requests queued unread hold back the stream's window, so a client cannot
    stream faster than the server consumes; reading them gives the window back."""
    release = asyncio.Event()
    read: list[str] = []

    async def slow_reader(requests: AsyncIterator[Request], context: Any) -> None:
        await release.wait()
        async for request in requests:
            read.append(request.id)

    async def body() -> None:
        client = Client(routes={b"/t.S/Slow": Route("Slow", Request, slow_reader, True, True)})
        client.send(client.headers(1, "/t.S/Slow"))
        payload = Request(id="x", raw_input_contents=[b"\0" * ((1 << 20) - 64)]).SerializeToString()
        message = b"\x00" + len(payload).to_bytes(4, "big") + payload
        window, sent = 8 << 20, 0  # the stream window the server announced; what we sent

        def granted() -> int:
            frames = client.received().get(1, Stream()).frames
            given = sum(f.parse_u32(x.payload, "WINDOW_UPDATE") for x in frames if x.kind == f.WINDOW_UPDATE)
            frames.clear()
            return given

        for _ in range(30):  # a client that would stream 30 MiB, within the window it is given
            window += granted()
            if window < len(message):
                break
            client.send(f.frame(f.DATA, 0, 1, message))
            window -= len(message)
            sent += 1
            await settle()
        assert sent < 16  # held back: the window stopped coming while the reader was behind
        release.set()
        await settle()
        assert len(read) == sent
        assert granted() > 0  # caught up: the window is back

    run(body)


def _answer_now(request: Request, call: Any) -> bool:
    """A `Route.soon` that answers on the spot, as the inference service does when it can."""
    call.answer(pb.ModelInferResponse(id=request.id, model_name="x" * int(request.model_version or 0)))
    return True


SOON_ROUTES = {b"/t.S/Echo": Route("Echo", Request, echo, False, False, soon=_answer_now)}


def test_a_unary_answer_goes_out_as_headers_one_data_frame_and_trailers() -> None:
    async def body() -> None:
        client = Client(routes=SOON_ROUTES)
        client.received()
        client.call(1, "/t.S/Echo", Request(id="one", model_version="3"))
        await settle()
        stream = client.received()[1]
        assert [(x.kind, x.flags) for x in stream.frames] == [
            (f.HEADERS, f.END_HEADERS), (f.DATA, 0), (f.HEADERS, f.END_HEADERS | f.END_STREAM)]
        assert stream.headers == [(":status", "200"), ("content-type", "application/grpc")]
        assert pb.ModelInferResponse.FromString(_messages(stream.data)[0]).id == "one"
        assert stream.trailers == {"grpc-status": "0"}
        assert not client.connection.calls  # the call is over
        assert client.connection.flow.sending == {}

    run(body)


def test_a_unary_answer_the_window_cannot_take_waits_for_it() -> None:
    async def body() -> None:
        client = Client(routes=SOON_ROUTES)
        client.send(f.settings({f.INITIAL_WINDOW_SIZE: 10}))
        client.call(1, "/t.S/Echo", Request(model_version="100"))  # a ~110-byte answer
        await settle()
        stream = client.received()[1]
        assert stream.headers and len(stream.data) == 10 and not stream.trailers
        client.send(f.window_update(1, 1000))
        stream = client.received()[1]
        assert stream.trailers == {"grpc-status": "0"}
        assert pb.ModelInferResponse.FromString(_messages(stream.data)[0]).model_name == "x" * 100
        assert not client.connection.calls

    run(body)


def test_a_unary_answer_waits_while_the_socket_is_full_and_one_too_large_is_refused() -> None:
    async def body() -> None:
        client = Client(GrpcOptions(max_message_size=50), routes=SOON_ROUTES)
        client.received()
        client.connection.pause_writing()
        client.call(1, "/t.S/Echo", Request(id="a"))
        await settle()
        held = client.received()[1]
        assert held.data == b"" and not held.trailers  # no DATA while the socket is full
        client.connection.resume_writing()
        await settle()
        stream = client.received()[1]
        assert pb.ModelInferResponse.FromString(_messages(stream.data)[0]).id == "a"
        assert stream.trailers == {"grpc-status": "0"}
        client.call(3, "/t.S/Echo", Request(model_version="100"))  # too large to send
        await settle()
        stream = client.received()[3]
        assert stream.trailers["grpc-status"] == "8" and stream.data == b""

    run(body)


def test_the_only_calls_answer_is_written_at_once() -> None:
    # One request at a time (c=1), answered later (a model process's answer): the answer goes to
    # the socket as it is made, not at the end of the loop's turn; the call's bookkeeping comes
    # after, while the client reads.
    held: list[tuple[Request, Any]] = []

    async def body() -> None:
        client = Client(routes={b"/t.S/Echo": Route("Echo", Request, echo, False, False, soon=_holding(held))})
        await settle()
        client.received()
        client.call(1, "/t.S/Echo", Request(id="now"))
        request, call = held.pop()
        call.answer(pb.ModelInferResponse(id=request.id))
        stream = client.received()[1]  # no turn of the loop in between
        assert pb.ModelInferResponse.FromString(_messages(stream.data)[0]).id == "now"
        assert stream.trailers == {"grpc-status": "0"}

    run(body)


def test_answers_made_inside_one_read_go_out_in_one_write() -> None:
    # Calls answered while their read is handled (one open at a time, each answered on the spot)
    # leave with the read's one write, not one write each.
    async def body() -> None:
        client = Client(routes=SOON_ROUTES)
        await settle()
        client.received()
        writes = []
        client.transport.writelines = writes.append  # type: ignore[method-assign]
        client.send(b"".join(client.call_frames(i, "/t.S/Echo", Request(id=str(i))) for i in (1, 3, 5)))
        assert len(writes) == 1
        for piece in writes[0]:
            client.transport.data += piece
        streams = client.received()
        ids = [pb.ModelInferResponse.FromString(_messages(streams[i].data)[0]).id for i in (1, 3, 5)]
        assert ids == ["1", "3", "5"]

    run(body)


def _holding(held: list[tuple[Request, Any]]) -> Callable[[Request, Any], bool]:
    """A `Route.soon` that keeps each call open, to be answered later by the test."""
    def hold(request: Request, call: Any) -> bool:
        held.append((request, call))
        return True
    return hold


def test_answers_of_calls_open_together_go_out_in_one_write() -> None:
    held: list[tuple[Request, Any]] = []

    async def body() -> None:
        client = Client(routes={b"/t.S/Echo": Route("Echo", Request, echo, False, False, soon=_holding(held))})
        await settle()
        client.received()
        for stream_id in (1, 3, 5):
            client.call(stream_id, "/t.S/Echo", Request(id=str(stream_id)))
        writes = []
        client.transport.writelines = writes.append  # type: ignore[method-assign]
        for request, call in held:  # answered in one turn of the loop, as a batch's responses are
            call.answer(pb.ModelInferResponse(id=request.id))
        await settle()
        assert len(writes) == 1  # the end of the turn took them all, the last one included
        for piece in writes[0]:
            client.transport.data += piece
        streams = client.received()
        ids = [pb.ModelInferResponse.FromString(_messages(streams[i].data)[0]).id for i in (1, 3, 5)]
        assert ids == ["1", "3", "5"]
        assert all(streams[i].trailers == {"grpc-status": "0"} for i in (1, 3, 5))

    run(body)
