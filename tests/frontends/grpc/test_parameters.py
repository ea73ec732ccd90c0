"""gRPC parameters and version strings, with Triton's texts; status codes; message conversions."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from naiad.core.server import Region
from naiad.errors import InvalidArgument, Status
from naiad.frontends.grpc import messages
from naiad.frontends.grpc.parameters import (
    decode_request_parameters,
    empty_final_response,
    encode_parameters,
    parse_version,
)
from naiad.frontends.grpc.status import as_naiad_error, grpc_code


def _parameters(**values: pb.InferParameter) -> dict[str, pb.InferParameter]:
    return dict(values)


# -------------------------------------------------------------------------------- versions


def test_versions() -> None:
    assert parse_version("") is None
    assert parse_version("3") == 3
    with pytest.raises(InvalidArgument, match=r"^failed to get model version from specified version string 'x' "
                                              r"\(details: stol\), version should be an integral value > 0$"):
        parse_version("x")
    with pytest.raises(InvalidArgument, match=r"^invalid model version specified '-1' , version should be an "
                                              r"integral value > 0$"):
        parse_version("-1")


# ----------------------------------------------------------------------- request parameters


def test_request_parameters_of_every_type() -> None:
    decoded = decode_request_parameters(_parameters(
        s=pb.InferParameter(string_param="x"), i=pb.InferParameter(int64_param=-2),
        b=pb.InferParameter(bool_param=False), d=pb.InferParameter(double_param=0.25),
        sequence_id=pb.InferParameter(string_param="seq"), priority=pb.InferParameter(uint64_param=2),
        timeout=pb.InferParameter(int64_param=100), sequence_start=pb.InferParameter(bool_param=True),
        triton_enable_empty_final_response=pb.InferParameter(bool_param=True)))
    assert decoded == {"s": "x", "i": -2, "b": False, "d": 0.25, "sequence_id": "seq", "priority": 2,
                       "timeout": 100, "sequence_start": True}


@pytest.mark.parametrize(("key", "parameter", "message"), [
    ("sequence_id", pb.InferParameter(bool_param=True),
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ("sequence_end", pb.InferParameter(int64_param=1), "invalid value type for 'sequence_end' parameter, expected "
                                                       "bool_param."),
    ("priority", pb.InferParameter(int64_param=-1), "invalid value for 'priority', expected value >= 0."),
    ("priority", pb.InferParameter(string_param="1"),
     "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
    ("timeout", pb.InferParameter(uint64_param=1), "invalid value type for 'timeout' parameter, expected int64_param."),
    ("custom", pb.InferParameter(uint64_param=1),
     "invalid value type for 'custom' parameter, expected int64_param, bool_param, or string_param."),
    ("custom", pb.InferParameter(), "invalid value type for 'custom' parameter, expected int64_param, bool_param, "
                                    "or string_param."),
    ("triton_x", pb.InferParameter(bool_param=True),
     "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with "
     "'triton_' are allowed: triton_enable_empty_final_response"),
    ("triton_enable_empty_final_response", pb.InferParameter(int64_param=1),
     "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
])
def test_request_parameter_errors(key: str, parameter: pb.InferParameter, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode_request_parameters({key: parameter})
    assert str(info.value) == message


def test_empty_final_response_flag() -> None:
    assert not empty_final_response({})
    assert empty_final_response({"triton_enable_empty_final_response": pb.InferParameter(bool_param=True)})
    assert not empty_final_response({"triton_enable_empty_final_response": pb.InferParameter(bool_param=False)})


def test_encode_parameters_from_python_and_numpy() -> None:
    message = pb.ModelInferResponse()
    encode_parameters(message.parameters, {"a": np.int32(4), "b": np.float64(0.5), "c": np.bool_(True),
                                           "d": b"x", "e": [1]})
    assert json_format.MessageToDict(message)["parameters"] == {
        "a": {"int64Param": "4"}, "b": {"doubleParam": 0.5}, "c": {"boolParam": True},
        "d": {"stringParam": "x"}, "e": {"stringParam": "[1]"}}


# ------------------------------------------------------------------------------- status codes


@pytest.mark.parametrize(("status", "code"), [
    (Status.INTERNAL, grpc.StatusCode.INTERNAL), (Status.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
    (Status.INVALID_ARG, grpc.StatusCode.INVALID_ARGUMENT), (Status.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (Status.UNSUPPORTED, grpc.StatusCode.UNIMPLEMENTED), (Status.ALREADY_EXISTS, grpc.StatusCode.ALREADY_EXISTS),
    (Status.CANCELLED, grpc.StatusCode.CANCELLED), (Status.UNKNOWN, grpc.StatusCode.UNKNOWN),
])
def test_status_mapping(status: Status, code: grpc.StatusCode) -> None:
    assert grpc_code(status) is code


def test_backend_errors_without_a_status_are_unknown() -> None:
    error = as_naiad_error(RuntimeError("boom"))
    assert (error.status, error.message) == (Status.UNKNOWN, "boom")
    original = InvalidArgument("bad")
    assert as_naiad_error(original) is original


# ---------------------------------------------------------------------------------- messages


def _stats(count: int) -> dict[str, Any]:
    duration = {"count": count, "ns": count * 10}
    return {"model_stats": [{
        "name": "m", "version": "1", "last_inference": 0, "inference_count": count, "execution_count": count,
        "inference_stats": {k: duration for k in ("success", "fail", "queue", "compute_input", "compute_infer",
                                                  "compute_output", "cache_hit", "cache_miss")},
        "response_stats": {}, "batch_stats": [{"batch_size": 1, "compute_input": duration,
                                               "compute_infer": duration, "compute_output": duration}],
        "memory_usage": [],
    }]}


def test_statistics_leave_zero_counts_out_like_triton() -> None:
    as_json = json_format.MessageToDict(messages.statistics(_stats(0)), preserving_proto_field_name=True)
    (model,) = as_json["model_stats"]
    assert model["inference_stats"]["success"] == {} and "inference_count" not in model
    (model,) = json_format.MessageToDict(messages.statistics(_stats(2)),
                                         preserving_proto_field_name=True)["model_stats"]
    assert model["inference_stats"]["success"] == {"count": "2", "ns": "20"}
    assert model["batch_stats"][0]["batch_size"] == "1"


def test_log_settings_are_typed() -> None:
    response = messages.log_settings({"log_file": "", "log_info": True, "log_verbose_level": 2})
    assert {k: v.WhichOneof("parameter_choice") for k, v in response.settings.items()} == {
        "log_file": "string_param", "log_info": "bool_param", "log_verbose_level": "uint32_param"}
    request = pb.LogSettingsRequest()
    request.settings["log_info"].bool_param = False
    request.settings["log_verbose_level"].uint32_param = 1
    request.settings["unset"].SetInParent()
    assert messages.log_changes(request.settings) == {"log_info": False, "log_verbose_level": 1, "unset": None}


def test_repository_parameters() -> None:
    request = pb.RepositoryModelLoadRequest()
    request.parameters["config"].string_param = "{}"
    request.parameters["file:1/model.onnx"].bytes_param = b"\x00\x01"
    assert messages.repository_parameters(request.parameters) == {"config": "{}", "file:1/model.onnx": b"\x00\x01"}
    request.parameters["config"].bool_param = True
    with pytest.raises(InvalidArgument, match="'config' parameter must be a JSON string"):
        messages.repository_parameters(request.parameters)
    request = pb.RepositoryModelLoadRequest()
    request.parameters["file:1/model.onnx"].string_param = "x"
    with pytest.raises(InvalidArgument, match=r"file parameter 'file:1/model.onnx' must be bytes_param"):
        messages.repository_parameters(request.parameters)


def test_index_and_shared_memory_status() -> None:
    index = messages.repository_index([{"name": "a", "version": "1", "state": "READY"}, {"name": "b"}])
    assert [(m.name, m.version, m.state) for m in index.models] == [("a", "1", "READY"), ("b", "", "")]
    status = messages.shm_status([Region("r", "/k", 8, 64)])
    assert json_format.MessageToDict(status, preserving_proto_field_name=True) == {
        "regions": {"r": {"name": "r", "key": "/k", "offset": "8", "byte_size": "64"}}}
