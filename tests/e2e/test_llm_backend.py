"""The "llm" backend on a real server: the bundled SmolLM2-135M-Instruct GGUF as a decoupled model,
asked through Triton's generate endpoints (one server for the module: the model loads in ~7 s)."""

from __future__ import annotations

import json
import queue
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import ServerProcess
from gguf import GGUFReader

from e2e.llm_server import MODEL, QUESTION, llm_server
from e2e.raw_http import Answer, http, post
from naiad.llm.loading.gguf import smollm2_path
from naiad.llm.loading.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def prompt() -> str:
    """The chat-templated question: text_input is raw, as with Triton's vLLM backend."""
    return Tokenizer.from_gguf(GGUFReader(smollm2_path())).apply_chat_template(QUESTION)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with llm_server(tmp_path_factory.mktemp("llm-repo")) as running:
        yield running


def _generate(server: ServerProcess, endpoint: str, body: dict[str, Any]) -> Answer:
    return post(server.url, f"/v2/models/{MODEL}/{endpoint}", json.dumps(body).encode(),
                {"Content-Type": "application/json"}, timeout=60)


def _events(answer: Answer) -> list[dict[str, Any]]:
    chunks = answer.body.decode().split("\n\n")
    assert chunks[-1] == ""
    assert all(chunk.startswith("data: ") for chunk in chunks[:-1])
    return [json.loads(chunk.removeprefix("data: ")) for chunk in chunks[:-1]]


def test_generate_answers_the_question(server: ServerProcess, prompt: str) -> None:
    answer = _generate(server, "generate", {"text_input": prompt, "max_tokens": 20, "temperature": 0})
    assert answer.status == 200, answer.body
    assert "Paris" in answer.json()["text_output"]
    assert answer.json()["model_name"] == MODEL


def test_stream_sends_the_same_text_piece_by_piece(server: ServerProcess, prompt: str) -> None:
    body = {"text_input": prompt, "max_tokens": 20, "temperature": 0}
    whole = _generate(server, "generate", body).json()["text_output"]
    answer = _generate(server, "generate_stream", {**body, "stream": True})
    assert answer.status == 200, answer.body
    events = _events(answer)
    assert len(events) > 3
    assert "".join(event["text_output"] for event in events) == whole
    # Without `stream`, generate_stream gets the whole text in one event, as /generate does.
    assert [event["text_output"] for event in _events(_generate(server, "generate_stream", body))] == [whole]


def test_sampling_parameters(server: ServerProcess, prompt: str) -> None:
    body = {"text_input": prompt, "max_tokens": 5, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 7,
            "ignore_eos": True}
    first = _generate(server, "generate", body)
    assert first.status == 200, first.body
    # A seed makes the draws reproducible; ignore_eos with 5 tokens gives non-empty text.
    assert first.json()["text_output"] == _generate(server, "generate", body).json()["text_output"]
    assert first.json()["text_output"]
    # Request parameters from the `parameters` object work like top-level keys.
    nested = _generate(server, "generate", {"text_input": prompt, "parameters": {"max_tokens": 20, "temperature": 0}})
    assert "Paris" in nested.json()["text_output"]


@pytest.mark.parametrize(("extra", "message"), [
    ({"temperature": -1}, "temperature must be at least 0"),
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"top_p": 0}, "top_p must be in (0, 1]"),
    ({"max_tokens": 1_000_000}, "exceeds the model's context length"),
    ({"parameters": {"seed": "x"}}, "'seed' must be an integer"),
    ({"stream": 1}, "'stream' must be true or false"),
    ({"best_of": 2}, "unknown parameter 'best_of'"),
    ({"parameters": {"temprature": 0}}, "unknown parameter 'temprature'"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number above 0"),
    ({"logprobs": 21}, "logprobs must be an integer in [0, 20]"),
    ({"prompt_logprobs": 21}, "prompt_logprobs must be an integer in [0, 20]"),
    ({"pooling": "mean"}, "serves no embeddings"),
    ({"guided_regex": "(unclosed"}, "regex cannot be used"),
    ({"guided_json": "[1]"}, "'guided_json' must be a JSON object"),
    ({"stop": ""}, "'stop' must be a non-empty string"),
    ({"min_tokens": 30, "max_tokens": 20}, "min_tokens (30) must not exceed max_tokens (20)"),
])
def test_invalid_parameters_are_400(server: ServerProcess, prompt: str, extra: dict[str, Any], message: str) -> None:
    answer = _generate(server, "generate", {"text_input": prompt, **extra})
    assert answer.status == 400, answer.body
    assert message in answer.json()["error"]


