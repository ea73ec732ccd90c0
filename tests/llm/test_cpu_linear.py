"""Prepacked bf16 linears (naiad's panels where the CPU has AVX-512, else oneDNN's): the
results of nn.Linear in bf16, and only where they apply (the packing tests need a CPU whose bf16
oneDNN packs: AVX512-BW/VL/DQ or AVX-NE-CONVERT)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from naiad.llm import kernels
from naiad.llm.engine import model_runner
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY
from naiad.llm.layers.cpu_linear import PackedLinear, PanelLinear, can_prepack, prepack_linears

needs_packing = pytest.mark.skipif(
    not can_prepack(torch.bfloat16, torch.device("cpu")),
    reason="oneDNN packs no bf16 weights on this CPU or torch build (no AVX512-BW/VL/DQ or AVX-NE-CONVERT)",
)


@needs_packing
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_packed_linear_equals_nn_linear_in_bf16(bias: bool, rows: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = linear(x)
        packed = PackedLinear(linear)
        assert torch.equal(packed(x), expected)
        assert torch.equal(packed(x.view(1, rows, 96)), expected.view(1, rows, 200))  # leading dims kept


@pytest.mark.skipif(not kernels.has_bf16_linear(), reason="this CPU or build lacks AVX-512")
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_panel_linear_gives_nn_linears_bf16_results(bias: bool, rows: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    x = torch.randn(2, rows, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = linear(x)
        got = PanelLinear(linear)(x)
    assert got.shape == expected.shape
    # the same float32 sums rounded once; only their order differs
    torch.testing.assert_close(got, expected, rtol=2**-8, atol=1e-3)


@needs_packing
@pytest.mark.parametrize("panels", [True, False])
def test_prepack_swaps_every_linear(panels: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """For naiad's panels where bf16_linear runs, else (or turned off) for oneDNN's packing."""
    if panels and not kernels.has_bf16_linear():
        pytest.skip("this CPU or build lacks AVX-512")
    if not panels:
        monkeypatch.setenv("NAIAD_LLM_BF16_KERNEL", "0")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4, bias=False))).to(torch.bfloat16)
    assert prepack_linears(model) == 2
    assert not any(isinstance(module, nn.Linear) for module in model.modules())
    kind = PanelLinear if panels else PackedLinear
    assert sum(isinstance(module, kind) for module in model.modules()) == 2


def test_only_bf16_on_the_cpu() -> None:
    assert not can_prepack(torch.float32, torch.device("cpu"))  # fp32 packed rounds differently
    assert not can_prepack(torch.bfloat16, torch.device("meta"))


@needs_packing
def test_a_bf16_engine_generates_the_same_tokens_packed_or_not(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = [[5, 9, 2, 7, 1, 8], [3, 3, 4], list(range(1, 30))]

    def generate() -> list[list[int]]:
        engine = LLMEngine(EngineConfig(model=tiny_models["qwen2"], dtype="bf16", kv_cache_memory=8 << 20))
        return engine.generate(prompts, max_tokens=12, sampling_params=GREEDY)

    packed = generate()
    monkeypatch.setattr(model_runner, "can_prepack", lambda dtype, device: False)
    assert generate() == packed


def test_without_bf16_in_hardware_nothing_is_packed_and_bf16_still_generates(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AVX2-only CPU: oneDNN refuses to pack bf16 weights there, so the engine keeps plain
    linears and serves bf16 all the same (the bundled model failed to load on such CPUs)."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not can_prepack(torch.bfloat16, torch.device("cpu"))
    engine = LLMEngine(EngineConfig(model=tiny_models["qwen2"], dtype="bf16", kv_cache_memory=8 << 20))
    assert not any(isinstance(module, PackedLinear | PanelLinear) for module in engine.runner.model.modules())
    (tokens,) = engine.generate([[5, 9, 2, 7, 1, 8]], max_tokens=6, sampling_params=GREEDY)
    assert len(tokens) == 6
