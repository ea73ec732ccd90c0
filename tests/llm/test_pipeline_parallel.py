"""Pipeline parallelism on the CPU: the layers in stages on separate processes, joined by gloo.

Split in stages (and in stages of two tensor-parallel ranks each), the model must produce the
same greedy tokens as one process over the same continuous batch (prefix caching on, and under
preemption), logprobs within float tolerance; each stage holds only its own layers; stages work
on successive micro-batches at once (shown by the order of events, not by timing); a pipeline
that the layers cannot fill is refused before any process starts; a stage's worker that dies
fails the step, and the requests in flight, with an error that names it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm.test_tensor_parallel import _assert_close, _children, _top_logprobs
from llm.tiny_models import REQUESTS, TINY, build_tiny_model, run_staggered
from naiad.llm.distributed.parallel import destroy_group, free_port, init_group, stage_layers
from naiad.llm.distributed.pipeline import split_plan, split_rows
from naiad.llm.distributed.workers import WorkerDied
from naiad.llm.engine.engine_core import AddRequest, CoreMessage, EngineClient, EngineFailed, StepOutputs
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.model_runner import ModelRunner, RunnerConfig, StepPlan
from naiad.llm.engine.sampling_params import GREEDY
from naiad.llm.layers.quantization import OUTLIER_COLUMNS, Int8Linear

BLOCK = 4
LAYERS = 3  # odd: two stages hold 2 and 1 layers


def _kv_bytes(num_blocks: int, tp: int, pp: int) -> int:
    """The KV memory of `num_blocks` blocks on a rank of the stage with the most layers."""
    layers = max(len(r) for r in stage_layers(LAYERS, pp))
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    return num_blocks * 2 * layers * BLOCK * (TINY["num_key_value_heads"] // tp) * head_dim * 4  # fp32


def _config(path: Path, tp: int, pp: int, num_blocks: int = 256, **overrides: object) -> EngineConfig:
    settings = {
        "model": path, "dtype": "float32", "block_size": BLOCK, "kv_cache_memory": _kv_bytes(num_blocks, tp, pp),
        "max_num_batched_tokens": 32, "max_model_len": 96, "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
    }
    return EngineConfig(**{**settings, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # llama: tied embeddings (the last stage's LM head is its own copy of the embedding);
    # qwen2: q/k/v biases and an untied LM head.
    root = tmp_path_factory.mktemp("pp")
    return {variant: build_tiny_model(variant, root / variant, num_hidden_layers=LAYERS)
            for variant in ("llama", "qwen2")}


_EXPECTED: dict[tuple[str, int], tuple[list[list[int]], list, int]] = {}


def _one_process(models: dict[str, Path], variant: str, num_blocks: int, **overrides: object) -> tuple:
    """One process's tokens, logprobs and weight bytes for the batch (computed once per model)."""
    key = (variant, num_blocks)
    if key not in _EXPECTED:
        one = LLMEngine(_config(models[variant], 1, 1, num_blocks, **overrides))
        _EXPECTED[key] = (run_staggered(one), _top_logprobs(one), one.runner.weight_bytes())
    return _EXPECTED[key]


