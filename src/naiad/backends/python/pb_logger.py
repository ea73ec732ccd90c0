"""pb_utils' Logger: model logging into the server log, each line with its caller's file and line
(see pb_utils). Without a runtime (pb_runtime) lines go to stderr in upstream's format."""

from __future__ import annotations

import datetime
import enum
import os
import sys
from typing import Any

from naiad.backends.python import pb_runtime
from naiad.backends.python.pb_args import as_str


class _LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Model logging into the server log: `pb_utils.Logger.log_info("...")`, or
    `Logger.log("...", Logger.WARNING)`. Each line carries the caller's file and line."""

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = _LogLevel.INFO) -> None:
        _emit(message, level, sys._getframe(1))

    @staticmethod
    def log_info(message: str) -> None:
        _emit(message, _LogLevel.INFO, sys._getframe(1))

    @staticmethod
    def log_warn(message: str) -> None:
        _emit(message, _LogLevel.WARNING, sys._getframe(1))

    @staticmethod
    def log_error(message: str) -> None:
        _emit(message, _LogLevel.ERROR, sys._getframe(1))

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit(message, _LogLevel.VERBOSE, sys._getframe(1))


_LEADING_CHAR = {_LogLevel.INFO: "I", _LogLevel.WARNING: "W", _LogLevel.ERROR: "E", _LogLevel.VERBOSE: "I"}


def _emit(message: Any, level: Any, frame: Any) -> None:
    if isinstance(message, bytes | bytearray):  # a log line is worth keeping even when not UTF-8
        message = bytes(message).decode("utf-8", "replace")
    message = as_str(message, "Logger: message")
    try:
        log_level = _LogLevel(level)
    except (ValueError, TypeError):
        raise TypeError(f"Logger: level must be a Logger.LogLevel, got {level!r}") from None
    # The frame of whoever called Logger.*, as upstream reads it with inspect.currentframe().
    filename, line = frame.f_code.co_filename, int(frame.f_lineno)
    runtime = pb_runtime.get()
    if runtime is not None:
        runtime.log(int(log_level), message, filename, line)
        return
    # Upstream's format before the stub's log channel is up: glog-like prefix, then two blanks.
    now = datetime.datetime.now(datetime.UTC)
    prefix = (f"{_LEADING_CHAR[log_level]}{now:%m%d %H:%M:%S}.{now.microsecond:06d} {os.getpid()} "
              f"{os.path.basename(filename)}:{line}]")
    print(f"{prefix}  {message}", file=sys.stderr, flush=True)
