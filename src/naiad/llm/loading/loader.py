"""Load a model into torch: a Hugging Face directory (config.json and *.safetensors) or a GGUF file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader
from safetensors import safe_open

from naiad.llm import kernels
from naiad.llm.distributed.parallel import TensorParallel
from naiad.llm.layers.cpu_linear import native_bf16
from naiad.llm.layers.quantization import Q8BlockLinear
from naiad.llm.loading import gguf
from naiad.llm.loading.tokenizer import Tokenizer
from naiad.llm.models.llama import DecoderLayer, LlamaArgs, LlamaForCausalLM

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def read_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json")
    config: dict[str, Any] = json.loads(path.read_text())
    return config


def resolve_dtype(dtype: str | torch.dtype, config: dict[str, Any], device: str | torch.device = "cpu") -> torch.dtype:
    """`dtype` by name, or for "auto" the fastest that keeps the checkpoint's quality: its own
    (bf16 for a GGUF file, which names none; float32 for a checkpoint that names none), except
    that a CPU without bf16 in hardware computes half precision in float32 (`native_bf16`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        # transformers 5 writes "dtype", older versions "torch_dtype".
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        if dtype not in DTYPES:
            raise ValueError(f"the checkpoint's dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if DTYPES[dtype] != torch.float32 and torch.device(device).type == "cpu" and not native_bf16():
            return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_quantization(
    quantization: str, model: str | Path, device: str | torch.device = "cpu", tp: TensorParallel | None = None
) -> str:
    """`quantization` by name, or for "auto" the fastest way to run the checkpoint that keeps its
    quality: a GGUF file's own blocks ("gguf": its Q4/Q8 values exactly, a byte per weight read per
    token instead of bf16's two) where q8_linear runs on AVX512-VNNI on the CPU and one rank holds
    the layers; the checkpoint as it is ("none") everywhere else. Measured on 2 cores with VNNI,
    SmolLM2-135M's Q4_1 file: 162-174 tokens/s at 1 stream against 119-131 dequantized to bf16
    (on bf16_linear.c, fused), but 0.75-0.9x bf16 at 16 and 64 streams: the blocks win where one
    chat waits on each token; without VNNI the portable kernel was 0.2x bf16 at 16 streams
    (docs/benchmarks.md)."""
    if quantization != "auto":
        return quantization
    single = tp is None or not tp.active
    fast = torch.device(device).type == "cpu" and kernels.has_vnni()
    return "gguf" if single and fast and _all_linears_kept(model) else "none"


#: The decoder layers' linear tensors in a GGUF file (blk.N.<part>.weight).
_LINEAR_PARTS = frozenset({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})


def _all_linears_kept(model: str | Path) -> bool:
    """Whether `model` is a GGUF file whose every layer linear is of a type "gguf" keeps (Q8_0,
    Q4_0, Q4_1): K-quants and F16 would be dequantized around the kept blocks in float32, slower
    than the whole file in bf16."""
    if not gguf.is_gguf(model):
        return False
    kinds = [tensor.tensor_type for tensor in gguf.open_gguf(model).tensors if _is_layer_linear(tensor.name)]
    return bool(kinds) and all(kind in gguf.KEPT_TYPES for kind in kinds)


def _is_layer_linear(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in _LINEAR_PARTS and parts[3] == "weight"


def load_model(
    model: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    tp: TensorParallel | None = None,
    quantization: str = "none",
) -> LlamaForCausalLM:
    """Build the model from a HF directory (config.json, safetensors) or a `.gguf` file; under
    tensor parallelism, this rank's shard of it.

    `quantization="gguf"` keeps a GGUF file's Q8_0 / Q4_0 / Q4_1 linear layers as they are (`_keep_blocks`);
    other methods are applied after loading (quantization.quantize_linears).
    """
    if gguf.is_gguf(model):
        reader = gguf.open_gguf(model)
        config = gguf.read_config(reader)
        args = LlamaArgs.from_hf_config(config)
        if quantization == "gguf":
            if tp is not None and tp.active:
                raise ValueError("quantization 'gguf' does not run under tensor parallelism yet")
            built = _empty(args, resolve_dtype(dtype, config, device), device, tp)
            kept = _keep_blocks(built, reader, args)
            built.load_weights(gguf.read_weights(reader, args, skip=kept))
            return built.eval()
        # "auto" for dequantized blocks: bf16 where the CPU computes it (the file names no dtype)
        dequantized = {"dtype": "bfloat16", **config}
        return _build(args, resolve_dtype(dtype, dequantized, device), device, gguf.read_weights(reader, args), tp)
    if quantization == "gguf":
        raise ValueError(f"quantization 'gguf' needs a .gguf model file, not {model}")
    config = read_config(model)
    args = LlamaArgs.from_hf_config(config)
    return _build(args, resolve_dtype(dtype, config, device), device, _safetensors(Path(model)), tp)


def load_tokenizer(model: Path) -> Tokenizer:
    """The tokenizer that comes with a model (GGUF metadata or tokenizer.json)."""
    return Tokenizer.from_gguf(gguf.open_gguf(model)) if gguf.is_gguf(model) else Tokenizer.from_dir(model)


def read_args(model: str | Path) -> LlamaArgs:
    """The model's architecture alone (no weights read), from config.json or the GGUF metadata."""
    config = gguf.read_config(gguf.open_gguf(model)) if gguf.is_gguf(model) else read_config(model)
    return LlamaArgs.from_hf_config(config)


def _build(
    args: LlamaArgs,
    dtype: torch.dtype,
    device: str | torch.device,
    weights: Iterator[tuple[str, torch.Tensor]],
    tp: TensorParallel | None = None,
) -> LlamaForCausalLM:
    model = _empty(args, dtype, device, tp)
    model.load_weights(weights)
    return model.eval()


def _empty(
    args: LlamaArgs, dtype: torch.dtype, device: str | torch.device, tp: TensorParallel | None
) -> LlamaForCausalLM:
    # On the meta device, parameters take no memory and no time to initialise: the checkpoint
    # overwrites them all (`load_weights` checks that it does). `to_empty` only reserves their
    # memory: the pages of a linear that `_keep_blocks` swaps out are never touched.
    with torch.device("meta"):
        model = LlamaForCausalLM(args, tp)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()
    return model


def _keep_blocks(model: LlamaForCausalLM, reader: GGUFReader, args: LlamaArgs) -> frozenset[str]:
    """Swap each linear layer whose GGUF tensors are all Q8_0, Q4_0 or Q4_1 for a `Q8BlockLinear`
    of the file's blocks (fused q/k/v and gate/up: their rows one after the other; zero
    minimums for parts without them); the GGUF tensor names used, which `read_weights` then
    skips. Other types (K-quants, F16, ...) stay dequantized."""
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    # A pipeline stage numbers its layers from 0; the file from the model's first.
    first = getattr(model.model, "layer_range", range(0)).start
    plan: list[tuple[torch.nn.Module, str, list[str]]] = []
    layer: DecoderLayer
    for index, layer in enumerate(model.model.layers):  # type: ignore[assignment]  # ModuleList items are Modules to mypy
        blk = f"blk.{first + index}"
        plan += [(layer.self_attn, "qkv_proj", [f"{blk}.attn_q", f"{blk}.attn_k", f"{blk}.attn_v"]),
                 (layer.self_attn, "o_proj", [f"{blk}.attn_output"]),
                 (layer.mlp, "gate_up_proj", [f"{blk}.ffn_gate", f"{blk}.ffn_up"]),
                 (layer.mlp, "down_proj", [f"{blk}.ffn_down"])]
    head = "output" if "output.weight" in tensors else "token_embd"  # tied: the embedding's matrix
    if getattr(model, "lm_head", None) is not None:
        plan.append((model, "lm_head", [head]))
    used: set[str] = set()
    for parent, attr, parts in plan:
        weights = [tensors.get(f"{part}.weight") for part in parts]
        if not all(t is not None and t.tensor_type in gguf.KEPT_TYPES for t in weights):
            continue
        biases = [tensors.get(f"{part}.bias") for part in parts]
        if any(b is not None for b in biases) and not all(b is not None for b in biases):
            continue  # some parts with a bias, some without: leave it to the dequantized path
        parts_blocks = [gguf.blocks(t, args) for t in weights]
        mins = None
        if any(m is not None for _, _, m in parts_blocks):
            mins = torch.cat([torch.zeros_like(s) if m is None else m for _, s, m in parts_blocks])
        bias = torch.cat([gguf.dequantized(b, args) for b in biases]) if biases[0] is not None else None
        setattr(parent, attr, Q8BlockLinear(torch.cat([q for q, _, _ in parts_blocks]),
                                            torch.cat([s for _, s, _ in parts_blocks]), bias, mins))
        used.update(t.name for t in [*weights, *biases] if t is not None)
    if head == "token_embd" and getattr(model.model, "embed_tokens", None) is not None:
        used.discard("token_embd.weight")  # the embedding still needs it
    return frozenset(used)


def load_gguf(
    path: str | Path, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu", quantization: str = "none"
) -> tuple[LlamaForCausalLM, Tokenizer, tuple[int, ...]]:
    """A GGUF file's model (dequantized, "auto" being bf16 where the CPU computes bf16 and float32
    elsewhere, unless `quantization="gguf"`: float32 around the file's blocks),
    its tokenizer and its end tokens."""
    reader = gguf.open_gguf(path)
    model = load_model(path, dtype, device, quantization=quantization)
    return model, Tokenizer.from_gguf(reader), gguf.read_eos_token_ids(reader)


def _safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors files")
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                yield name, f.get_tensor(name)


def read_eos_token_ids(model_dir: str | Path) -> tuple[int, ...]:
    """The end-of-sequence tokens: generation_config.json's, else config.json's (either may list several).

    For a `.gguf` file, the one its tokenizer metadata names.
    """
    if gguf.is_gguf(model_dir):
        return gguf.read_eos_token_ids(gguf.open_gguf(model_dir))
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (eos,)
    return ()
