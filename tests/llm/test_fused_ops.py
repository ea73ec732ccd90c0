"""The C fused element-wise ops against the torch reference they replace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from naiad.llm import kernels
from naiad.llm.models.llama import apply_rotary

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# float32 differs by summation order only; half types may differ in the last place where the
# reference's vectorised exp / rsqrt round differently from the C library's.
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}

pytestmark = pytest.mark.skipif(kernels.library() is None, reason="gcc could not build the kernels")


def _reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 96, generator=generator) * 3).to(dtype)
    weight = torch.randn(96, generator=generator).to(dtype)
    out, summed = kernels.rms_norm(x, weight, 1e-6)
    assert summed is None
    torch.testing.assert_close(out.float(), _reference_norm(x, weight, 1e-6).float(), atol=TOLERANCE[dtype],
                               rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_adds_the_residual_first(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    x, residual = (torch.randn(5, 64, generator=generator).to(dtype) for _ in range(2))
    weight = torch.randn(64, generator=generator).to(dtype)
    out, summed = kernels.rms_norm(x, weight, 1e-5, residual)
    assert summed is not None
    assert torch.equal(summed, x + residual)  # one rounding, as torch's add
    torch.testing.assert_close(out.float(), _reference_norm(x + residual, weight, 1e-5).float(),
                               atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_inside_a_fused_qkv_row(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(2)
    tokens, heads, kv_heads, dim = 6, 4, 2, 32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    angles = torch.rand(tokens, dim // 2, generator=generator) * 6
    emb = torch.cat((angles, angles), dim=-1)[:, None, :]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    expected_q, expected_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    kernels.rotary_(q, k, cos, sin)
    torch.testing.assert_close(q.float(), expected_q.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    torch.testing.assert_close(k.float(), expected_k.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v_before)  # v is left alone


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype: torch.dtype) -> None:
    gate_up = (torch.randn(9, 2 * 80, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gate_up).float(), (F.silu(gate) * up).float(),
                               atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_rotary_refuses_heads_that_are_not_contiguous() -> None:
    q = torch.randn(4, 8, 3).transpose(1, 2)  # [4, 3, 8] with heads strided
    with pytest.raises(ValueError, match="contiguous"):
        kernels.rotary_(q, q, torch.ones(4, 8), torch.zeros(4, 8))


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch (and so the kernels' OpenMP team) on two threads, whatever the machine has."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prompt_split_over_threads_rotates_as_one_token_at_a_time(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(4)
    tokens, heads, kv_heads, dim = 70, 4, 2, 32  # 70 tokens: jobs of 35 on two threads
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype)
    angles = torch.rand(tokens, dim // 2, generator=generator) * 6
    emb = torch.cat((angles, angles), dim=-1)[:, None, :]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    alone = qkv.clone()
    for t in range(tokens):  # one token per call: always on the calling thread
        row = alone[t : t + 1]
        kernels.rotary_(row[:, : heads * dim].view(1, heads, dim),
                        row[:, heads * dim : (heads + kv_heads) * dim].view(1, kv_heads, dim), cos[t], sin[t])
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    expected_q = apply_rotary(q.clone(), cos, sin)
    kernels.rotary_(q, k, cos, sin)
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    assert torch.equal(qkv.view(bits), alone.view(bits))
    torch.testing.assert_close(q.float(), expected_q.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_split_over_threads_gate_as_one_row_at_a_time(dtype: torch.dtype) -> None:
    gate_up = (torch.randn(70, 2 * 80, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    together = kernels.silu_mul(gate_up)
    one_by_one = torch.cat([kernels.silu_mul(gate_up[r : r + 1]) for r in range(70)])
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    assert torch.equal(together.view(bits), one_by_one.view(bits))
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(together.float(), (F.silu(gate) * up).float(), atol=TOLERANCE[dtype],
                               rtol=TOLERANCE[dtype])
