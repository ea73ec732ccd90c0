"""oneDNN-prepacked linears: same results as nn.Linear in bf16, and only where they apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from naiad.llm import model_runner
from naiad.llm.cpu_linear import PackedLinear, can_prepack, prepack_linears
from naiad.llm.engine import EngineConfig, LLMEngine
from naiad.llm.sampling_params import GREEDY

pytestmark = pytest.mark.skipif(
    not can_prepack(torch.bfloat16, torch.device("cpu")), reason="this torch build has no oneDNN linear"
)


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


def test_prepack_swaps_every_linear() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4, bias=False))).to(torch.bfloat16)
    assert prepack_linears(model) == 2
    assert not any(isinstance(module, nn.Linear) for module in model.modules())
    assert sum(isinstance(module, PackedLinear) for module in model.modules()) == 2


def test_only_bf16_on_the_cpu() -> None:
    assert not can_prepack(torch.float32, torch.device("cpu"))  # fp32 packed rounds differently
    assert not can_prepack(torch.bfloat16, torch.device("meta"))


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
