"""HTTP/1.1 on asyncio with httptools: one protocol object per connection.

Why not an ASGI server: the per-request cost of an inference server's front door is mostly
the HTTP layer. Writing each response (status line, headers and body) with one
`transport.write` halves the send syscalls of an ASGI server, which writes headers and body
separately, and skipping ASGI's message dicts and middleware saves the rest.

Requests on one connection are answered in order (HTTP/1.1 pipelining): they queue and run one
at a time, and reading pauses while the queue is non-empty.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from naiad.frontends.http.reply import Reply

log = logging.getLogger(__name__)

Headers = dict[bytes, bytes]
Dispatch = Callable[[str, str, Headers, bytes], Awaitable[tuple[Reply, list[tuple[bytes, bytes]]]]]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_LARGE_BODY = 64 * 1024  # above this, write head and body separately instead of joining them


class _Request:
    __slots__ = ("body", "headers", "keep_alive", "method", "too_large", "url")

    def __init__(self) -> None:
        self.url = b""
        self.headers: Headers = {}
        self.body: list[bytes] = []
        self.method = ""
        self.keep_alive = True
        self.too_large = False


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
    def __init__(self, dispatch: Dispatch, max_body: int, connections: Connections) -> None:
        self.dispatch = dispatch
        self.max_body = max_body
        self.connections = connections
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.current = _Request()
        self.size = 0
        self.queue: collections.deque[_Request] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.paused = False

    @property
    def busy(self) -> bool:
        return self.task is not None or bool(self.queue)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.open.discard(self)
        self.queue.clear()
        if self.task is not None:
            self.task.cancel()  # nobody is left to read the answer
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b'{"error":"protocol upgrade is not supported"}')
        except httptools.HttpParserError as error:
            self._fail(400, b'{"error":"malformed HTTP request: ' + str(error).encode()[:200] + b'"}')

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = _Request()
        self.size = 0

    def on_url(self, url: bytes) -> None:
        self.current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
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
        request.method = self.parser.get_method().decode("ascii")
        request.keep_alive = self.parser.should_keep_alive()
        self.queue.append(request)
        if self.task is None:
            self._next()
        elif self.transport is not None and not self.paused:
            self.transport.pause_reading()  # pipelined requests wait their turn
            self.paused = True

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
        try:
            if request.too_large:
                reply, extra = _too_large(self.max_body), []
            else:
                path = unquote(httptools.parse_url(request.url).path.decode("latin-1"))
                body = request.body[0] if len(request.body) == 1 else b"".join(request.body)
                reply, extra = await self.dispatch(request.method, path, request.headers, body)
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("unhandled error")
            reply, extra = Reply(500, b'{"error":"internal server error"}'), []
        self._write(reply, extra, request.keep_alive and not request.too_large)
        self.task = None
        self._next()

    def _write(self, reply: Reply, extra: list[tuple[bytes, bytes]], keep_alive: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        head = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
                % (reply.status, _REASONS.get(reply.status, b""), reply.content_type, len(reply.body))]
        for name, value in (*reply.headers, *extra):
            head.append(name + b": " + value + b"\r\n")
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if len(reply.body) > _LARGE_BODY:
            transport.writelines([b"".join(head), reply.body])
        else:
            head.append(reply.body)
            transport.write(b"".join(head))
        if not keep_alive:
            transport.close()

    def _fail(self, status: int, body: bytes) -> None:
        self._write(Reply(status, body), [], keep_alive=False)


def _too_large(limit: int) -> Reply:
    message = (f'{{"error":"request body size exceeds the maximum allowed value of {limit} bytes; '
               'use --http-max-input-size to increase the limit"}').encode()
    return Reply(400, message)
