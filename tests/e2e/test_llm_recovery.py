"""An llm model whose engine core dies is restarted: on a real server, a tiny random-weight Llama
served three times (one engine-core process; two tensor-parallel ranks; one whose weights are
gone by the time it restarts). The engine core, or worker rank 1, is SIGKILLed under a stream:
the stream ends with an error naming the death, requests meanwhile get a 503 saying the model
restarts, and the model turns ready again and answers as before. A restart that cannot succeed
gives up after its limit, and the model stays not ready with the last error.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import time
import urllib.request
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
parameters {{ key: "engine_restart_limit" value: {{ string_value: "{limit}" }} }}
parameters {{ key: "engine_restart_backoff" value: {{ string_value: "{backoff}" }} }}
"""
#: name: (tensor_parallel_size, engine_restart_limit, engine_restart_backoff)
MODELS = {"core": (1, 3, 1.0), "tp2": (2, 3, 1.0), "fragile": (1, 2, 0.2)}
PROMPT = "w5 w9 w33 w70 w101 w12 w64"
GREEDY = {"text_input": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
# Long enough that the kill lands while it runs (a context of 2048 for the tiny model).
LONG_STREAM = {"text_input": PROMPT, "max_tokens": 2000, "temperature": 0, "ignore_eos": True, "stream": True}
RECOVERY_SECS = 60


def _tiny_llm(path: Path) -> Path:
    """The tiny Llama with a word-level tokenizer over its vocabulary ("w0" ... "w127")."""
    build_tiny_model("llama", path, max_position_embeddings=2048)
    vocab = {f"w{i}": i for i in range(TINY["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_llm(tmp_path_factory.mktemp("recovery") / "weights")


@pytest.fixture(scope="module")
def server(weights: Path) -> Iterator[ServerProcess]:
    root = weights.parent
    repo = root / "models"
    for name, (tp, limit, backoff) in MODELS.items():
        model = weights if name != "fragile" else shutil.copytree(weights, root / "fragile-weights")
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(model=model, tp=tp, limit=limit, backoff=backoff))
    with running_server(["--model-repository", str(repo)], root / "server.log") as running:
        yield running


def _generate(server: ServerProcess, model: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    answer = post(server.url, f"/v2/models/{model}/generate", json.dumps(body).encode(),
                  {"Content-Type": "application/json"}, timeout=60)
    return answer.status, answer.json()


def _greedy(server: ServerProcess, model: str) -> str:
    status, answer = _generate(server, model, GREEDY)
    assert status == 200, answer
    text = answer["text_output"]
    assert isinstance(text, str) and text
    return text


def _log(server: ServerProcess) -> str:
    """The server's whole log (its `logs()` is the tail only)."""
    return server.log_path.read_text(errors="replace")


def _core_pids(server: ServerProcess, model: str) -> list[int]:
    """Every engine core the model started, oldest first (the server logs each one's pid)."""
    pattern = re.compile(rf"model '{model}': engine core started \(pid (\d+)\)")
    return [int(pid) for pid in pattern.findall(_log(server))]


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def _wait_ready(server: ServerProcess, model: str, ready: bool = True, timeout: float = RECOVERY_SECS) -> float:
    """Seconds until the model's ready endpoint says `ready`; fails the test after `timeout`."""
    start = time.monotonic()
    while (server.get(f"/v2/models/{model}/ready") == 200) != ready:
        assert time.monotonic() - start < timeout, f"{model} not {'ready' if ready else 'down'} after {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - start


def _stream_until_killed(server: ServerProcess, model: str, victim: int) -> str:
    """Start a long stream, SIGKILL `victim` once it has begun; the stream's error."""
    connection = http.client.HTTPConnection(server.url, timeout=60)
    connection.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(LONG_STREAM),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the stream has begun
    os.kill(victim, signal.SIGKILL)
    rest = response.read().decode()
    connection.close()
    errors = [json.loads(line.removeprefix("data: "))["error"] for line in rest.splitlines() if '"error"' in line]
    assert errors, f"the stream ended without an error: {rest[-500:]}"
    return str(errors[0])


def _metric(server: ServerProcess, name: str, model: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith(name) and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {model} in /metrics")


def test_a_killed_engine_core_is_restarted(server: ServerProcess) -> None:
    before = _greedy(server, "core")
    (core,) = _core_pids(server, "core")
    assert _metric(server, "nv_llm_engine_restarts", "core") == 0

    error = _stream_until_killed(server, "core", core)
    assert "engine process exited with code -9" in error, error
    # While it restarts, a request is refused at once, saying so (503: a client may retry).
    status, answer = _generate(server, "core", GREEDY)
    assert status == 503, answer
    assert "model 'core' is not ready" in answer["error"] and "restarting" in answer["error"], answer
    assert server.get("/v2/models/core/ready") == 400

    _wait_ready(server, "core")
    assert _greedy(server, "core") == before
    old, new = _core_pids(server, "core")
    assert (old, new != old) == (core, True)
    assert _metric(server, "nv_llm_engine_restarts", "core") == 1
    logs = _log(server)
    assert "model 'core': its engine core died: the engine process exited with code -9" in logs
    assert "model 'core': engine core restarted; the model is ready" in logs
    assert server.get("/v2/models/tp2/ready") == 200  # the other models serve on


def test_a_killed_tensor_parallel_worker_restarts_the_group(server: ServerProcess) -> None:
    before = _greedy(server, "tp2")
    (core,) = _core_pids(server, "tp2")
    (worker,) = _children(core)

    error = _stream_until_killed(server, "tp2", worker)
    assert "tensor-parallel worker 1" in error and "exited with code -9" in error, error
    _wait_ready(server, "tp2", ready=False, timeout=10)  # the core exits...
    _wait_ready(server, "tp2")  # ...and a new one starts, with a new worker
    assert _greedy(server, "tp2") == before
    new_core = _core_pids(server, "tp2")[-1]
    assert new_core != core and len(_children(new_core)) == 1 and _children(new_core) != [worker]


def test_a_worker_lost_while_idle_is_replaced_before_the_next_request(server: ServerProcess) -> None:
    _wait_ready(server, "tp2")
    core = _core_pids(server, "tp2")[-1]
    (worker,) = _children(core)
    os.kill(worker, signal.SIGKILL)
    # No request runs: the idle core notices within a second, exits, and is restarted.
    _wait_ready(server, "tp2", ready=False, timeout=10)
    _wait_ready(server, "tp2")
    assert _core_pids(server, "tp2")[-1] != core
    _greedy(server, "tp2")
    assert re.search(r"model 'tp2': its engine core died: the engine process exited with code 0 "
                     r"\(the engine failed: tensor-parallel worker 1 .* exited with code -9", _log(server))


def test_a_restart_that_keeps_failing_gives_up_with_the_reason(server: ServerProcess, weights: Path) -> None:
    _greedy(server, "fragile")
    (core,) = _core_pids(server, "fragile")
    shutil.rmtree(weights.parent / "fragile-weights")  # the next core cannot load the model
    os.kill(core, signal.SIGKILL)

    given_up = "model 'fragile': its engine core died and 2 restart attempt(s) failed"
    deadline = time.monotonic() + RECOVERY_SECS
    while given_up not in _log(server):
        assert time.monotonic() < deadline, _log(server)[-3000:]
        time.sleep(0.2)
    assert _log(server).count("model 'fragile': restarting its engine core failed") == 2
    assert server.get("/v2/models/fragile/ready") == 400
    status, answer = _generate(server, "fragile", GREEDY)
    assert status == 503, answer
    message = answer["error"]
    assert "2 restart attempt(s) failed" in message and "the engine could not start" in message, message
    # The repository index lists the loaded version UNAVAILABLE with that reason.
    index = post(server.url, "/v2/repository/index", b"{}", {"Content-Type": "application/json"}).json()
    (entry,) = [e for e in index if e["name"] == "fragile"]
    assert entry["state"] == "UNAVAILABLE" and "2 restart attempt(s) failed" in entry["reason"], entry
    (healthy,) = [e for e in index if e["name"] != "fragile"][:1]
    assert healthy["state"] == "READY" and "reason" not in healthy, healthy
    time.sleep(1.0)  # and it stays down: no attempt after the limit
    assert server.get("/v2/models/fragile/ready") == 400
    assert len(_core_pids(server, "fragile")) == 1
