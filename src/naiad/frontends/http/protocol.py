"""HTTP/1.1 on asyncio with httptools: one protocol object per connection.

Why not an ASGI server: the per-request cost of an inference server's front door is mostly
the HTTP layer. Writing each response (status line, headers and body) with one
`transport.write` halves the send syscalls of an ASGI server, which writes headers and body
separately, and skipping ASGI's message dicts and middleware saves the rest.

Requests on one connection are answered in order (HTTP/1.1 pipelining): they queue and run one
at a time, and reading pauses while the queue is non-empty.

Slow clients: a request's headers and body, and a new connection's first request, must arrive
within `read_timeout` seconds of their first byte (--http-read-timeout-secs), else 408 and close,
so connections that dribble bytes (slowloris) cannot pile up. A body whose Content-Length is over
the limit is refused as soon as its headers are in; the rest is read and dropped, never kept.

Balancing: with `max_requests` (--http-max-requests-per-connection) the Nth response on a
connection says `connection: close` and the connection closes, so a keep-alive client opens a
new one, which a load balancer may send to another replica. Requests a client pipelined behind
the Nth are not answered (a client must retry those, as after any close).

A `StreamReply` (the generate_stream endpoint) is written as it is produced, in chunked transfer
encoding, waiting whenever the client reads slower than the server writes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from naiad.frontends.http.reply import RECEIVED, Reply, StreamReply

log = logging.getLogger(__name__)

Headers = dict[bytes, bytes]
Dispatch = Callable[[str, str, Headers, bytes], Awaitable[tuple[Reply, list[tuple[bytes, bytes]]]]]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_LARGE_BODY = 64 * 1024  # above this, write head and body separately instead of joining them
# Request line and headers; past it 431 (the parser would keep growing one header value).
MAX_HEAD = 64 * 1024


class _Request:
    __slots__ = ("answered", "body", "chunked_ok", "completed_ns", "headers", "keep_alive", "method", "started_ns",
                 "too_large", "url")

    def __init__(self) -> None:
        self.started_ns = time.monotonic_ns()  # made when its first byte is parsed
        self.completed_ns = 0
        self.url = b""
        self.headers: Headers = {}
        self.body: list[bytes] = []
        self.method = ""
        self.keep_alive = True
        self.chunked_ok = True  # HTTP/1.0 clients know no chunked encoding
        self.too_large = False
        self.answered = False  # refused before its body arrived: nothing is left to do at its end


class Connections:
    """The open connections of one listener, so shutdown can close the idle ones."""

    def __init__(self) -> None:
        self.open: set[HttpProtocol] = set()

    def busy(self) -> int:
        return sum(1 for c in self.open if c.busy)

    def close_idle(self) -> None:
        for connection in list(self.open):
            if not connection.busy:
                connection.close()


class HttpProtocol(asyncio.Protocol):
    def __init__(self, dispatch: Dispatch, max_body: int, connections: Connections, read_timeout: float = 0.0,
                 max_requests: int = 0) -> None:
        self.dispatch = dispatch
        self.max_requests = max_requests  # responses before the connection closes; 0: no limit
        self.responses = 0  # begun on this connection
        self.max_body = max_body
        self.connections = connections
        self.read_timeout = read_timeout  # seconds; 0: wait for slow clients for ever
        self.deadline: asyncio.TimerHandle | None = None  # armed while a request is being received
        self.reading = False  # a request's first byte is in, its last is not
        self.in_head = False  # a request's line and headers are being received
        self.head_size = 0  # bytes of whole reads spent on the current head
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.current = _Request()
        self.size = 0
        self.queue: collections.deque[_Request] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.paused = False
        self.writable = asyncio.Event()  # cleared while the transport's write buffer is full
        self.writable.set()

    @property
    def busy(self) -> bool:
        return self.task is not None or bool(self.queue)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.open.add(self)
        self._arm()  # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.open.discard(self)
        self._disarm()
        self.queue.clear()
        if self.task is not None:
            self.task.cancel()  # nobody is left to read the answer
        self.transport = None
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        continuing_head = self.in_head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b'{"error":"protocol upgrade is not supported"}')
            return
        except httptools.HttpParserError as error:
            self._fail(400, b'{"error":"malformed HTTP request: ' + str(error).encode()[:200] + b'"}')
            return
        # Only reads that began inside a head count (one that started a head may end another
        # request's body): the limit is exact to within one read.
        if continuing_head and self.in_head:
            self.head_size += len(data)
            if self.head_size > MAX_HEAD:
                self._fail(431, b'{"error":"request line and headers exceed %d bytes"}' % MAX_HEAD)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = _Request()
        self.size = 0
        self.reading = True
        self.in_head = True
        self.head_size = 0
        if self.deadline is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self.current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self._declares_too_large():
            self.current.too_large = True
            if not self.busy:  # answer now, before the body; queued replies go first otherwise
                self.current.answered = True
                self._write(_too_large(self.max_body), [], keep_alive=False, close=False)
            return  # and no 100 Continue: the client need not send the body at all
        # Clients that send `Expect: 100-continue` (curl, for bodies over 1 MiB) wait for this
        # before sending the body.
        if self.current.headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        request = self.current
        self.size += len(body)
        if self.size > self.max_body:
            request.too_large = True
            request.body.clear()  # keep reading to stay in sync with the stream, but keep nothing
        elif not request.too_large:
            request.body.append(body)

    def on_message_complete(self) -> None:
        request = self.current
        self.reading = False
        self._disarm()
        if request.answered:
            self.close()  # its 400 went out with `connection: close` when the headers came
            return
        request.completed_ns = time.monotonic_ns()
        request.method = self.parser.get_method().decode("ascii")
        request.keep_alive = self.parser.should_keep_alive()
        request.chunked_ok = self.parser.get_http_version() != "1.0"
        self.queue.append(request)
        if self.task is None:
            self._next()
        elif self.transport is not None and not self.paused:
            self.transport.pause_reading()  # pipelined requests wait their turn
            self.paused = True

    def _declares_too_large(self) -> bool:
        length = self.current.headers.get(b"content-length")
        return length is not None and length.strip().isdigit() and int(length) > self.max_body

    # -- slow clients --------------------------------------------------------------------------

    def _arm(self) -> None:
        if self.read_timeout > 0:
            self.deadline = asyncio.get_running_loop().call_later(self.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _read_timed_out(self) -> None:
        self.deadline = None
        if self.busy:
            # A pipelined request waits while we answer the one before: the wait is ours.
            self._arm()
        elif self.reading:
            log.debug("closing a connection whose request did not arrive within %s s", self.read_timeout)
            message = (f'{{"error":"request not received within {self.read_timeout:g} s '
                       '(--http-read-timeout-secs)"}').encode()
            self._fail(408, message)
        else:
            self.close()  # opened, and never sent a byte

    # -- requests ------------------------------------------------------------------------------

    def _next(self) -> None:
        if not self.queue:
            if self.paused and self.transport is not None:
                self.transport.resume_reading()
                self.paused = False
            return
        request = self.queue.popleft()
        self.task = asyncio.get_running_loop().create_task(self._run(request))

    async def _run(self, request: _Request) -> None:
        keep_alive = request.keep_alive and not request.too_large
        self.responses += 1
        if self.max_requests and self.responses >= self.max_requests:
            keep_alive = False  # the last one this connection answers: the client reconnects
        try:
            if request.too_large:
                reply, extra = _too_large(self.max_body), []
            else:
                path = unquote(httptools.parse_url(request.url).path.decode("latin-1"))
                body = request.body[0] if len(request.body) == 1 else b"".join(request.body)
                RECEIVED.set((request.started_ns, request.completed_ns))  # this request's own task
                reply, extra = await self.dispatch(request.method, path, request.headers, body)
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("unhandled error")
            reply, extra = Reply(500, b'{"error":"internal server error"}'), []
        if isinstance(reply, StreamReply):
            try:
                await self._stream(reply, extra, keep_alive and request.chunked_ok, request.chunked_ok)
            except asyncio.CancelledError:
                return
        else:
            self._write(reply, extra, keep_alive)
        self.task = None
        self._next()

    def _write(self, reply: Reply, extra: list[tuple[bytes, bytes]], keep_alive: bool, close: bool = True) -> None:
        """Write one reply; without keep-alive the connection then closes, unless `close` is False
        (a refusal sent before the body arrived: the body is read and dropped first)."""
        transport = self.transport
        if transport is None:
            return
        head = _head(reply, extra, keep_alive, b"content-length: %d\r\n" % len(reply.body))
        sending = time.monotonic_ns()
        if len(reply.body) > _LARGE_BODY:
            transport.writelines([b"".join(head), reply.body])
        else:
            head.append(reply.body)
            transport.write(b"".join(head))
        if reply.on_sent is not None:
            reply.on_sent(sending, time.monotonic_ns())
        if not keep_alive and close:
            transport.close()

    async def _stream(self, reply: StreamReply, extra: list[tuple[bytes, bytes]], keep_alive: bool,
                      chunked: bool) -> None:
        """Write the head, then each chunk as it comes. Without chunked encoding (HTTP/1.0) the
        body ends where the connection does. Always closes the chunk source: when the client is
        gone this task is cancelled, and closing the source cancels the request behind it."""
        try:
            if self.transport is None:
                return
            framing = b"transfer-encoding: chunked\r\n" if chunked else b""
            self.transport.write(b"".join(_head(reply, extra, keep_alive, framing)))
            try:
                async for chunk in reply.chunks:
                    if chunk:
                        await self._write_chunk(chunk, chunked)
                if self.transport is not None and chunked:
                    self.transport.write(b"0\r\n\r\n")
            except Exception:  # CancelledError (the client left) is no Exception: it goes on up
                # The status is out already: cutting the body short is the only way left to fail.
                log.exception("streamed response failed")
                keep_alive = False
            if not keep_alive:
                self.close()
        finally:
            await reply.chunks.aclose()

    async def _write_chunk(self, chunk: bytes, chunked: bool) -> None:
        if not self.writable.is_set():
            await self.writable.wait()  # the client reads slower than we write: wait for it
        if self.transport is None:
            return  # the client is gone; this task's cancellation is on its way
        if chunked:
            self.transport.writelines([b"%x\r\n" % len(chunk), chunk, b"\r\n"])
        else:
            self.transport.write(chunk)

    def _fail(self, status: int, body: bytes) -> None:
        self._write(Reply(status, body), [], keep_alive=False)


def _head(reply: Reply, extra: list[tuple[bytes, bytes]], keep_alive: bool, framing: bytes) -> list[bytes]:
    """Status line and headers; `framing` is the content-length or transfer-encoding line."""
    head = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n" % (reply.status, _REASONS.get(reply.status, b""),
                                                        reply.content_type), framing]
    for name, value in (*reply.headers, *extra):
        head.append(name + b": " + value + b"\r\n")
    if not keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    return head


def _too_large(limit: int) -> Reply:
    message = (f'{{"error":"request body size exceeds the maximum allowed value of {limit} bytes; '
               'use --http-max-input-size to increase the limit"}').encode()
    return Reply(400, message)