def test_grpc_stream_infer(server: ServerProcess, prompt: str) -> None:
    """ModelStreamInfer: one response per new text piece, then the empty final one."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    whole = _generate(server, "generate", {"text_input": prompt, "max_tokens": 20, "temperature": 0})
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        client.async_stream_infer(MODEL, [text], parameters={"stream": True, "max_tokens": 20, "temperature": 0},
                                  enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            pieces.append(result.as_numpy("text_output")[0].decode())
    finally:
        client.stop_stream()
        client.close()
    assert len(pieces) > 3
    assert "".join(pieces) == whole.json()["text_output"]


def _failures(server: ServerProcess) -> int:
    stats = http(server.url, f"/v2/models/{MODEL}/stats").json()["model_stats"][0]
    return int(stats["inference_stats"]["fail"]["count"])


def test_a_client_that_leaves_aborts_its_sequence(server: ServerProcess, prompt: str) -> None:
    """The request ends (a failure in the statistics) once its client leaves, long before its
    1,000 tokens: told by the tokens the engine generated, not by how long it took."""
    before, generated_before = _failures(server), _llm_metrics(server)["nv_llm_generation_tokens"]
    body = json.dumps({"text_input": prompt, "max_tokens": 1000, "ignore_eos": True, "stream": True}).encode()
    request = (b"POST /v2/models/%s/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
               % (MODEL.encode(), len(body), body))
    host, port = server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while b"data: " not in received:  # generation has begun
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    deadline = time.monotonic() + 60  # a bound on the wait, never reached when things work
    while _failures(server) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _failures(server) == before + 1
    generated = _llm_metrics(server)["nv_llm_generation_tokens"] - generated_before
    assert generated < 1000 / 2, f"{generated:.0f} of the 1,000 tokens were generated for a client that left"


def test_finish_reason_and_token_counts_only_when_asked(server: ServerProcess, prompt: str) -> None:
    body = {"text_input": prompt, "max_tokens": 3, "temperature": 0}
    plain = _generate(server, "generate", body).json()
    assert set(plain) == {"model_name", "model_version", "text_output"}
    asked = _generate(server, "generate", {**body, "return_finish_reason": True, "return_num_tokens": True}).json()
    assert asked["text_output"] == plain["text_output"]
    assert (asked["finish_reason"], asked["completion_tokens"]) == ("length", 3)
    tokenizer = Tokenizer.from_gguf(GGUFReader(smollm2_path()))
    assert asked["prompt_tokens"] == len(tokenizer.encode(prompt))
    whole = _generate(server, "generate", {**body, "max_tokens": 50, "return_finish_reason": True}).json()
    assert whole["finish_reason"] == "stop" and "Paris" in whole["text_output"]


def test_stop_strings_cut_the_text_streamed_or_not(server: ServerProcess, prompt: str) -> None:
    body = {"text_input": prompt, "max_tokens": 20, "temperature": 0}
    whole = _generate(server, "generate", body).json()["text_output"]
    expected = whole[: whole.index("is Par")]
    stopped = _generate(server, "generate", {**body, "stop": '["xyz", "is Par"]', "return_finish_reason": True})
    assert stopped.json()["text_output"] == expected
    assert stopped.json()["finish_reason"] == "stop"
    events = _events(_generate(server, "generate_stream", {**body, "stream": True, "stop": "is Par"}))
    assert "".join(event["text_output"] for event in events) == expected


def test_streamed_logprobs_cover_every_token(server: ServerProcess, prompt: str) -> None:
    body = {"text_input": prompt, "max_tokens": 5, "temperature": 0, "stream": True, "logprobs": 2,
            "return_num_tokens": True, "return_finish_reason": True}
    events = _events(_generate(server, "generate_stream", body))
    entries = [entry for event in events for entry in json.loads(event["logprobs"])]
    assert len(entries) == 5 == events[-1]["completion_tokens"]
    assert events[-1]["finish_reason"] == "length"
    assert all(event["finish_reason"] == "" for event in events[:-1])
    assert "".join(entry["token"] for entry in entries) == "".join(event["text_output"] for event in events)
    for entry in entries:
        assert entry["logprob"] <= 0 and len(entry["top"]) == 2 and entry["top"][0]["id"] == entry["id"]


def _llm_metrics(server: ServerProcess) -> dict[str, float]:
    """The smollm2 series of /metrics by family name (+ bucket bound), instance label dropped."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http(f"127.0.0.1:{server.metrics_port}", "/metrics").body.decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == MODEL:
                key = family.name + (f"@{sample.labels['le']}" if "le" in sample.labels else "")
                key += "_count" if sample.name.endswith("_count") else ""
                values[key] = sample.value
    return values


def test_llm_metrics_follow_a_generation(server: ServerProcess, prompt: str) -> None:
    before = _llm_metrics(server)
    answer = _generate(server, "generate", {"text_input": prompt, "max_tokens": 5, "ignore_eos": True,
                                            "return_num_tokens": True})
    assert answer.status == 200, answer.body
    after = _llm_metrics(server)

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0)

    assert delta("nv_llm_prompt_tokens") == answer.json()["prompt_tokens"]
    assert delta("nv_llm_generation_tokens") == 5
    assert delta("nv_llm_time_to_first_token_seconds_count") == 1
    assert delta("nv_llm_inter_token_latency_seconds_count") >= 1  # tokens arrive a step or more apart
    assert 0 <= after["nv_llm_kv_cache_usage"] <= 1
    assert 0 <= after["nv_llm_prefix_cache_hit_rate"] <= 1
    assert after["nv_llm_preemptions"] == 0
    assert delta("nv_inference_request_success") == 1  # the core's own counters cover the llm model too


def test_statistics_measure_the_hand_over_to_the_engine(server: ServerProcess, prompt: str) -> None:
    """The llm backend's execution is parsing and tokenizing the prompt (compute_input) and
    handing it to the engine core (compute_infer); the tokens stream back afterwards."""
    answer = _generate(server, "generate", {"text_input": prompt, "max_tokens": 4, "temperature": 0})
    assert answer.status == 200, answer.body
    stats = http(server.url, f"/v2/models/{MODEL}/stats").json()["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] >= 1
    for phase in ("queue", "compute_input", "compute_infer"):
        assert stats[phase]["count"] == stats["success"]["count"] and stats[phase]["ns"] > 0, phase
