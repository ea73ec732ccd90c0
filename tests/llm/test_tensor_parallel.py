"""Tensor parallelism on the CPU: two processes (the engine and one worker) joined by gloo.

The model split two ways must produce the same greedy tokens as one process over the same
continuous batch, and logprobs within float tolerance (the row-parallel sums add in another
order). A model that cannot be split is refused before any process starts; a worker that dies
fails the requests in flight with an error that names it, and the engine core exits, so that
the model instance reports itself not ready.

One tensor-parallel engine at a time: a process joins one torch.distributed group.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from llm.tiny_models import REQUESTS, TINY, build_tiny_model, run_staggered
from naiad.llm.distributed.workers import WorkerDied
from naiad.llm.engine.engine_core import AddRequest, CoreMessage, EngineClient, EngineFailed, StepOutputs
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY, SamplingParams
from naiad.llm.engine.sequence import TokenLogprobs
from naiad.llm.layers.quantization import OUTLIER_COLUMNS, Int8Linear

BLOCK = 4


def _kv_bytes(num_blocks: int, tp: int, head_dim: int = TINY["hidden_size"] // TINY["num_attention_heads"]) -> int:
    """The KV memory of `num_blocks` blocks on one rank of `tp` (each holds its share of the kv heads)."""
    kv_heads = TINY["num_key_value_heads"] // tp
    return num_blocks * 2 * TINY["num_hidden_layers"] * BLOCK * kv_heads * head_dim * 4  # fp32


def _config(path: Path, tp: int, num_blocks: int = 256, **overrides: object) -> EngineConfig:
    settings = {
        "model": path, "dtype": "float32", "block_size": BLOCK, "kv_cache_memory": _kv_bytes(num_blocks, tp),
        "max_num_batched_tokens": 32, "max_model_len": 96, "tensor_parallel_size": tp,
    }
    return EngineConfig(**{**settings, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def models(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # An odd vocabulary: the last rank's embedding and LM head rows are padded.
    odd = build_tiny_model("llama", tmp_path_factory.mktemp("tp") / "odd-vocab", vocab_size=129)
    return {"llama": tiny_models["llama"], "qwen2": tiny_models["qwen2"], "odd-vocab": odd}


def _top_logprobs(engine: LLMEngine) -> list[list[TokenLogprobs]]:
    """The greedy tokens' logprobs and top-20 alternatives for a few prompts run together."""
    params = SamplingParams(temperature=0, logprobs=20)
    ids = [engine.add_request(prompt, 4, sampling_params=params) for prompt, _, _ in REQUESTS[:4]]
    done = {}
    while engine.has_unfinished():
        done.update((seq.seq_id, seq.logprobs) for seq in engine.step())
    return [done[request_id] for request_id in ids]


def _assert_close(one: list[list[TokenLogprobs]], two: list[list[TokenLogprobs]]) -> None:
    for row_one, row_two in zip(one, two, strict=True):
        for (own1, ids1, values1), (own2, ids2, values2) in zip(row_one, row_two, strict=True):
            assert own2 == pytest.approx(own1, abs=1e-4)
            assert ids2[:5] == ids1[:5]  # the most likely tokens are far apart (see tiny_models)
            # All twenty values, sorted: a near-tie far down may swap two ids, not the values.
            assert sorted(values2) == pytest.approx(sorted(values1), abs=1e-4)


@pytest.mark.parametrize("variant", ["llama", "qwen2", "odd-vocab"])
def test_two_ranks_match_one_process(models: dict[str, Path], variant: str) -> None:
    # llama: tied embeddings (one vocab-parallel tensor for both); qwen2: q/k/v biases
    # (column-parallel) and an untied LM head; odd-vocab: padded vocab shards, and a KV cache
    # of 16 blocks that preempts, so recomputed sequences must come out the same too.
    num_blocks = 16 if variant == "odd-vocab" else 256
    max_len = {"max_model_len": 64} if variant == "odd-vocab" else {}
    one = LLMEngine(_config(models[variant], 1, num_blocks, **max_len))
    expected = run_staggered(one)
    expected_logprobs = _top_logprobs(one)
    two = LLMEngine(_config(models[variant], 2, num_blocks, **max_len))
    try:
        assert two.workers is not None and len(two.workers.workers) == 1
        assert two.runner.num_blocks == one.runner.num_blocks == num_blocks
        assert two.runner.kv_caches[0][0].shape[2] == TINY["num_key_value_heads"] // 2  # this rank's kv heads
        assert run_staggered(two) == expected
        assert two.block_manager.prefix_cache_hits > 0
        if variant == "odd-vocab":
            assert two.scheduler.num_preemptions > 0
        _assert_close(expected_logprobs, _top_logprobs(two))
    finally:
        two.close()
    assert not multiprocessing.active_children()


