"""HTTP/1.1 on asyncio with httptools: one protocol object per connection.

Why not an ASGI server: the per-request cost of an inference server's front door is mostly
the HTTP layer. Writing each response (status line, headers and body) with one
`transport.write` halves the send syscalls of an ASGI server, which writes headers and body
separately, and skipping ASGI's message dicts and middleware saves the rest.

Requests on one connection are answered in order (HTTP/1.1 pipelining): they queue and run one
at a time, and reading pauses while the queue is non-empty, and while the socket's send buffer
is full (a client that pipelines requests and reads no answers gets no more of them read: the
server holds one read's worth of requests, never their piled-up answers).

Hostile clients (docs/reliability.md): request heads are counted per request (64 KiB, 431);
with `admit` (--auth-token, restricted APIs) a request is refused from its headers, before any
of its body is read, and whatever body follows is dropped; a keep-alive connection idle for
`idle_timeout` seconds is closed (--http-idle-timeout-secs); `limit` (--max-connections) admits
connections, shared with gRPC: at the limit the longest-idle connection makes room, else the
newcomer gets 503 and is closed.

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

from naiad.frontends.connections import ConnectionLimit, IdleTimer, ReadPauses
from naiad.frontends.http.reply import RECEIVED, Headers, Reply, StreamReply

log = logging.getLogger(__name__)

Answer = Callable[[Reply, list[tuple[bytes, bytes]]], None]
Dispatch = Callable[[str, str, Headers, bytes], Awaitable[tuple[Reply, list[tuple[bytes, bytes]]]]]
#: answer a request without a task where it can: (method, path, headers, body, answer) -> what
#: cancels it if the client leaves, or the awaitable that answers it (the general path)
DispatchNow = Callable[[str, str, Headers, bytes, Answer],
                       Callable[[], None] | Awaitable[tuple[Reply, list[tuple[bytes, bytes]]]]]
#: Checks a request from its URL and headers alone: None lets it in, else the refusal to send.
Admit = Callable[[bytes, Headers], Reply | None]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_LARGE_BODY = 64 * 1024  # above this, write head and body separately instead of joining them
# Request line and headers; past it 431 (the parser would keep growing one header value).
MAX_HEAD = 64 * 1024
# Body bytes of a request refused from its headers read (and dropped) before the connection closes.
DROP_LIMIT = 1 << 20


class _Request:
    __slots__ = ("answered", "body", "chunked_ok", "completed_ns", "headers", "keep_alive", "method", "refusal",
                 "started_ns", "url")

    def __init__(self) -> None:
        self.started_ns = time.monotonic_ns()  # made when its first byte is parsed
        self.completed_ns = 0
        self.url = b""
        self.headers: Headers = {}
        self.body: list[bytes] = []
        self.method = ""
        self.keep_alive = True
        self.chunked_ok = True  # HTTP/1.0 clients know no chunked encoding
        self.refusal: Reply | None = None  # answered without dispatch (too large, not admitted); body dropped
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
    """One HTTP/1.1 connection: parse, dispatch, answer in order, under per-connection limits.

    Over 25 methods for a reason: asyncio's Protocol callbacks, the request parser's steps and
    one method per limit (read pauses, body size, idle and read timers, pipelining depth), all
    of which touch the same transport state; pulling them apart would pass that state around.
    """

    def __init__(self, dispatch: Dispatch, max_body: int, connections: Connections, read_timeout: float = 0.0,
                 max_requests: int = 0, admit: Admit | None = None, idle_timeout: float = 0.0,
                 limit: ConnectionLimit | None = None, dispatch_now: DispatchNow | None = None) -> None:
        self.dispatch = dispatch
        self.dispatch_now = dispatch_now
        self.waiting: _Waiting | None = None  # a request answered without a task, until its reply
        self.admit = admit
        self.idle_timer = IdleTimer(idle_timeout, self._idle_expired)  # --http-idle-timeout-secs
        self.limit = limit
        self.max_requests = max_requests  # responses before the connection closes; 0: no limit
        self.responses = 0  # begun on this connection
        self.max_body = max_body
        self.connections = connections
        self.read_timeout = read_timeout  # seconds; 0: wait for slow clients for ever
        # Times each wait for a request's bytes (--http-read-timeout-secs) with the idle timer's
        # lazy mechanism: `idle()` starts a wait and `busy()` ends it, stores per request.
        self.read_timer = IdleTimer(read_timeout, self._read_timed_out)
        self.reading = False  # a request's first byte is in, its last is not
        self.in_head = False  # a request's line and headers are being received
        self.head_size = 0  # bytes of whole reads spent on the current head
        self.heads_begun = 0  # requests whose first byte has been parsed
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        # The loop, kept: asyncio.get_running_loop() makes a getpid() system call on Python < 3.12.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.current = _Request()
        self.size = 0
        self.queue: collections.deque[_Request] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.pauses = ReadPauses()  # "queue" (a request is running), "writes" (the send buffer is full)
        self.writable = asyncio.Event()  # cleared while the transport's write buffer is full
        self.writable.set()

    @property
    def busy(self) -> bool:
        return self.task is not None or self.waiting is not None or bool(self.queue)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.pauses.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        if self.limit is not None and not self.limit.admit(self):
            log.debug("refusing an HTTP connection: --max-connections reached")
            self._write(_TOO_MANY_CONNECTIONS, [], keep_alive=False)
            return
        self.connections.open.add(self)
        self.idle_timer.since = time.monotonic()  # idle (and evictable) until its first request; not timed yet
        self.read_timer.idle()  # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.open.discard(self)
        if self.limit is not None:
            self.limit.release(self)
        self.idle_timer.cancel()
        self.read_timer.cancel()
        self.queue.clear()
        if self.task is not None:
            self.task.cancel()  # nobody is left to read the answer
        if self.waiting is not None:
            self.waiting.cancel()
        self.transport = self.pauses.transport = None
        self.writable.set()
        # The parser and the idle timer call back into this protocol: without them it goes with
        # its last reference, not at the next cyclic garbage collection (a client opening a
        # connection per request left ~20 objects a request to it).
        self.parser = _CLOSED_PARSER
        self.idle_timer.on_expiry = self.read_timer.on_expiry = _nothing

    def pause_writing(self) -> None:
        self.writable.clear()
        self.pauses.pause("writes")  # what the client asks next would pile up unsent too

    def resume_writing(self) -> None:
        self.writable.set()
        self.pauses.resume("writes")
        if self.task is None and self.waiting is None and self.queue:
            self._next()

    def data_received(self, data: bytes) -> None:
        continuing_head = self.in_head
        begun = self.heads_begun
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b'{"error":"protocol upgrade is not supported"}')
            return
        except httptools.HttpParserError as error:
            self._fail(400, b'{"error":"malformed HTTP request: ' + str(error).encode()[:200] + b'"}')
            return
        # Only reads that began and ended inside the same head count (a read may hold whole
        # pipelined requests, or end another request's body): exact to within one read.
        if continuing_head and self.in_head and begun == self.heads_begun:
            self.head_size += len(data)
            if self.head_size > MAX_HEAD:
                self._fail(431, b'{"error":"request line and headers exceed %d bytes"}' % MAX_HEAD)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def evict(self) -> None:
        """Make room for a new connection (--max-connections): this one is idle."""
        self.close()

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = _Request()
        self.size = 0
        self.reading = True
        self.in_head = True
        self.head_size = 0
        self.heads_begun += 1
        if self.idle_timer.since:
            self.idle_timer.busy()
            if self.limit is not None:
                self.limit.busy(self)
        if not self.read_timer.since:  # else the connection's wait for its first request goes on
            self.read_timer.idle()

    def on_url(self, url: bytes) -> None:
        self.current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        request = self.current
        length = request.headers.get(b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body:
            request.refusal = _too_large(self.max_body)
        elif self.admit is not None:
            request.refusal = self.admit(request.url, request.headers)
        if request.refusal is not None:
            if not self.busy:  # answer now, before the body; queued replies go first otherwise
                request.answered = True
                self._write(request.refusal, [], keep_alive=False, close=False)
            return  # and no 100 Continue: the client need not send the body at all
        # Clients that send `Expect: 100-continue` (curl, for bodies over 1 MiB) wait for this
        # before sending the body.
        if self.current.headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        request = self.current
        self.size += len(body)
        if request.refusal is not None:
            # Refused from its headers: what follows is read and dropped, so that a client that
            # sends its whole body before reading gets the answer; past DROP_LIMIT the
            # connection closes instead (a stranger's upload costs no more than that).
            if request.answered and self.size > DROP_LIMIT:
                self.close()
            return
        if self.size > self.max_body:
            request.refusal = _too_large(self.max_body)
            request.body.clear()
        else:
            request.body.append(body)

    def on_message_complete(self) -> None:
        request = self.current
        self.reading = False
        self.read_timer.busy()
        if request.answered:
            self.close()  # its 400 went out with `connection: close` when the headers came
            return
        request.completed_ns = time.monotonic_ns()
        request.method = self.parser.get_method().decode("ascii")
        request.keep_alive = self.parser.should_keep_alive()
        request.chunked_ok = self.parser.get_http_version() != "1.0"
        self.queue.append(request)
        if self.task is None and self.waiting is None and self.writable.is_set():
            self._next()
        else:
            self.pauses.pause("queue")  # pipelined requests wait their turn

    # -- slow clients --------------------------------------------------------------------------

    def _went_idle(self) -> None:
        """No request in hand: the idle timeout runs, and the connection may make room for another."""
        self.idle_timer.idle()
        if self.limit is not None:
            self.limit.idle(self)

    def _idle_expired(self) -> None:
        log.debug("closing a keep-alive connection idle for %s s (--http-idle-timeout-secs)", self.idle_timer.timeout)
        self.close()

    def _read_timed_out(self) -> None:
        if self.busy:
            # A pipelined request waits while we answer the one before: the wait is ours.
            self.read_timer.idle()
        elif self.reading:
            log.debug("closing a connection whose request did not arrive within %s s", self.read_timeout)
            message = (f'{{"error":"request not received within {self.read_timeout:g} s '
                       '(--http-read-timeout-secs)"}').encode()
            self._fail(408, message)
        else:
            self.close()  # opened, and never sent a byte

    # -- requests ------------------------------------------------------------------------------

    def _next(self) -> None:
        """Start the queued requests, one at a time, until one has to wait for its answer."""
        while self.queue and self.task is None and self.waiting is None:
            if not self.writable.is_set():
                return  # the client is not reading its answers: resume_writing goes on
            self._start(self.queue.popleft())
        if not self.queue:
            if self.pauses.reasons:  # (paused only behind pipelined requests: most skip the call)
                self.pauses.resume("queue")
            if self.task is None and self.waiting is None and not self.reading:
                self._went_idle()

    def _start(self, request: _Request) -> None:
        keep_alive = request.keep_alive and request.refusal is None
        self.responses += 1
        if self.max_requests and self.responses >= self.max_requests:
            keep_alive = False  # the last one this connection answers: the client reconnects
        if request.refusal is not None:
            self._write(request.refusal, [], keep_alive)
            return
        path = _path(request.url)
        body = request.body[0] if len(request.body) == 1 else b"".join(request.body)
        if self.dispatch_now is not None:
            # Dispatched from a callback of its own, once this turn of the loop has read every
            # connection that is ready: submitting at once woke an instance's thread that then
            # fought this one for the GIL between reads (one more context switch per request and
            # 10-20 % fewer inferences/s at 32 connections; docs/benchmarks.md, 2026-12-04 evening).
            waiting = self.waiting = _Waiting(self, keep_alive)
            loop = self.loop
            assert loop is not None  # set when connected, before any request
            loop.call_soon(self._dispatch, request, path, body, waiting)
            return
        work = self.dispatch(request.method, path, request.headers, body)
        self.task = self._loop().create_task(self._run(request, work, keep_alive))

    def _dispatch(self, request: _Request, path: str, body: bytes, waiting: _Waiting) -> None:
        """Start a request through `dispatch_now`; it is this connection's `waiting` meanwhile."""
        if self.transport is None or self.dispatch_now is None:
            return  # the client went away before its turn
        try:
            started = self.dispatch_now(request.method, path, request.headers, body, waiting.answer)
        except Exception:  # a bug: answer it as the task path does, and keep the connection
            log.exception("unhandled error")
            waiting.answer(Reply(500, b'{"error":"internal server error"}'), [])
            return
        if waiting.answered:  # inside dispatch_now (an error, a refusal): answer moved on already
            return
        if callable(started):  # a canceller: not a coroutine (nor any awaitable we are given)
            waiting.cancel = started  # its answer comes later, from the event loop
            return
        self.waiting = None
        self.task = self._loop().create_task(self._run(request, started, waiting.keep_alive))

    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self.loop is not None  # set when connected, before any request
        return self.loop

    async def _run(self, request: _Request, work: Awaitable[tuple[Reply, list[tuple[bytes, bytes]]]],
                   keep_alive: bool) -> None:
        try:
            RECEIVED.set((request.started_ns, request.completed_ns))  # this request's own task
            reply, extra = await work
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


