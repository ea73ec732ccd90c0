"""The PyTorch backend's config parameters (Triton's names) and torch's process-wide inter-op pool."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidArgument

log = logging.getLogger(__name__)

# Triton parameters naiad accepts without acting on them: global torch switches that would
# change every other model in the process, or Triton features naiad does not have.
_IGNORED_PARAMETERS = frozenset({
    "DISABLE_CUDNN", "ENABLE_NVFUSER", "ENABLE_TENSOR_FUSER", "ENABLE_JIT_EXECUTOR",
    "ENABLE_JIT_PROFILING", "ENABLE_WEIGHT_SHARING", "TORCH_COMPILE_OPTIONAL_PARAMETERS",
    "MODEL_INIT_LIBRARY", "ENABLE_DETERMINISTIC_ALGORITHMS", "ENABLE_CUDA_GRAPH", "DISABLE_PINNED_INPUT",
})
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True, slots=True)
class Settings:
    """The model's config parameters, parsed once at load."""

    inference_mode: bool = True
    optimized_execution: bool = True
    cache_cleaning: bool = False
    # One intra-op thread per instance unless told otherwise, as naiad's onnxruntime sessions:
    # torch's default (every core, per instance) oversubscribes a small machine as soon as two
    # instances or the server's own threads compete, and OpenMP's spinning then cuts throughput
    # erratically (measured on 2 cores: batch-8 MLP rows/s 236-889 with 2 threads, 1385 with 1).
    intra_op_threads: int = 1
    inter_op_threads: int | None = None


def parse_settings(config: mc.ModelConfig) -> Settings:
    """Read Triton's PyTorch parameters; raise InvalidArgument naming a malformed one."""
    params = {key: str(value.string_value) for key, value in config.parameters.items()}
    for key in sorted(_IGNORED_PARAMETERS & params.keys()):
        log.info("model '%s': parameter %s is accepted but has no effect in naiad's pytorch backend",
                 config.name, key)
    return Settings(
        inference_mode=_bool(params, "INFERENCE_MODE", True),
        optimized_execution=not _bool(params, "DISABLE_OPTIMIZED_EXECUTION", False),
        cache_cleaning=_bool(params, "ENABLE_CACHE_CLEANING", False),
        intra_op_threads=_count(params, "INTRA_OP_THREAD_COUNT", "NUM_THREADS") or 1,
        inter_op_threads=_count(params, "INTER_OP_THREAD_COUNT", "NUM_INTEROP_THREADS"),
    )


def _bool(params: Mapping[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "").strip().lower()
    if not value:
        return default
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise InvalidArgument(f"parameter {key} must be true or false, got '{params[key]}'")


def _count(params: Mapping[str, str], *keys: str) -> int | None:
    for key in keys:  # Triton's name first, then the python-based backend's alias
        if key in params:
            try:
                value = int(params[key])
            except ValueError:
                value = 0
            if value < 1:
                raise InvalidArgument(f"parameter {key} must be a positive integer, got '{params[key]}'")
            return value
    return None


# --- threads -----------------------------------------------------------------------------------

_interop_lock = threading.Lock()
_interop_threads: int | None = None


def apply_inter_op_threads(model: str, count: int) -> None:
    """torch has one inter-op pool per process, sized once before first use: as in Triton, the
    first model that sets it wins and a later, different value is ignored with a warning."""
    global _interop_threads
    with _interop_lock:
        if _interop_threads is None:
            try:
                torch.set_num_interop_threads(count)
            except RuntimeError as error:  # the pool already started (another torch user)
                log.warning("model '%s': INTER_OP_THREAD_COUNT=%d ignored: %s", model, count, error)
                return
            _interop_threads = count
        elif _interop_threads != count:
            log.warning("model '%s': INTER_OP_THREAD_COUNT=%d ignored: torch's inter-op pool is "
                        "process-wide and already sized to %d", model, count, _interop_threads)
