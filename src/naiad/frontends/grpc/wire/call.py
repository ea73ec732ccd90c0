"""One gRPC call on one HTTP/2 stream, seen by the servicer as its `context`.

The call reassembles request messages, runs the servicer method as a task and sends what the
method answers. It offers the part of grpc.aio.ServicerContext that naiad's servicer uses
(`invocation_metadata`, `abort`, `write`, `set_compression`, `send_initial_metadata`), so the
same servicer runs on this transport and on grpcio's.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from naiad.frontends.grpc.wire.framing import COMPRESSION_NAMES, CallError, MessageReader, pack
from naiad.frontends.grpc.wire.router import Route

if TYPE_CHECKING:
    from naiad.frontends.grpc.wire.connection import Connection

log = logging.getLogger(__name__)

_END = object()  # the client half-closed the stream
_TOO_MANY = "grpc: Too many request messages for a unary call"
_MISSING = "grpc: Missing request message for a unary call"
_BACKLOG = 4  # messages of a stream waiting unread before its window is held back
_HIDDEN = frozenset({b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"})
# each status's number (StatusCode's value is a tuple behind an enum property: two lookups a call)
_CODE_NUMBERS = {code: int(code.value[0]) for code in grpc.StatusCode}
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class Call:
    """The server side of one call; the connection feeds it and sends what it queues."""

    def __init__(self, connection: Connection, stream_id: int, route: Route,
                 headers: list[tuple[bytes, bytes]], max_message_size: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.route = route
        self.headers = headers
        self.headers_sent = False
        self.closed = False  # trailers sent or the stream reset: nothing more goes out
        self.remote_closed = False
        self.max_message_size = max_message_size
        found = dict(headers)
        self.accepts = _accepted(found.get(b"grpc-accept-encoding", b""))
        encoding = found.get(b"grpc-encoding")
        self.reader = MessageReader(max_message_size, encoding.decode("latin-1") if encoding else None)
        self.requests: list[Any] = []
        self.queue: asyncio.Queue[Any] | None = asyncio.Queue() if route.client_streaming else None
        self.encoding: str | None = None
        self.task: asyncio.Task[None] | None = None
        timeout = found.get(b"grpc-timeout")  # (most calls have none: no call to _deadline)
        self.deadline: asyncio.TimerHandle | None = _deadline(timeout, self) if timeout else None
        # Trace stamps: when the call opened and its request was whole (GRPC_RECV_*), and who
        # to tell when a unary response went out (GRPC_SEND_*; the servicer sets it).
        self.opened_ns = time.monotonic_ns()
        self.received_ns = 0
        self.on_sent: Callable[[int, int], None] | None = None
        # A call answered without a task (Route.soon): what stops its request if the call ends first.
        self.on_cancel: Callable[[], None] | None = None

    # -- fed by the connection --------------------------------------------------------------

    def start(self) -> None:
        soon = self.route.soon
        if soon is None or len(self.requests) != 1:
            self.task = asyncio.get_running_loop().create_task(self._run())
            return
        try:
            request = self._one_request()
            if soon(request, self):
                return
        except CallError as error:
            self.finish(error.code, error.message)
            return
        self.task = asyncio.get_running_loop().create_task(self._run(request))

    def receive(self, data: bytes, end: bool) -> None:
        """DATA for this call; `end` when the client half-closed."""
        try:
            messages = self.reader.feed(data) if data else []
        except CallError as error:
            self.fail(error)
            return
        if self.queue is not None:
            for message in messages:
                self.queue.put_nowait(message)
            if end:
                self.queue.put_nowait(_END)
        else:
            self.requests.extend(messages)
            if len(self.requests) > 1 or (self.requests and self.reader.partial):
                # A unary call has one message: fail at the first byte of a second one, as
                # grpcio does, instead of buffering whatever the client sends until it ends.
                self.fail(CallError(grpc.StatusCode.INTERNAL, _TOO_MANY))
                return
        if end:
            self.received_ns = time.monotonic_ns()
            self.remote_closed = True
            if self.task is None:
                self.start()

    def reset(self) -> None:
        """The client reset the stream, or the connection is gone: stop, send nothing."""
        self.closed = True
        self.remote_closed = True
        self._cancel()
        if self.deadline is not None:
            self.deadline.cancel()

    def expire(self) -> None:
        self.deadline = None
        self.fail(CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def fail(self, error: CallError) -> None:
        """End the call now with `error` (from outside the servicer's task)."""
        self._cancel()
        self.finish(error.code, error.message)

    def _cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.on_cancel is not None:
            self.on_cancel()
            self.on_cancel = None

    # -- the servicer's context ------------------------------------------------------------

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        metadata: list[tuple[str, str | bytes]] = []
        for name, value in self.headers:
            if name[:1] == b":" or name in _HIDDEN:
                continue
            key = name.decode("latin-1")
            metadata.append((key, base64.b64decode(value + b"==") if key.endswith("-bin") else value.decode("latin-1")))
        return metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise CallError(code, details)

    def set_compression(self, compression: grpc.Compression) -> None:
        name = COMPRESSION_NAMES.get(compression)
        self.encoding = name if name in self.accepts else None

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str]] = ()) -> None:
        if not self.headers_sent and not self.closed:
            self.connection.send_headers(self)

    async def write(self, message: Message) -> None:
        if self.closed:
            raise asyncio.CancelledError("the stream is closed")
        self.send(message.SerializeToString())
        await self.connection.writable(self)
        if self.closed:  # reset while it waited (the send timeout)
            raise asyncio.CancelledError("the stream was reset")

    # -- sending ---------------------------------------------------------------------------

    def send(self, payload: bytes) -> None:
        if self.closed:
            return
        self._send_packed(self._pack(payload))

    def _pack(self, payload: bytes) -> list[bytes]:
        if len(payload) > self.max_message_size:
            raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"grpc: trying to send message larger than max ({len(payload)} vs. "
                            f"{self.max_message_size})")
        return pack(payload, self.encoding)

    def _send_packed(self, pieces: list[bytes]) -> None:
        if not self.headers_sent:
            self.connection.send_headers(self)
        if not self.connection.send_data(self, pieces):
            raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            "the connection holds too many responses its client has not read "
                            "(--grpc-max-unsent-bytes)")

    def answer(self, message: Message) -> None:
        """The one response of a unary call that `Route.soon` took, then its OK trailers."""
        self.on_cancel = None
        if self.closed:
            return
        try:
            pieces = self._pack(message.SerializeToString())
            # nearly always: headers, message and trailers in one go
            if not self.headers_sent and self.connection.answer_unary(self, pieces):
                if self.deadline is not None:
                    self.deadline.cancel()
                return
            self._send_packed(pieces)
        except CallError as error:
            self.finish(error.code, error.message)
            return
        self.finish(grpc.StatusCode.OK)

    def finish(self, code: grpc.StatusCode, message: str = "") -> None:
        if self.closed:
            return
        if self.deadline is not None:
            self.deadline.cancel()
        self.connection.send_trailers(self, _CODE_NUMBERS[code], message)

    # -- the servicer's task ---------------------------------------------------------------

    async def _run(self, request: Message | None = None) -> None:
        """The servicer method as a task; `request` when `start` already parsed it."""
        route = self.route
        try:
            if route.client_streaming:
                await route.handler(self._stream_requests(), self)
            else:
                if request is None:
                    request = self._one_request()
                response = await route.handler(request, self)
                if not route.server_streaming:
                    sending = time.monotonic_ns()
                    self.send(response.SerializeToString())
                    if self.on_sent is not None:
                        self.on_sent(sending, time.monotonic_ns())
            self.finish(grpc.StatusCode.OK)
        except CallError as error:
            self.finish(error.code, error.message)
        except asyncio.CancelledError:
            self.finish(grpc.StatusCode.CANCELLED, "Cancelled")
        except Exception as error:
            log.exception("unhandled error in %s", route.name)
            self.finish(grpc.StatusCode.UNKNOWN, f"Unexpected error in {route.name}: {error}")

    def _one_request(self) -> Message:
        if len(self.requests) != 1:
            raise CallError(grpc.StatusCode.INTERNAL, _TOO_MANY if self.requests else _MISSING)
        return self._parse(self.requests.pop())

    def backlogged(self) -> bool:
        """Hold back the client's window (back-pressure): a stream's requests wait unread, or a
        unary call has its one message."""
        if self.queue is None:
            return bool(self.requests)
        return self.queue.qsize() >= _BACKLOG

    async def _stream_requests(self) -> AsyncIterator[Message]:
        assert self.queue is not None
        while (item := await self.queue.get()) is not _END:
            if not self.backlogged():
                self.connection.refill(self)
            yield self._parse(item)

    def _parse(self, data: bytes) -> Message:
        try:
            return self.route.request_type.FromString(data)
        except DecodeError as error:
            raise CallError(grpc.StatusCode.INTERNAL, f"grpc: failed to parse the request: {error}") from None


def _accepted(value: bytes) -> frozenset[str]:
    """The encodings a grpc-accept-encoding value names. A client sends the same value on every
    call: parsed once per value, for a bounded number of short values (a client picks them)."""
    accepts = _ACCEPTED.get(value)
    if accepts is None:
        accepts = frozenset(name.strip() for name in value.decode("latin-1").split(","))
        if len(_ACCEPTED) < _ACCEPTED_LIMIT and len(value) <= _ACCEPTED_LENGTH:
            _ACCEPTED[value] = accepts
    return accepts


_ACCEPTED: dict[bytes, frozenset[str]] = {}
_ACCEPTED_LIMIT = 64  # values kept
_ACCEPTED_LENGTH = 128  # the longest value kept ("identity,deflate,gzip" is 21): a few KB in all


def _deadline(value: bytes | None, call: Call) -> asyncio.TimerHandle | None:
    """The grpc-timeout header (e.g. `20S`, `100m`) as a timer that expires the call."""
    if not value or value[-1:] not in _TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    seconds = int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]
    return asyncio.get_running_loop().call_later(seconds, call.expire)
