"""Decode attention over the paged KV cache on the GPU, as one Triton kernel.

One program per (row, head) walks the row's block table a block at a time with an online
softmax (running max, running sum, rescaled accumulator), reading K and V straight from the
cache: no gather into a padded copy and no mask tensor, unlike the torch reference. Used on
CUDA devices when the `triton` package is importable (PyTorch's CUDA wheels ship it); the
torch reference is used otherwise. `NAIAD_LLM_KERNELS=0` turns it off, as the CPU kernel.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the GPU path is the torch reference
    triton = None


def supports(q: torch.Tensor, block_size: int) -> bool:
    return (
        triton is not None
        and (q.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
        and os.environ.get("NAIAD_LLM_KERNELS", "1") != "0"
        and _power_of_two(q.shape[-1])  # tl.arange needs powers of two
        and _power_of_two(block_size)
    )


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


if triton is not None:

    @triton.jit
    def _paged_decode(
        q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr,
        scale, window,
        stride_q_row, stride_q_head,
        stride_k_block, stride_k_slot, stride_k_head,
        stride_table_row,
        stride_out_row, stride_out_head,
        GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        context = tl.load(lens_ptr + row)
        first = tl.where(window > 0, tl.maximum(context - window, 0), 0)
        dims = tl.arange(0, HEAD_DIM)
        slots = tl.arange(0, BLOCK_SIZE)
        q = tl.load(q_ptr + row * stride_q_row + head * stride_q_head + dims).to(tl.float32) * scale
        running_max = -float("inf")
        running_sum = 0.0
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        # Every block visited holds at least one visible position, so the max is finite after
        # the first one and no exp(-inf - -inf) arises.
        for index in range(first // BLOCK_SIZE, tl.cdiv(context, BLOCK_SIZE)):
            block = tl.load(tables_ptr + row * stride_table_row + index).to(tl.int64)
            positions = index * BLOCK_SIZE + slots
            visible = (positions < context) & (positions >= first)
            offsets = block * stride_k_block + slots[:, None] * stride_k_slot + kv_head * stride_k_head + dims[None, :]
            k = tl.load(k_ptr + offsets, mask=visible[:, None], other=0.0).to(tl.float32)
            scores = tl.where(visible, tl.sum(k * q[None, :], axis=1), -float("inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=0))
            weights = tl.exp(scores - new_max)
            rescale = tl.exp(running_max - new_max)
            v = tl.load(v_ptr + offsets, mask=visible[:, None], other=0.0).to(tl.float32)
            acc = acc * rescale + tl.sum(weights[:, None] * v, axis=0)
            running_sum = running_sum * rescale + tl.sum(weights, axis=0)
            running_max = new_max
        out = acc / running_sum
        tl.store(out_ptr + row * stride_out_row + head * stride_out_head + dims, out.to(out_ptr.dtype.element_ty))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`q` `[rows, heads, d]`, one query per row, over `[blocks, block_size, kv_heads, d]` caches."""
    assert triton is not None, "triton is not installed"
    rows, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    if rows == 0:
        return out
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("the K and V caches must share one layout with contiguous head dims")
    _paged_decode[(rows, heads)](
        q, k_cache, v_cache, block_tables, context_lens, out,
        scale, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
    )
    return out
