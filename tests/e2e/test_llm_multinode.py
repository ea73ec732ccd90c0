"""A model sharded over two "nodes" on loopback through a real server, placed the way the KServe
multi-node runtime places it: the server gets `--backend-config=llm,nnodes=2,...` (auto-complete
fills what a model's config leaves out), and a `naiad llm-node` agent with no node rank joins.
A model whose config sets its own placement keeps it (one process), and both answer alike.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from conftest import ServerProcess, running_server

from e2e.test_llm_pipeline_parallel import _text
from e2e.test_llm_tensor_parallel import PROMPT, _tiny_llm

pytestmark = pytest.mark.e2e

KEY = "e2e-multinode-secret"
CONFIG = """
backend: "llm"
parameters {{ key: "model" value: {{ string_value: "{model}" }} }}
parameters {{ key: "dtype" value: {{ string_value: "fp32" }} }}
parameters {{ key: "kv_cache_memory" value: {{ string_value: "4194304" }} }}
{placement}
"""
ONE_PROCESS = """parameters { key: "nnodes" value: { string_value: "1" } }
parameters { key: "tensor_parallel_size" value: { string_value: "1" } }"""


def _two_free_ports() -> int:
    """A port whose next one is free too (the step channel, then the process group)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("multinode")
    weights = _tiny_llm(root / "weights")
    repo = root / "models"
    for name, placement in (("single", ONE_PROCESS), ("sharded", "")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(model=weights, placement=placement))
    port = _two_free_ports()
    saved = os.environ.get("NAIAD_CLUSTER_KEY")
    os.environ["NAIAD_CLUSTER_KEY"] = KEY  # the server process (and its engine core) inherit it
    # Node 1's agent first, as a worker pod may start before the head: it waits for rank 0.
    agent = subprocess.Popen(
        [sys.executable, "-m", "naiad.cli", "llm-node", "--master-addr", "127.0.0.1", "--master-port", str(port),
         "--nnodes", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    args = ["--model-repository", str(repo), "--backend-config=llm,nnodes=2",
            "--backend-config=llm,tensor_parallel_size=2", "--backend-config=llm,master_addr=127.0.0.1",
            f"--backend-config=llm,master_port={port}"]
    try:
        with running_server(args, root / "server.log") as running:
            yield running
    finally:
        agent.send_signal(signal.SIGINT)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
        if saved is None:
            del os.environ["NAIAD_CLUSTER_KEY"]
        else:
            os.environ["NAIAD_CLUSTER_KEY"] = saved


def test_a_model_placed_by_the_backend_config_spans_two_nodes(cluster: ServerProcess) -> None:
    body = {"text_input": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    one = _text(cluster, "single", body)
    assert len(one.split()) == 24
    assert _text(cluster, "sharded", body) == one
    # The placement the server filled in shows in the model's config, as auto-completed fields do.
    sharded = _parameters(cluster, "sharded")
    assert (sharded["nnodes"], sharded["tensor_parallel_size"], sharded["master_addr"]) == ("2", "2", "127.0.0.1")
    assert _parameters(cluster, "single")["nnodes"] == "1"  # the model's own setting wins


def _parameters(server: ServerProcess, model: str) -> dict[str, str]:
    with urllib.request.urlopen(f"http://{server.url}/v2/models/{model}/config", timeout=10) as response:
        document = json.loads(response.read())
    return {key: value["string_value"] for key, value in document["parameters"].items()}
