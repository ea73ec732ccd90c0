"""naiad's Llama-family model on paged attention against transformers, logit for logit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from llm.tiny_models import hf_greedy, hf_model
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY
from naiad.llm.layers.attention import AttentionMetadata, allocate_kv_caches
from naiad.llm.loading import gguf, loader
from naiad.llm.loading.loader import load_model
from naiad.llm.models.llama import LlamaArgs, LlamaForCausalLM

BLOCK = 4
PROMPT = [1, 17, 99, 4, 56, 23, 23, 8, 120, 64, 3]
VARIANTS = ["llama", "qwen2", "qwen3", "llama3-rope", "mistral-window"]


class Runner:
    """Sequences fed through the model by hand: row `s` owns blocks `[16 s, 16 s + 16)`."""

    def __init__(self, model: LlamaForCausalLM, num_seqs: int = 1) -> None:
        args = model.args
        dtype = model.lm_head.weight.dtype
        self.model = model
        self.caches = allocate_kv_caches(
            args.num_layers, 16 * num_seqs, BLOCK, args.num_kv_heads, args.head_dim, dtype, "cpu"
        )
        self.tables = [list(range(16 * s, 16 * s + 16)) for s in range(num_seqs)]
        self.computed = [0] * num_seqs

    def feed(self, rows: dict[int, list[int]]) -> list[torch.Tensor]:
        """One step over `{seq: new tokens}`; the logits of every new token, per row."""
        seqs = list(rows)
        lens = [len(rows[s]) for s in seqs]
        contexts = [self.computed[s] + len(rows[s]) for s in seqs]
        meta = AttentionMetadata.build(lens, contexts, [self.tables[s] for s in seqs], BLOCK, "cpu")
        tokens = torch.tensor([t for s in seqs for t in rows[s]])
        positions = torch.tensor([p for s in seqs for p in range(self.computed[s], self.computed[s] + len(rows[s]))])
        with torch.inference_mode():
            logits = self.model(tokens, positions, meta, self.caches, torch.arange(len(tokens)))
        for s in seqs:
            self.computed[s] += len(rows[s])
        return list(logits.split(lens))


def _hf_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_and_decode_logits_match_transformers(tiny_models: dict[str, Path], variant: str) -> None:
    path = tiny_models[variant]
    reference, runner = hf_model(path), Runner(load_model(path, "float32"))
    tokens = list(PROMPT)
    (logits,) = runner.feed({0: tokens})
    torch.testing.assert_close(logits, _hf_logits(reference, tokens), atol=1e-4, rtol=0)
    for _ in range(4):
        tokens.append(int(logits[-1].argmax()))
        (logits,) = runner.feed({0: tokens[-1:]})
        torch.testing.assert_close(logits[0], _hf_logits(reference, tokens)[-1], atol=1e-4, rtol=0)


def test_chunked_prefill_matches_one_pass(tiny_models: dict[str, Path]) -> None:
    model = load_model(tiny_models["qwen2"], "float32")
    (whole,) = Runner(model).feed({0: PROMPT})
    runner = Runner(model)
    chunks = [runner.feed({0: PROMPT[a:b]})[0] for a, b in [(0, 5), (5, 6), (6, 11)]]
    torch.testing.assert_close(torch.cat(chunks), whole, atol=1e-5, rtol=0)


def test_mixed_rows_match_each_row_alone(tiny_models: dict[str, Path]) -> None:
    """A decode row, a chunk after computed tokens and a fresh prompt in one flattened step."""
    model = load_model(tiny_models["llama"], "float32")
    prompts = {0: PROMPT[:9], 1: PROMPT[2:11], 2: PROMPT[:5]}
    batched = Runner(model, 3)
    batched.feed({0: prompts[0][:8], 1: prompts[1][:6]})
    rows = batched.feed({0: prompts[0][8:], 1: prompts[1][6:], 2: prompts[2]})
    for (seq, prompt), row in zip(prompts.items(), rows, strict=True):
        (alone,) = Runner(model).feed({0: prompt})
        torch.testing.assert_close(row, alone[-len(row) :], atol=1e-5, rtol=0, msg=f"row {seq}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_close_to_float32(tiny_models: dict[str, Path], dtype: torch.dtype) -> None:
    path = tiny_models["llama"]
    model = load_model(path, str(dtype).removeprefix("torch."))
    assert {p.dtype for p in model.parameters()} == {dtype}
    (half,) = Runner(model).feed({0: PROMPT})
    (full,) = Runner(load_model(path, "float32")).feed({0: PROMPT})
    torch.testing.assert_close(half.float(), full, atol=0.15, rtol=0.05)


def test_checkpoint_without_a_weight_is_refused(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    source = tiny_models["qwen2"]
    weights = load_file(source / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.bias"]
    save_file(weights, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((source / "config.json").read_text())
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.qkv_proj\.bias"):
        load_model(tmp_path)


def test_unsupported_configs_are_refused() -> None:
    base = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 128,
    }
    with pytest.raises(ValueError, match="not of the Llama family"):
        LlamaArgs.from_hf_config({**base, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="yarn"):
        LlamaArgs.from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    mistral = LlamaArgs.from_hf_config({**base, "model_type": "mistral", "sliding_window": 64})
    assert mistral.sliding_window == 64 and mistral.max_model_len == 2048  # the window does not cap the context
    assert mistral.num_kv_heads == 4 and mistral.head_dim == 16


def test_config_dtype_is_the_default(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tiny_models["llama"]
    config = json.loads((source / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(source / "model.safetensors")
    monkeypatch.setattr(loader, "native_bf16", lambda: True)
    assert load_model(tmp_path).lm_head.weight.dtype == torch.bfloat16
    assert load_model(tmp_path, "float32").lm_head.weight.dtype == torch.float32  # asked for


def test_auto_computes_half_precision_checkpoints_in_float32_without_bf16_in_hardware(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AVX2-only CPU emulates bf16 matmuls (SmolLM2 decodes 4.4 tok/s in bf16, 20.7 in
    float32 there): "auto" then computes in float32, while an explicit "bf16" is kept."""
    source = tiny_models["llama"]
    config = json.loads((source / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(source / "model.safetensors")
    monkeypatch.setattr(loader, "native_bf16", lambda: False)
    assert load_model(tmp_path).lm_head.weight.dtype == torch.float32
    assert load_model(tmp_path, "bf16").lm_head.weight.dtype == torch.bfloat16
    assert loader.resolve_dtype("auto", {"dtype": "bfloat16"}, "meta") == torch.bfloat16  # not a CPU


def test_auto_dequantizes_a_gguf_file_to_bf16_only_where_the_cpu_computes_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    path = gguf.smollm2_path()
    monkeypatch.setattr(loader, "native_bf16", lambda: True)
    assert load_model(path, device="meta").lm_head.weight.dtype == torch.bfloat16  # without loading the weights
    monkeypatch.setattr(loader, "native_bf16", lambda: False)
    assert load_model(path).lm_head.weight.dtype == torch.float32


def test_a_sliding_window_model_generates_what_transformers_does(tiny_models: dict[str, Path]) -> None:
    """Prompts and outputs well past the 6-token window, the longer prompt in chunks."""
    path = tiny_models["mistral-window"]
    reference = hf_model(path)
    engine = LLMEngine(EngineConfig(model=path, dtype="float32", block_size=4, kv_cache_memory=4 << 20,
                                    max_num_batched_tokens=8, max_model_len=64))
    prompts = [PROMPT, PROMPT[:4], PROMPT[3:] * 2]
    outputs = engine.generate(prompts, max_tokens=15, sampling_params=GREEDY)
    assert outputs == [hf_greedy(reference, prompt, 15) for prompt in prompts]
