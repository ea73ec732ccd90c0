"""The gRPC listener: GRPCInferenceService and grpc.health.v1.Health on --grpc-address:--grpc-port.

By default it runs naiad's own HTTP/2 transport on the event loop (`wire/`), which serves about
twice the calls per second of grpcio's asyncio server on the same machine (docs/benchmarks.md,
"gRPC frontend candidates"); --grpc-transport=grpcio selects grpcio's server instead. Both
run the same servicer.
"""

from __future__ import annotations

import logging
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2

from naiad.config.options import ServerOptions
from naiad.core.server import InferenceServer
from naiad.errors import Unavailable
from naiad.frontends.connections import ConnectionLimit
from naiad.frontends.grpc.access import grpc_gates, guard, header_checks
from naiad.frontends.grpc.grpcio_server import GrpcioServer
from naiad.frontends.grpc.health import HealthService
from naiad.frontends.grpc.service import GrpcInferenceService
from naiad.frontends.grpc.tls import ssl_context, tls_files
from naiad.frontends.grpc.wire.router import routes
from naiad.frontends.grpc.wire.server import WireServer

log = logging.getLogger(__name__)

#: --grpc-infer-response-compression-level → the algorithm gRPC's own level mapping picks for
#: clients that accept gzip and deflate (low and medium: the first, high: the last).
COMPRESSION: dict[str, grpc.Compression | None] = {
    "none": None,
    "low": grpc.Compression.Gzip,
    "medium": grpc.Compression.Gzip,
    "high": grpc.Compression.Deflate,
}


class Transport(Protocol):
    async def start(self, host: str, port: int) -> None: ...
    async def stop(self, grace: float | None) -> None: ...


class GrpcService:
    """The gRPC frontend: servicers on the transport --grpc-transport names (naiad | grpcio)."""

    def __init__(self, server: InferenceServer, options: ServerOptions, limit: ConnectionLimit | None = None) -> None:
        self.server = server
        self.limit = limit  # --max-connections (naiad's own transport; grpcio counts its own)
        self.host, self.port = options.grpc_address, options.grpc_port
        self.options = options.grpc
        self.transport_name = options.grpc.transport
        self.access = options.access
        self._transport: Transport | None = None

    async def start(self) -> None:
        """Listen; Unavailable when the address cannot be bound or TLS files cannot be read."""
        transport = self._transport_for()
        try:
            await transport.start(self.host, self.port)
        except OSError as error:
            raise Unavailable(f"failed to start GRPC service at {self.host}:{self.port}: {error}") from None
        self._transport = transport
        log.info("Started GRPCInferenceService at %s:%d", self.host, self.port)

    def _transport_for(self) -> Transport:
        tls = tls_files(self.options)
        compression = COMPRESSION[self.options.response_compression_level]
        service = GrpcInferenceService(self.server, self.options.header_forward_pattern, compression)
        health = HealthService(self.server)
        access = self.access
        gated = grpc_gates(access.grpc_restricted, access.auth_token, access.auth_health)
        if self.transport_name == "grpcio":
            if gated:
                guard([service, health], gated)
            return GrpcioServer(service, health, self.options, tls, self.limit)
        # naiad's own transport checks access at a call's headers, before reading its body.
        table = routes([(service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"], service),
                        (health_pb2.DESCRIPTOR.services_by_name["Health"], health)], header_checks(gated))
        return WireServer(table, self.options, ssl_context(tls) if tls else None, self.limit)

    async def stop(self, grace: float | None = None) -> None:
        """Stop listening; calls still open after `grace` seconds are cancelled."""
        if self._transport is not None:
            await self._transport.stop(grace)
            self._transport = None
