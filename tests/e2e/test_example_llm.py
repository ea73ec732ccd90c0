"""`make serve`'s LLM repository (examples/llm): SmolLM2 as a chat model behind the OpenAI API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from conftest import EXAMPLES, ServerProcess, running_server

from e2e.llm_server import MODEL, QUESTION, wait_model_ready


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("example-llm") / "naiad.log"
    with running_server(["--model-repository", str(EXAMPLES / "llm")], log) as server:
        wait_model_ready(server)
        yield server


def test_the_example_config_chats_through_the_openai_client(server: ServerProcess) -> None:
    assert (EXAMPLES / "llm" / MODEL / "config.pbtxt").is_file()
    client = openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused")
    assert [model.id for model in client.models.list().data] == [MODEL]
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30)
    assert "Paris" in answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop"


def test_the_makefile_serves_the_example_llm_repository() -> None:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    serve = next(line for line in makefile.splitlines() if "naiad serve" in line)
    assert "$(LLM_REPO)" in serve and "LLM_REPO := examples/llm" in makefile
