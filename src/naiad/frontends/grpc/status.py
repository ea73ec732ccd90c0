"""naiad's protocol-neutral Status → gRPC status codes (SPEC §1.2). Only this package knows gRPC codes."""

from __future__ import annotations

import grpc

from naiad.errors import NaiadError, Status

GRPC_CODES: dict[Status, grpc.StatusCode] = {
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
    Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Status.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Status.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Status.CANCELLED: grpc.StatusCode.CANCELLED,
}


def grpc_code(status: Status) -> grpc.StatusCode:
    """Triton's mapping; anything unlisted (UNKNOWN) is UNKNOWN."""
    return GRPC_CODES.get(status, grpc.StatusCode.UNKNOWN)


def as_naiad_error(error: BaseException) -> NaiadError:
    """A backend's failure as a NaiadError: its own status when it has one, else UNKNOWN."""
    return error if isinstance(error, NaiadError) else NaiadError(str(error))
