"""Tensor parallelism across two Ray nodes: two network namespaces joined by a veth pair, a Ray
node in each, rank 1 placed on the other node by a STRICT_SPREAD placement group.

The driver (tests/integrations/two_node_tp_driver.py) runs inside the head's namespace, where
10.200.0.1 is the only address besides loopback: the rendezvous and gloo must use it, and rank 1,
on 10.200.0.2, must reach it. Its greedy tokens must equal one process's. Needs root (CI runs as
root); skipped only where Ray is not installed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from llm.tiny_models import build_tiny_model

from integrations.netns import HEAD_IP, RAY_PORT, WORKER_IP, TwoNodes

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("two_node_tp_driver.py")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    nodes = TwoNodes(tmp_path_factory.mktemp("ray-two-nodes"))
    try:
        yield nodes
    finally:
        nodes.close()


def test_tp2_across_two_nodes_matches_one_process(two_nodes: TwoNodes, tmp_path: Path) -> None:
    model = build_tiny_model("llama", tmp_path / "llama")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])}
    done = two_nodes.run([sys.executable, str(DRIVER), f"{HEAD_IP}:{RAY_PORT}", str(model)],
                         timeout=240, env=env, cwd=ROOT)
    two_nodes.check_alive()
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["two"] == result["one"] and all(result["one"])
    # Rank 1 really ran on the other node, inside the group it was given; rank 0 met it at the
    # head's namespace address, not 127.0.0.1.
    assert result["rank1"]["ip"] == WORKER_IP and result["rank0"]["ip"] == HEAD_IP
    assert result["rank1"]["node_id"] != result["rank0"]["node_id"]
    assert result["rank1"]["placement_group_id"] == result["placement_group_id"]
    assert result["host"] == HEAD_IP
