"""pb_utils' errors: TritonError with Triton's codes, and TritonModelException (see pb_utils)."""

from __future__ import annotations

import enum

from naiad.backends.python.pb_args import as_str

# -- errors ----------------------------------------------------------------------------------


class _ErrorCode(enum.IntEnum):
    """TRITONSERVER_Error_Code, in tritonserver.h order."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error to put in an `InferenceResponse`: `TritonError("bad input", TritonError.INVALID_ARG)`."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = _ErrorCode.INTERNAL) -> None:
        message = as_str(message, "TritonError(): message")
        try:
            self._code = _ErrorCode(code)
        except (ValueError, TypeError):
            raise TypeError(f"TritonError(): code must be one of the TritonError codes, got {code!r}") from None
        self._message = message

    def message(self) -> str:
        return self._message

    def code(self) -> _ErrorCode:
        return self._code

    # Upstream prints the bare object; the message is what anyone printing an error wants.
    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, TritonError.{self._code.name})"


class TritonModelException(Exception):
    """Raised by pb_utils on misuse, and by models from initialize/execute/finalize to fail them."""

    def message(self) -> str:
        return str(self)
