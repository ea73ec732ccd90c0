"""A decode step's layers as one C call (models/fused_decode.py, kernels/decoder.c): the same
logits, bit for bit, as the layer-by-layer forward, and only where it applies."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from llm.test_gguf_q8 import write_gguf
from llm.test_quantization_smollm2 import BLOCK, Batch
from llm.tiny_models import tokens
from naiad.llm import kernels
from naiad.llm.engine.model_runner import ModelRunner, RunnerConfig
from naiad.llm.layers.attention import AttentionMetadata
from naiad.llm.models.fused_decode import FusedDecode
from naiad.llm.models.llama import LlamaForCausalLM

needs_kernels = pytest.mark.skipif(kernels.library() is None, reason="gcc could not build the CPU kernels")


def _model(path: Path, quantization: str, dtype: str = "float32") -> LlamaForCausalLM:
    runner = ModelRunner(RunnerConfig(model=path, dtype=dtype, kv_cache_memory=8 << 20,
                                      quantization=quantization))
    assert isinstance(runner.model, LlamaForCausalLM)
    return runner.model


@pytest.fixture(scope="module", params=["gguf-Q4_1", "gguf-Q8_0", "int8", "bf16"])
def model(request: pytest.FixtureRequest, tiny_models: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> LlamaForCausalLM:
    if request.param == "int8":
        return _model(tiny_models["llama"], "int8")
    if request.param == "bf16":  # bf16 panels (kernels/bf16_linear.c) where the CPU runs them
        if not kernels.has_bf16_linear():
            pytest.skip("this CPU or build lacks AVX-512: bf16 models keep oneDNN's linears, layer by layer")
        return _model(tiny_models["llama"], "none", "bf16")
    kind = gguf.GGMLQuantizationType[request.param.removeprefix("gguf-")]
    return _model(write_gguf(tiny_models["llama"], tmp_path_factory.mktemp("gguf") / "tiny.gguf", kind), "gguf")


def _decode(model: LlamaForCausalLM, fused: FusedDecode | None, rows: int) -> list[torch.Tensor]:
    """Prompts of different lengths prefilled, then five decode steps; every step's logits."""
    model.model.fused_decode = fused
    batch = Batch(model, rows, 80)
    prompts = [tokens(5 + 3 * i, seed=40 + i) for i in range(rows)]
    batch.feed(prompts)  # a prefill: layer by layer whatever `fused` is
    steps = []
    nexts = [[prompt[-1]] for prompt in prompts]
    for _ in range(5):
        logits = batch.feed(nexts)
        steps.append(torch.cat(logits))
        nexts = [[int(row.argmax())] for row in logits]
    return steps


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 20])
def test_fused_steps_give_the_layer_by_layers_logits_bit_for_bit(model: LlamaForCausalLM, rows: int) -> None:
    fused = model.model.fused_decode
    assert fused is not None, "a quantized model on the CPU decodes fused"
    try:
        expected = _decode(model, None, rows)
        got = _decode(model, fused, rows)
    finally:
        model.model.fused_decode = fused
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(a, b), f"step {step}: max difference {(a - b).abs().max()}"


def _greedy(batch: Batch, nexts: list[int]) -> list[int]:
    """One decode step of `batch`'s sequences through the fused layers and head: each row's token."""
    contexts = [done + 1 for done in batch.computed]
    meta = AttentionMetadata.build([1] * len(nexts), contexts, batch.tables, BLOCK, "cpu")
    with torch.inference_mode():
        got = batch.model.greedy_tokens(torch.tensor(nexts), torch.tensor(batch.computed), meta, batch.caches)
    assert got is not None, "a decode step of a fused model takes the fused head"
    batch.computed = contexts
    return got.tolist()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 20])
