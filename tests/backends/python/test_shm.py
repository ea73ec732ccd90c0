"""The shared-memory arenas: ring allocation, views without copies, frees when views die."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from naiad.backends.python.shm import ALIGNMENT, Arena, PendingFrees, SegmentMap, _Ring


def test_ring_reuses_space_freed_in_order() -> None:
    ring = _Ring(4 * ALIGNMENT)
    first = ring.alloc(ALIGNMENT)
    second = ring.alloc(2 * ALIGNMENT)
    assert (first, second) == (0, ALIGNMENT)
    assert ring.alloc(2 * ALIGNMENT) is None  # only one block left at the end
    ring.free(first)
    assert ring.alloc(2 * ALIGNMENT) is None  # the hole at the front is one block: too small
    assert ring.alloc(ALIGNMENT) == 3 * ALIGNMENT
    assert ring.alloc(ALIGNMENT) == 0  # wraps into the freed front
    ring.free(second)
    assert ring.in_use() == 2


def test_ring_out_of_order_free_waits_for_the_tail() -> None:
    ring = _Ring(3 * ALIGNMENT)
    a, b, c = (ring.alloc(ALIGNMENT) for _ in range(3))
    ring.free(b)
    ring.free(c)
    assert ring.alloc(ALIGNMENT) is None  # `a` still holds the tail
    ring.free(a)
    assert ring.in_use() == 0
    assert ring.alloc(3 * ALIGNMENT) == 0


def test_arena_grows_when_a_long_allocation_blocks_the_ring() -> None:
    segments: list[tuple[int, int]] = []
    arena = Arena("test", lambda seg, fd, size: segments.append((seg, size)), initial_size=1024)
    try:
        held = arena.write(np.zeros(200, np.uint8))
        for _ in range(20):  # the ring fills behind `held`, then a bigger segment opens
            seg, off, _ = arena.write(np.ones(300, np.uint8))
            arena.free(seg, off)
        assert len(segments) >= 1
        assert arena.in_use() == 1
        arena.free(held[0], held[1])
        assert arena.in_use() == 0
    finally:
        arena.close()


def test_views_share_memory_and_free_when_the_last_view_dies() -> None:
    frees = PendingFrees()
    reader = SegmentMap(frees)
    arena = Arena("test", lambda seg, fd, size: reader.add(seg, os.dup(fd), size))
    try:
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        seg, off, nbytes = arena.write(data)
        view = reader.array(seg, off, nbytes, np.dtype(np.float32), (3, 4))
        np.testing.assert_array_equal(view, data)
        view[0, 0] = 42.0  # the writer's memory changes too: the view is no copy
        assert arena._segments[seg][0][off : off + 4] == np.float32(42.0).tobytes()
        column = view[:, 1]
        del view
        gc.collect()
        assert len(frees) == 0  # `column` still looks at the allocation
        del column
        assert frees.take() == [(seg, off)]
        arena.free(seg, off)
        assert arena.in_use() == 0
    finally:
        arena.close()
        reader.close()


def test_zero_byte_tensors_take_no_space() -> None:
    arena = Arena("test", lambda *args: pytest.fail("no segment needed"))
    assert arena.write(np.zeros((0, 4), np.float32)) == (-1, 0, 0)
    reader = SegmentMap(PendingFrees())
    assert reader.array(-1, 0, 0, np.dtype(np.float32), (0, 4)).shape == (0, 4)
