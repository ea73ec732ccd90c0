"""Logging in Triton's line format, and the settings the logging extension reads and changes."""

from __future__ import annotations

import logging
import os
import sys
import threading
from datetime import UTC, datetime
from typing import Any

from naiad.errors import InvalidArgument

_LEVEL_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
                  logging.CRITICAL: "E"}


class TritonFormatter(logging.Formatter):
    """`I0520 20:03:25.829575 1234 file.py:441] "message"` (default) or ISO8601 timestamps."""

    def __init__(self, iso8601: bool = False) -> None:
        super().__init__()
        self.iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        letter = _LEVEL_LETTERS.get(record.levelno, "I")
        if self.iso8601:
            when = datetime.fromtimestamp(record.created, tz=UTC)
            stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ ") + letter
        else:
            stamp = letter + datetime.fromtimestamp(record.created).strftime("%m%d %H:%M:%S.%f")
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f'{stamp} {os.getpid()} {record.filename}:{record.lineno}] "{text}"'


class LogSettings:
    """The logging extension's settings (SPEC §1.12), applied to the `naiad` logger tree."""

    def __init__(self, log_file: str = "", info: bool = True, warning: bool = True, error: bool = True,
                 verbose: int = 0, log_format: str = "default") -> None:
        self._lock = threading.Lock()
        self.values: dict[str, Any] = {
            "log_file": log_file, "log_info": info, "log_warning": warning, "log_error": error,
            "log_verbose_level": verbose, "log_format": log_format,
        }
        stream = open(log_file, "a") if log_file else sys.stderr  # noqa: SIM115 - lives as long as the server
        self.handler = logging.StreamHandler(stream)
        logger = logging.getLogger("naiad")
        for old in [h for h in logger.handlers if getattr(h, "naiad_settings", False)]:
            logger.removeHandler(old)  # one LogSettings owns the output at a time
        self.handler.naiad_settings = True  # type: ignore[attr-defined]
        logger.addHandler(self.handler)
        logger.propagate = False
        self._apply()

    def get(self) -> dict[str, Any]:
        with self._lock:
            return dict(self.values)

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate every change first, then apply them all; returns the full settings."""
        with self._lock:
            checked = {key: self._check(key, value) for key, value in changes.items()}
            self.values.update(checked)
            self._apply()
            return dict(self.values)

    def _check(self, key: str, value: Any) -> Any:
        if key == "log_file":
            raise InvalidArgument("log file location can not be updated through network protocol")
        if key in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise InvalidArgument(f"expect boolean for '{key}'")
            return value
        if key == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument("expect positive integer for 'log_verbose_level'")
            return value
        if key == "log_format":
            if value not in ("default", "ISO8601"):
                raise InvalidArgument(
                    f"invalid argument for log_format, got: {value}; expected: 'default' or 'ISO8601'"
                )
            return value
        raise InvalidArgument(f"Logging setting '{key}' is not supported")

    def _apply(self) -> None:
        values = self.values
        if values["log_verbose_level"] > 0:
            level = logging.DEBUG
        elif values["log_info"]:
            level = logging.INFO
        elif values["log_warning"]:
            level = logging.WARNING
        elif values["log_error"]:
            level = logging.ERROR
        else:
            level = logging.CRITICAL + 1
        logging.getLogger("naiad").setLevel(level)
        self.handler.setFormatter(TritonFormatter(values["log_format"] == "ISO8601"))
