"""`grpc.health.v1.Health/Check`: SERVING while the server is ready (Triton's answer for every
service name); Watch is not implemented, as in Triton."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from naiad.core.server import InferenceServer
from naiad.frontends.grpc.context import CallContext

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthService(health_pb2_grpc.HealthServicer):
    """The standard gRPC health check, answered from the server's readiness."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: CallContext) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=_SERVING if self.server.is_ready() else _NOT_SERVING)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: CallContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Health/Watch is not implemented")
