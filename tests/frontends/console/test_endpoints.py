"""The console's endpoints on a real server, without a browser: the page, the live data after
traffic, the config as config.pbtxt, the traced inference, the token, and --console=false."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

pytestmark = pytest.mark.e2e
TOKEN = "console-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("console")
    (folder / "token").write_text(TOKEN + "\n")
    args = ["--model-repository", str(example_repo), "--model-control-mode", "explicit",
            "--load-model", "simple", "--auth-token-file", str(folder / "token")]
    with running_server(args, folder / "naiad.log") as started:
        yield started


def _call(server: ServerProcess, path: str, body: Any = None, headers: dict[str, str] | None = None,
          ) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{server.url}{path}", data=data, headers=headers or {},
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_the_page_needs_no_token_but_the_data_does(server: ServerProcess) -> None:
    status, headers, body = _call(server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'<script type="module" src="/console/app.js">' in body
    status, _, _ = _call(server, "/console/charts.js")
    assert status == 200
    for path in ("/console/api/live", "/console/api/models/simple/config.pbtxt"):
        status, headers, _ = _call(server, path)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    status, _, _ = _call(server, "/console/api/models/simple/infer", {"inputs": []})
    assert status == 401


def test_live_data_after_traffic(server: ServerProcess) -> None:
    status, _, body = _call(server, "/console/api/live", headers=AUTH)  # opens the latency windows
    assert status == 200
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    for _ in range(20):
        client.infer("simple", inputs, headers=dict(AUTH))  # tritonclient adds its own headers to the dict
    client.close()
    status, headers, body = _call(server, "/console/api/live", headers=AUTH)
    assert status == 200 and headers["cache-control"] == "no-store"
    document = json.loads(body)
    assert document["control_mode"] == "explicit"
    models = {(m["name"], m["version"]): m for m in document["models"]}
    assert set(models) == {("simple", "1"), ("simple", "2")}
    latest = models["simple", "2"]  # no version asked: the highest serves
    assert latest["success"] == 20 and latest["inferences"] == 20
    assert sum(count for _, count in latest["batches"]) == latest["executions"] > 0
    latency = latest["latency"]
    assert latency["count"] == 20
    assert 0 < latency["total"][0] <= latency["total"][1]
    assert 0 <= latency["queue"][0] <= latency["total"][1]
    assert 0 < latency["compute"][0] <= latency["total"][1]
    assert models["simple", "1"]["latency"] is None


def test_config_as_pbtxt(server: ServerProcess) -> None:
    status, headers, body = _call(server, "/console/api/models/simple/config.pbtxt", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/plain")
    config = text_format.Parse(body.decode(), model_config_pb2.ModelConfig())
    assert config.name == "simple" and config.max_batch_size == 8
    assert [tensor.name for tensor in config.input] == ["INPUT0", "INPUT1"]
    status, _, body = _call(server, "/console/api/models/nope/config.pbtxt", headers=AUTH)
    assert status in (400, 404) and b"nope" in body


def test_traced_inference(server: ServerProcess) -> None:
    request = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]}
    status, _, body = _call(server, "/console/api/models/simple/versions/1/infer", request, AUTH)
    assert status == 200
    answer = json.loads(body)
    assert answer["error"] is None
    (response,) = answer["responses"]
    outputs = {output["name"]: output["data"] for output in response["outputs"]}
    assert outputs == {"OUTPUT0": [i + 1 for i in range(16)], "OUTPUT1": [i - 1 for i in range(16)]}
    names = [stamp["name"] for stamp in answer["trace"]]
    for name in ("HTTP_RECV_START", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END",
                 "REQUEST_END"):
        assert name in names
    times = [stamp["ns"] for stamp in answer["trace"]]
    assert times == sorted(times)
    # traced whatever the settings say, and the settings are left as they were
    status, _, body = _call(server, "/v2/trace/setting", headers=AUTH)
    assert json.loads(body)["trace_level"] == ["OFF"]


def test_inference_errors(server: ServerProcess) -> None:
    bad = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}]}
    status, _, body = _call(server, "/console/api/models/simple/infer", bad, AUTH)
    assert status == 400 and b"INPUT1" in body
    status, _, _ = _call(server, "/console/api/models/nope/infer", bad, AUTH)
    assert status in (400, 404)
    status, _, _ = _call(server, "/console/api/models/simple/infer", None, AUTH)  # a GET
    assert status == 405


def test_console_off(example_repo: Path, tmp_path: Path) -> None:
    args = ["--model-repository", str(example_repo), "--model-control-mode", "explicit", "--load-model", "simple",
            "--console=false"]
    with running_server(args, tmp_path / "naiad.log") as plain:
        for path in ("/", "/console/app.js", "/console/api/live"):
            assert _call(plain, path)[0] == 404
        assert _call(plain, "/v2/health/ready")[0] == 200
