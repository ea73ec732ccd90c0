"""Model repository extension over gRPC (SPEC §1.9, §2 explicit mode): index, load / unload, config
and `file:` overrides as bytes_param, errors with their status codes. One explicit-mode server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from conftest import ServerProcess, running_server
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from e2e.lifecycle_util import broken, tagged, tagged_config
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

MODELS = ("startup", "second", "broken", "override", "never_loaded")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc_explicit")
    for tag, name in enumerate(MODELS):
        write_model(root, name, tagged_config(), {1: broken if name == "broken" else tagged(tag)})
    args = ["--model-repository", str(root), "--model-control-mode=explicit", "--load-model=startup"]
    with running_server(args, root.parent / "naiad.log") as process:
        yield process


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as opened:
        yield opened


def _infer(client: Any, model: str) -> tuple[str, int]:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "INT32").set_data_from_numpy(np.zeros((1, 4), np.int32))
    result = client.infer(model, [tensor])
    return result.get_response().model_version, int(result.as_numpy("OUTPUT0")[0, 0])


def _error(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value.status()), caught.value.message()


def _index(client: Any) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for entry in client.get_model_repository_index(as_json=True).get("models", []):
        grouped.setdefault(entry["name"], []).append(entry)
    return grouped


def _config_json(max_batch_size: int = 8) -> str:
    return json.dumps({
        "backend": "onnxruntime", "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [4]}],
    })


def test_index_and_ready_filter(client: Any, server: ServerProcess) -> None:
    index = _index(client)
    assert set(index) == set(MODELS)
    assert index["startup"] == [{"name": "startup", "version": "1", "state": "READY"}]
    assert index["never_loaded"] == [{"name": "never_loaded"}]
    with grpc.insecure_channel(server.grpc_url) as channel:
        ready = service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(
            service_pb2.RepositoryIndexRequest(repository_name="any", ready=True), timeout=10)
    assert {m.name for m in ready.models} == {"startup"}


def test_load_infer_unload(client: Any) -> None:
    client.load_model("second")
    assert client.is_model_ready("second") and _infer(client, "second") == ("1", MODELS.index("second"))
    client.unload_model("second", unload_dependents=True)
    assert not client.is_model_ready("second")
    assert _index(client)["second"] == [{"name": "second", "version": "1", "state": "UNAVAILABLE",
                                         "reason": "unloaded"}]
    assert _error(client.get_model_metadata, "second") == (
        "StatusCode.NOT_FOUND", "Request for unknown model: 'second' is not found")
    client.unload_model("ghost")  # unloading what is not loaded is fine


def test_load_errors(client: Any) -> None:
    assert _error(client.load_model, "nope") == (
        "StatusCode.INVALID_ARGUMENT", "failed to load 'nope', failed to poll from model repository")
    status, message = _error(client.load_model, "broken")
    assert status == "StatusCode.INVALID_ARGUMENT" and message.startswith("load failed for model 'broken': ")
    assert _error(client.load_model, "..") == (
        "StatusCode.INVALID_ARGUMENT", "model name must not contain path traversal characters")
    assert client.is_model_ready("startup")


def test_config_override_and_file_overrides(client: Any, tmp_path: Path) -> None:
    client.load_model("override", config=_config_json(max_batch_size=2))
    assert client.get_model_config("override").config.max_batch_size == 2
    status, message = _error(client.load_model, "override", config="{not json")
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert client.get_model_config("override").config.max_batch_size == 2  # the old one keeps serving
    model = tmp_path / "model.onnx"
    tagged(33)(model)
    client.load_model("from_files", config=_config_json(), files={"file:3/model.onnx": model.read_bytes()})
    assert client.get_model_metadata("from_files").versions == ["3"]
    assert _infer(client, "from_files") == ("3", 33)
    client.unload_model("from_files")
    status, message = _error(client.load_model, "files_only", files={"file:1/model.onnx": model.read_bytes()})
    assert status == "StatusCode.INVALID_ARGUMENT" and "config" in message


def test_wrongly_typed_load_parameters(server: ServerProcess) -> None:
    request = service_pb2.RepositoryModelLoadRequest(model_name="override")
    request.parameters["config"].bool_param = True
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request, timeout=10)
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "'config' parameter must be a JSON string (string_param)")


def test_aio_load_and_unload(server: ServerProcess) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            await client.load_model("second")
            assert await client.is_model_ready("second")
            await client.unload_model("second")
            assert not await client.is_model_ready("second")
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))
