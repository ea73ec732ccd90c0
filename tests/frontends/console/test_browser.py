"""The web console driven in a real headless Chromium against a real server with `make serve`'s
models (the example repository and SmolLM2): the models page, unload / load from the page, an
inference from the Try it form, a streamed chat answer, live charts after traffic, and the token
prompt. Each page's screenshot goes to tests/.screenshots/ (git-ignored)."""

from __future__ import annotations

import json
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from e2e.llm_server import CONFIG as LLM_CONFIG
from e2e.llm_server import MODEL as LLM_MODEL
from e2e.llm_server import wait_model_ready
from PIL import Image, ImageDraw, ImageFont

pytestmark = pytest.mark.e2e
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def served(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[str]]]:
    """What `make serve` serves (its LLM in fp32: bf16 needs CPU features CI may lack), in
    explicit mode with every model loaded; yields the server and the model names."""
    folder = tmp_path_factory.mktemp("console-browser")
    llm_repo = folder / "llm"
    (llm_repo / LLM_MODEL / "1").mkdir(parents=True)
    (llm_repo / LLM_MODEL / "config.pbtxt").write_text(LLM_CONFIG)
    args = ["--model-repository", str(example_repo), "--model-repository", str(llm_repo),
            "--model-control-mode", "explicit", "--load-model", "*"]
    server = ServerProcess(args, folder / "naiad.log")
    try:
        server.wait_live(timeout=300)  # every example model and the LLM load first
        wait_model_ready(server)
        names = sorted(path.name for path in example_repo.iterdir() if (path / "config.pbtxt").exists())
        yield server, [*names, LLM_MODEL]
    finally:
        server.stop()


def _open(page: Any, server: ServerProcess, where: str = "") -> None:
    page.goto(f"http://{server.url}/{where}")
    page.wait_for_selector("#models tbody tr", state="attached", timeout=TIMEOUT_MS)


def _state(page: Any, model: str) -> list[str]:
    return page.locator(f'#models tr[data-model="{model}"] td.state').all_inner_texts()


def test_models_page_lists_every_model(page: Any, served: tuple[ServerProcess, list[str]], screenshot: Any) -> None:
    server, names = served
    _open(page, server)
    listed = page.eval_on_selector_all("#models tbody tr", "rows => rows.map(row => row.dataset.model)")
    assert sorted(set(listed)) == sorted(names)
    assert _state(page, "simple") == ["READY", "READY"]  # both versions serve (version_policy all)
    simple = page.locator('#models tr[data-model="simple"]').first
    assert "onnxruntime" in simple.inner_text() and "max batch 8" in simple.inner_text()
    assert "llm" in page.locator(f'#models tr[data-model="{LLM_MODEL}"]').inner_text()
    page.click('#models tr[data-model="simple"] button[data-action=config]')
    config = page.locator("#config-dialog pre")
    config.filter(has_text='name: "simple"').wait_for(timeout=TIMEOUT_MS)
    assert "max_batch_size: 8" in config.inner_text()
    screenshot(page, "config")
    page.click("#config-dialog button[value=close]")
    screenshot(page, "models")


def test_try_it_sends_an_inference_and_shows_its_trace(page: Any, served: tuple[ServerProcess, list[str]],
                                                       screenshot: Any) -> None:
    server, _ = served
    _open(page, server, "#try/simple")
    page.wait_for_selector('#try-inputs [data-input="INPUT1"]', timeout=TIMEOUT_MS)
    page.select_option("#try-version", "1")
    page.fill('#try-inputs [data-input="INPUT0"] [name=data]', json.dumps(list(range(16))))
    page.fill('#try-inputs [data-input="INPUT1"] [name=data]', json.dumps([3] * 16))
    page.click("#try-form button[type=submit]")
    page.wait_for_selector('#try-outputs [data-output="OUTPUT1"]', timeout=TIMEOUT_MS)
    values = {name: json.loads(page.get_attribute(f'[data-output="{name}"]', "data-values"))
              for name in ("OUTPUT0", "OUTPUT1")}
    assert values == {"OUTPUT0": [i + 3 for i in range(16)], "OUTPUT1": [i - 3 for i in range(16)]}
    phases = page.eval_on_selector_all("#try-trace .phase", "rows => rows.map(row => row.dataset.phase)")
    assert {"request", "queue", "compute infer"} <= set(phases)
    screenshot(page, "try")


