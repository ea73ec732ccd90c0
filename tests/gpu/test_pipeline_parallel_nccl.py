"""Pipeline parallelism over NCCL: two stages on two GPUs (and TP x PP on four) against one GPU.

The same continuous batch as the CPU test (tests/llm/test_pipeline_parallel.py), the hidden states
and logits moving by NCCL point-to-point instead of gloo. Skipped unless torch sees enough GPUs.
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
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="pipeline parallelism over NCCL needs two CUDA devices"),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen2", tmp_path_factory.mktemp("nccl-pp") / "qwen2", num_hidden_layers=3)


def _engine(path: Path, tp: int, pp: int) -> LLMEngine:
    # Rank r runs on cuda:r (stage-major: stage s's ranks are s * tp ... s * tp + tp - 1).
    return LLMEngine(EngineConfig(model=path, dtype="float32", device="cuda:0", block_size=4,
                                  kv_cache_memory=8 << 20, max_num_batched_tokens=32, max_model_len=96,
                                  tensor_parallel_size=tp, pipeline_parallel_size=pp))


@pytest.mark.parametrize(("tp", "pp"), [(1, 2), (2, 2)])
def test_stages_on_gpus_match_one_gpu(model: Path, tp: int, pp: int) -> None:
    if torch.cuda.device_count() < tp * pp:
        pytest.skip(f"TP {tp} x PP {pp} over NCCL needs {tp * pp} CUDA devices")
    expected = run_staggered(_engine(model, 1, 1))
    parallel = _engine(model, tp, pp)
    try:
        assert parallel.runner.kv_caches[0][0].device == torch.device("cuda:0")
        assert run_staggered(parallel) == expected
    finally:
        parallel.close()
    assert not multiprocessing.active_children()
