"""Pipeline parallelism on a real server: one tiny random-weight Llama served with
`pipeline_parallel_size` 1 and 2 (the engine-core process is stage 0; stage 1 is its worker,
gloo on the CPU), asked through Triton's generate endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import ServerProcess, running_server

from e2e.raw_http import post
from e2e.test_llm_tensor_parallel import PROMPT, _tiny_llm

pytestmark = pytest.mark.e2e

CONFIG = """
backend: "llm"
parameters {{ key: "model" value: {{ string_value: "{model}" }} }}
parameters {{ key: "dtype" value: {{ string_value: "fp32" }} }}
parameters {{ key: "kv_cache_memory" value: {{ string_value: "4194304" }} }}
parameters {{ key: "pipeline_parallel_size" value: {{ string_value: "{pp}" }} }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("pp-repo")
    weights = _tiny_llm(root / "weights")  # two layers: one per stage
    repo = root / "models"
    for name, pp in (("pp1", 1), ("pp2", 2)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(model=weights, pp=pp))
    with running_server(["--model-repository", str(repo)], root / "server.log") as running:
        yield running


def _text(server: ServerProcess, model: str, body: dict[str, object]) -> str:
    answer = post(server.url, f"/v2/models/{model}/generate", json.dumps(body).encode(),
                  {"Content-Type": "application/json"}, timeout=60)
    assert answer.status == 200, answer.body
    text: str = answer.json()["text_output"]
    return text


def test_two_stages_answer_as_one_process(server: ServerProcess) -> None:
    body = {"text_input": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    one = _text(server, "pp1", body)
    assert len(one.split()) == 24
    assert _text(server, "pp2", body) == one
