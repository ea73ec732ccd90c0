"""The llm backend's engine core runs in a process of its own: killing it fails the open request
with an error (the server goes on) and the model reports not ready; stopping the server ends it;
an answer larger than the server's reads of the core's channel arrives whole."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from e2e.llm_server import CONFIG, MODEL, QUESTION, llm_server
from e2e.raw_http import post
from naiad.channel import READ_SIZE

pytestmark = pytest.mark.e2e


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children.extend(int(child) for child in text)
    return children


def _engine_cores(server_pid: int) -> list[int]:
    """The server's children running multiprocessing's spawn entry point (the engine core)."""
    cores = []
    for child in _children(server_pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except FileNotFoundError:
            continue
        if b"multiprocessing.spawn" in command and b"spawn_main" in command:
            cores.append(child)
    return cores


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_killed_engine_core_fails_its_request_and_the_model_goes_not_ready(tmp_path: Path) -> None:
    with llm_server(tmp_path / "repo") as server:
        (core,) = _engine_cores(server.process.pid)
        # A long generation; the core is killed while it runs.
        body = {"text_input": "Count from one to a thousand:", "max_tokens": 400, "ignore_eos": True,
                "temperature": 0}
        killer_started = time.monotonic()
        def kill_soon() -> None:
            time.sleep(1.0)
            os.kill(core, signal.SIGKILL)

        threading.Thread(target=kill_soon, daemon=True).start()
        answer = post(server.url, f"/v2/models/{MODEL}/generate", json.dumps(body).encode(),
                      {"Content-Type": "application/json"}, timeout=120)
        assert answer.status == 500, answer.body
        assert "engine" in answer.error()
        assert time.monotonic() - killer_started < 60
        assert server.get(f"/v2/models/{MODEL}/ready") != 200
        assert server.get("/v2/health/live") == 200  # the server itself goes on
    assert server.process.returncode is not None


def test_stopping_the_server_ends_its_engine_core(tmp_path: Path) -> None:
    with llm_server(tmp_path / "repo") as server:
        cores = _engine_cores(server.process.pid)
        assert len(cores) == 1
        answer = post(server.url, f"/v2/models/{MODEL}/generate",
                      json.dumps({"text_input": "Hi", "max_tokens": 2}).encode(),
                      {"Content-Type": "application/json"}, timeout=60)
        assert answer.status == 200, answer.body
    deadline = time.monotonic() + 30
    while _alive(cores[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(cores[0])


def test_a_long_prompts_logprobs_cross_from_the_core_whole_beside_a_streaming_bystander(tmp_path: Path) -> None:
    """lm-eval's scoring request on a 2,000-token prompt with 20 alternatives a token: the core's
    answer is one message of ~0.5 MB, twice the server's reads of the channel (READ_SIZE). The
    server's reader must make room for all of it: a reader that asked for a few bytes of room met
    a full buffer, read nothing, took that for the end of the stream and declared the core dead
    (the request failed with "the engine process exited"). A chat streaming meanwhile finishes,
    and the core is the same process afterwards."""
    prompt_tokens, alternatives = 2000, 20
    # A uint16 token id and a float64 logprob in msgpack's smallest forms: 3 + 9 bytes each.
    assert (prompt_tokens - 1) * alternatives * 12 > 1.5 * READ_SIZE
    config = CONFIG.replace('"67108864"', f'"{256 << 20}"')  # the prompt's KV: ~92 MB in fp32
    assert config != CONFIG
    with llm_server(tmp_path / "repo", config=config) as server:
        (core,) = _engine_cores(server.process.pid)
        client = openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", timeout=120, max_retries=0)
        bystander: dict[str, object] = {}
        first_chunk = threading.Event()

        def chat() -> None:
            pieces: list[str] = []
            finish = None
            messages: Any = QUESTION
            try:
                chunks: Any = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,
                                                             temperature=0, stream=True)
                for chunk in chunks:
                    first_chunk.set()
                    if chunk.choices:
                        pieces.append(chunk.choices[0].delta.content or "")
                        finish = chunk.choices[0].finish_reason or finish
            except Exception as error:  # reported below, in the test's thread
                bystander["error"] = error
            first_chunk.set()
            bystander.update(text="".join(pieces), finish=finish)

        streaming = threading.Thread(target=chat)
        streaming.start()
        assert first_chunk.wait(60)
        ids = [100 + (i * 7919) % 40000 for i in range(prompt_tokens)]
        answer = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=alternatives,
                                           max_tokens=1, temperature=0)
        streaming.join(120)
        logprobs = answer.choices[0].logprobs
        assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
        assert logprobs.top_logprobs is not None
        assert len(logprobs.tokens) == prompt_tokens + 1  # every prompt token, then the generated one
        assert logprobs.token_logprobs[0] is None and all(v <= 0 for v in logprobs.token_logprobs[1:])
        assert all(top for top in logprobs.top_logprobs[1:])
        assert "error" not in bystander, bystander
        assert bystander["text"] and bystander["finish"] in ("stop", "length")
        assert _engine_cores(server.process.pid) == [core]  # not restarted after a reported death
        again = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3,
                                          temperature=0)
        assert again.choices[0].text
