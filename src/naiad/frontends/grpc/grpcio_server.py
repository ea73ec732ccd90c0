"""The servicers on grpcio's asyncio server: the fallback transport (--grpc-transport=grpcio).

naiad serves gRPC on its own HTTP/2 transport by default (see `wire/`); grpcio's server is kept
because it is the reference implementation of the protocol, for comparison and as a way out.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from naiad.config.options import GrpcOptions
from naiad.errors import Unavailable
from naiad.frontends.connections import ConnectionLimit
from naiad.frontends.grpc.health import HealthService
from naiad.frontends.grpc.service import GrpcInferenceService
from naiad.frontends.grpc.tls import TlsFiles, grpcio_credentials


def channel_options(options: GrpcOptions, connections: int = 0) -> list[tuple[str, int]]:
    """Message size limits (both directions), keepalive with tritonserver's meaning, and the
    maximum connection age (gRPC core jitters it by +-10 % itself), and the hardening limits
    gRPC core has: concurrent streams, idle connections, and `connections` (--max-connections;
    counted apart from the HTTP listener's, 0: none)."""
    chosen = [
        ("grpc.max_send_message_length", options.max_message_size),
        ("grpc.max_receive_message_length", options.max_message_size),
        ("grpc.keepalive_time_ms", options.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", options.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(options.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", options.http2_max_pings_without_data),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", options.http2_min_recv_ping_interval_without_data_ms),
        ("grpc.http2.max_ping_strikes", options.http2_max_ping_strikes),
        ("grpc.server_handshake_timeout_ms", int(options.handshake_timeout_secs * 1000)),
        # gRPC core enforces these limits of the hardening issue itself (its own flood limits,
        # flow control and write back-pressure too); the send timeout and the unsent-bytes
        # limit are naiad's own transport's only.
        ("grpc.max_concurrent_streams", options.max_concurrent_streams),
        # A port another process holds is an error, not a silently shared listener.
        ("grpc.so_reuseport", 0),
    ]
    # 0 is naiad's "no limit"; left out, gRPC core's own default (no limit) applies.
    if options.max_connection_age_ms > 0:
        chosen.append(("grpc.max_connection_age_ms", options.max_connection_age_ms))
    if options.max_connection_age_grace_ms > 0:
        chosen.append(("grpc.max_connection_age_grace_ms", options.max_connection_age_grace_ms))
    if options.max_connection_idle_ms > 0:
        chosen.append(("grpc.max_connection_idle_ms", options.max_connection_idle_ms))
    if connections > 0:
        chosen.append(("grpc.max_allowed_incoming_connections", connections))
    return chosen


class GrpcioServer:
    """GRPCInferenceService and Health on a grpc.aio server."""

    def __init__(self, service: GrpcInferenceService, health: HealthService, options: GrpcOptions,
                 tls: TlsFiles | None, limit: ConnectionLimit | None = None) -> None:
        connections = limit.limit if limit is not None else 0
        self._server = grpc.aio.server(options=channel_options(options, connections))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(health, self._server)
        self.tls = tls

    async def start(self, host: str, port: int) -> None:
        address = f"{host}:{port}"
        try:
            if self.tls is None:
                self._server.add_insecure_port(address)
            else:
                self._server.add_secure_port(address, grpcio_credentials(self.tls))
        except RuntimeError as error:
            raise Unavailable(f"failed to start GRPC service at {address}: {error}") from None
        await self._server.start()

    async def stop(self, grace: float | None) -> None:
        await self._server.stop(grace)
