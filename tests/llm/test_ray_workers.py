"""Tensor parallelism with rank 1 as a Ray actor (naiad.llm.distributed.ray_workers), on a real local Ray.

The engine runs exactly as with its worker processes, with `distributed_executor_backend: ray`
building a `RayWorkerGroup` instead of a `WorkerGroup`: two ranks give the same greedy
tokens as one process over the staggered continuous batch. The rank runs inside the placement
group it was given (vLLM #30016: not merely somewhere with free CPUs); a killed rank is reported
by name; a group that does not fit is refused with the numbers. Skipped only without Ray.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402

import naiad.llm.distributed.ray_workers as ray_workers_module  # noqa: E402
from llm.tiny_models import REQUESTS, TINY, run_staggered  # noqa: E402
from naiad.llm.distributed.ray_workers import RayWorkerGroup  # noqa: E402
from naiad.llm.distributed.workers import WorkerDied  # noqa: E402
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402

pytestmark = pytest.mark.ray

BLOCK = 4


def _config(path: Path, tp: int) -> EngineConfig:
    kv_heads = TINY["num_key_value_heads"] // tp
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    kv_bytes = 256 * 2 * TINY["num_hidden_layers"] * BLOCK * kv_heads * head_dim * 4  # 256 fp32 blocks
    return EngineConfig(
        model=path, dtype="float32", block_size=BLOCK, kv_cache_memory=kv_bytes,
        max_num_batched_tokens=32, max_model_len=96, tensor_parallel_size=tp, distributed_executor_backend="ray",
    )


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # address="local": a cluster of our own, never one some `ray start` left on this machine.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def ray_groups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RayWorkerGroup]]:
    """The RayWorkerGroups LLMEngine builds get an explicit PACK group of 1-CPU bundles (the
    placement group a caller passes); the list collects them for the test to inspect."""
    made: list[RayWorkerGroup] = []
    groups: list[Any] = []

    def make(config: Any, tp_size: int, pp_size: int = 1) -> RayWorkerGroup:
        pg = placement_group([{"CPU": 1}] * (tp_size * pp_size), strategy="PACK")
        ray.get(pg.ready(), timeout=60)
        groups.append(pg)
        made.append(RayWorkerGroup(config, tp_size, pp_size, placement_group=pg))
        return made[-1]

    monkeypatch.setattr(ray_workers_module, "RayWorkerGroup", make)
    try:
        yield made
    finally:
        for pg in groups:
            remove_placement_group(pg)


def test_two_ray_ranks_match_one_process(
    local_ray: None, ray_groups: list[RayWorkerGroup], tiny_models: dict[str, Path]
) -> None:
    one = LLMEngine(_config(tiny_models["llama"], 1))
    expected = run_staggered(one)
    two = LLMEngine(_config(tiny_models["llama"], 2))
    try:
        assert run_staggered(two) == expected
        assert all(expected) and sum(map(len, expected)) > len(REQUESTS)  # real generations, not empty ones
        (group,) = ray_groups
        (worker,) = group.workers
        where = ray.get(worker.actor.where.remote())
        # The rank runs inside the group it was given, not wherever Ray had room (vLLM #30016).
        assert where["placement_group_id"] == group.placement_group.id.hex()
        assert worker.info is not None and worker.info.layers == range(TINY["num_hidden_layers"])
    finally:
        two.close()
    assert ray_groups[0].workers == []  # close stopped the actor


@pytest.mark.parametrize("when", ["stepping", "idle"])
def test_killed_rank_is_reported_by_name(
    local_ray: None, ray_groups: list[RayWorkerGroup], tiny_models: dict[str, Path], when: str
) -> None:
    engine = LLMEngine(_config(tiny_models["llama"], 2))
    try:
        prompt, max_tokens, _ = REQUESTS[0]
        engine.add_request(prompt, max_tokens)
        engine.step()
        (group,) = ray_groups
        group.check()  # alive
        ray.kill(group.workers[0].actor)
        if when == "stepping":
            # Rank 0's next collective meets a dead peer: gloo fails it (not a 10-minute wait)...
            with pytest.raises(Exception):  # noqa: B017 - gloo's own error type and text vary
                while engine.has_unfinished():
                    engine.step()
            # ... and the group names the rank that died.
            with pytest.raises(WorkerDied, match="tensor-parallel worker 1 died"):
                group.check(wait=30)
        else:
            # No step in flight: the engine core's idle checks find it through their probes.
            deadline = time.monotonic() + 30
            with pytest.raises(WorkerDied, match="tensor-parallel worker 1 died"):
                while time.monotonic() < deadline:
                    group.check(wait=1)
                    time.sleep(0.2)
    finally:
        engine.close()


def test_bad_placement_is_refused(local_ray: None, tiny_models: dict[str, Path]) -> None:
    config = _config(tiny_models["llama"], 2).runner_config()
    pg = placement_group([{"CPU": 1}] * 3, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=60)
        with pytest.raises(ValueError, match="3 bundles; 2 ranks need one each"):
            RayWorkerGroup(config, 2, placement_group=pg)
    finally:
        remove_placement_group(pg)
    pg = placement_group([{"CPU": 1}, {"GPU": 0.0, "memory": 1024}], strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=60)
        with pytest.raises(ValueError, match="bundle 1 of the placement group has no CPU for rank 1"):
            RayWorkerGroup(config, 2, placement_group=pg)
    finally:
        remove_placement_group(pg)
    with pytest.raises(ValueError, match="'SIDEWAYS' is not one of"):
        RayWorkerGroup(config, 2, strategy="SIDEWAYS")
    # 2 ranks of 3 CPUs on a 4-CPU cluster: refused with the numbers, not a hang.
    with pytest.raises(RuntimeError, match="could not place 2 ranks"):
        RayWorkerGroup(config, 2, cpus_per_rank=3, ready_timeout=3)
