"""The Triton decode-attention kernel against the torch reference, on a GPU (or, for whoever
debugs it, on the CPU with TRITON_INTERPRET=1)."""

from __future__ import annotations

import os

import pytest
import torch

from naiad.llm.kernels import triton_attention
from naiad.llm.layers.attention import AttentionMetadata, decode_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(triton_attention.triton is None, reason="triton is not installed"),
    pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1", reason="no CUDA device"),
]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _case(dtype: torch.dtype, heads: int, kv_heads: int, lens: list[int], block: int = 16, head_dim: int = 64):
    generator = torch.Generator().manual_seed(0)
    num_blocks = sum(-(-n // block) for n in lens) + 3
    shape = (num_blocks, block, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=generator).to(DEVICE, dtype) for _ in range(2))
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables, used = [], 0
    for n in lens:
        tables.append(order[used : used + -(-n // block)])
        used += -(-n // block)
    meta = AttentionMetadata.build([1] * len(lens), lens, tables, block, DEVICE)
    q = torch.randn(len(lens), heads, head_dim, generator=generator).to(DEVICE, dtype)
    return q, (k_cache, v_cache), meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2)])
def test_triton_kernel_matches_the_reference(dtype: torch.dtype, heads: int, kv_heads: int) -> None:
    q, cache, meta = _case(dtype, heads, kv_heads, [1, 15, 16, 17, 100, 300])
    assert triton_attention.supports(q, 16)
    out = triton_attention.paged_decode_attention(q, *cache, meta.decode_block_tables, meta.decode_context_lens, 0.125)
    expected = decode_reference(q, cache, meta, 0.125)
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("window", [1, 7, 16, 40])
def test_triton_kernel_with_a_sliding_window(window: int) -> None:
    q, cache, meta = _case(torch.float32, 4, 2, [1, 6, 33, 90], block=4, head_dim=32)
    out = triton_attention.paged_decode_attention(q, *cache, meta.decode_block_tables, meta.decode_context_lens,
                                                  0.2, window)
    expected = decode_reference(q, cache, meta, 0.2, window)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
