"""Fixtures for the pb_utils tests: no runtime leaks from one test to the next."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from backends.python.pb_fakes import FakeRuntime

from naiad.backends.python import pb_metrics, pb_utils


@pytest.fixture(autouse=True)
def _no_runtime_left_behind() -> Iterator[None]:
    pb_utils._set_runtime(None)
    pb_metrics.take_changes()  # custom-metric changes another test left for its runtime
    yield
    pb_utils._set_runtime(None)


@pytest.fixture
def runtime() -> FakeRuntime:
    fake = FakeRuntime()
    pb_utils._set_runtime(fake)
    return fake