def _check_matches_one_process(models: dict[str, Path], engine: LLMEngine, variant: str) -> None:
    config = engine.config
    tp, pp, num_blocks = config.tensor_parallel_size, config.pipeline_parallel_size, engine.runner.num_blocks
    overrides = {"max_model_len": config.max_model_len}
    expected, expected_logprobs, full_bytes = _one_process(models, variant, num_blocks, **overrides)
    assert engine.workers is not None and len(engine.workers.workers) == tp * pp - 1
    # Each stage holds its layers, and only their weights and KV cache.
    stages = stage_layers(LAYERS, pp)
    assert engine.runner.model.model.layer_range == stages[0]
    assert len(engine.runner.kv_caches) == len(stages[0])
    for worker in engine.workers.workers:
        assert worker.info is not None
        assert worker.info.layers == stages[worker.rank // tp]
        assert worker.info.parameter_bytes < full_bytes / tp
    assert engine.runner.weight_bytes() < full_bytes / tp
    assert run_staggered(engine) == expected
    assert engine.block_manager.prefix_cache_hits > 0
    if num_blocks == 16:
        assert engine.scheduler.num_preemptions > 0
    _assert_close(expected_logprobs, _top_logprobs(engine))


@pytest.mark.parametrize(
    ("variant", "pp"),
    [
        ("llama", 2),  # 2 + 1 layers, a KV cache of 16 blocks that preempts
        ("qwen2", 3),  # a middle stage with neither embedding nor head
    ],
)
def test_stages_match_one_process(models: dict[str, Path], variant: str, pp: int) -> None:
    num_blocks = 16 if variant == "llama" else 256
    engine = LLMEngine(_config(models[variant], 1, pp, num_blocks, max_model_len=64 if variant == "llama" else 96))
    try:
        assert engine.runner.num_blocks == num_blocks  # the same blocks on every stage
        _check_matches_one_process(models, engine, variant)
    finally:
        engine.close()
    assert not multiprocessing.active_children()


def test_int8_stages_calibrate_together_and_match_one_process(models: dict[str, Path]) -> None:
    """`quantization: "int8"` in two stages: every stage runs its part of the calibration forward at
    its start (hidden states handed on as in a step), and the greedy tokens are one process's."""
    one = LLMEngine(_config(models["llama"], 1, 1, quantization="int8"))
    expected = run_staggered(one)
    two = LLMEngine(_config(models["llama"], 1, 2, quantization="int8"))
    try:
        layer = two.runner.model.model.layers[0].mlp.down_proj
        assert isinstance(layer, Int8Linear) and layer.columns.numel() == OUTLIER_COLUMNS
        assert run_staggered(two) == expected
    finally:
        two.close()
    assert not multiprocessing.active_children()


@pytest.fixture(scope="module")
def tp2_pp2(models: dict[str, Path]) -> Iterator[LLMEngine]:
    """Two stages of two tensor-parallel ranks: four processes, started once for two tests."""
    engine = LLMEngine(_config(models["qwen2"], 2, 2))
    yield engine
    engine.close()
    assert not multiprocessing.active_children()


def test_two_stages_of_two_ranks_match_one_process(models: dict[str, Path], tp2_pp2: LLMEngine) -> None:
    assert tp2_pp2.runner.num_blocks == 256
    assert tp2_pp2.runner.kv_caches[0][0].shape[2] == TINY["num_key_value_heads"] // 2  # this rank's kv heads
    _check_matches_one_process(models, tp2_pp2, "qwen2")


def _plan(num_tokens: list[int], sampling: list[bool]) -> StepPlan:
    tokens = [t for row, n in enumerate(num_tokens) for t in range(row * 100, row * 100 + n)]
    ends = [sum(num_tokens[: row + 1]) for row in range(len(num_tokens))]
    return StepPlan(tokens, list(range(len(tokens))), num_tokens, [n + 3 for n in num_tokens],
                    [[row] for row in range(len(num_tokens))],
                    [end - 1 for end, samples in zip(ends, sampling, strict=True) if samples])


def test_a_step_splits_into_at_most_one_micro_batch_per_stage_of_whole_rows() -> None:
    assert split_rows([1], 2) == [range(1)]  # one row: one micro-batch
    assert split_rows([1, 1, 1, 1], 2) == [range(2), range(2, 4)]
    assert split_rows([20, 1, 1, 1], 2) == [range(1), range(1, 4)]  # by tokens
    assert split_rows([1, 1, 1, 20], 2) == [range(3), range(3, 4)]
    assert split_rows([5, 5], 4) == [range(1), range(1, 2)]
    assert split_rows([30, 1, 1], 3) == [range(1), range(1, 2), range(2, 3)]  # a row for every run
    plan = _plan([3, 1, 4, 1], [True, False, True, True])
    parts = split_plan(plan, 2)
    assert [p.num_tokens for p in parts] == [[3, 1], [4, 1]]
    # Each part's logits rows index its own tokens; together they are the step's, in order.
    assert [p.logits_indices for p in parts] == [[2], [3, 4]]
    assert [t for p in parts for t in p.token_ids] == plan.token_ids
    assert [p.token_ids[i] for p in parts for i in p.logits_indices] == [plan.token_ids[i]
                                                                         for i in plan.logits_indices]
    assert [t for p in parts for t in p.block_tables] == plan.block_tables
    assert split_plan(plan, 1) == [plan]


def _probe_stage(rank: int, port: int, model: Path, plan: StepPlan, started: Any, results: Any) -> None:
    """One stage of a two-stage pipeline, its layers wrapped to show when each micro-batch runs.

    Stage 1 says when it begins micro-batch 0; stage 0, on beginning micro-batch 1, waits for
    that. Stages that overlap get there; a pipeline that finished stage 0's micro-batches before
    handing any on would wait in vain (the timeout only ends the failing case)."""
    import torch

    tp = init_group(rank, 2, port, torch.device("cpu"), tp_size=1)
    runner = ModelRunner(RunnerConfig(model, dtype="float32", block_size=BLOCK, kv_cache_memory=1 << 20), tp)
    (layer,) = runner.model.model.layers  # one layer a stage: one call a micro-batch
    forward, calls, overlapped = layer.forward, [], []

    def probed(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        if rank == 1 and len(calls) == 1:
            started.set()
        if rank == 0 and len(calls) == 2:
            overlapped.append(started.wait(60))
        return forward(*args, **kwargs)

    layer.forward = probed
    with torch.inference_mode():
        logits = runner.forward_plan(plan)
    if rank == 0:
        assert logits is not None
        results.put((overlapped, logits.tolist()))
    destroy_group()


def test_stage_1_runs_micro_batch_0_while_stage_0_runs_micro_batch_1(tiny_models: dict[str, Path]) -> None:
    import torch

    model = tiny_models["llama"]  # two layers: one a stage
    plan = StepPlan(REQUESTS[0][0] + REQUESTS[4][0] + REQUESTS[1][0][:5], [*range(5), 0, *range(5)],
                    [5, 1, 5], [5, 1, 5], [[0, 1], [2], [3, 4]], [4, 5, 10])
    context = multiprocessing.get_context("spawn")
    started, results = context.Event(), context.Queue()
    port = free_port()
    stages = [context.Process(target=_probe_stage, args=(rank, port, model, plan, started, results))
              for rank in range(2)]
    for stage in stages:
        stage.start()
    overlapped, logits = results.get(timeout=120)
    for stage in stages:
        stage.join(30)
        assert stage.exitcode == 0
    assert overlapped == [True]
    # The micro-batched logits are one process's.
    one = ModelRunner(RunnerConfig(model, dtype="float32", block_size=BLOCK, kv_cache_memory=1 << 20))
    with torch.inference_mode():
        expected = one.forward_plan(plan)
    assert expected is not None
    assert torch.tensor(logits) == pytest.approx(expected, abs=1e-4)


def test_layers_split_as_evenly_as_possible() -> None:
    assert stage_layers(3, 2) == [range(2), range(2, 3)]
    assert stage_layers(24, 4) == [range(6), range(6, 12), range(12, 18), range(18, 24)]
    assert stage_layers(5, 3) == [range(2), range(2, 4), range(4, 5)]


@pytest.mark.parametrize(
    ("pp", "message"),
    [
        (4, "pipeline_parallel_size 4 exceeds the model's 3 decoder layers"),
        (0, "pipeline_parallel_size must be at least 1"),
    ],
)
def test_more_stages_than_layers_are_refused_before_starting_workers(
    models: dict[str, Path], pp: int, message: str
) -> None:
    before = set(multiprocessing.active_children())  # the module's two-by-two engine's
    with pytest.raises(ValueError, match=message):
        LLMEngine(_config(models["llama"], 1, 1, pipeline_parallel_size=pp))
    assert set(multiprocessing.active_children()) == before


def test_the_engine_raises_worker_died_naming_the_stage_whose_worker_exited(tp2_pp2: LLMEngine) -> None:
    # Runs after the test above: the engine is not of use once a rank is gone.
    engine = tp2_pp2
    assert engine.workers is not None
    engine.add_request(REQUESTS[0][0], 50, sampling_params=GREEDY)
    engine.step()
    worker = engine.workers.workers[2].process  # rank 3: stage 1, tensor-parallel rank 1
    worker.kill()
    worker.join(10)
    try:
        with pytest.raises(WorkerDied, match=r"pipeline worker 3 \(stage 1, tensor-parallel rank 1\) "
                                             r"\(pid \d+\) exited with code -9"):
            engine.step()
    finally:
        engine.close()
    assert not multiprocessing.active_children()


def test_a_stage_killed_mid_step_fails_the_requests_in_flight_and_stops_the_core(models: dict[str, Path]) -> None:
    # As the server runs it: the engine core (stage 0) in its own process, which starts stage 1.
    messages: list[CoreMessage] = []
    stepping, failed = threading.Event(), threading.Event()

    def on_message(message: CoreMessage) -> None:
        messages.append(message)
        if isinstance(message, StepOutputs) and message.outputs:
            stepping.set()
        if isinstance(message, EngineFailed) and message.request_ids:
            failed.set()

    client = EngineClient(_config(models["llama"], 1, 2, max_model_len=256), on_message)
    try:
        core_pid = client._core.pid
        assert core_pid is not None
        (worker_pid,) = _children(core_pid)
        ids = [f"r{i}" for i in range(3)]
        for i, request_id in enumerate(ids):
            client.add(AddRequest(request_id, REQUESTS[i][0], 200, GREEDY, ignore_eos=True))
        assert stepping.wait(60)
        os.kill(worker_pid, signal.SIGKILL)
        assert failed.wait(60)
        failure = next(m for m in messages if isinstance(m, EngineFailed) and m.request_ids)
        assert sorted(failure.request_ids) == ids
        assert "pipeline worker 1 (stage 1, tensor-parallel rank 0)" in failure.message
        assert f"exited with code {-signal.SIGKILL}" in failure.message
        assert "must be restarted" in failure.message
        deadline = time.monotonic() + 30
        while client.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not client.is_alive()
    finally:
        client.close()
