"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.utils.shared_memory as shm

from e2e.shm_util import Regions


@pytest.fixture
def regions() -> Iterator[Regions]:
    created = Regions()
    yield created
    created.destroy()
    assert not any(key.startswith(f"/naiad-e2e-{created.tag}") for key in shm.mapped_shared_memory_regions())
