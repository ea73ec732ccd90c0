"""The KServe V2 HTTP frontend as a plain ASGI application (served by uvicorn).

No web framework: one regex per route family and a dict of handlers keep the per-request
overhead to a few microseconds. Only this package knows HTTP status codes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from naiad.core.server import InferenceServer
from naiad.errors import InvalidArgument, NaiadError
from naiad.frontends.http import handlers
from naiad.frontends.http.compression import choose_encoding, compress, decompress
from naiad.frontends.http.reply import Reply, error_reply
from naiad.frontends.http.routes import match

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class HttpApp:
    def __init__(self, server: InferenceServer, max_input_size: int) -> None:
        self.server = server
        self.max_input_size = max_input_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan and websockets are not ours to answer
        headers = dict(scope["headers"])
        try:
            reply = await self._handle(scope, receive, headers)
        except NaiadError as error:
            reply = error_reply(error)
        except Exception:
            log.exception("unhandled error for %s %s", scope["method"], scope["path"])
            reply = Reply(500, b'{"error":"internal server error"}')
        await self._send(send, reply, headers)

    async def _handle(self, scope: Scope, receive: Receive, headers: dict[bytes, bytes]) -> Reply:
        route = match(scope["path"])
        if route is None:
            return Reply(404, b'{"error":"Not Found"}')
        handler = handlers.HANDLERS.get((route.action, scope["method"]))
        if handler is None:
            allowed = any(action == route.action for action, _ in handlers.HANDLERS)
            return Reply(405, b'{"error":"Method Not Allowed"}') if allowed else Reply(404, b'{"error":"Not Found"}')
        body = await self._read_body(receive, headers) if scope["method"] == "POST" else b""
        return await handler(self.server, route, body, headers)

    async def _read_body(self, receive: Receive, headers: dict[bytes, bytes]) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InvalidArgument("client disconnected before sending the whole request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_input_size:
                raise InvalidArgument(
                    f"request body size exceeds the maximum allowed value of {self.max_input_size} bytes; "
                    "use --http-max-input-size to increase the limit"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = headers.get(b"content-encoding")
        if encoding:
            body = decompress(body, encoding.decode("latin-1"), self.max_input_size)
        return body

    @staticmethod
    async def _send(send: Send, reply: Reply, headers: dict[bytes, bytes]) -> None:
        body = reply.body
        out = [(b"content-type", reply.content_type), *reply.headers]
        accept = headers.get(b"accept-encoding")
        encoding = choose_encoding(accept.decode("latin-1")) if accept and body else None
        if encoding:
            body = compress(body, encoding)
            out.append((b"content-encoding", encoding.encode()))
        out.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": out})
        await send({"type": "http.response.body", "body": body})

