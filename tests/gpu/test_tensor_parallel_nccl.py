"""Tensor parallelism over NCCL: two GPUs, one rank each, against one process on one GPU.

The same continuous batch as the CPU test (tests/llm/test_tensor_parallel.py), with the
collectives on NCCL instead of gloo. Skipped unless torch sees two CUDA devices.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
from llm.tiny_models import build_tiny_model, run_staggered

from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism over NCCL needs two CUDA devices"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nccl-models")
    return {variant: build_tiny_model(variant, root / variant) for variant in ("llama", "qwen2")}


def _engine(path: Path, tp: int) -> LLMEngine:
    # Rank r runs on cuda:r: the engine's device is rank 0's, and each worker takes its own.
    return LLMEngine(EngineConfig(model=path, dtype="float32", device="cuda:0", block_size=4,
                                  kv_cache_memory=8 << 20, max_num_batched_tokens=32, max_model_len=96,
                                  tensor_parallel_size=tp))


@pytest.mark.parametrize("variant", ["llama", "qwen2"])
def test_two_gpus_match_one(models: dict[str, Path], variant: str) -> None:
    expected = run_staggered(_engine(models[variant], 1))
    two = _engine(models[variant], 2)
    try:
        assert two.runner.kv_caches[0][0].device == torch.device("cuda:0")
        assert run_staggered(two) == expected
    finally:
        two.close()
    assert not multiprocessing.active_children()
