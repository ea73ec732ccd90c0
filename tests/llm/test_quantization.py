"""8-bit linear layers: the packed layout, int8 blocks and outlier columns, the C kernel (VNNI,
its logic on plain-C stand-ins, and portable paths) against torch, the layers' two paths, and
the engine's greedy tokens and a model's perplexity against fp32 on random-weight models
(test_quantization_smollm2.py does the same on a real model)."""

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
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import SamplingParams
from naiad.llm.layers.quantization import (
    KERNEL_MAX_ROWS,
    OUTLIER_COLUMNS,
    Int8Linear,
    Q8BlockLinear,
    kernel_activations,
    pack,
    quantize_blocks,
    quantize_linears,
    unpack,
    weight_bytes,
)

needs_kernels = pytest.mark.skipif(kernels.library() is None, reason="no C compiler: the torch path serves alone")
# Both of the kernel's paths: "0" forces the portable one on a CPU with VNNI.
PATHS = [pytest.param("1", id="vnni-if-present"), pytest.param("0", id="portable")]


def _quantized_activations(x: torch.Tensor, columns: list[int] = ()) -> torch.Tensor:  # type: ignore[assignment]
    """What the kernel multiplies: each row's blocks of 32 (zero-padded, the outlier `columns` taken
    out) rounded to steps of max|x| / 16383, then the outlier columns exact."""
    rows, inp = x.shape
    rest = x.float().clone()
    rest[:, list(columns)] = 0
    padded = nn.functional.pad(rest, (0, -inp % 32)).reshape(rows, -1, 32)
    step = padded.abs().amax(dim=2, keepdim=True) / 16383
    q = torch.where(step > 0, torch.round(padded / step), torch.zeros_like(padded))
    out = (q * step).reshape(rows, -1)[:, :inp]
    out[:, list(columns)] = x.float()[:, list(columns)]
    return out


def test_rounding_error_is_at_most_half_a_block_step() -> None:
    weight = torch.randn(48, 80) * 0.3
    weight[5, 40] = 30.0  # an outlier weight coarsens its own block only
    q, scale = quantize_blocks(weight)
    assert q.dtype == torch.int8 and q.shape == (48, 96) and scale.dtype == torch.float16 and scale.shape == (48, 3)
    assert int(q.abs().max()) == 127 and q[:, 80:].eq(0).all()  # 80 inputs padded to 96
    step = scale.float().repeat_interleave(32, dim=1)[:, :80]
    assert torch.all((weight - q[:, :80].float() * step).abs() <= step / 2 + 1e-6)
    assert step[5, 40] > 10 * step[4, 40]


def test_int8_keeps_the_largest_inputs_columns_in_float16() -> None:
    torch.manual_seed(5)
    linear = nn.Linear(100, 20, bias=False)
    rms = torch.rand(100)
    rms[[7, 42, 99]] = 100.0
    expected = sorted({7, 42, 99} | set(rms.topk(OUTLIER_COLUMNS).indices.tolist()))
    layer = Int8Linear(linear, torch.tensor(expected[::-1]))  # in any order
    assert layer.columns.tolist() == expected and len(expected) == OUTLIER_COLUMNS
    weight = layer.dequantized()
    columns = torch.tensor(expected)
    # those columns are the weights' float16 values, and zero in the int8 blocks (not counted twice)
    torch.testing.assert_close(weight[:, columns], linear.weight[:, columns].detach().half().float(), rtol=0, atol=0)
    assert unpack(layer.packed, 20, 100)[:, columns].eq(0).all()
    assert (weight - linear.weight.detach()).abs().max() < 0.01 * linear.weight.abs().max()
    assert Int8Linear(linear).columns.numel() == 0  # no calibration: none
    for bad in ([3, 3], [-1], [100]):
        with pytest.raises(ValueError, match="not distinct inputs of 100"):
            Int8Linear(linear, torch.tensor(bad))


