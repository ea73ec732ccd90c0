"""One client's HTTP/2 connection carrying gRPC calls: an asyncio Protocol on the event loop.

It reads frames, keeps the connection's state (settings, flow-control windows, streams, HPACK,
keepalive) and sends what calls queue. Output gathered while handling input, or from calls
that finish in the same loop iteration, goes out in one write.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, cast

from naiad.config.options import GrpcOptions
from naiad.frontends.grpc.wire import age
from naiad.frontends.grpc.wire import frames as f
from naiad.frontends.grpc.wire.call import Call
from naiad.frontends.grpc.wire.headers import HeaderDecoder, response_headers, trailers
from naiad.frontends.grpc.wire.keepalive import PingPolicy, PingSchedule
from naiad.frontends.grpc.wire.router import Route

log = logging.getLogger(__name__)

STREAM_WINDOW = 8 << 20  # what each request stream may send ahead (SETTINGS_INITIAL_WINDOW_SIZE)
CONNECTION_WINDOW = 64 << 20
MAX_FRAME = 1 << 20
MAX_HEADER_LIST = 64 << 10
_UNIMPLEMENTED = 12
_NOT_FOUND = "Method not found: "


class Connection(asyncio.Protocol):
    """Frames in, frames out; calls do the gRPC work."""

    def __init__(self, routes: dict[bytes, Route], options: GrpcOptions, connections: set[Connection]) -> None:
        self.routes = routes
        self.options = options
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.reader = f.FrameReader(MAX_FRAME)
        self.decoder = HeaderDecoder(MAX_HEADER_LIST)
        self.calls: dict[int, Call] = {}
        self.blocked: dict[int, Call] = {}  # calls waiting for flow-control window
        self.last_stream_id = 0
        self.preface: bytes | None = b""  # the client preface received so far; None once complete
        self.partial: tuple[int, int, bytearray] | None = None  # (stream, flags, block) until END_HEADERS
        self.send_window = f.DEFAULT_WINDOW
        self.peer_window = f.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.recv_window = CONNECTION_WINDOW
        self.out: list[bytes | memoryview] = []
        self.flush_scheduled = False
        self.going_away = False
        self._writable = asyncio.Event()
        self._writable.set()
        self.ping_policy = PingPolicy(options)
        self.pings = PingSchedule(options)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._age_ping: bytes | None = None  # the PING between max-age's two GOAWAYs

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.connections.add(self)
        ours = {f.INITIAL_WINDOW_SIZE: STREAM_WINDOW, f.MAX_FRAME_SIZE: MAX_FRAME,
                f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST, f.ENABLE_PUSH: 0}
        self.emit(f.settings(ours) + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW))
        self.flush()
        self._schedule_keepalive()
        limit = age.age_seconds(self.options)
        if limit > 0:
            self._timers["age"] = asyncio.get_running_loop().call_later(limit, self._age_reached)
        if self.options.handshake_timeout_secs > 0:
            # A client that never completes the preface and a first frame holds a socket for
            # nothing (a slow-client attack): gRPC core gives it 120 s, so does naiad by default.
            loop = asyncio.get_running_loop()
            self._timers["handshake"] = loop.call_later(self.options.handshake_timeout_secs, self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        self.flush_scheduled = True  # what this data makes us send goes out in one write, below
        try:
            if self.preface is not None:
                data = self._take_preface(data)
            for frame in self.reader.feed(data):
                self._on_frame(frame)
            self._time_partial_frame()
        except f.ProtocolError as error:
            log.debug("HTTP/2 protocol error from a gRPC client: %s", error)
            self.close(error.code, str(error).encode())
        except Exception:
            log.exception("gRPC connection failed")
            self.close(f.INTERNAL_ERROR)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        for call in list(self.calls.values()):
            call.reset()
        self.calls.clear()
        self.blocked.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def writable(self) -> None:
        """Wait while the socket's send buffer is full (streams writing faster than the client reads)."""
        if not self._writable.is_set():
            await self._writable.wait()

    # -- frames in -------------------------------------------------------------------------

    def _take_preface(self, data: bytes) -> bytes:
        received = self.preface or b""
        need = len(f.PREFACE) - len(received)
        received += data[:need]
        if not f.PREFACE.startswith(received):
            raise f.ProtocolError("not an HTTP/2 client (bad connection preface)")
        self.preface = None if len(received) == len(f.PREFACE) else received
        return data[need:]

    def _on_frame(self, frame: f.Frame) -> None:
        if "handshake" in self._timers:
            self._timers.pop("handshake").cancel()
        if self.partial is not None and frame.kind != f.CONTINUATION:
            raise f.ProtocolError("a header block was interrupted")
        handler = _HANDLERS.get(frame.kind)
        if handler is not None:
            handler(self, frame)

    def _on_data(self, frame: f.Frame) -> None:
        size = len(frame.payload)
        self.recv_window -= size
        if self.recv_window < CONNECTION_WINDOW // 2:
            self.emit(f.window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        if self.recv_window < 0:
            raise f.ProtocolError("the client overran the connection window", f.FLOW_CONTROL_ERROR)
        call = self.calls.get(frame.stream_id)
        if call is None or call.remote_closed:
            return  # a call already answered or reset: its data is dropped
        end = bool(frame.flags & f.END_STREAM)
        call.recv_window -= size
        if not end and not call.backlogged():
            self.refill(call)
        call.receive(f.unpad(frame.flags, frame.payload), end)

    def refill(self, call: Call) -> None:
        """Give a call's window back to the client once half of it is used. A streaming call
        whose reader has fallen behind gets it only as the reader catches up (Call.backlogged):
        that is what stops a client from streaming requests faster than they are served."""
        if call.recv_window < STREAM_WINDOW // 2 and not call.remote_closed:
            self.emit(f.window_update(call.stream_id, STREAM_WINDOW - call.recv_window))
            call.recv_window = STREAM_WINDOW

    def _on_headers(self, frame: f.Frame) -> None:
        block = f.unpad(frame.flags, frame.payload)
        if frame.flags & f.PRIORITY_FLAG:
            block = block[5:]
        if frame.flags & f.END_HEADERS:
            self._on_header_block(frame.stream_id, frame.flags, block)
        else:
            self.partial = (frame.stream_id, frame.flags, bytearray(block))

    def _on_continuation(self, frame: f.Frame) -> None:
        if self.partial is None or self.partial[0] != frame.stream_id:
            raise f.ProtocolError("CONTINUATION without a header block to continue")
        stream_id, flags, block = self.partial
        block += frame.payload
        if len(block) > MAX_HEADER_LIST:
            raise f.ProtocolError("header block too large", f.ENHANCE_YOUR_CALM)
        if frame.flags & f.END_HEADERS:
            self.partial = None
            self._on_header_block(stream_id, flags, bytes(block))

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
        self._start_call(stream_id, headers, end)

    def _start_call(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        if self.going_away:
            self.emit(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        path = next((value for name, value in headers if name == b":path"), b"")
        route = self.routes.get(path)
        if route is None:
            message = _NOT_FOUND + path.decode("latin-1")
            self.emit(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id,
                              trailers(_UNIMPLEMENTED, message, headers_too=True)))
            if not end:
                self.emit(f.rst_stream(stream_id, f.NO_ERROR))
            return
        call = Call(self, stream_id, route, headers, (self.peer_window, STREAM_WINDOW), self.options.max_message_size)
        self.calls[stream_id] = call
        if route.client_streaming:
            call.start()
        if end:
            call.receive(b"", True)

    def _on_rst_stream(self, frame: f.Frame) -> None:
        call = self.calls.pop(frame.stream_id, None)
        self.blocked.pop(frame.stream_id, None)
        if call is not None:
            call.reset()

    def _on_settings(self, frame: f.Frame) -> None:
        if frame.flags & f.ACK:
            return
        values = f.parse_settings(frame.payload)
        if f.INITIAL_WINDOW_SIZE in values:
            window = values[f.INITIAL_WINDOW_SIZE]
            if window > f.MAX_WINDOW:
                raise f.ProtocolError("initial window too large", f.FLOW_CONTROL_ERROR)
            for call in self.calls.values():
                call.window += window - self.peer_window
            self.peer_window = window
        if f.MAX_FRAME_SIZE in values:
            self.peer_max_frame = max(f.DEFAULT_MAX_FRAME, min(values[f.MAX_FRAME_SIZE], MAX_FRAME))
        self.emit(f.frame(f.SETTINGS, f.ACK, 0))
        self._unblock()

    def _on_ping(self, frame: f.Frame) -> None:
        if len(frame.payload) != 8:
            raise f.ProtocolError("PING payload must be 8 bytes", f.FRAME_SIZE_ERROR)
        if frame.flags & f.ACK:
            if self._age_ping is not None and frame.payload == self._age_ping:
                self._age_go_away()
                return
            timer = self._timers.pop("ping_timeout", None)
            if timer is not None:
                timer.cancel()
            return
        if self.ping_policy.received_ping(time.monotonic(), idle=not self.calls):
            self.close(f.ENHANCE_YOUR_CALM, b"too_many_pings")
            return
        self.emit(f.frame(f.PING, f.ACK, 0, frame.payload))

    def _on_goaway(self, frame: f.Frame) -> None:
        self.going_away = True
        if not self.calls and self.transport is not None:
            self.transport.close()

    def _on_window_update(self, frame: f.Frame) -> None:
        increment = f.parse_u32(frame.payload, "WINDOW_UPDATE")
        if frame.stream_id == 0:
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise f.ProtocolError("connection window overflow", f.FLOW_CONTROL_ERROR)
            self._unblock()
            return
        call = self.calls.get(frame.stream_id)
        if call is not None:
            call.window += increment
            if frame.stream_id in self.blocked:
                self._flush_call(call)

    # -- frames out ------------------------------------------------------------------------

    def emit(self, data: bytes | memoryview) -> None:
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(self.out)
        self.out = []

    def send_headers(self, call: Call) -> None:
        call.headers_sent = True
        encoding = call.encoding.encode() if call.encoding else None
        self.emit(f.frame(f.HEADERS, f.END_HEADERS, call.stream_id, response_headers(encoding)))
        self._sent_data()

    def send_data(self, call: Call, pieces: list[bytes]) -> None:
        call.pending.extend(memoryview(piece) for piece in pieces)
        self._flush_call(call)

    def send_trailers(self, call: Call, code: int, message: str) -> None:
        call.closed = True
        call.trailers = trailers(code, message, headers_too=not call.headers_sent)
        self._flush_call(call)

    def _flush_call(self, call: Call) -> None:
        """Send the call's DATA as far as the windows allow, then its trailers."""
        while call.pending:
            budget = min(self.send_window, call.window, self.peer_max_frame)
            if budget <= 0:
                self.blocked[call.stream_id] = call
                return
            self._send_frame_of(call, budget)
        self.blocked.pop(call.stream_id, None)
        if call.trailers is not None:
            self.emit(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, call.stream_id, call.trailers))
            call.trailers = None
            self._end(call)
        self._sent_data()

    def _send_frame_of(self, call: Call, budget: int) -> None:
        pieces: list[memoryview] = []
        taken = 0
        pending = call.pending
        while pending and taken < budget:
            piece = pending[0]
            room = budget - taken
            if len(piece) <= room:
                pieces.append(pending.popleft())
                taken += len(piece)
            else:
                pieces.append(piece[:room])
                pending[0] = piece[room:]
                taken += room
        self.emit(f.head(f.DATA, 0, call.stream_id, taken))
        self.out.extend(pieces)
        self.send_window -= taken
        call.window -= taken

    def _end(self, call: Call) -> None:
        self.calls.pop(call.stream_id, None)
        if not call.remote_closed:
            self.emit(f.rst_stream(call.stream_id, f.NO_ERROR))  # we are done: stop sending
        if self.going_away and not self.calls and self.transport is not None:
            self.flush()
            self.transport.close()

    def _unblock(self) -> None:
        for call in list(self.blocked.values()):
            self._flush_call(call)

    def _sent_data(self) -> None:
        self.ping_policy.sent_data()
        self.pings.sent_data()

    # -- keepalive and shutdown ------------------------------------------------------------

    def _schedule_keepalive(self) -> None:
        if self.pings.interval_s > 0:
            loop = asyncio.get_running_loop()
            self._timers["keepalive"] = loop.call_later(self.pings.interval_s, self._keepalive)

    def _keepalive(self) -> None:
        if self.pings.should_ping(idle=not self.calls) and "ping_timeout" not in self._timers:
            self.emit(f.frame(f.PING, 0, 0, os.urandom(8)))
            loop = asyncio.get_running_loop()
            self._timers["ping_timeout"] = loop.call_later(self.pings.timeout_s, self._ping_timed_out)
        self._schedule_keepalive()

    def _time_partial_frame(self) -> None:
        """A frame begun must end within the handshake timeout too: a client dribbling one
        frame a byte at a time (slowloris after the preface) is closed like a slow preface."""
        if not self.reader.partial:
            if "frame" in self._timers:
                self._timers.pop("frame").cancel()
        elif "frame" not in self._timers and self.options.handshake_timeout_secs > 0:
            loop = asyncio.get_running_loop()
            self._timers["frame"] = loop.call_later(self.options.handshake_timeout_secs, self._frame_timed_out)

    def _frame_timed_out(self) -> None:
        self._timers.pop("frame", None)
        log.debug("gRPC client did not finish a frame in time: closing its connection")
        self.close(f.PROTOCOL_ERROR, b"frame not completed in time")

    def _handshake_timed_out(self) -> None:
        self._timers.pop("handshake", None)
        log.debug("gRPC client did not send the HTTP/2 preface and a frame in time: closing its connection")
        self.close(f.PROTOCOL_ERROR, b"HTTP/2 preface and first frame not received in time")

    def _ping_timed_out(self) -> None:
        log.debug("gRPC client did not answer a keepalive ping: closing its connection")
        if self.transport is not None:
            self.transport.abort()

    def _age_reached(self) -> None:
        """The connection is --grpc-max-connection-age-ms old: end it gracefully, as gRPC core
        does: GOAWAY naming every stream, a PING, and once its answer shows the client has seen
        the GOAWAY, the final GOAWAY; calls then open finish (within the grace) and it closes."""
        self._timers.pop("age", None)
        if self.going_away or self.transport is None:
            return
        log.debug("gRPC connection reached its maximum age: sending GOAWAY")
        self._age_ping = os.urandom(8)
        self.emit(f.goaway(age.MAX_STREAM_ID, f.NO_ERROR, b"max_age"))
        self.emit(f.frame(f.PING, 0, 0, self._age_ping))
        loop = asyncio.get_running_loop()
        self._timers["age_ping"] = loop.call_later(age.PING_WAIT_S, self._age_go_away)
        grace = age.grace_seconds(self.options)
        if grace > 0:
            self._timers["age_grace"] = loop.call_later(grace, self._age_grace_over)

    def _age_go_away(self) -> None:
        timer = self._timers.pop("age_ping", None)
        if timer is not None:
            timer.cancel()
        self._age_ping = None
        if not self.going_away:
            self.go_away()

    def _age_grace_over(self) -> None:
        self._timers.pop("age_grace", None)
        if self.calls:
            log.debug("gRPC calls still open after the maximum connection age's grace: closing")
        self.close()

    def go_away(self) -> None:
        """Stop taking calls; the connection closes once the running ones are answered."""
        self.going_away = True
        self.emit(f.goaway(self.last_stream_id, f.NO_ERROR))
        if not self.calls and self.transport is not None:
            self.flush()
            self.transport.close()

    def close(self, code: int = f.NO_ERROR, debug: bytes = b"") -> None:
        """Close now: GOAWAY with `code`, calls still running are cancelled."""
        self.emit(f.goaway(self.last_stream_id, code, debug))
        self.flush()
        for call in list(self.calls.values()):
            call.reset()
        if self.transport is not None:
            self.transport.close()


_HANDLERS: dict[int, Any] = {
    f.DATA: Connection._on_data,
    f.HEADERS: Connection._on_headers,
    f.CONTINUATION: Connection._on_continuation,
    f.RST_STREAM: Connection._on_rst_stream,
    f.SETTINGS: Connection._on_settings,
    f.PING: Connection._on_ping,
    f.GOAWAY: Connection._on_goaway,
    f.WINDOW_UPDATE: Connection._on_window_update,
}
