"""The HTTP listener: start it, stop accepting, close idle connections."""

from __future__ import annotations

import asyncio
import logging

from naiad.frontends.connections import ConnectionLimit
from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.protocol import Connections, HttpProtocol
from naiad.frontends.http.tls import http_ssl_context

log = logging.getLogger(__name__)


class HttpService:
    def __init__(self, app: HttpApp, host: str, port: int, backlog: int = 4096,
                 read_timeout: float = 0.0, tls: tuple[str, str] = ("", ""), max_requests: int = 0,
                 idle_timeout: float = 0.0, limit: ConnectionLimit | None = None) -> None:
        self.app = app
        self.idle_timeout = idle_timeout  # --http-idle-timeout-secs; 0: no limit
        self.limit = limit  # --max-connections, shared with the gRPC listener
        self.max_requests = max_requests  # --http-max-requests-per-connection; 0: no limit
        self.read_timeout = read_timeout  # --http-read-timeout-secs; 0: no limit
        self.tls = tls  # (--http-ssl-cert, --http-ssl-key); empty: plain HTTP
        self.host = host
        self.port = port
        self.backlog = backlog
        self.connections = Connections()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        max_body = self.app.max_input_size
        context = http_ssl_context(*self.tls)  # Unavailable (a start-up error) when unusable
        admit = self.app.admit if self.app.gates is not None else None
        self._server = await loop.create_server(
            lambda: HttpProtocol(self.app.dispatch, max_body, self.connections, self.read_timeout,
                                 self.max_requests, admit, self.idle_timeout, self.limit,
                                 self.app.dispatch_now),
            self.host, self.port, backlog=self.backlog, reuse_address=True, ssl=context,
        )
        log.info("Started HTTPService at %s:%d%s", self.host, self.port, " (HTTPS)" if context else "")

    def stop_accepting(self) -> None:
        """Shutdown has begun: refuse new connections (as Triton, server PR #6986); open ones go on."""
        if self._server is not None:
            self._server.close()

    def busy(self) -> int:
        """Connections with a request being answered or queued."""
        return self.connections.busy()

    async def stop(self) -> None:
        """Stop accepting, close idle keep-alive connections, and let busy ones finish their reply."""
        if self._server is not None:
            self._server.close()
        self.connections.close_idle()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