def test_try_it_reads_an_image_file(page: Any, served: tuple[ServerProcess, list[str]], tmp_path: Path,
                                    screenshot: Any) -> None:
    """A UINT8 [-1, -1, 3] input takes an image: the OCR pipeline reads the text drawn in it."""
    image = Image.new("RGB", (480, 120), "white")
    ImageDraw.Draw(image).text((24, 30), "HELLO NAIAD", fill="black", font=ImageFont.load_default(size=40))
    image.save(tmp_path / "hello.png")
    server, _ = served
    _open(page, server, "#try/ocr")
    box = '#try-inputs [data-input="IMAGE"]'
    page.set_input_files(f"{box} input[type=file]", str(tmp_path / "hello.png"))
    page.wait_for_function(f"""() => document.querySelector('{box} [name=shape]').value === "120,480,3" """,
                           timeout=TIMEOUT_MS)
    page.click("#try-form button[type=submit]")
    page.wait_for_selector('#try-outputs [data-output="TEXT"]', timeout=60_000)
    assert json.loads(page.get_attribute('[data-output="TEXT"]', "data-values")) == ["HELLO NAIAD"]
    screenshot(page, "try-image")


def test_try_it_reads_an_audio_file(page: Any, served: tuple[ServerProcess, list[str]], tmp_path: Path) -> None:
    """An FP32 [-1, -1] input takes an audio file, decoded to samples at the rate asked for:
    the identity model hands them back."""
    samples = (np.sin(np.arange(800) / 8) * 16000).astype(np.int16)
    with wave.open(str(tmp_path / "tone.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(samples.tobytes())
    server, _ = served
    _open(page, server, "#try/identity")
    box = '#try-inputs [data-input="INPUT0"]'
    page.set_input_files(f"{box} input[type=file]", str(tmp_path / "tone.wav"))
    page.wait_for_function(f"""() => document.querySelector('{box} [name=shape]').value === "1,800" """,
                           timeout=TIMEOUT_MS)
    page.click("#try-form button[type=submit]")
    page.wait_for_selector('#try-outputs [data-output="OUTPUT0"]', timeout=TIMEOUT_MS)
    got = np.array(json.loads(page.get_attribute('[data-output="OUTPUT0"]', "data-values")))
    np.testing.assert_allclose(got, samples / 32768, atol=1e-3)


class _Traffic:
    """Requests to `simple` from a thread, until stopped."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.server.url)
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        deadline = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < deadline:
            client.infer("simple", inputs)
            self.sent += 1
            time.sleep(0.005)
        client.close()

    def __enter__(self) -> _Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _latest(page: Any, chart: str) -> dict[str, Any]:
    text = page.get_attribute(f'[data-chart="{chart}"] canvas', "data-latest")
    return json.loads(text) if text else {}


def test_charts_show_throughput_after_traffic(page: Any, served: tuple[ServerProcess, list[str]],
                                              screenshot: Any) -> None:
    server, _ = served
    _open(page, server, "#metrics")
    page.wait_for_selector('[data-chart="memory"] canvas[data-latest]', timeout=TIMEOUT_MS)
    with _Traffic(server) as traffic:
        page.wait_for_function(
            """() => {
                const canvas = document.querySelector('[data-chart="throughput"] canvas');
                return canvas && Number(canvas.dataset.max) > 0;
            }""", timeout=TIMEOUT_MS)
        page.select_option("#metrics-model", "simple/2")  # no version asked: the highest serves
        page.wait_for_function(
            """() => {
                const latest = document.querySelector('[data-chart="latency"] canvas').dataset.latest;
                return latest && JSON.parse(latest)["total p99"] > 0;
            }""", timeout=TIMEOUT_MS)
        time.sleep(2)  # a few more points on the charts for the screenshot
    assert traffic.sent > 0
    assert float(page.get_attribute('[data-chart="throughput"] canvas', "data-max")) > 0
    latency = _latest(page, "latency")
    assert 0 < latency["total p50"] <= latency["total p99"]
    batches = _latest(page, "batches")
    assert sum(batches.values()) > 0
    assert _latest(page, "memory")["naiad RSS"] > 0
    screenshot(page, "metrics")


def test_chat_streams_an_answer(page: Any, served: tuple[ServerProcess, list[str]], screenshot: Any) -> None:
    server, _ = served
    _open(page, server, f"#chat/{LLM_MODEL}")
    page.wait_for_selector(f'#chat-model option[value="{LLM_MODEL}"]', state="attached", timeout=TIMEOUT_MS)
    page.select_option("#chat-model", LLM_MODEL)
    page.click("#chat-form summary")
    page.fill("#chat-form [name=max_tokens]", "24")
    page.fill("#chat-form [name=temperature]", "0")
    page.fill("#chat-form [name=message]", "What is the capital of France?")
    page.click("#chat-form button[type=submit]")
    answer = page.locator('#chat-log .message[data-role="assistant"]')
    answer.wait_for(timeout=TIMEOUT_MS)
    page.wait_for_function(
        """() => document.querySelector('#chat-log .message[data-role="assistant"]').dataset.state !== "streaming" """,
        timeout=120_000)
    assert answer.get_attribute("data-state") == "done", page.inner_text("#status")
    assert int(answer.get_attribute("data-chunks")) > 1  # streamed: more than one piece
    text = answer.locator(".content").inner_text()
    assert "Paris" in text, text
    assert "tokens" in answer.locator(".stats").inner_text()
    screenshot(page, "chat")
    # The live data was polled all along: the LLM's charts show the answer's tokens and latency.
    page.click('header a[href="#metrics"]')
    page.select_option("#metrics-model", f"{LLM_MODEL}/1")
    for chart in ("tokens", "ttft", "itl"):  # drawn for the chosen model on the next frame
        page.wait_for_function(
            """(chart) => {
                const canvas = document.querySelector(`[data-chart="${chart}"] canvas`);
                return canvas && Number(canvas.dataset.max) > 0;
            }""", arg=chart, timeout=TIMEOUT_MS)
    screenshot(page, "metrics-llm")


def test_unload_then_load_from_the_page(page: Any, served: tuple[ServerProcess, list[str]]) -> None:
    server, _ = served
    _open(page, server)
    row = '#models tr[data-model="simple"]'
    page.click(f"{row} button[data-action=unload]")
    page.wait_for_function(
        f"""() => [...document.querySelectorAll('{row} td.state')].every(cell => cell.innerText === "UNAVAILABLE")""",
        timeout=TIMEOUT_MS)
    assert server.get("/v2/models/simple/ready") == 400
    assert page.is_disabled(f"{row} button[data-action=unload]")
    page.click(f"{row} button[data-action=load]")
    page.wait_for_function(
        f"""() => [...document.querySelectorAll('{row} td.state')]
                     .map(cell => cell.innerText).join() === "READY,READY" """,
        timeout=TIMEOUT_MS)
    assert server.get("/v2/models/simple/ready") == 200


def test_token_and_restricted_api_prompts(page: Any, example_repo: Path, tmp_path: Path, screenshot: Any) -> None:
    """With --auth-token-file the page asks for the token, and for a restricted group's header
    (--http-restricted-api) when a call needs it; then it shows the models."""
    (tmp_path / "token").write_text("s3cret\n")
    args = ["--model-repository", str(example_repo), "--model-control-mode", "explicit", "--load-model", "simple",
            "--auth-token-file", str(tmp_path / "token"), "--http-restricted-api", "model-repository:admin-key=k"]
    with running_server(args, tmp_path / "naiad.log") as server:
        page.goto(f"http://{server.url}/")
        dialog = page.locator("#credentials")
        dialog.wait_for(state="visible", timeout=TIMEOUT_MS)
        assert "token" in dialog.inner_text()
        screenshot(page, "token")
        page.fill("#credentials input", "wrong")
        page.click("#credentials button[value=ok]")
        dialog.wait_for(state="visible", timeout=TIMEOUT_MS)  # asked again
        page.fill("#credentials input", "s3cret")
        page.click("#credentials button[value=ok]")
        page.locator("#credentials", has_text="admin-key").wait_for(state="visible", timeout=TIMEOUT_MS)
        page.fill("#credentials input", "k")
        page.click("#credentials button[value=ok]")
        page.wait_for_selector('#models tr[data-model="simple"]', timeout=TIMEOUT_MS)
        assert _state(page, "simple") == ["READY", "READY"]
