"""Model repository extension (SPEC §1.9, §2 explicit mode): index, load / unload, config and
file overrides, invalid names. One explicit-mode server serves the module; each test uses its
own model names so the tests stay independent."""

from __future__ import annotations

import base64
import http.client as httpconn
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from e2e.lifecycle_util import broken, index_by_name, replace_file, tagged, tagged_config
from e2e.raw_http import http, post_json
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

MODELS = ("startup", "second", "broken", "override", "reload_me", "unload_twice", "never_loaded")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explicit")
    for tag, name in enumerate(MODELS):
        if name == "broken":
            write_model(root, name, tagged_config(), {1: broken})
        else:
            write_model(root, name, tagged_config(), {1: tagged(tag)})
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(repo), "--model-control-mode=explicit", "--load-model=startup"]
    with running_server(args, tmp_path_factory.mktemp("explicit-log") / "naiad.log") as process:
        yield process


@pytest.fixture
def client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def _infer(client: Any, model: str, version: str = "") -> tuple[str, int]:
    """(model_version, tag) of the answer to one request for a `tagged` model."""
    tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.int32))
    result = client.infer(model, [tensor], model_version=version)
    return result.get_response()["model_version"], int(result.as_numpy("OUTPUT0")[0, 0])


def _error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def _config_json(max_batch_size: int = 8, extra: dict[str, Any] | None = None) -> str:
    config = {
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [4]}],
    }
    return json.dumps({**config, **(extra or {})})


def _onnx_bytes(tmp_path: Path, tag: int) -> bytes:
    path = tmp_path / f"tagged-{tag}.onnx"
    tagged(tag)(path)
    return path.read_bytes()


# ------------------------------------------------------------------------------- index


def test_startup_loads_only_the_named_model(server: ServerProcess, client: Any) -> None:
    index = index_by_name(server.url)
    assert index["startup"] == [{"name": "startup", "version": "1", "state": "READY"}]
    assert index["never_loaded"] == [{"name": "never_loaded"}]  # never loaded: name only (SPEC §0)
    assert set(index) == set(MODELS)
    assert client.is_model_ready("startup")
    assert not client.is_model_ready("never_loaded")
    assert _infer(client, "startup") == ("1", 0)


def test_index_ready_filter(server: ServerProcess, client: Any) -> None:
    ready = post_json(server.url, "/v2/repository/index", {"ready": True}).json()
    assert ready and all(e["state"] == "READY" for e in ready)
    assert "startup" in {e["name"] for e in ready}
    assert "never_loaded" not in {e["name"] for e in ready}
    assert {e["name"] for e in client.get_model_repository_index()} == set(MODELS)


def test_index_with_repository_name_in_path(server: ServerProcess) -> None:
    answer = post_json(server.url, "/v2/repository/anyrepo/index", {})
    assert answer.status == 200 and {e["name"] for e in answer.json()} == set(MODELS)


# ------------------------------------------------------------------------- load/unload


