"""8-bit linear layers: the packed layout, the C kernel (VNNI and portable paths) against torch,
the layers' two paths, and the engine's greedy tokens and a model's perplexity against fp32 on
random-weight models (test_quantization_smollm2.py does the same on a real model)."""

from __future__ import annotations

import ctypes
import math
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from llm.tiny_models import TINY, hf_model, tokens
from naiad.llm import kernels
from naiad.llm.engine import EngineConfig, LLMEngine
from naiad.llm.quantization import (
    KERNEL_MAX_ROWS,
    Int8Linear,
    Q8BlockLinear,
    pack,
    quantize_linears,
    quantize_rows,
    unpack,
    weight_bytes,
)
from naiad.llm.sampling_params import SamplingParams

needs_kernels = pytest.mark.skipif(kernels.library() is None, reason="no C compiler: the torch path serves alone")
# Both of the kernel's paths: "0" forces the portable one on a CPU with VNNI.
PATHS = [pytest.param("1", id="vnni-if-present"), pytest.param("0", id="portable")]


def _quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """What the kernel multiplies: each row's blocks of 32 rounded to int8 steps (zero-padded)."""
    rows, inp = x.shape
    padded = nn.functional.pad(x.float(), (0, -inp % 32)).reshape(rows, -1, 32)
    scale = padded.abs().amax(dim=2, keepdim=True) / 127.0
    q = torch.where(scale > 0, torch.round(padded / scale), torch.zeros_like(padded))
    return (q * scale).reshape(rows, -1)[:, :inp]


def test_rounding_error_is_at_most_half_a_step() -> None:
    weight = torch.randn(48, 96) * 0.3
    q, scale = quantize_rows(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.all((weight - q.float() * scale[:, None]).abs() <= scale[:, None] / 2 + 1e-7)


def test_pack_pads_to_whole_panels_and_unpack_inverts_it() -> None:
    q = torch.randint(-127, 128, (40, 70), dtype=torch.int8)
    packed = pack(q)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 96 // 4, 16, 4)  # 40 → 48 channels, 70 → 96 inputs
    # channel 17's inputs 4..7 sit in panel 1, quad 1, lane 1, stored as w + 128
    assert packed[1, 1, 1].tolist() == [int(v) + 128 for v in q[17, 4:8]]
    assert packed[2, :, 8:].eq(128).all() and packed[:, 70 // 4 + 1 :].eq(128).all()  # zero weights pad
    torch.testing.assert_close(unpack(packed, 40, 70), q)


@needs_kernels
@pytest.mark.parametrize("vnni", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, KERNEL_MAX_ROWS, 37])
def test_the_kernel_matches_torch_on_the_same_quantized_inputs(
    monkeypatch: pytest.MonkeyPatch, vnni: str, dtype: torch.dtype, rows: int
) -> None:
    monkeypatch.setenv("NAIAD_LLM_VNNI", vnni)
    torch.manual_seed(rows)
    layer = Int8Linear(nn.Linear(80, 40, bias=True))  # 80 inputs: a padded last block; 40: a part panel
    x = torch.randn(rows, 80).to(dtype)
    got = kernels.q8_linear(x, layer.packed, layer.scales, layer.scale_kind, layer.bias, 40)
    assert got.dtype == dtype and got.shape == (rows, 40)
    expected = _quantized_activations(x) @ layer.dequantized().T + layer.bias
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)
    # and against the unquantized activations: the error is the activations' rounding, small
    exact = x.float() @ layer.dequantized().T + layer.bias
    assert (got.float() - exact).abs().max() < 0.02 * exact.abs().max()


@needs_kernels
@pytest.mark.parametrize("vnni", PATHS)
def test_the_kernel_multiplies_q8_0_blocks(monkeypatch: pytest.MonkeyPatch, vnni: str) -> None:
    monkeypatch.setenv("NAIAD_LLM_VNNI", vnni)
    torch.manual_seed(1)
    q = torch.randint(-127, 128, (24, 96), dtype=torch.int8)
    scales = (torch.rand(24, 3) * 0.01 + 1e-3).half()
    layer = Q8BlockLinear(q, scales, bias=torch.randn(24))
    dequantized = (q.float().reshape(24, 3, 32) * scales.float()[..., None]).reshape(24, 96)
    torch.testing.assert_close(layer.dequantized(), dequantized)
    x = torch.randn(5, 96)
    expected = _quantized_activations(x) @ dequantized.T + layer.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("vnni", PATHS)
