import logging
import re

import pytest

from naiad.errors import InvalidArgument
from naiad.observability.logs import LogSettings

LINE = re.compile(r'^I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ test_logs\.py:\d+\] "hello 42"$')
ISO_LINE = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z I \d+ test_logs\.py:\d+\] "hello 42"$')


def test_log_file_gets_tritons_line_format(tmp_path):
    path = tmp_path / "naiad.log"
    settings = LogSettings(log_file=str(path))
    logging.getLogger("naiad.test").info("hello %d", 42)
    settings.handler.flush()
    assert LINE.match(path.read_text().strip())
    assert settings.get()["log_file"] == str(path)


def test_iso8601_format_and_levels(tmp_path):
    path = tmp_path / "naiad.log"
    settings = LogSettings(log_file=str(path), log_format="ISO8601")
    logger = logging.getLogger("naiad.test")
    logger.info("hello %d", 42)
    settings.update({"log_info": False})
    logger.info("not written")
    logger.warning("hello %d", 42)
    settings.handler.flush()
    lines = path.read_text().strip().splitlines()
    assert len(lines) == 2 and ISO_LINE.match(lines[0])
    assert lines[1].split(" ")[1] == "W"


def test_verbose_level_enables_debug():
    settings = LogSettings(verbose=1)
    assert logging.getLogger("naiad").isEnabledFor(logging.DEBUG)
    settings.update({"log_verbose_level": 0})
    assert not logging.getLogger("naiad").isEnabledFor(logging.DEBUG)


def test_a_bad_update_changes_nothing():
    settings = LogSettings()
    with pytest.raises(InvalidArgument, match="expect boolean for 'log_info'"):
        settings.update({"log_warning": False, "log_info": "yes"})
    assert settings.get()["log_warning"] is True
