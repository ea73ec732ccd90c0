"""Multi-node parallelism, two "nodes" on loopback: this process is node 0 (the engine, rank 0) and
a `naiad llm-node` agent process is node 1, joined over TCP with a shared key.

Tensor parallelism across the nodes and pipeline stages on different nodes must give the same
greedy tokens as one process over the same continuous batch; a node that never comes, a wrong
key, and a remote rank that dies each end with an error that says so.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm.tiny_models import TINY, run_staggered
from naiad.llm.distributed import nodes
from naiad.llm.distributed.nodes import KEY_ENV
from naiad.llm.distributed.workers import WorkerDied
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY

BLOCK = 4
KEY = "loopback-test-secret"


def _config(path: Path, port: int = 0, **overrides: object) -> EngineConfig:
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    kv_bytes = 256 * 2 * TINY["num_hidden_layers"] * BLOCK * TINY["num_key_value_heads"] * head_dim * 4
    settings = {"model": path, "dtype": "float32", "block_size": BLOCK, "kv_cache_memory": kv_bytes,
                "max_num_batched_tokens": 32, "max_model_len": 96, "master_port": port}
    return EngineConfig(**{**settings, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def _agent(port: int, node_rank: int | None = 1, secret: str = KEY) -> subprocess.Popen[bytes]:
    """A node's agent, as an operator starts it on the other machine (no node rank: the next free
    one, as the pods of a Kubernetes Deployment start it)."""
    env = {**os.environ, KEY_ENV: secret}
    rank = [] if node_rank is None else ["--node-rank", str(node_rank)]
    return subprocess.Popen(
        [sys.executable, "-m", "naiad.cli", "llm-node", "--master-addr", "127.0.0.1", "--master-port", str(port),
         "--nnodes", "2", *rank, "--once"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


@pytest.fixture
def port() -> Iterator[int]:
    # Two free ports in a row: the step channel and the process group's rendezvous.
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            first = int(sock.getsockname()[1])
        if first < 65535 and _free(first + 1):
            yield first
            return
    pytest.fail("no two consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tensor-across-nodes", "stage-per-node"])
def test_two_nodes_match_one_process(tiny_models: dict[str, Path], key: str, port: int, tp: int, pp: int) -> None:
    expected = run_staggered(LLMEngine(_config(tiny_models["llama"])))
    agent = _agent(port, node_rank=1 if tp == 2 else None)  # the pipeline case takes the free node
    engine = LLMEngine(_config(tiny_models["llama"], port, nnodes=2, tensor_parallel_size=tp,
                               pipeline_parallel_size=pp))
    try:
        assert engine.workers is not None
        (remote,) = engine.workers.workers
        assert remote.rank == 1 and "on node 1" in remote.name
        assert remote.process.pid != agent.pid and remote.info is not None  # loaded its shard, reported in
        assert run_staggered(engine) == expected
    finally:
        engine.close()
    status = agent.wait(60)
    output = agent.stdout.read().decode(errors="replace") if agent.stdout else ""
    assert status == 0, f"the agent exited with {status}; its log, whole:\n{output}"  # not a truncated repr
    assert not multiprocessing.active_children()


def test_a_dead_remote_rank_fails_the_next_step(tiny_models: dict[str, Path], key: str, port: int) -> None:
    agent = _agent(port)
    engine = LLMEngine(_config(tiny_models["llama"], port, nnodes=2, tensor_parallel_size=2))
    try:
        assert engine.workers is not None
        (remote,) = engine.workers.workers
        os.kill(remote.process.pid, signal.SIGKILL)  # the same machine here: the test can reach it
        engine.add_request([1, 2, 3], 4, sampling_params=GREEDY)
        deadline = time.monotonic() + 30
        with pytest.raises(WorkerDied, match=r"tensor-parallel worker 1 on node 1 .* closed its connection"):
            while time.monotonic() < deadline:
                engine.step()
                time.sleep(0.1)
    finally:
        engine.close()
        agent.kill()
        agent.wait(30)


def test_a_node_that_never_connects_is_named(
    tiny_models: dict[str, Path], key: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodes, "NODE_WAIT_SECS", 2.0)
    with pytest.raises(RuntimeError, match=r"node\(s\) \[1\] did not connect their ranks \[1\]"):
        LLMEngine(_config(tiny_models["llama"], port, nnodes=2, tensor_parallel_size=2))
    assert not multiprocessing.active_children()


def test_an_agent_with_the_wrong_key_is_not_let_in(
    tiny_models: dict[str, Path], key: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodes, "NODE_WAIT_SECS", 8.0)
    agent = _agent(port, secret="not-the-key")
    try:
        with pytest.raises(RuntimeError, match=r"did not connect.*digest"):
            LLMEngine(_config(tiny_models["llama"], port, nnodes=2, tensor_parallel_size=2))
        out, _ = agent.communicate(timeout=30)
        assert agent.returncode == 1 and b"refused this node's $NAIAD_CLUSTER_KEY" in out, out
    finally:
        agent.kill()
        agent.wait(30)


def test_bad_clusters_are_refused_before_any_process_starts(
    tiny_models: dict[str, Path], port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["llama"]
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=f"shared secret in \\${KEY_ENV}"):
        LLMEngine(_config(model, port, nnodes=2, tensor_parallel_size=2))
    monkeypatch.setenv(KEY_ENV, KEY)
    with pytest.raises(ValueError, match=r"2 ranks .* do not split evenly over 3 nodes"):
        LLMEngine(_config(model, port, nnodes=3, tensor_parallel_size=2))
    with pytest.raises(ValueError, match="nnodes applies to the mp backend"):
        LLMEngine(_config(model, port, nnodes=2, tensor_parallel_size=2, distributed_executor_backend="ray"))
    with pytest.raises(ValueError, match="distributed_executor_backend must be mp or ray"):
        LLMEngine(_config(model, port, distributed_executor_backend="slurm"))
    assert not multiprocessing.active_children()


def test_the_agent_refuses_a_bad_node_rank(port: int) -> None:
    agent = _agent(port, node_rank=2)
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 2 and b"node rank must be in 1..1" in out


def test_a_second_agent_for_the_same_node_is_turned_away(tiny_models: dict[str, Path], key: str, port: int) -> None:
    agents = [_agent(port), _agent(port, node_rank=None)]  # node 1, and "any" when none is left
    engine = LLMEngine(_config(tiny_models["llama"], port, nnodes=2, tensor_parallel_size=2))
    try:
        assert engine.workers is not None and len(engine.workers.workers) == 1
        refused = []
        deadline = time.monotonic() + 60
        while not refused and time.monotonic() < deadline:
            refused = [agent for agent in agents if agent.poll() is not None]
            time.sleep(0.1)
        (turned_away,) = refused
        out = turned_away.stdout.read() if turned_away.stdout else b""
        assert turned_away.returncode == 1 and b"has no place for" in out, out
    finally:
        engine.close()
        for agent in agents:
            agent.kill()
            agent.wait(30)
