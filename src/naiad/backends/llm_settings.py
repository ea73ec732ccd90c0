"""The "llm" backend's model settings: where the `model` parameter points (a bundled model or a
path), the config parameters that become the engine's settings, and those the deployment may
fill in (`--backend-config=llm,...`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from naiad.errors import InvalidArgument
from naiad.llm.loading import gguf

BUNDLED = {"bundled:smollm2": gguf.smollm2_path}


def model_path(model: str, version_dir: Path) -> Path:
    """A config's `model` parameter as a path: a bundled model's, or one relative to the version."""
    if model in BUNDLED:
        return BUNDLED[model]()
    path = Path(model)
    return path if path.is_absolute() else version_dir / path


#: Where an engine's ranks run is the deployment's to say more than the repository's (a KServe
#: multi-node runtime knows the node count and the head's address, the model's config does not):
#: auto-complete fills these parameters, when the config leaves them out, from the server's
#: `--backend-config=llm,<name>=<value>` (Triton's backend settings).
PLACEMENT_SETTINGS = ("tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend", "nnodes",
                      "master_addr", "master_port")

#: the config parameters that set EngineConfig fields, and how each is read
ENGINE_PARAMETERS: dict[str, type] = {
    "dtype": str, "device": str, "block_size": int, "kv_cache_memory": int, "kv_cache_fraction": float,
    "max_num_seqs": int, "max_num_batched_tokens": int, "max_model_len": int, "enable_prefix_caching": bool,
    "enforce_eager": bool, "quantization": str, "tensor_parallel_size": int, "pipeline_parallel_size": int,
    "pipeline_micro_batches": int, "distributed_executor_backend": str, "nnodes": int, "master_addr": str,
    "master_port": int,
}


def config_parameter(name: str, text: str, kind: type) -> Any:
    """A config parameter's text as `kind` (bool, int, float or str); a clear error otherwise."""
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise InvalidArgument(f"parameter '{name}' must be true or false, got {text!r}")
        return text.lower() in ("true", "1")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise InvalidArgument(f"parameter '{name}' must be {noun}, got {text!r}") from None
    return text
