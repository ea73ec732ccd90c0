"""Server endpoints on the shared example server: health, metadata, config, statistics, logging,
compression and the HTTP error rules (SPEC §0, §1.1, §1.2, §1.8, §1.10, §1.12, §6)."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from e2e.raw_http import http, post_json
from e2e.triton_observed import SERVER_EXTENSIONS

pytestmark = pytest.mark.e2e

EXAMPLE_MODELS = {"identity", "minilm", "simple", "simple_string",
                  "minilm_tokenizer", "minilm_encoder", "minilm_pooling", "minilm_embed",
                  "ocr", "ocr_det", "ocr_cls", "ocr_rec", "silero_vad"}
LOG_DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "default"}


@pytest.fixture
def client(example_server: Any) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(example_server.url)


def _error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def _simple_inputs(batch: int = 1) -> list[httpclient.InferInput]:
    data = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    inputs = [httpclient.InferInput(n, [batch, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(np.ones_like(data))
    return inputs


# ------------------------------------------------------------------------------ health


def test_health_live_and_ready_are_200_with_empty_body(example_server: Any, client: Any) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        answer = http(example_server.url, path)
        assert (answer.status, answer.body) == (200, b"")
    assert client.is_server_live() and client.is_server_ready()


def test_health_is_get_only(example_server: Any) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert http(example_server.url, path, "POST", b"").status == 405


# ---------------------------------------------------------------------------- metadata


def test_server_metadata(example_server: Any, client: Any) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"
    assert isinstance(metadata["version"], str) and metadata["version"]
    assert metadata["extensions"] == SERVER_EXTENSIONS  # Triton's list, in its order
    assert http(example_server.url, "/v2").json() == metadata


def test_model_metadata_lists_every_serving_version(client: Any) -> None:
    metadata = client.get_model_metadata("simple")
    assert metadata == {
        "name": "simple",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("OUTPUT0", "OUTPUT1")],
    }


def test_versioned_model_metadata_lists_only_that_version(client: Any) -> None:
    assert client.get_model_metadata("simple", "1")["versions"] == ["1"]
    assert client.get_model_metadata("simple", "2")["versions"] == ["2"]


def test_model_metadata_of_unknown_model_and_version_is_404(example_server: Any, client: Any) -> None:
    error = _error(client.get_model_metadata, "foo")
    assert (error.status(), error.message()) == ("404", "Request for unknown model: 'foo' is not found")
    error = _error(client.get_model_metadata, "simple", "99")
    assert (error.status(), error.message()) == (
        "404", "Request for unknown model: 'simple' version 99 is not found")
    answer = http(example_server.url, "/v2/models/foo")
    assert answer.status == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": "Request for unknown model: 'foo' is not found"}


# ------------------------------------------------------------------------------ ready


def test_model_ready_with_and_without_version(example_server: Any, client: Any) -> None:
    for path in ("/v2/models/simple/ready", "/v2/models/simple/versions/1/ready",
                 "/v2/models/simple/versions/2/ready"):
        answer = http(example_server.url, path)
        assert (answer.status, answer.body) == (200, b"")
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "2")
    assert not client.is_model_ready("simple", "3")
    assert not client.is_model_ready("foo")


@pytest.mark.parametrize("path", ["/v2/models/simple/versions/3/ready", "/v2/models/foo/ready"])
def test_model_not_ready_is_400_with_triton_text(example_server: Any, path: str) -> None:
    answer = http(example_server.url, path)
    assert answer.status == 400
    assert answer.json() == {"error": "Model version not ready"}
    assert answer.headers["content-type"].startswith("text/plain")  # SPEC §0


# ----------------------------------------------------------------------------- config


def test_model_config_json_prints_names_enums_numbers_and_defaults(client: Any) -> None:
    config = client.get_model_config("simple")
    assert config["name"] == "simple"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 8
    assert config["version_policy"] == {"all": {}}
    first = config["input"][0]
    assert first["name"] == "INPUT0"
    assert first["data_type"] == "TYPE_INT32"
    assert first["format"] == "FORMAT_NONE"
    assert first["dims"] == [16]  # int64 as a JSON number, not a string
    assert first["optional"] is False and first["is_shape_tensor"] is False  # defaults are printed
    assert config["output"][1]["name"] == "OUTPUT1" and config["output"][1]["label_filename"] == ""
    group = config["instance_group"][0]
    assert group["kind"] == "KIND_CPU" and isinstance(group["count"], int) and group["count"] >= 1
    assert config["optimization"]["priority"] == "PRIORITY_DEFAULT"
    assert config["default_model_filename"] == "model.onnx"
    assert client.get_model_config("simple", "1") == config


def test_model_config_int64_lists_are_numbers(client: Any) -> None:
    config = client.get_model_config("minilm")
    assert config["version_policy"] == {"specific": {"versions": [1]}}
    assert config["output"][0]["dims"] == [-1, 384]


def test_model_config_of_unknown_model_and_version_is_404(client: Any) -> None:
    error = _error(client.get_model_config, "foo")
    assert (error.status(), error.message()) == ("404", "Request for unknown model: 'foo' is not found")
    error = _error(client.get_model_config, "simple", "7")
    assert (error.status(), error.message()) == (
        "404", "Request for unknown model: 'simple' version 7 is not found")


# ------------------------------------------------------------------------ HTTP errors


@pytest.mark.parametrize("path", ["/v2/foo", "/v3", "/v2/models/simple/bogus", "/v2/models/simple/versions/x",
                                  "/v2/health/dead"])
def test_unknown_url_is_404_not_found(example_server: Any, path: str) -> None:
    answer = http(example_server.url, path)
    assert answer.status == 404
    assert answer.json() == {"error": "Not Found"}


def test_not_found_body_is_text_plain(example_server: Any) -> None:
    assert http(example_server.url, "/v2/foo").headers["content-type"].startswith("text/plain")  # SPEC §0


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v2/health/live"),
    ("DELETE", "/v2"),
    ("GET", "/v2/models/simple/infer"),
    ("POST", "/v2/models/simple/config"),
    ("GET", "/v2/repository/index"),
    ("GET", "/v2/repository/models/simple/load"),
    ("PUT", "/v2/logging"),
])
def test_wrong_verb_is_405(example_server: Any, method: str, path: str) -> None:
    assert http(example_server.url, path, method, b"" if method != "GET" else None).status == 405


# ------------------------------------------------------------------------- statistics


def _stats(client: Any, name: str = "", version: str = "") -> list[dict[str, Any]]:
    return client.get_inference_statistics(name, version)["model_stats"]


def test_statistics_for_all_models_one_model_and_one_version(client: Any) -> None:
    everything = _stats(client)
    assert {s["name"] for s in everything} == EXAMPLE_MODELS
    assert [s["version"] for s in everything if s["name"] == "simple"] == ["1", "2"]
    assert [(s["name"], s["version"]) for s in _stats(client, "simple")] == [("simple", "1"), ("simple", "2")]
    (one,) = _stats(client, "simple", "2")
    assert (one["name"], one["version"]) == ("simple", "2")
    assert set(one) >= {"last_inference", "inference_count", "execution_count", "inference_stats",
                        "batch_stats"}
    assert set(one["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                           "compute_output", "cache_hit", "cache_miss"}
    assert one["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}


def test_statistics_of_unknown_model_and_version_is_400(example_server: Any, client: Any) -> None:
    error = _error(client.get_inference_statistics, "foo")
    assert (error.status(), error.message()) == ("400", "requested model 'foo' is not available")
    answer = http(example_server.url, "/v2/models/foo/stats")
    assert (answer.status, answer.json()) == (400, {"error": "requested model 'foo' is not available"})
    error = _error(client.get_inference_statistics, "simple", "9")
    assert (error.status(), error.message()) == (
        "400", "requested model version is not available for model 'simple'")


def _by_batch(stats: dict[str, Any]) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_statistics_count_inferences_executions_and_batches(client: Any) -> None:
    (before,) = _stats(client, "identity", "1")
    for batch in (3, 1, 3):
        tensor = httpclient.InferInput("INPUT0", [batch, 5], "FP32")
        tensor.set_data_from_numpy(np.ones((batch, 5), np.float32))
        client.infer("identity", [tensor])
    (after,) = _stats(client, "identity", "1")
    assert after["inference_count"] - before["inference_count"] == 7
    assert after["execution_count"] - before["execution_count"] == 3
    success_before, success_after = before["inference_stats"]["success"], after["inference_stats"]["success"]
    assert success_after["count"] - success_before["count"] == 3
    assert success_after["ns"] > success_before["ns"]
    queue = after["inference_stats"]["queue"]["count"] - before["inference_stats"]["queue"]["count"]
    assert queue == 3
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    old, new = _by_batch(before), _by_batch(after)
    assert new[3] - old.get(3, 0) == 2
    assert new[1] - old.get(1, 0) == 1
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0


def test_statistics_are_kept_per_version(client: Any) -> None:
    (v1_before,), (v2_before,) = _stats(client, "simple", "1"), _stats(client, "simple", "2")
    client.infer("simple", _simple_inputs(2), model_version="1")
    (v1_after,), (v2_after,) = _stats(client, "simple", "1"), _stats(client, "simple", "2")
    assert v1_after["inference_count"] - v1_before["inference_count"] == 2
    assert v2_after["inference_count"] == v2_before["inference_count"]


# ---------------------------------------------------------------------------- logging


def test_logging_get_update_and_reject_bad_values(example_server: Any, client: Any) -> None:
    assert client.get_log_settings() == LOG_DEFAULTS
    try:
        updated = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601",
                                              "log_info": False})
        assert updated == {**LOG_DEFAULTS, "log_verbose_level": 1, "log_format": "ISO8601", "log_info": False}
        assert client.get_log_settings() == updated
        for bad in ({"log_info": "yes"}, {"log_warning": 1}, {"log_verbose_level": -1},
                    {"log_verbose_level": "2"}, {"log_format": "json"},
                    {"log_error": False, "log_format": "xml"}):
            answer = post_json(example_server.url, "/v2/logging", bad)
            assert answer.status == 400, bad
            assert "error" in answer.json()
        assert client.get_log_settings() == updated  # a rejected update changes nothing
    finally:
        assert client.update_log_settings({k: v for k, v in LOG_DEFAULTS.items() if k != "log_file"}) \
            == LOG_DEFAULTS


def test_logging_log_file_is_read_only(example_server: Any, client: Any) -> None:
    error = _error(client.update_log_settings, {"log_file": "/tmp/naiad-elsewhere.log"})
    assert error.status() == "400"
    assert client.get_log_settings()["log_file"] == ""


# ------------------------------------------------------------------------ compression


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_client_compressed_requests_and_responses(client: Any, algorithm: str) -> None:
    result = client.infer("simple", _simple_inputs(), model_version="1",
                          request_compression_algorithm=algorithm, response_compression_algorithm=algorithm)
    expected = np.arange(16, dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected - 1)


@pytest.mark.parametrize(("encoding", "pack"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_raw_compressed_request_body(example_server: Any, encoding: str, pack: Any) -> None:
    document = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    answer = http(example_server.url, "/v2/models/identity/infer", "POST", pack(json.dumps(document).encode()),
                  {"Content-Type": "application/json", "Content-Encoding": encoding})
    assert answer.status == 200, answer.body
    assert answer.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]
    answer = http(example_server.url, "/v2/repository/index", "POST", pack(b'{"ready": true}'),
                  {"Content-Encoding": encoding})
    assert answer.status == 200 and {e["name"] for e in answer.json()} == EXAMPLE_MODELS


@pytest.mark.parametrize(("encoding", "unpack"), [("gzip", gzip.decompress), ("deflate", zlib.decompress)])
def test_infer_response_compressed_when_accepted(example_server: Any, encoding: str, unpack: Any) -> None:
    document = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    answer = http(example_server.url, "/v2/models/identity/infer", "POST", document.encode(),
                  {"Accept-Encoding": encoding})
    assert answer.status == 200
    assert answer.headers["content-encoding"] == encoding
    assert json.loads(unpack(answer.body))["outputs"][0]["data"] == [1.0, 2.0]


def test_only_successful_infer_responses_are_compressed(example_server: Any) -> None:
    """Triton compresses inference responses only: tritonclient.http.aio sends `Accept-Encoding:
    gzip, deflate` on every call (aiohttp's default) but inflates only inference responses."""
    accept = {"Accept-Encoding": "gzip, deflate"}
    for path in ("/v2", "/v2/models/simple", "/v2/models/simple/config", "/v2/models/simple/stats",
                 "/v2/logging", "/v2/models/foo"):
        answer = http(example_server.url, path, headers=accept)
        assert "content-encoding" not in answer.headers, path
        assert "error" in answer.json() or answer.status == 200
    bad = json.dumps({"inputs": [{"name": "NOPE", "shape": [1], "datatype": "FP32", "data": [1]}]})
    answer = http(example_server.url, "/v2/models/identity/infer", "POST", bad.encode(), accept)
    assert answer.status == 400 and "content-encoding" not in answer.headers
    assert "error" in answer.json()


def test_undecodable_compressed_body_is_400(example_server: Any) -> None:
    answer = http(example_server.url, "/v2/repository/index", "POST", b"not gzip at all",
                  {"Content-Encoding": "gzip"})
    assert answer.status == 400 and "error" in answer.json()


# ----------------------------------------------------------------------- asyncio client


def test_aio_client_health_and_ready(example_server: Any) -> None:
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(example_server.url) as client:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("simple", "1")
            assert not await client.is_model_ready("simple", "5")

    asyncio.run(scenario())


def test_aio_client_metadata_config_index_stats_logging(example_server: Any) -> None:
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(example_server.url) as client:
            assert (await client.get_server_metadata())["name"] == "triton"
            assert (await client.get_model_metadata("simple", "2"))["versions"] == ["2"]
            assert (await client.get_model_config("simple"))["max_batch_size"] == 8
            index = await client.get_model_repository_index()
            assert {e["name"] for e in index} == EXAMPLE_MODELS
            stats = await client.get_inference_statistics("simple")
            assert [s["version"] for s in stats["model_stats"]] == ["1", "2"]
            assert await client.get_log_settings() == LOG_DEFAULTS

    asyncio.run(scenario())


def test_aio_client_errors(example_server: Any) -> None:
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(example_server.url) as client:
            with pytest.raises(InferenceServerException) as caught:
                await client.get_model_metadata("foo")
            assert (caught.value.status(), caught.value.message()) == (
                "404", "Request for unknown model: 'foo' is not found")
            with pytest.raises(InferenceServerException) as caught:
                await client.get_inference_statistics("foo")
            assert (caught.value.status(), caught.value.message()) == (
                "400", "requested model 'foo' is not available")

    asyncio.run(scenario())


def test_aio_client_compressed_infer(example_server: Any) -> None:
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(example_server.url) as client:
            for algorithm in ("gzip", "deflate"):
                result = await client.infer("simple", _simple_inputs(), model_version="2",
                                            request_compression_algorithm=algorithm,
                                            response_compression_algorithm=algorithm)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(16, dtype=np.int32)[None] - 1)

    asyncio.run(scenario())


def test_aio_load_in_none_mode_is_503(example_server: Any) -> None:
    async def scenario() -> None:
        async with aioclient.InferenceServerClient(example_server.url) as client:
            for call in (client.load_model, client.unload_model):
                with pytest.raises(InferenceServerException) as caught:
                    await call("simple")
                assert (caught.value.status(), caught.value.message()) == (
                    "503", "explicit model load / unload is not allowed if polling is enabled")

    asyncio.run(scenario())
