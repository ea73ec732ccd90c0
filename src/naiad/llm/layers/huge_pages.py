"""The LLM's large CPU tensors (weights, KV cache) on transparent huge pages.

At one stream a decode step does little but read every weight once, so it runs at the rate the
CPU streams memory, and on this project's machines that rate depends on the page size: a 256 MB
buffer summed by two threads, same process, alternating, read at 33-41 GB/s on 4 KiB pages against
50-65 on 2 MiB pages at one time, 29-32 against 33-36 at another, and never slower on huge pages
(docs/benchmarks.md). A hardware prefetcher stops at every 4 KiB page boundary and each page costs
a TLB entry; a huge page gives it 2 MiB to run through.

Linux backs an anonymous private mapping with huge pages where the mapping is advised to
(`MADV_HUGEPAGE`; `/sys/kernel/mm/transparent_hugepage/enabled` set to "madvise", the usual
default, or "always"). torch's CPU allocator advises nothing, so weights land on 4 KiB pages. Here
the runner moves them, once they are in their final layout (packed, quantized), into one such
mapping, and allocates the KV cache in another. Where the kernel says "never" or the platform has
no `MADV_HUGEPAGE`, nothing moves and nothing changes.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

HUGE_PAGE = 2 << 20
_ALIGN = 64  # each tensor's start in an arena: a cache line, and every dtype's alignment
_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def supported() -> bool:
    """Whether anonymous memory can be advised onto huge pages here (Linux, THP not "never"), and
    `NAIAD_LLM_HUGE_PAGES` is not "0" (the switch the before/after measurements use)."""
    if os.environ.get("NAIAD_LLM_HUGE_PAGES", "1") == "0":
        return False
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in _SETTING.read_text()
    except OSError:
        return False


def arena(nbytes: int) -> torch.Tensor:
    """`nbytes` of zeroed memory as a uint8 tensor starting on a huge-page boundary, in a private
    anonymous mapping advised for huge pages (the tensor keeps the mapping alive)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=flags)
    mapping.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: the faults then take huge pages
    whole = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start : start + nbytes]


def zeros(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> list[torch.Tensor]:
    """Zeroed CPU tensors of these shapes, carved from one arena where huge pages are supported
    (else plain `torch.zeros`)."""
    if not supported():
        return [torch.zeros(shape, dtype=dtype) for shape in shapes]
    sizes = [_aligned(math.prod(shape) * dtype.itemsize) for shape in shapes]
    memory = arena(max(1, sum(sizes)))
    # Written now, as torch.zeros writes: otherwise each huge page faults in while serving, the
    # first request to touch it waiting for the kernel to zero (or compact memory for) 2 MiB
    # (a 128-token prefill took 120-245 ms instead of ~80 that way).
    memory.zero_()
    tensors, offset = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        tensors.append(memory[offset : offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape))
        offset += size
    return tensors


def place(module: nn.Module, min_bytes: int = 64 << 10) -> int:
    """Move `module`'s CPU parameters and buffers whose storage holds at least `min_bytes` into one
    arena; returns the bytes moved (0 where huge pages are not supported).

    Storage by storage: tensors that shared a storage (a tied embedding and LM head, views of one
    packed weight) share the new one at the same offsets, and each old storage can be freed as
    soon as its tensors have moved, so the copy needs little more memory than the weights. Call
    it before anything keeps the tensors' addresses (the fused decode's layer table).
    """
    if not supported():
        return 0
    users: dict[int, list[tuple[dict[str, Any], str]]] = {}  # storage -> where its tensors are registered
    sizes: dict[int, int] = {}
    for owner in module.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is None or tensor.device.type != "cpu" or tensor.layout != torch.strided:
                    continue
                storage = tensor.untyped_storage()
                if storage.nbytes() < min_bytes:
                    continue
                users.setdefault(storage.data_ptr(), []).append((table, name))
                sizes[storage.data_ptr()] = storage.nbytes()
    if not users:
        return 0
    memory = arena(sum(_aligned(size) for size in sizes.values()))
    base, offset = memory.storage_offset(), 0
    for key, places in users.items():
        registry, name = places[0]
        old = registry[name]
        assert old is not None
        source = torch.empty(0, dtype=torch.uint8).set_(old.untyped_storage())
        memory[offset : offset + sizes[key]].copy_(source)
        moved: dict[int, torch.Tensor] = {}  # the same tensor object in several places moves once
        for registry, name in places:
            tensor = registry[name]
            assert tensor is not None
            if id(tensor) not in moved:
                start = (base + offset) // tensor.element_size() + tensor.storage_offset()
                moved[id(tensor)] = torch.empty(0, dtype=tensor.dtype).set_(
                    memory.untyped_storage(), start, tensor.size(), tensor.stride())
            new = moved[id(tensor)]
            if isinstance(tensor, nn.Parameter):
                tensor.data = new  # the Parameter object stays: ties by identity hold
            else:
                registry[name] = new
        offset += _aligned(sizes[key])
    return offset


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN

