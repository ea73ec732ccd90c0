"""Client-side shared-memory regions for tests: unique keys, all destroyed at the end."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import tritonclient.utils.shared_memory as shm


class Regions:
    """Creates shared-memory objects with unique keys and destroys every one at the end."""

    def __init__(self) -> None:
        self.handles: dict[str, Any] = {}
        self.tag = uuid.uuid4().hex[:12]

    def create(self, name: str, byte_size: int, data: list[np.ndarray] | None = None, offset: int = 0) -> str:
        key = f"/naiad-e2e-{self.tag}-{name}"
        self.handles[name] = shm.create_shared_memory_region(name, key, byte_size)
        if data:
            shm.set_shared_memory_region(self.handles[name], data, offset)
        return key

    def contents(self, name: str, dtype: Any, shape: list[int], offset: int = 0) -> np.ndarray:
        return shm.get_contents_as_numpy(self.handles[name], dtype, shape, offset)

    def destroy(self) -> None:
        for handle in self.handles.values():
            shm.destroy_shared_memory_region(handle)
        self.handles.clear()
