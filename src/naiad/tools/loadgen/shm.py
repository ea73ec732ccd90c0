"""System shared memory regions for requests whose tensors skip the wire (perf_analyzer's
`--shared-memory system`): one region holds every input, written once; each slot gets its own
region for outputs, so concurrent answers never write over each other."""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

SHM_DIR = Path("/dev/shm")


@dataclass
class Region:
    """A POSIX shared memory object (`/dev/shm/<key>`) mapped into this process."""

    name: str  # the name it is registered under
    key: str  # "/<file name>", as the server opens it
    byte_size: int
    _map: mmap.mmap | None = field(default=None, repr=False)

    @classmethod
    def create(cls, name: str, byte_size: int) -> Region:
        key = f"/naiad_bench_{os.getpid()}_{secrets.token_hex(4)}_{name}"
        fd = os.open(SHM_DIR / key[1:], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, max(1, byte_size))
            mapped = mmap.mmap(fd, max(1, byte_size))
        finally:
            os.close(fd)
        return cls(name, key, byte_size, mapped)

    def write(self, offset: int, data: bytes) -> None:
        assert self._map is not None
        self._map[offset : offset + len(data)] = data

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        (SHM_DIR / self.key[1:]).unlink(missing_ok=True)


def shm_available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)
