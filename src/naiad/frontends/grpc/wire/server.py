"""The listener of naiad's own gRPC transport: accept connections, stop them gracefully."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time

from naiad.config.options import GrpcOptions
from naiad.frontends.connections import ConnectionLimit
from naiad.frontends.grpc.wire.connection import Connection
from naiad.frontends.grpc.wire.router import Route

log = logging.getLogger(__name__)

_STOP_TICK_S = 0.02


class WireServer:
    """gRPC over HTTP/2 written on asyncio (no grpcio server), for every route in `routes`."""

    def __init__(self, routes: dict[bytes, Route], options: GrpcOptions, tls: ssl.SSLContext | None,
                 limit: ConnectionLimit | None = None) -> None:
        self.routes = routes
        self.options = options
        self.tls = tls
        self.limit = limit  # --max-connections, shared with the HTTP listener
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int, backlog: int = 4096) -> None:
        """Listen; OSError when the address cannot be bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self.routes, self.options, self.connections, self.limit),
            host, port, ssl=self.tls, backlog=backlog, reuse_address=True,
        )

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, send GOAWAY, let calls finish for `grace` seconds, then close."""
        if self._server is None:
            return
        self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        deadline = time.monotonic() + (grace or 0.0)
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(_STOP_TICK_S)
        for connection in list(self.connections):
            connection.close()
        await self._server.wait_closed()
        self._server = None
