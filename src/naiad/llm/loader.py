"""Load a model into torch: a Hugging Face directory (config.json and *.safetensors) or a GGUF file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader
from safetensors import safe_open

from naiad.llm import gguf
from naiad.llm.models.llama import LlamaArgs, LlamaForCausalLM
from naiad.llm.parallel import TensorParallel
from naiad.llm.tokenizer import Tokenizer

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


def resolve_dtype(dtype: str | torch.dtype, config: dict[str, Any]) -> torch.dtype:
    """`dtype` by name, or the checkpoint's own for "auto" (float32 when it names none)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        # transformers 5 writes "dtype", older versions "torch_dtype".
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_model(
    model: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    tp: TensorParallel | None = None,
) -> LlamaForCausalLM:
    """Build the model from a HF directory (config.json, safetensors) or a `.gguf` file; under
    tensor parallelism, this rank's shard of it."""
    if gguf.is_gguf(model):
        reader = GGUFReader(model)
        config = gguf.read_config(reader)
        args = LlamaArgs.from_hf_config(config)
        return _build(args, resolve_dtype(dtype, config), device, gguf.read_weights(reader, args), tp)
    config = read_config(model)
    args = LlamaArgs.from_hf_config(config)
    return _build(args, resolve_dtype(dtype, config), device, _safetensors(Path(model)), tp)


def read_args(model: str | Path) -> LlamaArgs:
    """The model's architecture alone (no weights read), from config.json or the GGUF metadata."""
    config = gguf.read_config(GGUFReader(model)) if gguf.is_gguf(model) else read_config(model)
    return LlamaArgs.from_hf_config(config)


def _build(
    args: LlamaArgs,
    dtype: torch.dtype,
    device: str | torch.device,
    weights: Iterator[tuple[str, torch.Tensor]],
    tp: TensorParallel | None = None,
) -> LlamaForCausalLM:
    # On the meta device, parameters take no memory and no time to initialise: the checkpoint
    # overwrites them all (`load_weights` checks that it does).
    with torch.device("meta"):
        model = LlamaForCausalLM(args, tp)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()
    model.load_weights(weights)
    return model.eval()


def load_gguf(
    path: str | Path, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu"
) -> tuple[LlamaForCausalLM, Tokenizer, tuple[int, ...]]:
    """A GGUF file's model (dequantized; "auto" is float32), its tokenizer and its end tokens."""
    reader = GGUFReader(path)
    return load_model(path, dtype, device), Tokenizer.from_gguf(reader), gguf.read_eos_token_ids(reader)


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
        return gguf.read_eos_token_ids(GGUFReader(model_dir))
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (eos,)
    return ()
