"""Protocol-neutral errors.

Every error the core raises carries a `Status`; each frontend maps the status to its own wire
code (HTTP status, gRPC code). Nothing here knows about HTTP or gRPC.
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    """Triton's internal error codes (TRITONSERVER_Error_Code)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


class NaiadError(Exception):
    """An error with a status that frontends translate; the message is shown to clients as is."""

    status: Status = Status.UNKNOWN

    def __init__(self, message: str, status: Status | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message


class InvalidArgument(NaiadError):
    status = Status.INVALID_ARG


class NotFound(NaiadError):
    status = Status.NOT_FOUND


class Unavailable(NaiadError):
    status = Status.UNAVAILABLE


class Unsupported(NaiadError):
    status = Status.UNSUPPORTED


class InternalError(NaiadError):
    status = Status.INTERNAL


class AlreadyExists(NaiadError):
    status = Status.ALREADY_EXISTS


class Cancelled(NaiadError):
    status = Status.CANCELLED
