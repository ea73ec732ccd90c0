"""The HTTP listener: start it, stop accepting, close idle connections."""

from __future__ import annotations

import asyncio
import logging

from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.protocol import Connections, HttpProtocol

log = logging.getLogger(__name__)


class HttpService:
    def __init__(self, app: HttpApp, host: str, port: int, backlog: int = 4096) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.backlog = backlog
        self.connections = Connections()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        max_body = self.app.max_input_size
        self._server = await loop.create_server(
            lambda: HttpProtocol(self.app.dispatch, max_body, self.connections),
            self.host, self.port, backlog=self.backlog, reuse_address=True,
        )
        log.info("Started HTTPService at %s:%d", self.host, self.port)

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
