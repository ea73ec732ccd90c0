"""The inference path over gRPC: requested outputs, classification, versions, request ids and
parameters, every bad request with its status code and text, concurrency with the sync and aio
clients (SPEC §0, §1.2, §1.4, §1.7)."""

from __future__ import annotations

import asyncio
import queue
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from e2e.infer_models import infer_server as infer_server  # the fixture

pytestmark = pytest.mark.e2e

PREFIX = "[request id: <id_unknown>] "
NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND


@pytest.fixture
def client(infer_server: Any) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(infer_server.grpc_url)


@pytest.fixture
def stub(infer_server: Any) -> Any:
    with grpc.insecure_channel(infer_server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(n, list(a.shape), "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _fp32_input(data: np.ndarray, name: str = "INPUT0") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(data.shape), "FP32")
    return tensor.set_data_from_numpy(data)


def _error(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value.status()), caught.value.message()


def assert_serves(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[4.0, 5.0]], np.float32)
    assert client.infer("id_fp32", [_fp32_input(data)]).as_numpy("OUTPUT0").tolist() == data.tolist()


# ------------------------------------------------------------------------------ requested outputs


def test_requested_outputs_subset_and_order(client: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, b), model_version="1",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None and result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1"), grpcclient.InferRequestedOutput("OUTPUT0")]
    result = client.infer("simple", _simple_inputs(a, b), model_version="1", outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1", "OUTPUT0"]
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    every = client.infer("simple", _simple_inputs(a, b), model_version="1")
    assert [o.name for o in every.get_response().outputs] == ["OUTPUT0", "OUTPUT1"]


def test_strings_model(client: Any) -> None:
    a = np.array([[str(k).encode() for k in range(16)]], dtype=np.object_)
    inputs = [grpcclient.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("simple_string", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [[str(2 * k).encode() for k in range(16)]]
    assert result.as_numpy("OUTPUT1").tolist() == [[b"0"] * 16]


# ---------------------------------------------------------------------------------- classification


def test_classification_batched_with_labels_and_capped(client: Any) -> None:
    data = np.array([[0.1, 0.9, 0.3, 0.7, 0.5], [5, 4, 3, 2, 1]], dtype=np.float32)
    output = grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)
    result = client.infer("classify", [_fp32_input(data)], outputs=[output])
    tensor = result.get_output("OUTPUT0")
    assert (tensor.datatype, list(tensor.shape)) == ("BYTES", [2, 3])
    assert result.as_numpy("OUTPUT0").tolist() == [
        [b"0.900000:1:one", b"0.700000:3:three", b"0.500000:4:four"],
        [b"5.000000:0:zero", b"4.000000:1:one", b"3.000000:2:two"]]
    output = grpcclient.InferRequestedOutput("OUTPUT0", class_count=9)
    capped = client.infer("classify", [_fp32_input(data[:1])], outputs=[output]).as_numpy("OUTPUT0")
    assert capped.shape == (1, 5)


def test_classification_non_batched_and_errors(client: Any, stub: Any) -> None:
    output = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
    result = client.infer("idnb_fp32", [_fp32_input(np.array([1, 3, 2, -1], np.float32))], outputs=[output])
    assert result.as_numpy("OUTPUT0").tolist() == [b"3.000000:1", b"2.000000:2"]
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "BYTES").set_data_from_numpy(np.array([[b"1", b"2"]], np.object_))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)]
    assert _error(client.infer, "id_bytes", [tensor], outputs=outputs) == (
        "StatusCode.INVALID_ARGUMENT", "class result not available for output due to unsupported type 'BYTES'")
    request = _request("classify", [("INPUT0", "FP32", [1, 5], np.ones(5, np.float32).tobytes())])
    request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = -2
    assert _raw_error(stub, request) == (INVALID, "invalid value for 'classification' parameter, expected >= 0")
    assert_serves(client)


# ---------------------------------------------------------------------------------- versions and ids


def test_version_routing_and_request_ids(client: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 10, dtype=np.int32)
    for version, first in (("1", a + b), ("2", a - b), ("", a - b)):
        result = client.infer("simple", _simple_inputs(a, b), model_version=version, request_id=f"v{version}")
        response = result.get_response()
        assert (response.model_name, response.model_version, response.id) == ("simple", version or "2", f"v{version}")
        assert result.as_numpy("OUTPUT0").tolist() == first.tolist()
    assert client.infer("simple", _simple_inputs(a, b)).get_response().id == ""


