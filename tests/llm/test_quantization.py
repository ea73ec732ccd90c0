"""INT8 weight-only quantization: the C kernel against torch, the layer's two paths, and the
engine's greedy tokens and a model's perplexity against fp32 on random-weight models."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from llm.tiny_models import TINY, hf_model, tokens
from naiad.llm import kernels
from naiad.llm.engine import EngineConfig, LLMEngine
from naiad.llm.quantization import KERNEL_MAX_ROWS, Int8Linear, quantize_linears, quantize_rows, weight_bytes
from naiad.llm.sampling_params import SamplingParams


def _dequantized(layer: Int8Linear) -> torch.Tensor:
    return layer.qweight.float() * layer.scale[:, None]


def test_rounding_error_is_at_most_half_a_step() -> None:
    weight = torch.randn(48, 96) * 0.3
    q, scale = quantize_rows(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.all((weight - q.float() * scale[:, None]).abs() <= scale[:, None] / 2 + 1e-7)


@pytest.mark.skipif(kernels.library() is None, reason="no C compiler: the torch path serves alone")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, KERNEL_MAX_ROWS])
def test_the_kernel_matches_torch_on_the_dequantized_weight(dtype: torch.dtype, rows: int) -> None:
    torch.manual_seed(rows)
    layer = Int8Linear(nn.Linear(96, 40, bias=True))
    x = torch.randn(rows, 96).to(dtype)
    expected = x.float() @ _dequantized(layer).T + layer.bias
    got = kernels.int8_linear(x, layer.qweight, layer.scale, layer.bias)
    assert got.dtype == dtype and got.shape == (rows, 40)
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)


def test_prefill_sized_inputs_take_torch_and_agree() -> None:
    torch.manual_seed(0)
    layer = Int8Linear(nn.Linear(64, 32, bias=False))
    x = torch.randn(2, KERNEL_MAX_ROWS + 5, 64)  # more rows than the kernel takes
    torch.testing.assert_close(layer(x), x @ _dequantized(layer).T, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer(x[:, :1]), x[:, :1] @ _dequantized(layer).T, rtol=1e-4, atol=1e-4)


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="quantization must be one of none, int8"):
        quantize_linears(nn.Sequential(nn.Linear(4, 4)), "int4")


def _engine(path: Path, quantization: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=512,
                                  max_model_len=96, quantization=quantization))


def test_int8_greedy_tokens_agree_with_fp32(tiny_models: dict[str, Path]) -> None:
    """Each of fp32's greedy tokens is asked of int8 after the same prefix (teacher forcing: one
    early difference does not count as every later token differing)."""
    prompts = [tokens(12 + i % 7, seed=100 + i) for i in range(32)]
    greedy = SamplingParams(temperature=0.0, min_tokens=8)  # eight tokens each, EOS or not
    full = _engine(tiny_models["llama"], "none").generate(prompts, 8, greedy)
    int8_engine = _engine(tiny_models["llama"], "int8")
    assert isinstance(int8_engine.runner.model.model.layers[0].mlp.down_proj, Int8Linear)
    prefixes = [prompt + out[:i] for prompt, out in zip(prompts, full, strict=True) for i in range(8)]
    wanted = [out[i] for out in full for i in range(8)]
    answers = int8_engine.generate(prefixes, 1, SamplingParams(temperature=0.0, min_tokens=1))
    same = sum(answer == [token] for answer, token in zip(answers, wanted, strict=True))
    assert same / len(wanted) >= 0.95


def test_int8_perplexity_stays_within_two_percent(tiny_models: dict[str, Path]) -> None:
    text = torch.tensor([tokens(64, seed=7)])

    def perplexity(model: nn.Module) -> float:
        with torch.no_grad():
            logits = model(text).logits[0, :-1]
        return math.exp(torch.nn.functional.cross_entropy(logits, text[0, 1:]).item())

    model = hf_model(tiny_models["llama"])
    before, size_before = perplexity(model), weight_bytes(model)
    # transformers' Llama: q, k, v, o, gate, up and down per layer, then the LM head
    assert quantize_linears(model, "int8") == TINY["num_hidden_layers"] * 7 + 1
    after = perplexity(model)
    assert after < before * 1.02
    assert weight_bytes(model) < size_before  # embeddings stay fp32 (tied to the LM head here)
