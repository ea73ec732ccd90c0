"""The KServe V2 HTTP application: route, decompress, call the handler, map errors, compress.

Protocol-level work (parsing HTTP, writing responses) lives in `protocol.py`; this module only
turns (method, path, headers, body) into a Reply. Only this package knows HTTP status codes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import unquote

import httptools

from naiad.core.server import InferenceServer
from naiad.errors import NaiadError
from naiad.frontends.access import Gate
from naiad.frontends.http import handlers
from naiad.frontends.http.access import NO_ROUTE, check
from naiad.frontends.http.compression import choose_encoding, compress, decompress
from naiad.frontends.http.reply import Headers, Reply, error_reply
from naiad.frontends.http.routes import Route, match

log = logging.getLogger(__name__)



class HttpApp:
    def __init__(self, server: InferenceServer, max_input_size: int, gates: dict[str, Gate] | None = None,
                 extra: Mapping[tuple[str, str], handlers.Handler] | None = None) -> None:
        self.server = server
        self.max_input_size = max_input_size
        self.gates = gates or None  # route action → access check (http/access.py); None: no checks
        # (action, method) → handler; `extra` adds the web console's (naiad.frontends.console)
        self.handlers = {**handlers.HANDLERS, **(extra or {})}
        self.actions = {action for action, _ in self.handlers}

    def admit(self, url: bytes, headers: Headers) -> Reply | None:
        """The access check from a request's URL and headers alone, so that a refused request
        is answered before its body is read (the protocol calls it; dispatch checks again)."""
        if self.gates is None:
            return None
        path = unquote(httptools.parse_url(url).path.decode("latin-1"))
        route = match(path)
        gate = self.gates.get(route.action if route is not None else NO_ROUTE)
        return check(gate, headers) if gate is not None else None

    async def dispatch(self, method: str, path: str, headers: Headers,
                       body: bytes) -> tuple[Reply, list[tuple[bytes, bytes]]]:
        """Answer one request; returns the reply and any extra response headers."""
        route = match(path)
        if self.gates is not None:
            gate = self.gates.get(route.action if route is not None else NO_ROUTE)
            refused = check(gate, headers) if gate is not None else None
            if refused is not None:
                return refused, []
        try:
            reply = await self._handle(method, route, headers, body)
        except NaiadError as error:
            reply = error_reply(error)
        except Exception:
            log.exception("unhandled error for %s %s", method, path)
            reply = Reply(500, b'{"error":"internal server error"}')
        # Like Triton, compress successful inference responses only: tritonclient.http.aio asks
        # for gzip on every call (aiohttp's default) but inflates nothing else.
        if reply.status != 200 or route is None or route.action != "model_infer":
            return reply, []
        return self._compress(reply, headers)

    def dispatch_now(self, method: str, path: str, headers: Headers, body: bytes,
                     answer: Callable[[Reply, list[tuple[bytes, bytes]]], None],
                     ) -> Callable[[], None] | Awaitable[tuple[Reply, list[tuple[bytes, bytes]]]]:
        """Answer without a task of its own when the request allows (an inference: decode, queue,
        and `answer` from the event loop once its response is in): returns what cancels it if the
        client goes away. Any other request returns the awaitable that answers it instead."""
        route = match(path)
        if (route is None or route.action != "model_infer" or method != "POST" or self.server.tracer.active
                or headers.get(b"content-encoding")):
            return self.dispatch(method, path, headers, body)
        if self.gates is not None:
            gate = self.gates.get(route.action)
            refused = check(gate, headers) if gate is not None else None
            if refused is not None:
                answer(refused, [])
                return _nothing

        compressible = bool(headers.get(b"accept-encoding"))  # else no call to _compress per reply

        def answered(reply: Reply) -> None:
            if reply.status == 200 and compressible:
                answer(*self._compress(reply, headers))
            else:
                answer(reply, [])

        try:
            return handlers.model_infer_now(self.server, route, body, headers, answered)
        except NaiadError as error:
            answer(error_reply(error), [])
            return _nothing

    async def _handle(self, method: str, route: Route | None, headers: Headers, body: bytes) -> Reply:
        if route is None:
            return _not_found()
        handler = self.handlers.get((route.action, method))
        if handler is None:
            if route.action in self.actions:
                return Reply(405, b'{"error":"Method Not Allowed"}')
            return _not_found()
        encoding = headers.get(b"content-encoding")
        if encoding and body:
            body = decompress(body, encoding.decode("latin-1"), self.max_input_size)
        return await handler(self.server, route, body, headers)

    @staticmethod
    def _compress(reply: Reply, headers: Headers) -> tuple[Reply, list[tuple[bytes, bytes]]]:
        accept = headers.get(b"accept-encoding")
        encoding = choose_encoding(accept.decode("latin-1")) if accept and reply.body else None
        if encoding is None:
            return reply, []
        reply.body = compress(reply.body, encoding)
        return reply, [(b"content-encoding", encoding.encode())]


def _nothing() -> None:
    pass


def _not_found() -> Reply:
    return Reply(404, b'{"error":"Not Found"}', b"text/plain")  # Triton sends this body as text/plain (SPEC §0)