def test_request_id_prefixes_inference_errors(client: Any) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    outputs = [grpcclient.InferRequestedOutput("NOPE")]
    assert _error(client.infer, "simple", _simple_inputs(a, a), outputs=outputs, request_id="abc") == (
        "StatusCode.INVALID_ARGUMENT", "[request id: abc] unexpected inference output 'NOPE' for model 'simple'")


def test_request_parameters_are_accepted(client: Any) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    parameters = {"tenant": "blue", "beam": 4, "sampling": True, "temperature": 0.25}
    result = client.infer("simple", _simple_inputs(a, a), parameters=parameters, model_version="1", priority=1,
                          timeout=1_000_000)
    assert result.as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    assert not result.get_response().parameters


def test_decoupled_model_is_refused_on_unary_infer(client: Any) -> None:
    tensor = grpcclient.InferInput("IN", [2], "INT32").set_data_from_numpy(np.array([1, 2], np.int32))
    assert _error(client.infer, "repeat_int32", [tensor]) == (
        "StatusCode.UNIMPLEMENTED", "ModelInfer RPC doesn't support models with decoupled transaction policy")
    assert_serves(client)


# ------------------------------------------------------------------------------------- bad input


def _request(model: str, inputs: list[tuple[str, str, list[int], bytes]], version: str = "",
             **parameters: service_pb2.InferParameter) -> service_pb2.ModelInferRequest:
    """A request with raw contents: inputs are (name, datatype, shape, raw bytes)."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape, raw in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(value)
    return request


def _raw_error(stub: Any, request: service_pb2.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    return caught.value.code(), caught.value.details()


def _fp32(shape: list[int], count: int | None = None, name: str = "INPUT0") -> tuple[str, str, list[int], bytes]:
    size = int(np.prod(shape)) if count is None else count
    return name, "FP32", shape, np.ones(size, np.float32).tobytes()


def _int32(name: str, batch: int = 1) -> tuple[str, str, list[int], bytes]:
    return name, "INT32", [batch, 16], np.ones(16 * batch, np.int32).tobytes()


def _strings(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _bool(value: bool) -> service_pb2.InferParameter:
    return service_pb2.InferParameter(bool_param=value)


class Case(NamedTuple):
    request: service_pb2.ModelInferRequest
    code: grpc.StatusCode
    message: str


CASES: dict[str, Case] = {
    "shape rank": Case(_request("id_fp32", [_fp32([3])]), INVALID,
                       PREFIX + "unexpected shape for input 'INPUT0' for model 'id_fp32'. Expected [-1,-1], got [3]."
                       + NOTE),
    "shape fixed dim": Case(_request("classify", [_fp32([1, 4])]), INVALID,
                            PREFIX + "unexpected shape for input 'INPUT0' for model 'classify'. Expected [-1,5], "
                            "got [1,4]." + NOTE),
    "shape non-batched": Case(_request("idnb_fp32", [_fp32([1, 3])]), INVALID,
                              PREFIX + "unexpected shape for input 'INPUT0' for model 'idnb_fp32'. Expected [-1], got "
                              "[1,3]. "),
    "datatype": Case(_request("id_fp32", [("INPUT0", "INT32", [1, 2], b"\x00" * 8)]), INVALID,
                     PREFIX + "inference input 'INPUT0' data-type is 'INT32', but model 'id_fp32' expects 'FP32'"),
    "unknown datatype": Case(_request("id_fp32", [("INPUT0", "FP8", [1], b"\x00")]), INVALID,
                             "invalid datatype for input INPUT0"),
    "negative dim": Case(_request("id_fp32", [_fp32([1, -3], 3)]), INVALID,
                         "input 'INPUT0' for model 'id_fp32' has a negative dimension in shape [1,-3]"),
    "element count overflow": Case(_request("id_fp32", [_fp32([2**40, 2**40], 1)]), INVALID,
                                   "The shape [1099511627776,1099511627776] of input 'INPUT0' for model 'id_fp32' "
                                   "causes total element count to exceed maximum size of 9223372036854775807"),
    "byte size overflow": Case(_request("id_fp32", [_fp32([4, 2**60 + 2], 1)]), INVALID,
                               "byte size overflow for input 'INPUT0' for model 'id_fp32'"),
    "byte size mismatch": Case(_request("id_fp32", [_fp32([1, 3], 2)]), INVALID,
                               "input byte size mismatch for input 'INPUT0' for model 'id_fp32'. Expected 12, got 8"),
    "batch over max": Case(_request("id_fp32", [_fp32([9, 1])]), INVALID,
                           PREFIX + "inference request batch-size must be <= 8 for 'id_fp32'"),
    "batch zero": Case(_request("id_fp32", [_fp32([0, 1])]), INVALID,
                       PREFIX + "inference request batch-size must be >= 1 for 'id_fp32'"),
    "batch sizes differ": Case(_request("simple", [_int32("INPUT0"), _int32("INPUT1", 2)]), INVALID,
                               PREFIX + "input 'INPUT1' batch size does not match other inputs for 'simple'"),
    "missing input": Case(_request("simple", [_int32("INPUT0")]), INVALID,
                          PREFIX + "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
                          "but missing required input(s) ['INPUT1']. Please provide all required input(s)."),
    "no inputs": Case(_request("simple", []), INVALID,
                      PREFIX + "expected 2 inputs but got 0 inputs for model 'simple'. Got input(s) [], but missing "
                      "required input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."),
    "extra input": Case(_request("simple", [_int32("INPUT0"), _int32("INPUT1"), _int32("INPUT2")]), INVALID,
                        PREFIX + "unexpected inference input 'INPUT2' for model 'simple'"),
    "duplicate input": Case(_request("simple", [_int32("INPUT0"), _int32("INPUT0"), _int32("INPUT1")]), INVALID,
                            "input 'INPUT0' already exists in request"),
    "unknown model": Case(_request("nope", [_fp32([1, 1])]), NOT_FOUND,
                          "Request for unknown model: 'nope' is not found"),
    "unknown version": Case(_request("simple", [_int32("INPUT0"), _int32("INPUT1")], version="9"), NOT_FOUND,
                            "Request for unknown model: 'simple' version 9 is not found"),
    "version not a number": Case(_request("simple", [_int32("INPUT0")], version="latest"), INVALID,
                                 "failed to get model version from specified version string 'latest' (details: stol), "
                                 "version should be an integral value > 0"),
    "triton_ parameter": Case(_request("id_fp32", [_fp32([1, 1])], triton_x=_bool(True)), INVALID,
                              "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                              "following keys starting with 'triton_' are allowed: "
                              "triton_enable_empty_final_response"),
    "parameter type": Case(_request("id_fp32", [_fp32([1, 1])], sequence_end=service_pb2.InferParameter(int64_param=1)),
                           INVALID, "invalid value type for 'sequence_end' parameter, expected bool_param."),
    "bytes prefix cut": Case(_request("id_bytes", [("INPUT0", "BYTES", [1, 2], _strings(b"a") + b"\x01\x00")]), INVALID,
                             "element byte size indicator exceeds the end of the buffer for inference input 'INPUT0' "
                             "for model 'id_bytes'"),
    "bytes length past end": Case(_request("id_bytes", [("INPUT0", "BYTES", [1, 1], struct.pack("<I", 100) + b"xy")]),
                                  INVALID, "incomplete string data for inference input 'INPUT0' for model 'id_bytes', "
                                  "expecting string of length 100 but only 2 bytes available"),
    "bytes too few": Case(_request("id_bytes", [("INPUT0", "BYTES", [1, 3], _strings(b"a", b"b"))]), INVALID,
                          "expected 3 string elements for inference input 'INPUT0' for model 'id_bytes', got 2"),
    "bytes too many": Case(_request("id_bytes", [("INPUT0", "BYTES", [1, 1], _strings(b"a", b"b"))]), INVALID,
                           "unexpected number of string elements 2 for inference input 'INPUT0' for model 'id_bytes', "
                           "expecting 1"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_requests(stub: Any, client: Any, name: str) -> None:
    case = CASES[name]
    assert _raw_error(stub, case.request) == (case.code, case.message)
    assert_serves(client)


def test_raw_contents_count_and_typed_contents(stub: Any, client: Any) -> None:
    request = _request("simple", [_int32("INPUT0"), _int32("INPUT1")])
    del request.raw_input_contents[1]
    assert _raw_error(stub, request) == (
        INVALID, "unable to find data for input tensor 'INPUT1' for model 'simple' in request.")
    request = _request("simple", [_int32("INPUT0"), _int32("INPUT1")])
    request.raw_input_contents.append(b"\x00" * 4)
    assert _raw_error(stub, request) == (INVALID, "unexpected additional input data for model 'simple'")
    request = _request("simple", [_int32("INPUT0"), _int32("INPUT1")])
    request.inputs[1].contents.int_contents.extend([1] * 16)
    assert _raw_error(stub, request) == (
        INVALID, "contents field must not be specified when using raw_input_contents for 'INPUT1' for model 'simple'")
    assert_serves(client)


def test_unknown_outputs_and_duplicates(client: Any) -> None:
    data = np.ones((1, 2), np.float32)
    assert _error(client.infer, "id_fp32", [_fp32_input(data)], outputs=[grpcclient.InferRequestedOutput("OUTPUT9")]) \
        == ("StatusCode.INVALID_ARGUMENT", PREFIX + "unexpected inference output 'OUTPUT9' for model 'id_fp32'")
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0")] * 2
    assert _error(client.infer, "id_fp32", [_fp32_input(data)], outputs=outputs) == (
        "StatusCode.INVALID_ARGUMENT", "output 'OUTPUT0' already exists in request")


# ------------------------------------------------------------------------------------ concurrency


def _identity_calls(url: str, i: int) -> None:
    with grpcclient.InferenceServerClient(url) as client:
        for j in range(5):
            data = np.full((1 + (i + j) % 4, 1 + i % 7), i * 100 + j, dtype=np.float32)
            result = client.infer("id_fp32", [_fp32_input(data)], request_id=f"{i}-{j}")
            assert result.get_response().id == f"{i}-{j}"
            assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


def test_concurrent_threads(infer_server: Any) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        for future in [pool.submit(_identity_calls, infer_server.grpc_url, i) for i in range(32)]:
            future.result(timeout=60)


def test_sync_client_async_infer_and_compression(client: Any) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    data = [np.full((1, 3), i, dtype=np.float32) for i in range(24)]
    for i, values in enumerate(data):
        algorithm = (None, "gzip", "deflate")[i % 3]
        client.async_infer("id_fp32", [_fp32_input(values)], lambda result, error: answers.put((result, error)),
                           request_id=str(i), compression_algorithm=algorithm)
    results = [answers.get(timeout=30) for _ in data]
    assert all(error is None for _, error in results)
    by_id = {r.get_response().id: r.as_numpy("OUTPUT0").tolist() for r, _ in results}
    assert by_id == {str(i): values.tolist() for i, values in enumerate(data)}


def test_aio_many_concurrent_requests_good_and_bad(infer_server: Any) -> None:
    async def good(client: aioclient.InferenceServerClient, i: int) -> None:
        data = np.full((1 + i % 8, 1 + i % 11), float(i), dtype=np.float32)
        tensor = aioclient.InferInput("INPUT0", list(data.shape), "FP32").set_data_from_numpy(data)
        result = await client.infer("id_fp32", [tensor], request_id=str(i))
        assert result.get_response().id == str(i) and result.as_numpy("OUTPUT0").tolist() == data.tolist()

    async def bad(client: aioclient.InferenceServerClient, i: int) -> None:
        tensor = aioclient.InferInput("INPUT0", [9, 1], "FP32").set_data_from_numpy(np.ones((9, 1), np.float32))
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("id_fp32", [tensor], request_id=f"bad{i}")
        assert caught.value.message() == f"[request id: bad{i}] inference request batch-size must be <= 8 for 'id_fp32'"
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"

    async def main() -> None:
        client = aioclient.InferenceServerClient(infer_server.grpc_url)
        try:
            await asyncio.gather(*((bad if i % 4 == 0 else good)(client, i) for i in range(160)))
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_large_tensors_both_ways_with_and_without_compression(client: Any) -> None:
    """16 MiB each way: many DATA frames, both flow-control windows filled and reopened."""
    data = np.random.default_rng(7).random((1, 4 << 20), dtype=np.float32)
    for algorithm in (None, "gzip"):
        result = client.infer("id_fp32", [_fp32_input(data)], compression_algorithm=algorithm, client_timeout=60)
        assert np.array_equal(result.as_numpy("OUTPUT0"), data)
