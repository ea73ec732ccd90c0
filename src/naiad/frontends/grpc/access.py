"""Access control on the gRPC methods: each RPC's API group, and the refusals.

The checks are protocol-neutral (`naiad.frontends.access`). Only the methods that need a check
are wrapped, on the servicer instance itself, so both transports (naiad's own and grpcio's,
which look methods up by name on the servicer) see the guarded ones and unguarded methods
cost nothing. A restricted group missing its metadata ends the call with UNAVAILABLE and
Triton's text (grpc_server.cc / infer_handler.cc); a missing or wrong bearer token with
UNAUTHENTICATED.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import grpc

from naiad.frontends.access import Denial, Gate, Restriction, gates

#: RPC name → Triton API group (GRPCInferenceService, and grpc.health.v1.Health in "health").
METHOD_GROUPS: dict[str, str | None] = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health", "Watch": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "ModelStatistics": "statistics",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}

_RESTRICTED = "This protocol is restricted, expecting header '{header}'"
_CODES = {Denial.RESTRICTED: grpc.StatusCode.UNAVAILABLE, Denial.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED}


def grpc_gates(restricted: dict[str, Restriction], token: str, token_for_health: bool) -> dict[str, Gate]:
    """The gate of each RPC that needs one; `restricted` keys already carry Triton's
    `triton-grpc-protocol-` prefix (cli parses them so)."""
    return gates(METHOD_GROUPS, restricted, token, token_for_health, _RESTRICTED)


def header_checks(table: dict[str, Gate]) -> dict[str, Callable[[list[tuple[bytes, bytes]]], tuple[int, str] | None]]:
    """The gates as checks of a call's raw HTTP/2 headers, for naiad's own transport: a call
    is refused from its headers, before any of its body is read (a stranger's upload costs
    nothing), with the same status and message as `guard`'s."""
    return {name: _header_check(gate) for name, gate in table.items()}


def _header_check(gate: Gate) -> Callable[[list[tuple[bytes, bytes]]], tuple[int, str] | None]:
    wanted = gate.header.encode() if gate.header is not None else None

    def check(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
        authorization = restricted = None
        for name, value in headers:
            if name == b"authorization":
                authorization = value
            elif name == wanted:
                restricted = value
        denied = gate.check(authorization, restricted)
        return None if denied is None else (int(_CODES[denied[0]].value[0]), denied[1])

    return check


def guard(servicers: list[object], table: dict[str, Gate]) -> None:
    """Replace each gated method of `servicers` by one that checks the call's metadata first."""
    for servicer in servicers:
        for name, gate in table.items():
            method = getattr(servicer, name, None)
            if method is not None:
                setattr(servicer, name, _guarded(method, gate))


def _guarded(method: Callable[[Any, Any], Any], gate: Gate) -> Callable[[Any, Any], Any]:
    @functools.wraps(method)
    async def call(request: Any, context: Any) -> Any:
        authorization = restricted = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                authorization = value
            elif key == gate.header:
                restricted = value
        denied = gate.check(authorization, restricted)
        if denied is not None:
            await context.abort(_CODES[denied[0]], denied[1])
        return await method(request, context)

    return call

