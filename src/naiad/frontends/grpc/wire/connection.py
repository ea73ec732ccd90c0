"""One client's HTTP/2 connection carrying gRPC calls: an asyncio Protocol on the event loop.

It handles each frame and keeps the connection's streams (one `Call` each), HPACK state and the
stream limits a hostile client meets (docs/reliability.md, "Hostile clients"). The rest has its
own object: `Intake` (intake.py) the preface, frame reading, its deadlines and pauses;
`FlowControl` (flow.py) the windows of both directions; `Outbox` (outbox.py) what is sent and
what waits unsent; `Lifetime` (lifetime.py) keepalive, age and idle time; `FloodGuard`
(floods.py) the budgets of frames that ask for nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from naiad.config.options import GrpcOptions
from naiad.frontends.connections import ConnectionLimit
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.call import Call
from naiad.frontends.grpc.wire.floods import FloodGuard
from naiad.frontends.grpc.wire.flow import FlowControl
from naiad.frontends.grpc.wire.headers import HeaderDecoder, response_headers, trailers
from naiad.frontends.grpc.wire.intake import Intake
from naiad.frontends.grpc.wire.lifetime import Lifetime
from naiad.frontends.grpc.wire.outbox import Outbox
from naiad.frontends.grpc.wire.router import Route

log = logging.getLogger(__name__)

STREAM_WINDOW = 8 << 20  # what each request stream may send ahead (SETTINGS_INITIAL_WINDOW_SIZE)
CONNECTION_WINDOW = 64 << 20
MAX_FRAME = 1 << 20
MAX_HEADER_LIST = 64 << 10
MAX_HEADER_FRAMES = 32  # HEADERS + CONTINUATIONs of one header block
_UNIMPLEMENTED = 12
_NOT_FOUND = "Method not found: "


class Connection(asyncio.Protocol):
    """Frames in; calls do the gRPC work; the outbox sends what they answer.

    Over 25 methods for a reason: one handler per HTTP/2 frame type (ten, in _HANDLERS) beside
    asyncio's Protocol methods and the few the calls use; everything else is delegated.
    """

    def __init__(self, routes: dict[bytes, Route], options: GrpcOptions, connections: set[Connection],
                 limit: ConnectionLimit | None = None) -> None:
        self.routes = routes
        self.options = options
        self.connections = connections
        self.limit = limit
        self.transport: asyncio.Transport | None = None
        self.intake = Intake(MAX_FRAME, options.handshake_timeout_secs, self._input_timed_out)
        self.decoder = HeaderDecoder(MAX_HEADER_LIST)
        self.calls: dict[int, Call] = {}
        self.last_stream_id = 0
        self.block: tuple[int, int, bytearray, int] | None = None  # (stream, flags, block, frames) to END_HEADERS
        self.going_away = False
        self.closed = False
        self.now = time.monotonic()  # of the read being handled
        self.flow = FlowControl(STREAM_WINDOW, CONNECTION_WINDOW)
        self.lifetime = Lifetime(self, options)
        self.floods = FloodGuard(options, self.now)
        self.outbox = Outbox(self.flow, options.max_unsent_bytes, options.send_timeout_secs, self._ended,
                             self._stalled, self._data_sent)
        self.intake.block_open = lambda: self.block is not None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.outbox.transport = self.transport
        self.outbox.loop = asyncio.get_running_loop()
        ours = {f.INITIAL_WINDOW_SIZE: STREAM_WINDOW, f.MAX_FRAME_SIZE: MAX_FRAME,
                f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST, f.ENABLE_PUSH: 0}
        if self.options.max_concurrent_streams > 0:
            ours[f.MAX_CONCURRENT_STREAMS] = self.options.max_concurrent_streams
        self.emit(f.settings(ours))
        if self.limit is not None and not self.limit.admit(self):
            log.debug("refusing a gRPC connection: --max-connections reached")
            self.closed = True
            self.emit(f.goaway(0, f.ENHANCE_YOUR_CALM, b"too many connections (--max-connections)"))
            self.outbox.flush()
            self.transport.close()
            return
        self.connections.add(self)
        self.emit(f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW))
        self.outbox.flush()
        self.lifetime.start()
        self.intake.start(self.transport)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.outbox.flush_scheduled = True  # what this data makes us send goes out in one write, below
        self.now = time.monotonic()
        try:
            frames = self.intake.frames(data)
            for frame in frames:
                if self.block is not None and frame.kind != f.CONTINUATION:
                    raise f.ProtocolError("a header block was interrupted")
                handler = _HANDLERS.get(frame.kind)
                if handler is None:
                    self._on_unknown(frame)
                else:
                    handler(self, frame)
                if self.closed:
                    break
            if not self.closed:
                self.intake.took(len(frames), self.now)
        except f.ProtocolError as error:
            log.debug("HTTP/2 protocol error from a gRPC client: %s", error)
            self.close(error.code, str(error).encode())
        except Exception:
            log.exception("gRPC connection failed")
            self.close(f.INTERNAL_ERROR)
        outbox = self.outbox
        if outbox.out:
            outbox.flush()
        else:  # (a request answered later: nothing to write yet, and no flush's call)
            outbox.flush_scheduled = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        if self.limit is not None:
            self.limit.release(self)
        for call in list(self.calls.values()):
            call.reset()
        self.calls.clear()
        self.outbox.close()
        self.lifetime.stop()
        self.intake.stop()
        self.transport = None

    def pause_writing(self) -> None:
        """The client reads slower than we write: keep DATA here, and stop reading its frames
        (whatever they ask for would pile up unsent too)."""
        self.outbox.pause()
        self.intake.pauses.pause("writes")

    def resume_writing(self) -> None:
        self.outbox.resume()
        self.intake.pauses.resume("writes")

    async def writable(self, call: Call) -> None:
        """Wait while the socket is full or the connection holds --grpc-max-unsent-bytes; a call
        that waits past --grpc-send-timeout-secs is reset."""
        if not await self.outbox.room():
            self._stalled(call.stream_id)

    # -- frames in -------------------------------------------------------------------------

    def _on_data(self, frame: f.Frame) -> None:
        stream_id = frame.stream_id
        if stream_id == 0:
            raise f.ProtocolError("DATA on stream 0")
        update, within = self.flow.received(stream_id, len(frame.payload))
        if update is not None:
            self.emit(update)
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id > self.last_stream_id:
                raise f.ProtocolError(f"DATA on stream {stream_id}, which was never opened")
            return  # a call already answered or reset: its data is dropped
        if not within:
            self.reset(call, f.FLOW_CONTROL_ERROR)
            return
        if call.remote_closed:
            return
        end = bool(frame.flags & f.END_STREAM)
        payload = f.unpad(frame.flags, frame.payload)
        if not payload and not end:
            self.floods.count_control(self.now, "empty DATA frames")
        if not end and not call.backlogged():
            self.refill(call)
        call.receive(payload, end)

    def refill(self, call: Call) -> None:
        """Give a call's window back to the client once half of it is used. A call whose reader
        has fallen behind (Call.backlogged) gets it only as the reader catches up: that is what
        stops a client from streaming requests faster than they are served."""
        if not call.remote_closed:
            update = self.flow.refill(call.stream_id)
            if update is not None:
                self.emit(update)

    def _on_headers(self, frame: f.Frame) -> None:
        if frame.stream_id == 0:
            raise f.ProtocolError("HEADERS on stream 0")
        block = f.unpad(frame.flags, frame.payload)
        if frame.flags & f.PRIORITY_FLAG:
            block = block[5:]
        if frame.flags & f.END_HEADERS:
            self._on_header_block(frame.stream_id, frame.flags, block)
            return
        if not block:
            self.floods.count_control(self.now, "empty HEADERS frames")
        self.block = (frame.stream_id, frame.flags, bytearray(block), 1)

    def _on_continuation(self, frame: f.Frame) -> None:
        if self.block is None or self.block[0] != frame.stream_id:
            raise f.ProtocolError("CONTINUATION without a header block to continue")
        stream_id, flags, block, count = self.block
        if not frame.payload:
            self.floods.count_control(self.now, "empty CONTINUATION frames")
        block += frame.payload
        if len(block) > MAX_HEADER_LIST or count >= MAX_HEADER_FRAMES:
            raise f.ProtocolError("header block too large", f.ENHANCE_YOUR_CALM)
        if frame.flags & f.END_HEADERS:
            self.block = None
            self._on_header_block(stream_id, flags, bytes(block))
        else:
            self.block = (stream_id, flags, block, count + 1)

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always: the HPACK state must follow the client's
        end = bool(flags & f.END_STREAM)
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client end its side
            if end:
                call.receive(b"", True)
            return
        if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
            raise f.ProtocolError(f"stream {stream_id} cannot start here")
        self.last_stream_id = stream_id
        if self.going_away or 0 < self.options.max_concurrent_streams <= len(self.calls):
            self.floods.count_reset(self.now)  # refused streams cost like reset ones
            self.emit(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        self._start_call(stream_id, headers, end)

    def _start_call(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        path = b""
        for name, value in headers:  # (a loop: no generator's calls per call)
            if name == b":path":
                path = value
                break
        route = self.routes.get(path)
        refusal = (_UNIMPLEMENTED, _NOT_FOUND + path.decode("latin-1")) if route is None else (
            route.admit(headers) if route.admit is not None else None)
        if refusal is not None:
            # Answered from the headers alone (an unknown method, or a caller without the
            # credentials): whatever body the client sends is dropped, never buffered.
            self.emit(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id,
                              trailers(refusal[0], refusal[1], headers_too=True)))
            if not end:
                self.emit(f.rst_stream(stream_id, f.NO_ERROR))
            return
        assert route is not None
        call = Call(self, stream_id, route, headers, self.options.max_message_size)
        if not self.calls:
            self.lifetime.busy()
            if self.limit is not None:
                self.limit.busy(self)
        self.calls[stream_id] = call
        self.flow.open(stream_id)
        if route.client_streaming:
            call.start()
        if end:
            call.receive(b"", True)

    def _on_rst_stream(self, frame: f.Frame) -> None:
        f.parse_u32(frame.payload, "RST_STREAM")
        if frame.stream_id == 0 or frame.stream_id > self.last_stream_id:
            raise f.ProtocolError(f"RST_STREAM on stream {frame.stream_id}, which was never opened")
        call = self.calls.get(frame.stream_id)
        if call is None:
            self.floods.count_control(self.now, "RST_STREAM of closed streams")
            return
        self.floods.count_reset(self.now)
        self._forget(call)
        call.reset()

    def _on_settings(self, frame: f.Frame) -> None:
        if frame.stream_id != 0:
            raise f.ProtocolError("SETTINGS on a stream")
        if frame.flags & f.ACK:
            self.floods.count_control(self.now, "SETTINGS ACKs")
            return
        self.floods.count_settings(self.now)
        values = f.parse_settings(frame.payload)
        if f.MAX_FRAME_SIZE in values:
            size = values[f.MAX_FRAME_SIZE]
            if not f.DEFAULT_MAX_FRAME <= size <= f.MAX_FRAME_LIMIT:
                raise f.ProtocolError(f"SETTINGS_MAX_FRAME_SIZE {size} out of range")
            self.outbox.max_frame = min(size, MAX_FRAME)
        self.emit(f.frame(f.SETTINGS, f.ACK, 0))
        if f.INITIAL_WINDOW_SIZE in values:
            self.flow.peer_settings(values[f.INITIAL_WINDOW_SIZE])
            self.outbox.drain_all()

    def _on_ping(self, frame: f.Frame) -> None:
        if frame.stream_id != 0:
            raise f.ProtocolError("PING on a stream")
        if len(frame.payload) != 8:
            raise f.ProtocolError("PING payload must be 8 bytes", f.FRAME_SIZE_ERROR)
        if frame.flags & f.ACK:
            if not self.lifetime.ping_acked(frame.payload):
                self.floods.count_control(self.now, "PING ACKs nobody asked for")
            return
        if not self.lifetime.ping(frame.payload, self.now):
            self.close(f.ENHANCE_YOUR_CALM, b"too_many_pings")
            return
        self.emit(f.frame(f.PING, f.ACK, 0, frame.payload))

    def _on_goaway(self, frame: f.Frame) -> None:
        self.floods.count_control(self.now, "GOAWAY")
        self.going_away = True
        if not self.calls:
            self._close_transport()

    def _on_window_update(self, frame: f.Frame) -> None:
        increment = f.parse_u32(frame.payload, "WINDOW_UPDATE")
        stream_id = frame.stream_id
        if stream_id == 0:
            self.flow.granted(0, increment)
            if self.outbox.waiting:
                self.outbox.drain_all()
            else:
                self.floods.count_window_update(self.now, "WINDOW_UPDATEs that free nothing")
            return
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id > self.last_stream_id:
                raise f.ProtocolError(f"WINDOW_UPDATE on stream {stream_id}, which was never opened")
            self.floods.count_control(self.now, "WINDOW_UPDATEs of closed streams")
            return
        if not self.flow.granted(stream_id, increment):
            self.reset(call, f.PROTOCOL_ERROR if increment == 0 else f.FLOW_CONTROL_ERROR)
        elif self.outbox.has_waiting(stream_id):
            self.outbox.drain(stream_id)
        else:
            self.floods.count_window_update(self.now, "WINDOW_UPDATEs that free nothing")

    def _on_priority(self, frame: f.Frame) -> None:
        if frame.stream_id == 0:
            raise f.ProtocolError("PRIORITY on stream 0")
        self.floods.count_control(self.now, "PRIORITY")

    def _on_push_promise(self, frame: f.Frame) -> None:
        raise f.ProtocolError("PUSH_PROMISE from a client")

    def _on_unknown(self, frame: f.Frame) -> None:
        self.floods.count_control(self.now, "frames of unknown types")  # ignored, as RFC 9113 asks

    # -- frames out (for calls) ------------------------------------------------------------

    def emit(self, data: bytes | memoryview) -> None:
        self.outbox.emit(data)

    def send_headers(self, call: Call) -> None:
        call.headers_sent = True
        encoding = call.encoding.encode() if call.encoding else None
        self.emit(f.frame(f.HEADERS, f.END_HEADERS, call.stream_id, response_headers(encoding)))
        self.lifetime.sent_data()

    def answer_unary(self, call: Call, pieces: list[bytes]) -> bool:
        """Headers, the one message and OK trailers of a unary call that sent nothing yet, in one
        go, when the windows and the socket take the message now; False: nothing was sent."""
        encoding = call.encoding.encode() if call.encoding else None
        stream_id = call.stream_id
        # The connection's only call (one request at a time), answered after the read that
        # brought it: its answer is written at once and the call's bookkeeping follows while the
        # client reads it. With more calls open, or inside a read, answers go out together at the
        # end of the turn or of the read (one write).
        if not self.outbox.unary(stream_id, response_headers(encoding), pieces, sum(map(len, pieces)),
                                 trailers(0), len(self.calls) == 1):
            return False
        call.headers_sent = True
        call.closed = True
        self.floods.data_sent()
        self._ended(stream_id)  # (which tells the keepalive policy that data went out)
        return True

    def send_data(self, call: Call, pieces: list[bytes]) -> bool:
        """A message for the client; False when the connection already holds too much unsent."""
        return self.outbox.data(call.stream_id, pieces, sum(len(piece) for piece in pieces))

    def send_trailers(self, call: Call, code: int, message: str) -> None:
        call.closed = True
        self.outbox.trailers(call.stream_id, trailers(code, message, headers_too=not call.headers_sent))

    def reset(self, call: Call, code: int) -> None:
        """End a call at once with RST_STREAM `code`."""
        self._forget(call)
        call.reset()
        self.emit(f.rst_stream(call.stream_id, code))

    def _ended(self, stream_id: int) -> None:
        """The outbox sent a call's trailers."""
        call = self.calls.get(stream_id)
        if call is None:
            return
        self._forget(call)
        if not call.remote_closed:
            self.emit(f.rst_stream(stream_id, f.NO_ERROR))  # we are done: stop sending
        self.lifetime.sent_data()

    def _data_sent(self) -> None:
        self.lifetime.sent_data()  # pings are welcome again
        self.floods.data_sent()  # and WINDOW_UPDATEs answering it free

    def _stalled(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            log.debug("gRPC call sent nothing for --grpc-send-timeout-secs: resetting it")
            self.reset(call, f.CANCEL)

    def _forget(self, call: Call) -> None:
        stream_id = call.stream_id
        if self.calls.pop(stream_id, None) is None:
            return
        self.flow.close(stream_id)
        self.outbox.drop(stream_id)
        if not self.calls:
            self.lifetime.idle(time.monotonic())
            if self.limit is not None:
                self.limit.idle(self)
            if self.going_away and self.transport is not None:
                self.outbox.flush()
                self._close_transport()

    # -- the end ----------------------------------------------------------------------------

    def _input_timed_out(self, why: bytes) -> None:
        log.debug("gRPC client too slow (%s): closing its connection", why.decode())
        self.close(f.PROTOCOL_ERROR, why)

    def evict(self) -> None:
        """Make room for a new connection (--max-connections): this one has no call open."""
        self.go_away(b"too many connections (--max-connections)")

    def go_away(self, debug: bytes = b"") -> None:
        """Stop taking calls; the connection closes once the running ones are answered."""
        self.going_away = True
        self.emit(f.goaway(self.last_stream_id, f.NO_ERROR, debug))
        if not self.calls and self.transport is not None:
            self.outbox.flush()
            self._close_transport()

    def close(self, code: int = f.NO_ERROR, debug: bytes = b"") -> None:
        """Close now: GOAWAY with `code`, calls still running are cancelled."""
        self.emit(f.goaway(self.last_stream_id, code, debug))
        self.outbox.flush()
        for call in list(self.calls.values()):
            call.reset()
        self._close_transport()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _close_transport(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            self.lifetime.closing()


_HANDLERS: dict[int, Any] = {
    f.DATA: Connection._on_data,
    f.HEADERS: Connection._on_headers,
    f.PRIORITY: Connection._on_priority,
    f.RST_STREAM: Connection._on_rst_stream,
    f.SETTINGS: Connection._on_settings,
    f.PUSH_PROMISE: Connection._on_push_promise,
    f.PING: Connection._on_ping,
    f.GOAWAY: Connection._on_goaway,
    f.WINDOW_UPDATE: Connection._on_window_update,
    f.CONTINUATION: Connection._on_continuation,
}