def test_int8_ranks_calibrate_together_and_match_one_process(models: dict[str, Path]) -> None:
    """`quantization: "int8"` split two ways: every rank runs the calibration forward at its start
    (its all-reduces meet), a row-parallel layer keeps one process's float16 columns (each rank
    those in its share of the inputs), and the split int8 model's greedy tokens are one process's."""
    one = LLMEngine(_config(models["qwen2"], 1, quantization="int8"))
    expected = run_staggered(one)
    two = LLMEngine(_config(models["qwen2"], 2, quantization="int8"))
    try:
        layer = two.runner.model.model.layers[0].self_attn.qkv_proj
        assert isinstance(layer, Int8Linear) and layer.columns.numel() == OUTLIER_COLUMNS
        for name in ("self_attn.o_proj", "mlp.down_proj"):  # rank 0's share: the first inputs
            whole = one.runner.model.get_submodule(f"model.layers.1.{name}")
            share = two.runner.model.get_submodule(f"model.layers.1.{name}")
            assert isinstance(whole, Int8Linear) and isinstance(share, Int8Linear)
            assert share.columns.tolist() == [c for c in whole.columns.tolist() if c < share.in_features], name
        assert run_staggered(two) == expected
    finally:
        two.close()
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (4, "tensor_parallel_size 4 does not divide the model's 2 key/value heads"),
        (3, "tensor_parallel_size 3 does not divide the model's 4 attention heads"),
    ],
)
def test_a_model_that_does_not_split_is_refused_before_starting_workers(
    models: dict[str, Path], tp: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LLMEngine(_config(models["llama"], 1, tensor_parallel_size=tp))
    assert not multiprocessing.active_children()


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux's /proc)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children.extend(int(child) for child in (task / "children").read_text().split())
    return children


def test_a_killed_worker_fails_the_requests_in_flight_and_stops_the_core(models: dict[str, Path]) -> None:
    # As the server runs it: the engine core in its own process, which starts the worker.
    messages: list[CoreMessage] = []
    stepping, failed = threading.Event(), threading.Event()

    def on_message(message: CoreMessage) -> None:
        messages.append(message)
        if isinstance(message, StepOutputs) and message.outputs:
            stepping.set()
        if isinstance(message, EngineFailed) and message.request_ids:
            failed.set()

    client = EngineClient(_config(models["llama"], 2, max_model_len=256), on_message)
    try:
        core_pid = client._core.pid
        assert core_pid is not None
        (worker_pid,) = _children(core_pid)
        ids = [f"r{i}" for i in range(3)]
        for i, request_id in enumerate(ids):
            # Long enough to be in flight when the worker dies (200 tokens each).
            client.add(AddRequest(request_id, REQUESTS[i][0], 200, GREEDY, ignore_eos=True))
        assert stepping.wait(60)
        os.kill(worker_pid, signal.SIGKILL)
        assert failed.wait(60)
        failure = next(m for m in messages if isinstance(m, EngineFailed) and m.request_ids)
        assert sorted(failure.request_ids) == ids
        assert "tensor-parallel worker 1" in failure.message
        assert f"exited with code {-signal.SIGKILL}" in failure.message
        assert "must be restarted" in failure.message
        # The core exits: the client stops taking work, so the model reports itself not ready.
        deadline = time.monotonic() + 30
        while client.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not client.is_alive()
        with pytest.raises(RuntimeError, match="not running"):
            client.add(AddRequest("late", [5, 6], 4, GREEDY))
    finally:
        client.close()


def test_the_engine_raises_worker_died_when_stepped_after_a_worker_exits(models: dict[str, Path]) -> None:
    engine = LLMEngine(_config(models["llama"], 2))
    try:
        assert engine.workers is not None
        # One group per process: a second engine here is refused, and leaves the first one's alone.
        with pytest.raises(RuntimeError, match="already runs a tensor-parallel engine"):
            LLMEngine(_config(models["llama"], 2))
        engine.add_request(REQUESTS[0][0], 50, sampling_params=GREEDY)
        engine.step()
        worker = engine.workers.workers[0].process
        worker.kill()
        worker.join(10)
        with pytest.raises(WorkerDied, match=r"tensor-parallel worker 1 \(pid \d+\) exited with code -9"):
            engine.step()
    finally:
        engine.close()
    assert not multiprocessing.active_children()


def test_a_worker_that_cannot_start_fails_the_engines_start_with_its_error(models: dict[str, Path]) -> None:
    # Too little KV memory for one block: the worker fails as rank 0 does, and says so first.
    with pytest.raises(RuntimeError, match=r"tensor-parallel worker 1 could not start: .*do not hold one KV block"):
        LLMEngine(_config(models["llama"], 2, kv_cache_memory=16))
    assert not multiprocessing.active_children()