def test_pack_pads_to_whole_panels_and_unpack_inverts_it() -> None:
    q = torch.randint(-127, 128, (40, 70), dtype=torch.int8)
    packed = pack(q)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 96 // 4, 16, 4)  # 40 → 48 channels, 70 → 96 inputs
    # channel 17's inputs 4..7 sit in panel 1, quad 1, lane 1, stored as w + 128
    assert packed[1, 1, 1].tolist() == [int(v) + 128 for v in q[17, 4:8]]
    assert packed[2, :, 8:].eq(128).all() and packed[:, 70 // 4 + 1 :].eq(128).all()  # zero weights pad
    torch.testing.assert_close(unpack(packed, 40, 70), q)


def _layer(inp: int, out: int, outliers: bool, bias: bool = True) -> Int8Linear:
    """An int8 layer of random weights; with `outliers`, its float16 columns chosen by random RMS."""
    columns = torch.randperm(inp)[: min(OUTLIER_COLUMNS, inp)] if outliers else None
    return Int8Linear(nn.Linear(inp, out, bias=bias), columns)


def _with_outliers(x: torch.Tensor, layer: Int8Linear) -> torch.Tensor:
    """`x` with large values in the layer's outlier columns (when it has them) and elsewhere."""
    x = x.clone()
    x[:, layer.columns] *= 50
    x[:, 3] *= 20  # and in a column of the blocks: its block's step grows, not the others'
    return x


@needs_kernels
@pytest.mark.parametrize("vnni", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, KERNEL_MAX_ROWS, 37])
@pytest.mark.parametrize("outliers", [False, True], ids=["blocks", "outlier-columns"])
def test_the_kernel_matches_torch_on_the_same_quantized_inputs(
    monkeypatch: pytest.MonkeyPatch, vnni: str, dtype: torch.dtype, rows: int, outliers: bool
) -> None:
    monkeypatch.setenv("NAIAD_LLM_VNNI", vnni)
    torch.manual_seed(rows)
    layer = _layer(80, 40, outliers)  # 80 inputs: a padded last block; 40: a part panel
    x = _with_outliers(torch.randn(rows, 80), layer).to(dtype)
    got = kernels.q8_linear(x, layer.packed, layer.scales, layer.scale_kind, layer.bias, 40, layer.columns,
                            layer.column_weights)
    assert got.dtype == dtype and got.shape == (rows, 40)
    expected = _quantized_activations(x, layer.columns.tolist()) @ layer.dequantized().T + layer.bias
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    scale = expected.abs().max()
    torch.testing.assert_close(got.float() / scale, expected / scale, rtol=tolerance, atol=tolerance)
    # and against the unrounded activations: 15 bits per block leave (almost) nothing
    exact = x.float() @ layer.dequantized().T + layer.bias
    assert (got.float() - exact).abs().max() < max(1e-3, tolerance) * scale


@needs_kernels
@pytest.mark.parametrize("vnni", PATHS)
def test_an_outlier_input_costs_its_blocks_neighbours_no_precision(monkeypatch: pytest.MonkeyPatch, vnni: str) -> None:
    """One input 100x the others: with int8 activations (a step of max / 127) its 31 neighbours
    would round to 0 or 1 step (errors of 40 % and more); 15 bits keep them within 0.5 %."""
    monkeypatch.setenv("NAIAD_LLM_VNNI", vnni)
    torch.manual_seed(8)
    layer = _layer(64, 16, outliers=False, bias=False)
    x = torch.randn(1, 64) * 0.01
    x[0, 0] = 1.0
    without = x.clone()
    without[0, 0] = 0.0
    weight = layer.dequantized()
    got = layer(x) - x[:, :1] @ weight[:, :1].T  # the neighbours' share of the result
    torch.testing.assert_close(got, without @ weight.T, rtol=0.005, atol=0.005 * (without @ weight.T).abs().max())


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


def _layers_and_inputs() -> list[tuple[nn.Module, torch.Tensor]]:
    """Each kind of 8-bit layer with an input: int8 with outlier columns (bf16 input), Q8_0, Q4_1."""
    torch.manual_seed(4)
    int8 = _layer(200, 70, outliers=True)
    q8_0 = Q8BlockLinear(torch.randint(-127, 128, (40, 64), dtype=torch.int8), torch.rand(40, 2).half())
    q4_1 = Q8BlockLinear(torch.randint(0, 16, (40, 64), dtype=torch.int8), torch.rand(40, 2).half(), None,
                         -torch.rand(40, 2).half())
    return [(int8, _with_outliers(torch.randn(9, 200), int8).to(torch.bfloat16)), (q8_0, torch.randn(5, 64)),
            (q4_1, torch.randn(3, 64))]