def test_the_fused_head_picks_the_forwards_most_likely_tokens(model: LlamaForCausalLM, rows: int) -> None:
    assert model.fused_head is not None, "the LM head is of the fused layers' kind"
    prompts = [tokens(5 + 3 * i, seed=60 + i) for i in range(rows)]
    fused, forward = Batch(model, rows, 80), Batch(model, rows, 80)
    fused.feed(prompts)
    forward.feed(prompts)
    nexts = [prompt[-1] for prompt in prompts]
    for step in range(5):
        expected = [int(logits[0].max(dim=-1).indices) for logits in forward.feed([[t] for t in nexts])]
        got = _greedy(fused, nexts)
        assert got == expected, f"step {step}"
        nexts = got


@needs_kernels
def test_the_fused_head_leaves_prefills_to_the_forward(model: LlamaForCausalLM) -> None:
    batch = Batch(model, 2, 64)
    meta = AttentionMetadata.build([3, 1], [3, 1], batch.tables, BLOCK, "cpu")
    with torch.inference_mode():
        assert model.greedy_tokens(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 0]), meta, batch.caches) is None


@needs_kernels
def test_it_applies_only_to_decode_steps(model: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    fused = model.model.fused_decode
    assert fused is not None
    calls: list[int] = []
    real = fused.run_tokens
    monkeypatch.setattr(fused, "run_tokens", lambda ids, *rest: calls.append(ids.shape[0]) or real(ids, *rest))
    batch = Batch(model, 2, 64)
    batch.feed([tokens(9, seed=1), tokens(4, seed=2)])  # prefill
    batch.feed([[1], tokens(3, seed=3)])  # a decode row beside a prefill chunk
    assert calls == []
    batch.feed([[1], [2]])
    assert calls == [2]


def test_it_does_not_apply_to_an_unquantized_model_or_when_turned_off(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _model(tiny_models["llama"], "none").model.fused_decode is None  # float32: torch's linears, layer by layer
    monkeypatch.setenv("NAIAD_LLM_BF16_KERNEL", "0")  # bf16 on oneDNN's linears
    assert _model(tiny_models["llama"], "none", "bf16").model.fused_decode is None
    monkeypatch.setenv("NAIAD_LLM_FUSED_DECODE", "0")
    assert _model(tiny_models["llama"], "int8").model.fused_decode is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_tables_hold_what_the_rotary_gives_each_position(model: LlamaForCausalLM,
                                                                   dtype: torch.dtype) -> None:
    rotary = model.model.rotary
    positions = torch.tensor([0, 1, 7, 1023, 1024, 2500])
    cos, sin = rotary.tables(dtype, 2501)
    assert cos.shape[0] >= 2501 and cos.dtype == sin.dtype == dtype
    expected_cos, expected_sin = rotary(positions, dtype)
    assert torch.equal(cos[positions], expected_cos.reshape(len(positions), -1))
    assert torch.equal(sin[positions], expected_sin.reshape(len(positions), -1))
    assert rotary.tables(dtype)[0] is cos, "kept while long enough"


@needs_kernels
def test_a_step_past_the_rotary_tables_grows_them(model: LlamaForCausalLM) -> None:
    rotary = model.model.rotary
    fused = model.model.fused_decode
    assert fused is not None
    saved = dict(rotary._tables)
    try:
        cos, sin = rotary.tables(fused.dtype)
        rotary._tables[fused.dtype] = (cos[:4], sin[:4])  # shorter than the prompts below
        got = _decode(model, fused, 3)
        assert rotary.tables(fused.dtype)[0].shape[0] > 4, "grown past the step's positions"
    finally:
        rotary._tables = saved
    for step, (a, b) in enumerate(zip(got, _decode(model, fused, 3), strict=True)):
        assert torch.equal(a, b), f"step {step}"


@needs_kernels
def test_a_token_outside_the_embedding_is_refused(model: LlamaForCausalLM) -> None:
    batch = Batch(model, 1, 16)
    batch.feed([tokens(3, seed=5)])
    meta = AttentionMetadata.build([1], [4], batch.tables, BLOCK, "cpu")
    with torch.inference_mode(), pytest.raises(ValueError, match="outside the embedding"):
        model(torch.tensor([model.args.vocab_size + 5]), torch.tensor([3]), meta, batch.caches, torch.arange(1))
