"""The two-node test's driver, run inside the head node's namespace: TP=2 over two Ray nodes.

Usage: two_node_tp_driver.py RAY_ADDRESS MODEL_DIR — prints one JSON line: the one-process and
the two-rank greedy tokens, and where rank 0 and rank 1 ran.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import ray
from llm.tiny_models import TINY, run_staggered
from ray.util.placement_group import placement_group, remove_placement_group

import naiad.llm.distributed.ray_workers as ray_workers_module
from naiad.llm.distributed.ray_workers import RayWorkerGroup
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine


def config(model: Path, tp: int) -> EngineConfig:
    kv_heads, head_dim = TINY["num_key_value_heads"] // tp, TINY["hidden_size"] // TINY["num_attention_heads"]
    return EngineConfig(
        model=model, dtype="float32", block_size=4, max_num_batched_tokens=32, max_model_len=96,
        kv_cache_memory=256 * 2 * TINY["num_hidden_layers"] * 4 * kv_heads * head_dim * 4, tensor_parallel_size=tp,
        distributed_executor_backend="ray",
    )


def main(address: str, model: Path) -> None:
    ray.init(address=address, log_to_driver=False)
    here = ray.util.get_node_ip_address()
    deadline = time.monotonic() + 90
    while sum(node["Alive"] for node in ray.nodes()) < 2:  # the worker node may still be joining
        if time.monotonic() > deadline:
            raise SystemExit(f"the cluster has not two live nodes: {ray.nodes()}")
        time.sleep(0.5)
    # One rank per node; bundle 0 (rank 0, this process) pinned to this node.
    pg = placement_group([{"CPU": 1, f"node:{here}": 0.001}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=60)
    groups: list[RayWorkerGroup] = []

    def make(cfg: object, tp_size: int, pp_size: int = 1) -> RayWorkerGroup:
        groups.append(RayWorkerGroup(cfg, tp_size, pp_size, placement_group=pg))  # type: ignore[arg-type]
        return groups[-1]

    # The engine's Ray backend builds its group on this placement group (what a caller passing one does).
    ray_workers_module.RayWorkerGroup = make  # type: ignore[assignment,misc]
    one = run_staggered(LLMEngine(config(model, 1)))
    engine = LLMEngine(config(model, 2))
    try:
        two = run_staggered(engine)
        rank1 = ray.get(groups[0].workers[0].actor.where.remote())
    finally:
        engine.close()
        remove_placement_group(pg)
    print(json.dumps({
        "one": one, "two": two, "rank0": {"node_id": ray.get_runtime_context().get_node_id(), "ip": here},
        "rank1": rank1, "placement_group_id": pg.id.hex(), "host": groups[0].host,
    }))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
