"""Tensor parallelism on a real server: one tiny random-weight Llama served twice, with
`tensor_parallel_size` 1 and 2 (the engine-core process and one worker, gloo on the CPU), asked
through Triton's generate endpoints; then the worker is killed under a stream.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess, running_server
from llm.tiny_models import TINY, build_tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers

from e2e.raw_http import post

pytestmark = pytest.mark.e2e

CONFIG = """
backend: "llm"
parameters {{ key: "model" value: {{ string_value: "{model}" }} }}
parameters {{ key: "dtype" value: {{ string_value: "fp32" }} }}
parameters {{ key: "kv_cache_memory" value: {{ string_value: "4194304" }} }}
parameters {{ key: "tensor_parallel_size" value: {{ string_value: "{tp}" }} }}
"""
PROMPT = "w5 w9 w33 w70 w101 w12 w64"


def _tiny_llm(path: Path) -> Path:
    """The tiny Llama with a word-level tokenizer over its vocabulary ("w0" ... "w127")."""
    build_tiny_model("llama", path)
    vocab = {f"w{i}": i for i in range(TINY["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tp-repo")
    weights = _tiny_llm(root / "weights")
    repo = root / "models"
    for name, tp in (("tp1", 1), ("tp2", 2)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(model=weights, tp=tp))
    with running_server(["--model-repository", str(repo)], root / "server.log") as running:
        yield running


def _generate(server: ServerProcess, model: str, body: dict[str, object]) -> dict[str, object]:
    answer = post(server.url, f"/v2/models/{model}/generate", json.dumps(body).encode(),
                  {"Content-Type": "application/json"}, timeout=60)
    assert answer.status == 200, answer.body
    result: dict[str, object] = answer.json()
    return result


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def test_two_ranks_answer_as_one(server: ServerProcess) -> None:
    body = {"text_input": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    one = _generate(server, "tp1", body)["text_output"]
    assert one
    assert _generate(server, "tp2", body)["text_output"] == one


def test_a_killed_worker_fails_the_stream_and_the_model_is_not_ready(server: ServerProcess) -> None:
    # The tp2 engine core is the server's child that has a child of its own: the worker.
    (worker,) = [grandchild for child in _children(server.process.pid) for grandchild in _children(child)]
    connection = http.client.HTTPConnection(server.url, timeout=60)
    body = {"text_input": PROMPT, "max_tokens": 240, "temperature": 0, "ignore_eos": True, "stream": True}
    connection.request("POST", "/v2/models/tp2/generate_stream", json.dumps(body),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the stream has begun
    os.kill(worker, signal.SIGKILL)
    rest = response.read().decode()
    connection.close()
    errors = [json.loads(line.removeprefix("data: "))["error"] for line in rest.splitlines() if '"error"' in line]
    assert errors and "tensor-parallel worker 1" in errors[0] and "must be restarted" in errors[0], rest
    # The engine core exits once it has failed the requests: then the model is not ready.
    deadline = time.monotonic() + 30
    while server.get("/v2/models/tp2/ready") == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.get("/v2/models/tp2/ready") == 400
    assert server.get("/v2/models/tp1/ready") == 200  # the other model serves on
