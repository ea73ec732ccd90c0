"""The llm backend's engine supervisor: the restart policy and its parameters, and real engine-core
processes (a tiny random-weight Llama) killed under it: restarted and serving through the same
callback, left down when restarts are off, and a restart cut short by close()."""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from llm.tiny_models import build_tiny_model
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.llm import LLMModel
from naiad.backends.llm_supervisor import EngineSupervisor, RestartPolicy
from naiad.errors import InvalidArgument
from naiad.llm.engine.engine_core import AddRequest, CoreMessage, StepOutputs
from naiad.llm.engine.llm_engine import EngineConfig
from naiad.llm.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(limit=8, backoff=1.0, max_backoff=30.0)
    assert [policy.delay(attempt) for attempt in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert RestartPolicy(backoff=0).delay(3) == 0


def test_the_restart_parameters_are_read_and_checked(tmp_path: Path) -> None:
    def model(**parameters: str) -> LLMModel:
        config = mc.ModelConfig(name="m", backend="llm")
        for key, value in {"model": "weights", **parameters}.items():
            config.parameters[key].string_value = value
        return LLMModel(config, tmp_path, 1)

    assert model().restart_policy() == RestartPolicy(limit=5, backoff=1.0)
    assert model(engine_restart_limit="0", engine_restart_backoff="0.5").restart_policy() == RestartPolicy(0, 0.5)
    with pytest.raises(InvalidArgument, match="'engine_restart_limit' must be an integer"):
        model(engine_restart_limit="often").restart_policy()
    with pytest.raises(InvalidArgument, match="model 'm': the restart limit must be 0 or more, got -1"):
        model(engine_restart_limit="-1").restart_policy()
    with pytest.raises(InvalidArgument, match="restart backoff must be 0 or more seconds"):
        model(engine_restart_backoff="-2").restart_policy()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> EngineConfig:
    path = build_tiny_model("llama", tmp_path_factory.mktemp("supervisor") / "llama")
    return EngineConfig(model=path, dtype="float32", block_size=4, kv_cache_memory=4 << 20, max_model_len=96,
                        max_num_batched_tokens=16)


def _kill_core(supervisor: EngineSupervisor) -> int:
    pid = supervisor.client.pid
    assert pid is not None  # a process, not a thread
    os.kill(pid, signal.SIGKILL)
    return pid


def _until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.05)


def test_a_killed_core_is_replaced_and_serves_through_the_same_callback(config: EngineConfig) -> None:
    messages: queue.Queue[CoreMessage] = queue.Queue()
    supervisor = EngineSupervisor(config, messages.put, model_name="m", policy=RestartPolicy(limit=2, backoff=0.1))
    try:
        old = _kill_core(supervisor)
        _until(lambda: not supervisor.is_ready(), 10)
        _until(supervisor.is_ready, 60)
        assert supervisor.restarts == 1 and supervisor.client.pid not in (None, old)
        assert supervisor.not_ready_reason() == ""
        supervisor.add(AddRequest("after", [5, 6, 7], 3, GREEDY, ignore_eos=True))
        tokens: list[int] = []
        while len(tokens) < 3:
            message = messages.get(timeout=30)
            if isinstance(message, StepOutputs):
                tokens += [t for output in message.outputs if output.request_id == "after"
                           for t in output.new_token_ids]
        assert len(tokens) == 3
    finally:
        supervisor.close()


def test_with_restarts_off_a_dead_core_stays_down_and_says_why(config: EngineConfig) -> None:
    supervisor = EngineSupervisor(config, lambda message: None, model_name="m", policy=RestartPolicy(limit=0))
    try:
        _kill_core(supervisor)
        _until(lambda: bool(supervisor.reason), 10)
        assert "not restarted (engine_restart_limit 0)" in supervisor.not_ready_reason()
        assert "exited with code -9" in supervisor.reason
        with pytest.raises(RuntimeError, match="not restarted"):
            supervisor.add(AddRequest("late", [5, 6], 2, GREEDY))
        time.sleep(0.5)
        assert not supervisor.is_ready() and supervisor.restarts == 0
    finally:
        supervisor.close()


def test_close_cuts_a_restart_short(config: EngineConfig) -> None:
    supervisor = EngineSupervisor(config, lambda message: None, model_name="m",
                                  policy=RestartPolicy(limit=3, backoff=30.0))
    _kill_core(supervisor)
    _until(lambda: "attempt 1 of 3" in supervisor.reason, 10)
    with pytest.raises(RuntimeError, match="restarting it"):
        supervisor.add(AddRequest("meanwhile", [5, 6], 2, GREEDY))
    started = time.monotonic()
    supervisor.close()
    assert time.monotonic() - started < 5  # not the 30 s backoff
    assert supervisor.restarts == 0 and not supervisor.is_ready()
    assert supervisor.not_ready_reason() == "the model is unloading"
