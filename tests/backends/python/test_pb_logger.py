"""pb_utils' Logger (pb_logger): lines into the runtime with their caller's file and line, or to
stderr in upstream's format without one."""

from __future__ import annotations

import sys

import pytest
from backends.python.pb_fakes import FakeRuntime

from naiad.backends.python import pb_utils


def test_logger_reports_the_callers_file_and_line(runtime: FakeRuntime) -> None:
    logger = pb_utils.Logger
    line = sys._getframe().f_lineno
    logger.log_info("info")
    logger.log_warn("warn")
    logger.log_error("error")
    logger.log_verbose("verbose")
    logger.log("default level")
    logger.log("explicit", logger.ERROR)
    pb_utils.Logger.log(message="enum", level=pb_utils.Logger.LogLevel.WARNING)
    assert runtime.logs == [
        (0, "info", __file__, line + 1), (1, "warn", __file__, line + 2), (2, "error", __file__, line + 3),
        (3, "verbose", __file__, line + 4), (0, "default level", __file__, line + 5),
        (2, "explicit", __file__, line + 6), (1, "enum", __file__, line + 7)]
    with pytest.raises(TypeError):
        logger.log("bad level", 9)
    with pytest.raises(TypeError):
        logger.log_info(42)  # type: ignore[arg-type]


def test_logger_without_runtime_writes_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    line = sys._getframe().f_lineno
    pb_utils.Logger.log_warn("careful")
    err = capsys.readouterr().err
    # upstream's pre-channel format: W<mmdd hh:mm:ss.uuuuuu> <pid> <file>:<line>]  <message>
    assert err.startswith("W") and err.endswith(f" test_pb_logger.py:{line + 1}]  careful\n")
