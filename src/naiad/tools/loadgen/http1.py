"""A lean HTTP/1.1 client on asyncio: keep-alive connections carrying one exchange at a time.

A load generator's own CPU per request must stay below the server's, so nothing here builds a
request per call: callers write bytes they encoded once, and a response costs one parse by
httptools (C) and one callback. Bodies are kept only when the caller asks (`keep_body`) or when
the status is not 2xx (to say why a request failed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools

#: on_response(connection, status, body, keep_alive); status 0 when the connection failed.
OnResponse = Callable[["HttpConnection", int, bytes, bool], None]


class HttpError(RuntimeError):
    """A control call failed: no answer, or the server answered with an error status."""


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection; `write` one request, then `on_response` is called once."""

    def __init__(self, on_response: OnResponse, keep_body: bool = False) -> None:
        self.on_response = on_response
        self.keep_body = keep_body
        self.transport: asyncio.Transport | None = None
        self.pending = False  # a request is out and its response has not completed
        self.open = False
        self._parser = httptools.HttpResponseParser(self)
        self._status = 0
        self._body: list[bytes] = []

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(f"malformed HTTP response: {error}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.pending:
            why = f": {exc}" if exc else ""
            self._fail(f"the server closed the connection before answering{why}")

    # -- httptools callbacks -----------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.keep_body or self._status >= 300:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self.pending = False
        body = b""
        if self._body:
            body = b"".join(self._body)
            self._body = []
        self.on_response(self, self._status, body, self._parser.should_keep_alive())

    # -- use ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.pending = True
        self.transport.write(data)  # type: ignore[union-attr]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _fail(self, why: str) -> None:
        self.pending = False
        self._body = []
        self.on_response(self, 0, why.encode(), False)
        self.close()


async def connect(host: str, port: int, on_response: OnResponse, keep_body: bool = False) -> HttpConnection:
    """Open one connection to host:port."""
    loop = asyncio.get_running_loop()
    try:
        _, conn = await loop.create_connection(lambda: HttpConnection(on_response, keep_body), host, port)
    except OSError as error:
        raise HttpError(f"cannot connect to {host}:{port}: {error.strerror or error}") from None
    return conn


def request_bytes(method: str, host: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> bytes:
    """One complete HTTP/1.1 request (keep-alive), headers and body."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class HttpControl:
    """Request/response calls (metadata, statistics, repository) on one keep-alive connection,
    reopened when the server closes it. Calls are serialized: one at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        self.host, self.port = host, port
        self.headers = headers or {}
        self.timeout_s = timeout_s
        self._conn: HttpConnection | None = None
        self._answer: asyncio.Future[tuple[int, bytes]] | None = None
        self._lock = asyncio.Lock()

    def _on_response(self, conn: HttpConnection, status: int, body: bytes, keep_alive: bool) -> None:
        if not keep_alive:
            conn.close()
            self._conn = None
        if self._answer is not None and not self._answer.done():
            self._answer.set_result((status, body))

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of one call; status 0 with the reason as body when nothing answered."""
        async with self._lock:
            for attempt in range(2):  # a keep-alive connection the server closed meanwhile: once more
                if self._conn is None or not self._conn.open:
                    self._conn = await connect(self.host, self.port, self._on_response, keep_body=True)
                self._answer = asyncio.get_running_loop().create_future()
                hdrs = {**self.headers, **(headers or {})}
                if body:
                    hdrs.setdefault("Content-Type", "application/json")
                self._conn.write(request_bytes(method, f"{self.host}:{self.port}", path, body, hdrs))
                try:
                    status, answer = await asyncio.wait_for(self._answer, self.timeout_s)
                except TimeoutError:
                    self.close()
                    return 0, f"no answer to {method} {path} within {self.timeout_s:.0f} s".encode()
                if status or attempt:
                    return status, answer
                self._conn = None
            return 0, b"unreachable"  # pragma: no cover - the loop returns

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
