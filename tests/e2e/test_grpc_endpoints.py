"""gRPC health, metadata, config, statistics, logging, trace and CUDA shared memory on the shared
inference server, with tritonclient.grpc (sync and aio) and grpc.health.v1 (SPEC §1.2, §1.8,
§1.10-§1.13, §6)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from e2e.infer_models import DATATYPES, identity_name
from e2e.infer_models import infer_server as infer_server  # the fixture
from e2e.triton_observed import SERVER_EXTENSIONS

pytestmark = pytest.mark.e2e

LOG_DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "default"}


@pytest.fixture
def client(infer_server: Any) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(infer_server.grpc_url)


def _error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def _status(error: InferenceServerException) -> tuple[str, str]:
    return str(error.status()), error.message()


# ---------------------------------------------------------------------------------- health


def test_live_ready_and_the_standard_health_check(infer_server: Any, client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    with grpc.insecure_channel(infer_server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            next(iter(health.Watch(health_pb2.HealthCheckRequest(), timeout=5)))
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_model_ready_with_versions(client: Any) -> None:
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert client.is_model_ready("simple", "2")
    assert not client.is_model_ready("simple", "3") and not client.is_model_ready("nope")
    assert _status(_error(client.is_model_ready, "simple", "one")) == (
        "StatusCode.INVALID_ARGUMENT",
        "failed to get model version from specified version string 'one' (details: stol), version should be an "
        "integral value > 0")


# -------------------------------------------------------------------------------- metadata


def test_server_metadata(client: Any) -> None:
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "triton" and metadata["version"]
    assert metadata["extensions"] == SERVER_EXTENSIONS  # Triton's list, in its order
    assert list(client.get_server_metadata().extensions) == SERVER_EXTENSIONS


def test_model_metadata(client: Any) -> None:
    assert client.get_model_metadata("simple", as_json=True) == {
        "name": "simple", "versions": ["1", "2"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": n, "datatype": "INT32", "shape": ["-1", "16"]} for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": n, "datatype": "INT32", "shape": ["-1", "16"]} for n in ("OUTPUT0", "OUTPUT1")]}
    assert client.get_model_metadata("simple", "1").versions == ["1"]
    metadata = client.get_model_metadata("idnb_bf16")
    assert (metadata.inputs[0].datatype, list(metadata.inputs[0].shape)) == ("BF16", [-1])
    assert _status(_error(client.get_model_metadata, "nope")) == (
        "StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found")
    assert _status(_error(client.get_model_metadata, "simple", "9")) == (
        "StatusCode.NOT_FOUND", "Request for unknown model: 'simple' version 9 is not found")


def test_model_config_is_the_model_config_message(client: Any) -> None:
    config = client.get_model_config("simple").config
    assert (config.name, config.platform, config.backend, config.max_batch_size) == (
        "simple", "onnxruntime_onnx", "onnxruntime", 8)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", 8, [16]), ("INPUT1", 8, [16])]  # TYPE_INT32
    assert config.HasField("version_policy") and config.version_policy.HasField("all")
    decoupled = client.get_model_config("repeat_int32", as_json=True)["config"]
    assert decoupled["model_transaction_policy"] == {"decoupled": True}
    assert _status(_error(client.get_model_config, "simple", "7")) == (
        "StatusCode.NOT_FOUND", "Request for unknown model: 'simple' version 7 is not found")


# ------------------------------------------------------------------------------ statistics


def _infer_identity(client: Any, model: str, batch: int) -> None:
    tensor = grpcclient.InferInput("INPUT0", [batch, 2], "INT16")
    tensor.set_data_from_numpy(np.ones((batch, 2), np.int16))
    client.infer(model, [tensor])


def test_statistics_count_and_leave_zeros_out(client: Any) -> None:
    model = identity_name("INT16")
    (before,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
    for batch in (2, 1, 2):
        _infer_identity(client, model, batch)
    (after,) = client.get_inference_statistics(model, "1", as_json=True)["model_stats"]
    assert (after["name"], after["version"]) == (model, "1")
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 5
    success = after["inference_stats"]["success"]
    assert int(success["count"]) - int(before["inference_stats"]["success"].get("count", 0)) == 3
    assert "count" not in after["inference_stats"]["cache_hit"]  # protobuf JSON omits zeros (SPEC §6)
    batches = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert {1, 2} <= batches
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in everything} >= {identity_name(dt) for dt in DATATYPES} | {"simple", "repeat_int32"}


def test_statistics_errors(client: Any) -> None:
    assert _status(_error(client.get_inference_statistics, "nope")) == (
        "StatusCode.INVALID_ARGUMENT", "requested model 'nope' is not available")
    assert _status(_error(client.get_inference_statistics, "simple", "9")) == (
        "StatusCode.INVALID_ARGUMENT", "requested model version is not available for model 'simple'")


def test_repository_index_lists_every_model(client: Any) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "simple", "version": "2", "state": "READY"} in index
    assert {m["name"] for m in index} >= {identity_name(dt) for dt in DATATYPES}
    assert _status(_error(client.load_model, "simple")) == (
        "StatusCode.UNAVAILABLE", "explicit model load / unload is not allowed if polling is enabled")
    assert _status(_error(client.unload_model, "simple")) == (
        "StatusCode.UNAVAILABLE", "explicit model load / unload is not allowed if polling is enabled")


# --------------------------------------------------------------------------------- logging


def _raw_log_update(url: str, key: str, value: Any) -> grpc.RpcError:
    """A LogSettings update with the value typed as given (tritonclient types it by key)."""
    request = service_pb2.LogSettingsRequest()
    field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
    setattr(request.settings[key], field, value)
    with grpc.insecure_channel(url) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(request, timeout=5)
    return caught.value


def test_logging_get_update_and_refuse_bad_values(infer_server: Any, client: Any) -> None:
    assert client.get_log_settings(as_json=True)["settings"] == {
        "log_file": {"string_param": ""}, "log_info": {"bool_param": True}, "log_warning": {"bool_param": True},
        "log_error": {"bool_param": True}, "log_verbose_level": {"uint32_param": 0},
        "log_format": {"string_param": "default"}}
    try:
        updated = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601", "log_info": False},
                                             as_json=True)["settings"]
        assert updated["log_verbose_level"] == {"uint32_param": 1} and updated["log_info"] == {"bool_param": False}
        for key, value, message in (("log_info", "yes", "expect boolean for 'log_info'"),
                                    ("log_warning", 1, "expect boolean for 'log_warning'"),
                                    ("log_verbose_level", True, "expect positive integer for 'log_verbose_level'"),
                                    ("log_format", "json",
                                     "invalid argument for log_format, got: json; expected: 'default' or 'ISO8601'"),
                                    ("log_file", "/tmp/elsewhere.log",
                                     "log file location can not be updated through network protocol"),
                                    ("log_colour", True, "Logging setting 'log_colour' is not supported")):
            error = _raw_log_update(infer_server.grpc_url, key, value)
            assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
        assert client.get_log_settings(as_json=True)["settings"] == updated  # refused updates change nothing
    finally:
        client.update_log_settings({k: v for k, v in LOG_DEFAULTS.items() if k != "log_file"})
    assert client.get_log_settings(as_json=True)["settings"]["log_info"] == {"bool_param": True}


# ----------------------------------------------------------------- trace and CUDA memory


def test_trace_settings_default_to_off(client: Any) -> None:
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"]
    assert settings["trace_rate"]["value"] == ["1000"] and settings["trace_mode"]["value"] == ["triton"]
    assert _status(_error(client.get_trace_settings, "does-not-exist")) == (
        "StatusCode.INVALID_ARGUMENT", "Request for unknown model : does-not-exist")


def test_cuda_shared_memory_without_gpus(client: Any) -> None:
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    assert _status(_error(client.get_cuda_shared_memory_status, "r")) == (
        "StatusCode.NOT_FOUND", "Unable to find cuda shared memory region: 'r'")
    assert _status(_error(client.register_cuda_shared_memory, "r", base64.b64encode(b"handle"), 0, 64)) == (
        "StatusCode.UNIMPLEMENTED", "failed to register CUDA shared memory region: 'r', GPUs not supported")
    client.unregister_cuda_shared_memory("r")
    client.unregister_cuda_shared_memory()


# ------------------------------------------------------------------------------------- aio


def test_aio_client_every_read_rpc(infer_server: Any) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(infer_server.grpc_url)
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready("simple", "2")
            assert (await client.get_server_metadata()).name == "triton"
            assert (await client.get_model_metadata("simple")).versions == ["1", "2"]
            assert (await client.get_model_config("simple")).config.max_batch_size == 8
            assert (await client.get_inference_statistics("simple")).model_stats[0].name == "simple"
            assert any(m.name == "simple" for m in (await client.get_model_repository_index()).models)
            assert (await client.get_log_settings()).settings["log_format"].string_param == "default"
            assert (await client.get_system_shared_memory_status()).regions == {}
            with pytest.raises(InferenceServerException) as caught:
                await client.get_model_metadata("nope")
            assert _status(caught.value) == ("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found")
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))
