"""GGUF files served from their blocks (`quantization: "gguf"`): a tiny random Llama written as
Q8_0, Q4_0 and Q4_1 with the `gguf` package's writer, loaded both ways (dequantized to fp32, and
kept as 8-bit blocks for the C kernel)."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from llm.test_quantization_smollm2 import Batch
from llm.tiny_models import TINY, hf_model, tokens
from naiad.llm import kernels
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import SamplingParams
from naiad.llm.layers.quantization import Q8BlockLinear, weight_bytes
from naiad.llm.loading.gguf import open_gguf
from naiad.llm.loading.loader import load_model, read_args, resolve_quantization

_LAYER_PARTS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def _gguf_name(hf: str) -> str:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER_PARTS[module]}.{kind}"


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's rope permutation of Q/K rows (what the loader undoes)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(hf_dir: Path, path: Path, kind: gguf.GGMLQuantizationType) -> Path:
    """The HF model in `hf_dir` as a GGUF file: matrices in `kind`, vectors in F32."""
    args = read_args(hf_dir)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(args.num_layers)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_heads)
    writer.add_head_count_kv(args.num_kv_heads)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.rms_norm_eps)
    writer.add_uint32("llama.vocab_size", args.vocab_size)
    for name, tensor in hf_model(hf_dir).state_dict().items():
        if name == "lm_head.weight" and args.tie_word_embeddings:
            continue  # llama.cpp's converter drops the tied head
        array = tensor.numpy().astype(np.float32)
        if name.endswith("q_proj.weight"):
            array = _permute(array, args.num_heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, args.num_kv_heads)
        if array.ndim == 2:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(_gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=["Q8_0", "Q4_0", "Q4_1"])
def gguf_file(
    request: pytest.FixtureRequest, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    kind = gguf.GGMLQuantizationType[request.param]
    return write_gguf(tiny_models["llama"], tmp_path_factory.mktemp("gguf") / f"tiny-{kind.name}.gguf", kind)


def test_the_linears_keep_the_files_blocks(gguf_file: Path) -> None:
    dequantized, kept = load_model(gguf_file, "float32"), load_model(gguf_file, "float32", quantization="gguf")
    linears = {name: module for name, module in kept.named_modules() if isinstance(module, Q8BlockLinear)}
    # q/k/v, o, gate/up and down per layer, and the LM head (from the tied embedding's blocks)
    assert len(linears) == TINY["num_hidden_layers"] * 4 + 1
    plain = dict(dequantized.named_modules())
    for name, module in linears.items():
        # the same numbers as gguf's own dequantization, fused and unpermuted the same way
        torch.testing.assert_close(module.dequantized(), plain[name].weight.detach(), rtol=0, atol=0)
    torch.testing.assert_close(kept.model.embed_tokens.weight, dequantized.model.embed_tokens.weight)
    # 34 to 36 bytes per 32 weights, against fp32's 128 (the fp32 embedding stays)
    assert weight_bytes(kept) < 0.6 * weight_bytes(dequantized)


def test_logits_agree_with_the_dequantized_model(gguf_file: Path) -> None:
    dequantized, kept = load_model(gguf_file, "float32"), load_model(gguf_file, "float32", quantization="gguf")
    prompt = tokens(20, seed=3)
    (expected,) = Batch(dequantized, 1, len(prompt)).feed([prompt])
    (got,) = Batch(kept, 1, len(prompt)).feed([prompt])
    # the kept model also rounds its activations to 15 bits per block of 32, through two layers;
    # measured (2026-12-04, portable path): 0.027 % (Q8_0), 0.019 % (Q4_0), 0.026 % (Q4_1) of the
    # largest logit (int8 activations gave 2-3.4 %); the kernel itself is exact against torch on
    # the same rounded activations (test_quantization.py)
    assert (got - expected).abs().max() < 0.01 * expected.abs().max()


def _engine(path: Path, quantization: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=512,
                                  max_model_len=96, quantization=quantization))


def test_the_engine_serves_the_blocks_with_the_same_greedy_tokens(gguf_file: Path) -> None:
    """fp32's greedy tokens asked of the engine on the blocks after the same prefix (teacher forcing).
    Random weights: near ties are common, so most rather than all must agree."""
    prompts = [tokens(12 + i % 5, seed=200 + i) for i in range(16)]
    greedy = SamplingParams(temperature=0.0, min_tokens=8)
    full = _engine(gguf_file, "none").generate(prompts, 8, greedy)
    kept = _engine(gguf_file, "gguf")
    assert isinstance(kept.runner.model.model.layers[0].mlp.down_proj, Q8BlockLinear)
    prefixes = [prompt + out[:i] for prompt, out in zip(prompts, full, strict=True) for i in range(8)]
    wanted = [out[i] for out in full for i in range(8)]
    answers = kept.generate(prefixes, 1, SamplingParams(temperature=0.0, min_tokens=1))
    same = sum(answer == [token] for answer, token in zip(answers, wanted, strict=True))
    assert same / len(wanted) >= 0.9


def test_gguf_quantization_needs_a_gguf_file(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"needs a \.gguf model file"):
        load_model(tiny_models["llama"], "float32", quantization="gguf")


def test_a_file_is_parsed_once_per_process_and_version(gguf_file: Path) -> None:
    """The loader, the tokenizer and the end-token lookup share one parse of the metadata
    (seconds for a real vocabulary); a changed file is parsed again."""
    first = open_gguf(gguf_file)
    assert open_gguf(gguf_file) is first and open_gguf(str(gguf_file)) is first
    stat = gguf_file.stat()
    os.utime(gguf_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert open_gguf(gguf_file) is not first


@pytest.mark.parametrize("vnni", [True, False])
def test_auto_keeps_a_gguf_files_blocks_only_where_their_kernel_is_fast(
    gguf_file: Path, tiny_models: dict[str, Path], vnni: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernels, "has_vnni", lambda: vnni)
    assert resolve_quantization("auto", gguf_file) == ("gguf" if vnni else "none")
    assert resolve_quantization("auto", tiny_models["llama"]) == "none"  # a HF directory has no blocks to keep
    assert resolve_quantization("auto", gguf_file, "cuda") == "none"  # CUDA dequantizes them anyway
    assert resolve_quantization("int8", gguf_file) == "int8"  # a method by name is taken as it is
    f16 = write_gguf(tiny_models["llama"], gguf_file.with_name(f"f16-{gguf_file.name}"), gguf.GGMLQuantizationType.F16)
    assert resolve_quantization("auto", f16) == "none"  # nothing to keep: bf16 beats float32 around blocks
    engine = _engine(gguf_file, "auto")
    assert engine.runner.quantization == ("gguf" if vnni else "none")
    kept = isinstance(engine.runner.model.model.layers[0].mlp.down_proj, Q8BlockLinear)
    assert kept == vnni