def _run_on(library: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    monkeypatch.setattr(kernels, "_library", library)
    return [kernels.q8_linear(x, layer.packed, layer.scales, layer.scale_kind, layer.bias, layer.out_features,
                              layer.columns, layer.column_weights) for layer, x in _layers_and_inputs()]


def _build(tmp_path: Path, name: str, *flags: str) -> ctypes.CDLL:
    """q8_linear.c (with the thread pool it runs on) built with `flags` (x86-64 with gcc only)."""
    if platform.machine() != "x86_64" or shutil.which("gcc") is None:
        pytest.skip("these builds are x86-64 with gcc")
    folder = Path(kernels.__file__).parent
    target = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-O3", *flags, "-ffast-math", "-fopenmp", "-shared", "-fPIC", str(folder / "q8_linear.c"),
                    str(folder / "thread_pool.c"), "-o", str(target), "-lm"], check=True)
    library = ctypes.CDLL(str(target))
    library.q8_linear.argtypes = kernels.library().q8_linear.argtypes
    return library


@needs_kernels
def test_the_vnni_and_portable_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    if not kernels.has_vnni():
        pytest.skip("no AVX512-VNNI here (or NAIAD_LLM_VNNI=0): only the portable path runs")
    fast = _run_on(kernels.library(), monkeypatch)
    monkeypatch.setenv("NAIAD_LLM_VNNI", "0")
    assert not kernels.has_vnni()
    # the same integer sums: only the float scaling may round differently
    for got, expected in zip(_run_on(kernels.library(), monkeypatch), fast, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_the_vnni_paths_logic_on_plain_c_stand_ins_matches_the_portable_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The VNNI path's code (hi/lo activation bytes, vpdpbusd's sums, the outlier columns) run on
    any CPU: q8_linear.c built with avx512_standins.h, scalar versions of the intrinsics it uses."""
    standins = Path(__file__).parent / "avx512_standins.h"
    emulated = _build(tmp_path, "q8_standins", f'-DQ8_AVX512_STANDINS="{standins}"')
    assert emulated.q8_has_vnni() == 1
    monkeypatch.setenv("NAIAD_LLM_VNNI", "1")
    got = _run_on(emulated, monkeypatch)
    monkeypatch.setenv("NAIAD_LLM_VNNI", "0")
    for got_one, expected in zip(got, _run_on(kernels.library(), monkeypatch), strict=True):
        torch.testing.assert_close(got_one, expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_a_build_without_avx512_gives_the_same_results(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """q8_linear.c built for a baseline x86-64 (no AVX at all, as on a CI machine without VNNI)
    computes what this machine's build computes."""
    baseline = _build(tmp_path, "q8_baseline", "-march=x86-64")
    assert baseline.q8_has_vnni() == 0
    native = _run_on(kernels.library(), monkeypatch)
    for got, expected in zip(_run_on(baseline, monkeypatch), native, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_thread_count_changes_nothing(threads: int) -> None:
    torch.manual_seed(6)
    layer = _layer(256, 200, outliers=True)
    x = _with_outliers(torch.randn(7, 256), layer)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layer(x)
        torch.set_num_threads(threads)
        assert torch.equal(layer(x), one)  # each output summed by one thread in one order
    finally:
        torch.set_num_threads(before)


@needs_kernels
@pytest.mark.parametrize("outliers", [False, True], ids=["blocks", "outlier-columns"])
def test_without_vnni_prefill_sized_inputs_take_torch_with_the_kernels_rounding(
    monkeypatch: pytest.MonkeyPatch, outliers: bool
) -> None:
    """More rows than the portable kernel takes: torch multiplies, on activations rounded as the
    kernel rounds them, so that every path computes the same products."""
    monkeypatch.setenv("NAIAD_LLM_VNNI", "0")
    torch.manual_seed(0)
    layer = _layer(64, 32, outliers, bias=False)
    x = _with_outliers(torch.randn(KERNEL_MAX_ROWS + 5, 64), layer).reshape(3, -1, 64)
    torch.testing.assert_close(kernel_activations(x, layer.columns),
                               _quantized_activations(x.reshape(-1, 64), layer.columns.tolist()))
    got = layer(x)  # torch's path
    kernel = kernels.q8_linear(x, layer.packed, layer.scales, layer.scale_kind, None, 32, layer.columns,
                               layer.column_weights)
    torch.testing.assert_close(got, kernel, rtol=1e-5, atol=1e-5 * float(kernel.abs().max()))


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

    Random weights make near ties common: int8 agrees on 243 of 256 here (2026-12-04, portable
    path). The done criterion (97 %) is checked on a real model in test_quantization_smollm2.py."""
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