class _Waiting:
    """A request answered without a task of its own: `answer` writes its reply (from the event
    loop, now or later); `cancel` tells the server its client went away."""

    __slots__ = ("answered", "cancel", "keep_alive", "protocol")

    def __init__(self, protocol: HttpProtocol, keep_alive: bool) -> None:
        self.protocol = protocol
        self.keep_alive = keep_alive
        self.answered = False
        self.cancel: Callable[[], None] = _nothing

    def answer(self, reply: Reply, extra: list[tuple[bytes, bytes]]) -> None:
        if self.answered:
            return
        self.answered = True
        # The canceller (the job's) leads through the job's sink back to this answer: dropping it
        # leaves the request's objects to reference counting instead of a garbage collection.
        self.cancel = _nothing
        protocol = self.protocol
        protocol._write(reply, extra, self.keep_alive)
        if protocol.waiting is self:  # still this connection's request in hand: on to the next
            protocol.waiting = None
            protocol._next()


def _nothing() -> None:
    pass


#: What a closed connection's `parser` becomes: a parser with no callbacks (asyncio feeds a
#: closed connection nothing more).
_CLOSED_PARSER = httptools.HttpRequestParser(object())


def _path(url: bytes) -> str:
    """The request's path, percent-decoded (most URLs have neither a query nor an escape)."""
    if b"?" not in url and b"%" not in url and b"#" not in url:
        return url.decode("latin-1")
    return unquote(httptools.parse_url(url).path.decode("latin-1"))


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


_TOO_MANY_CONNECTIONS = Reply(503, b'{"error":"the server has too many connections open (--max-connections)"}')


def _too_large(limit: int) -> Reply:
    message = (f'{{"error":"request body size exceeds the maximum allowed value of {limit} bytes; '
               'use --http-max-input-size to increase the limit"}').encode()
    return Reply(400, message)
