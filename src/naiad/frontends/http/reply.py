"""What an HTTP handler answers: status, body, content type and extra headers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Any, Protocol

import msgspec

from naiad.errors import NaiadError, Status

#: A request's headers, names lower-cased (every HTTP module's one spelling of them).
Headers = dict[bytes, bytes]

HTTP_STATUS = {
    Status.INTERNAL: 500,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
}


#: (start, end) monotonic ns of the request being handled: when its first byte and its last
#: byte were read (the protocol sets it in the request's own task, for HTTP_RECV_* trace stamps).
RECEIVED: ContextVar[tuple[int, int] | None] = ContextVar("received", default=None)


class Reply:
    __slots__ = ("body", "content_type", "headers", "on_sent", "status")

    def __init__(self, status: int = 200, body: bytes = b"", content_type: bytes = b"application/json",
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or []
        #: called with (start, end) monotonic ns around the write of the reply (HTTP_SEND_* stamps)
        self.on_sent: Callable[[int, int], None] | None = None


class Chunks(Protocol):
    """The body of a streamed reply: chunks as they come, and `aclose` to stop producing them
    (the protocol always calls it, so a client that goes away cancels the work behind them)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


#: server-sent events (the generate extension's and the OpenAI routes' streams)
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"


class StreamReply(Reply):
    """A reply whose body is written as it is produced (chunked transfer encoding); the status
    and headers go out before the first chunk."""

    __slots__ = ("chunks",)

    def __init__(self, status: int, chunks: Chunks, content_type: bytes,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(status, b"", content_type, headers)
        self.chunks = chunks


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, msgspec.json.encode(value))


def error_reply(error: NaiadError) -> Reply:
    """Triton's mapping: INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, else 400."""
    return Reply(HTTP_STATUS.get(error.status, 400), msgspec.json.encode({"error": error.message}))