def test_the_kernel_multiplies_q4_1_blocks_with_minimums(monkeypatch: pytest.MonkeyPatch, vnni: str) -> None:
    """w = d q + m, q in 0..15: the kernel keeps q - 8 and adds (m + 8 d) times each block's sum of x."""
    monkeypatch.setenv("NAIAD_LLM_VNNI", vnni)
    torch.manual_seed(3)
    q = torch.randint(0, 16, (24, 96), dtype=torch.int8)
    scales, mins = (torch.rand(24, 3) * 0.02 + 1e-3).half(), (-torch.rand(24, 3) * 0.1).half()
    layer = Q8BlockLinear(q, scales, None, mins)
    d, m = scales.float().repeat_interleave(32, 1), mins.float().repeat_interleave(32, 1)
    torch.testing.assert_close(layer.dequantized(), q.float() * d + m, rtol=0, atol=0)
    x = torch.randn(5, 96)
    block_sums = x.reshape(5, 3, 32).sum(dim=2).repeat_interleave(32, 1) / 32
    expected = _quantized_activations(x) @ ((q.float() - 8) * d).T + block_sums @ (m + 8 * d).T
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_the_vnni_and_portable_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    if not kernels.has_vnni():
        pytest.skip("no AVX512-VNNI here (or NAIAD_LLM_VNNI=0): only the portable path runs")
    torch.manual_seed(2)
    layer = Int8Linear(nn.Linear(768, 200, bias=False))
    x = torch.randn(7, 768)
    fast = layer(x)
    monkeypatch.setenv("NAIAD_LLM_VNNI", "0")
    assert not kernels.has_vnni()
    # the same integer sums: only the float scaling may round differently
    torch.testing.assert_close(layer(x), fast, rtol=1e-6, atol=1e-6)


@needs_kernels
def test_a_build_without_avx512_gives_the_same_results(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """q8_linear.c built for a baseline x86-64 (no AVX at all, as on a CI machine without VNNI)
    computes what this machine's build computes."""
    if platform.machine() != "x86_64" or shutil.which("gcc") is None:
        pytest.skip("the baseline build is x86-64 with gcc")
    target = tmp_path / "q8_baseline.so"
    source = Path(kernels.__file__).parent / "q8_linear.c"
    subprocess.run(["gcc", "-O3", "-march=x86-64", "-ffast-math", "-pthread", "-shared", "-fPIC", str(source),
                    "-o", str(target), "-lm"], check=True)
    baseline = ctypes.CDLL(str(target))
    assert baseline.q8_has_vnni() == 0
    baseline.q8_linear.argtypes = kernels.library().q8_linear.argtypes
    torch.manual_seed(4)
    layers = [Int8Linear(nn.Linear(200, 70)), Q8BlockLinear(torch.randint(0, 16, (40, 64), dtype=torch.int8),
                                                            torch.rand(40, 2).half(), None, -torch.rand(40, 2).half())]
    inputs = [torch.randn(9, 200).to(torch.bfloat16), torch.randn(3, 64)]
    native = [layer(x) for layer, x in zip(layers, inputs, strict=True)]
    monkeypatch.setattr(kernels, "_library", baseline)
    for layer, x, expected in zip(layers, inputs, native, strict=True):
        torch.testing.assert_close(kernels.q8_linear(x, layer.packed, layer.scales, layer.scale_kind, layer.bias,
                                                     layer.out_features), expected, rtol=1e-5, atol=1e-5)


def test_without_vnni_prefill_sized_inputs_take_torch_and_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_LLM_VNNI", "0")
    torch.manual_seed(0)
    layer = Int8Linear(nn.Linear(64, 32, bias=False))
    x = torch.randn(2, KERNEL_MAX_ROWS + 5, 64)  # more rows than the portable kernel takes
    torch.testing.assert_close(layer(x), x @ layer.dequantized().T, rtol=1e-4, atol=1e-4)


def test_q8_blocks_of_the_wrong_shape_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        Q8BlockLinear(torch.zeros(4, 40, dtype=torch.int8), torch.ones(4, 1).half())
    with pytest.raises(ValueError, match="do not fit"):
        Q8BlockLinear(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 3).half())


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="quantization must be one of none, int8, gguf"):
        quantize_linears(nn.Sequential(nn.Linear(4, 4)), "int4")


def _engine(path: Path, quantization: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=512,
                                  max_model_len=96, quantization=quantization))


def test_int8_greedy_tokens_mostly_agree_with_fp32_on_random_weights(tiny_models: dict[str, Path]) -> None:
    """Each of fp32's greedy tokens is asked of int8 after the same prefix (teacher forcing: one
    early difference does not count as every later token differing).

    Random weights make near ties common: int8 (activations too) agrees on 243 of 256 here. The
    done criterion (95 %) is checked on a real model in test_quantization_smollm2.py."""
    prompts = [tokens(12 + i % 7, seed=100 + i) for i in range(32)]
    greedy = SamplingParams(temperature=0.0, min_tokens=8)  # eight tokens each, EOS or not
    full = _engine(tiny_models["llama"], "none").generate(prompts, 8, greedy)
    int8_engine = _engine(tiny_models["llama"], "int8")
    assert isinstance(int8_engine.runner.model.model.layers[0].mlp.down_proj, Int8Linear)
    prefixes = [prompt + out[:i] for prompt, out in zip(prompts, full, strict=True) for i in range(8)]
    wanted = [out[i] for out in full for i in range(8)]
    answers = int8_engine.generate(prefixes, 1, SamplingParams(temperature=0.0, min_tokens=1))
    same = sum(answer == [token] for answer, token in zip(answers, wanted, strict=True))
    assert same / len(wanted) >= 0.9


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