def test_load_then_unload(server: ServerProcess, client: Any) -> None:
    client.load_model("second")
    assert client.is_model_ready("second")
    assert _infer(client, "second") == ("1", MODELS.index("second"))
    assert index_by_name(server.url)["second"] == [{"name": "second", "version": "1", "state": "READY"}]

    client.unload_model("second")
    assert not client.is_model_ready("second")
    assert index_by_name(server.url)["second"] == [
        {"name": "second", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    error = _error(client.get_model_metadata, "second")
    assert (error.status(), error.message()) == ("404", "Request for unknown model: 'second' is not found")

    client.load_model("second")  # loads again after an unload
    assert _infer(client, "second") == ("1", MODELS.index("second"))


def test_load_answers_200_with_empty_body(server: ServerProcess) -> None:
    answer = post_json(server.url, "/v2/repository/models/startup/load", {})
    assert (answer.status, answer.body) == (200, b"")


def test_unload_of_a_model_not_loaded_is_200(server: ServerProcess, client: Any) -> None:
    client.unload_model("never_loaded")
    client.unload_model("ghost_model_that_does_not_exist")
    answer = post_json(server.url, "/v2/repository/models/never_loaded/unload", {})
    assert answer.status == 200
    client.load_model("unload_twice")
    client.unload_model("unload_twice")
    client.unload_model("unload_twice")
    assert not client.is_model_ready("unload_twice")


def test_unload_with_unload_dependents(server: ServerProcess, client: Any) -> None:
    client.load_model("unload_twice")
    client.unload_model("unload_twice", unload_dependents=True)
    assert not client.is_model_ready("unload_twice")


def test_load_of_unknown_model_is_400(client: Any) -> None:
    error = _error(client.load_model, "nope")
    assert (error.status(), error.message()) == ("400", "failed to load 'nope', failed to poll from model repository")


def test_load_of_broken_model_is_400_and_index_shows_why(server: ServerProcess, client: Any) -> None:
    error = _error(client.load_model, "broken")
    assert error.status() == "400"
    assert error.message().startswith("load failed for model 'broken': ")
    (entry,) = index_by_name(server.url)["broken"]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"]
    assert not client.is_model_ready("broken")
    assert client.is_model_ready("startup")  # the others keep serving


def test_reload_without_changes_keeps_the_loaded_model(client: Any) -> None:
    client.load_model("reload_me")
    _infer(client, "reload_me")
    (before,) = client.get_inference_statistics("reload_me")["model_stats"]
    client.load_model("reload_me")
    (after,) = client.get_inference_statistics("reload_me")["model_stats"]
    assert after["inference_count"] == before["inference_count"] >= 1  # not reloaded: stats kept


def test_reload_picks_up_a_changed_model_file(repo: Path, client: Any) -> None:
    client.load_model("reload_me")
    replace_file(repo / "reload_me" / "1" / "model.onnx", tagged(77))
    client.load_model("reload_me")
    assert _infer(client, "reload_me") == ("1", 77)


# --------------------------------------------------------------------------- overrides


def test_load_with_config_override_is_remembered(client: Any) -> None:
    client.load_model("override", config=_config_json(max_batch_size=2))
    assert client.get_model_config("override")["max_batch_size"] == 2
    assert client.get_model_metadata("override")["inputs"][0]["shape"] == [-1, 4]
    client.load_model("override")  # a plain load keeps the override (SPEC §2)
    assert client.get_model_config("override")["max_batch_size"] == 2
    client.load_model("override", config=_config_json(max_batch_size=0))
    assert client.get_model_config("override")["max_batch_size"] == 0
    assert client.get_model_metadata("override")["inputs"][0]["shape"] == [4]


def test_load_with_a_bad_config_override_keeps_the_old_model(client: Any) -> None:
    client.load_model("override", config=_config_json(max_batch_size=4))
    error = _error(client.load_model, "override", config=_config_json(max_batch_size=-1))
    assert error.status() == "400"
    assert error.message().startswith("load failed for model 'override': ")
    assert client.get_model_config("override")["max_batch_size"] == 4
    assert client.is_model_ready("override")
    error = _error(client.load_model, "override", config="{not json")
    assert error.status() == "400"


@pytest.mark.parametrize("tensor", [
    {"name": "WRONG", "data_type": "TYPE_INT32", "dims": [4]},
    {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
])
def test_config_that_does_not_match_the_model_file_fails_to_load(client: Any, tensor: dict[str, Any]) -> None:
    """Triton's onnxruntime backend checks config inputs against the model (unexpected inference
    input / unexpected datatype) and the load fails; the old version keeps serving."""
    client.load_model("override", config=_config_json(max_batch_size=4))
    error = _error(client.load_model, "override", config=_config_json(extra={"input": [tensor]}))
    assert error.status() == "400"
    assert client.get_model_config("override")["input"][0]["name"] == "INPUT0"
    assert client.get_model_config("override")["input"][0]["data_type"] == "TYPE_INT32"


def test_load_with_file_overrides_for_a_new_model(tmp_path: Path, server: ServerProcess, client: Any) -> None:
    files = {"file:3/model.onnx": _onnx_bytes(tmp_path, 33)}
    client.load_model("from_files", config=_config_json(), files=files)
    assert client.is_model_ready("from_files", "3")
    assert client.get_model_metadata("from_files")["versions"] == ["3"]
    assert _infer(client, "from_files") == ("3", 33)
    assert index_by_name(server.url)["from_files"] == [
        {"name": "from_files", "version": "3", "state": "READY"}]
    client.unload_model("from_files")
    assert not client.is_model_ready("from_files")


def test_file_overrides_replace_the_repository_directory(tmp_path: Path, client: Any) -> None:
    client.load_model("startup")
    files = {"file:5/model.onnx": _onnx_bytes(tmp_path, 55)}
    client.load_model("startup", config=_config_json(), files=files)
    assert client.get_model_metadata("startup")["versions"] == ["5"]
    assert _infer(client, "startup") == ("5", 55)


def test_file_overrides_without_config_are_400(tmp_path: Path, server: ServerProcess, client: Any) -> None:
    error = _error(client.load_model, "files_only", files={"file:1/model.onnx": _onnx_bytes(tmp_path, 1)})
    assert error.status() == "400"
    assert "config" in error.message()
    assert not client.is_model_ready("files_only")
    body = {"parameters": {"file:1/model.onnx": base64.b64encode(b"x").decode()}}
    assert post_json(server.url, "/v2/repository/models/files_only/load", body).status == 400


def test_file_override_with_bad_base64_is_400(server: ServerProcess) -> None:
    body = {"parameters": {"config": _config_json(), "file:1/model.onnx": "***not base64***"}}
    assert post_json(server.url, "/v2/repository/models/bad_base64/load", body).status == 400


# ------------------------------------------------------------------------------- names


def _raw_post(url: str, path: str) -> tuple[int, dict[str, Any]]:
    """http.client sends the path as given (urllib and tritonclient may normalise `..`)."""
    host, port = url.split(":")
    connection = httpconn.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.mark.parametrize("action", ["load", "unload"])
@pytest.mark.parametrize("name", ["..", "%2E%2E"])
def test_path_traversal_names_are_rejected(server: ServerProcess, name: str, action: str) -> None:
    status, body = _raw_post(server.url, f"/v2/repository/models/{name}/{action}")
    assert (status, body) == (400, {"error": "model name must not contain path traversal characters"})


def test_empty_model_name_does_not_route(server: ServerProcess) -> None:
    status, body = _raw_post(server.url, "/v2/repository/models//load")
    assert (status, body) == (404, {"error": "Not Found"})


# ---------------------------------------------------------------------- control modes


def test_load_and_unload_in_none_mode_are_503(example_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(example_server.url)
    for call in (client.load_model, client.unload_model):
        error = _error(call, "simple")
        assert (error.status(), error.message()) == (
            "503", "explicit model load / unload is not allowed if polling is enabled")
    assert client.is_model_ready("simple")
    answer = http(example_server.url, "/v2/repository/models/new_one/load", "POST", b"{}")
    assert answer.status == 503

