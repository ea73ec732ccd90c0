"""The memory-bandwidth ceiling of one decode step, measured in the same run (issue 21).

At one stream a decode step reads every weight the model uses once and does little arithmetic
per byte, so no engine can step faster than the time this machine takes to read those bytes.
The ceiling is that time: the bytes one step reads (`decode_read_bytes`) over the rate at which
torch's threads read a buffer of the same size (`read_rate`, a STREAM-style sum). Both benchmarks
that quote it (bench/llm_engine_step.py, bench/llm.py) measure the rate beside the steps they
compare with it: on a shared virtual machine the read rate moved between 25 and 56 GB/s within
an hour, so a rate from another run would say nothing.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from naiad.llm.layers import huge_pages


def decode_read_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter and buffer once (a tied LM head
    shares the embedding's tensor), not counting an embedding table the LM head does not use
    (a step reads one row of it per token: a few KB)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    inner = getattr(model, "model", None)
    embedding = getattr(getattr(inner, "embed_tokens", None), "weight", None)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if isinstance(embedding, torch.Tensor) and not (isinstance(head, torch.Tensor) and head is embedding):
        total -= embedding.numel() * embedding.element_size()
    return total


def read_rate(nbytes: int, repeats: int = 7) -> float:
    """Bytes per second at which torch's threads sum a float32 buffer of `nbytes` (median of
    `repeats` passes after one to warm it); the buffer is freed before returning.

    The buffer lies on huge pages where the engine puts its weights there (naiad.llm.layers.
    huge_pages): the ceiling is then the fastest rate this machine reads, not the 4 KiB-page rate
    (up to 33-41 against 50-65 GB/s on the same machine at the same time; docs/benchmarks.md)."""
    buffer = huge_pages.zeros([(max(1, nbytes // 4),)], torch.float32)[0]
    buffer.fill_(1.0)
    buffer.sum()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - started)
    read = buffer.numel() * buffer.element_size()
    del buffer
    return read / statistics.median(times)


def ceiling_tokens_per_s(read_bytes: int, rate: float, streams: int = 1) -> float:
    """Tokens per second if a step took only the time to read its weights once."""
    return streams * rate / read_bytes
