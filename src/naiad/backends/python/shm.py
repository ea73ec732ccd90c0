"""Shared memory between the server and a Python model's process, one arena per direction, for
tensors over `messages.INLINE_MAX` bytes (smaller ones travel inside their message).

Each side writes only into its own `Arena` (memfd segments, sent to the other side as file
descriptors over the control socket, so nothing is left in /dev/shm when a process dies) and
reads the other side's through a `SegmentMap`: numpy arrays that are views of the mapping, no
copies. A view's base array carries a finalizer; when the last view of an allocation dies, the
reading side queues its location in `PendingFrees`, and those go back to the writer with the
next message, which then reuses the space.

Allocation is a ring per segment: space is taken at the head and comes back from the tail, so
requests that finish in order (nearly all) recycle one segment forever. An allocation held for
long (a decoupled model keeping its request) only stops the ring from wrapping past it; the arena
then opens a larger segment instead of waiting.

This module imports only the standard library and numpy: it runs inside model processes too.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

ALIGNMENT = 64  # cache-line aligned: the views are handed to numpy kernels as they are
MIN_SEGMENT = 1 << 20
EMPTY = (-1, 0, 0)  # where a zero-byte tensor "lives": nothing is allocated for it


def _aligned(size: int) -> int:
    return (max(size, 1) + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


class _Ring:
    """Ring allocation over one segment; frees may come in any order."""

    __slots__ = ("head", "live", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.head = 0
        # start offset -> [end, freed]; dicts keep insertion (= allocation) order
        self.live: dict[int, list[Any]] = {}

    def alloc(self, size: int) -> int | None:
        if not self.live:
            self.head = 0
        if size > self.size:
            return None
        start: int | None = None
        if not self.live:
            start = 0
        else:
            tail = next(iter(self.live))
            if self.head > tail:  # not wrapped: room at the end, else at the front before the tail
                if self.head + size <= self.size:
                    start = self.head
                elif size <= tail:
                    start = 0
            elif self.head + size <= tail:  # wrapped: room between head and tail
                start = self.head
        if start is None:
            return None
        self.live[start] = [start + size, False]
        self.head = start + size
        return start

    def free(self, start: int) -> None:
        entry = self.live.get(start)
        if entry is None:
            return
        entry[1] = True
        # Give back everything freed at the tail: the ring reclaims space only in order.
        while self.live:
            first = next(iter(self.live))
            if not self.live[first][1]:
                break
            del self.live[first]

    def in_use(self) -> int:
        return sum(1 for _, freed in self.live.values() if not freed)


class Arena:
    """What one side writes: memfd segments with ring allocation, thread-safe.

    `on_new_segment(segment_id, fd, size)` is called (under the arena's lock) when a segment is
    created, so the owner can send the descriptor to the other side before any data refers to it.
    """

    def __init__(self, name: str, on_new_segment: Callable[[int, int, int], None],
                 initial_size: int = MIN_SEGMENT) -> None:
        self._name = name
        self._on_new_segment = on_new_segment
        self._lock = threading.Lock()
        self._segments: list[tuple[mmap.mmap, _Ring, int]] = []  # (mapping, ring, fd)
        self._initial = max(initial_size, ALIGNMENT)

    def write(self, array: np.ndarray) -> tuple[int, int, int]:
        """Copy `array`'s bytes into the arena; returns (segment id, offset, nbytes)."""
        data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        nbytes = data.nbytes
        if not nbytes:
            return EMPTY
        segment, offset = self._alloc(nbytes)
        # one buffer copy, no view objects (numpy's stubs do not say ndarray is a buffer)
        self._segments[segment][0][offset : offset + nbytes] = data  # type: ignore[call-overload]
        return segment, offset, nbytes

    def write_bytes(self, payload: bytes | bytearray | memoryview) -> tuple[int, int, int]:
        nbytes = len(payload)
        if not nbytes:
            return EMPTY
        segment, offset = self._alloc(nbytes)
        self._segments[segment][0][offset : offset + nbytes] = payload
        return segment, offset, nbytes

    def free(self, segment: int, offset: int) -> None:
        with self._lock:
            self._segments[segment][1].free(offset)

    def in_use(self) -> int:
        """Live allocations (for tests: everything handed over eventually comes back)."""
        with self._lock:
            return sum(ring.in_use() for _, ring, _ in self._segments)

    def _alloc(self, nbytes: int) -> tuple[int, int]:
        size = _aligned(nbytes)
        with self._lock:
            if self._segments:  # newest segment first: it is the biggest
                for index in range(len(self._segments) - 1, -1, -1):
                    offset = self._segments[index][1].alloc(size)
                    if offset is not None:
                        return index, offset
            last = self._segments[-1][1].size if self._segments else self._initial // 2
            segment_size = max(2 * last, 2 * size, self._initial)
            index = self._open(segment_size)
            offset = self._segments[index][1].alloc(size)
            assert offset is not None  # a fresh segment is at least twice the request
            return index, offset

    def _open(self, size: int) -> int:
        fd = os.memfd_create(f"{self._name}-{len(self._segments)}", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
        self._segments.append((mapping, _Ring(size), fd))
        index = len(self._segments) - 1
        self._on_new_segment(index, fd, size)
        return index

    def close(self) -> None:
        with self._lock:
            for mapping, _, fd in self._segments:
                os.close(fd)
                with contextlib.suppress(BufferError):  # views still alive: the mapping goes with them
                    mapping.close()
            self._segments.clear()


class PendingFrees:
    """Locations of the other side's allocations that this side no longer uses, to send back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[int, int]] = []

    def add(self, segment: int, offset: int) -> None:
        with self._lock:
            self._items.append((segment, offset))

    def take(self) -> list[tuple[int, int]]:
        if not self._items:
            return []  # (most messages) one added meanwhile goes with a later message, as after a take
        with self._lock:
            items, self._items = self._items, []
        return items

    def __len__(self) -> int:
        return len(self._items)


class SegmentMap:
    """The other side's segments, mapped read-write as their descriptors arrive."""

    def __init__(self, frees: PendingFrees) -> None:
        self._mappings: dict[int, mmap.mmap] = {}
        self._frees = frees

    def add(self, segment: int, fd: int, size: int) -> None:
        self._mappings[segment] = mmap.mmap(fd, size)
        os.close(fd)  # the mapping keeps the memory alive

    def view(self, segment: int, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 view of an allocation; when every array derived from it is gone, the
        allocation is queued to go back to its writer. Take one view per allocation: each
        view gives the allocation back once."""
        if segment < 0:
            return np.empty(0, np.uint8)
        block = np.frombuffer(self._mappings[segment], np.uint8, nbytes, offset)
        # Numpy collapses view chains onto the buffer object it made here, so every array
        # derived from `block` keeps that object alive: it dies with the last of them.
        weakref.finalize(block.base, self._frees.add, segment, offset)
        return block

    def array(self, segment: int, offset: int, nbytes: int, dtype: np.dtype[Any],
              shape: tuple[int, ...]) -> np.ndarray:
        return self.view(segment, offset, nbytes).view(dtype).reshape(shape)

    def close(self) -> None:
        for mapping in self._mappings.values():
            with contextlib.suppress(BufferError):
                mapping.close()
        self._mappings.clear()
