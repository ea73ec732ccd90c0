"""The inference path with the sync tritonclient and raw HTTP: raw binary requests, requested
outputs, classification, version routing, request ids and parameters, concurrent threads
(SPEC §0, §1.1-§1.4, §1.7)."""

from __future__ import annotations

import json
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from e2e.infer_models import assert_serves, fp32_request, infer_path, post_infer, split_binary
from e2e.infer_models import infer_server as infer_server  # the fixture
from e2e.raw_http import post

pytestmark = pytest.mark.e2e

RAW = {"Inference-Header-Content-Length": "0"}


@pytest.fixture
def client(infer_server: Any) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(infer_server.url)


def _simple_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(n, list(a.shape), "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def _simple_json(a: list[int], b: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": d}
                       for n, d in (("INPUT0", a), ("INPUT1", b))]}


def _error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


# ----------------------------------------------------------------------------- raw binary requests


def _raw(url: str, model: str, body: bytes) -> tuple[dict[str, Any], bytes]:
    answer = post(url, infer_path(model), body, RAW)
    assert answer.status == 200, answer.body
    assert answer.headers["content-type"] == "application/octet-stream"
    return split_binary(answer)


def test_raw_request_batched_model_is_batch_one_with_deduced_dim(infer_server: Any) -> None:
    values = np.arange(6, dtype=np.float32)
    header, blob = _raw(infer_server.url, "id_fp32", values.tobytes())
    assert header == {"model_name": "id_fp32", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 6], "parameters": {"binary_data_size": 24}}]}
    assert blob == values.tobytes()


def test_raw_request_non_batched_model(infer_server: Any) -> None:
    values = np.arange(5, dtype=np.int64)
    header, blob = _raw(infer_server.url, "idnb_int64", values.tobytes())
    assert header["outputs"][0]["shape"] == [5] and blob == values.tobytes()


@pytest.mark.parametrize("datatype", ["BOOL", "INT8", "UINT16", "FP16", "FP64", "BF16"])
def test_raw_request_datatypes(infer_server: Any, datatype: str) -> None:
    dtype = ml_dtypes.bfloat16 if datatype == "BF16" else np.dtype(datatype.lower().replace("fp", "float"))
    values = (np.arange(4) % 2 == 1) if datatype == "BOOL" else np.arange(4).astype(dtype)
    header, blob = _raw(infer_server.url, f"id_{datatype.lower()}", values.tobytes())
    output = header["outputs"][0]
    assert (output["datatype"], output["shape"]) == (datatype, [1, 4])
    assert blob == values.tobytes()


def test_raw_request_fixed_dims_and_empty_body(infer_server: Any) -> None:
    values = np.arange(5, dtype=np.float32)
    header, blob = _raw(infer_server.url, "classify", values.tobytes())
    assert header["outputs"][0]["shape"] == [1, 5] and blob == values.tobytes()
    header, blob = _raw(infer_server.url, "id_fp32", b"")
    assert header["outputs"][0] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 0],
                                    "parameters": {"binary_data_size": 0}}
    assert blob == b""


def test_raw_request_bytes_with_shape_one(infer_server: Any) -> None:
    element = "h\u00e9llo\x00world".encode()
    header, blob = _raw(infer_server.url, "bytes_one", element)
    assert header["outputs"][0] == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 1],
                                    "parameters": {"binary_data_size": 4 + len(element)}}
    assert blob == struct.pack("<I", len(element)) + element


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        ("simple", np.zeros(32, np.int32).tobytes(),
         "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple' model configuration"),
        ("simple_string", b"1",
         "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple_string' "
         "model configuration"),
        ("id_bytes", b"hello", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
        ("idnb_bytes", b"hello", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
        ("fp32_2d", np.zeros(4, np.float32).tobytes(),
         "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
         "variable-sized dimension"),
        ("id_fp32", b"\x00" * 6, "input byte size mismatch for input 'INPUT0' for model 'id_fp32'. Expected 4, got 6"),
        ("classify", b"\x00" * 24,
         "input byte size mismatch for input 'INPUT0' for model 'classify'. Expected 20, got 24"),
    ],
)
def test_raw_request_errors(infer_server: Any, model: str, body: bytes, message: str) -> None:
    answer = post(infer_server.url, infer_path(model), body, RAW)
    assert (answer.status, answer.error()) == (400, message)
    assert_serves(infer_server.url)


def test_raw_request_unknown_model_or_version(infer_server: Any) -> None:
    answer = post(infer_server.url, infer_path("nope"), b"\x00" * 4, RAW)
    assert (answer.status, answer.error()) == (404, "Request for unknown model: 'nope' is not found")
    answer = post(infer_server.url, infer_path("id_fp32", 3), b"\x00" * 4, RAW)
    assert (answer.status, answer.error()) == (404, "Request for unknown model: 'id_fp32' version 3 is not found")
    assert_serves(infer_server.url)


# -------------------------------------------------------------------------------- requested outputs


def test_requested_output_subset(client: Any, infer_server: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, b), model_version="1",
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()

    # An empty list of outputs asks for all of them.
    answer = post_infer(infer_server.url, "simple", {**_simple_json([2] * 16, [1] * 16), "outputs": []}, version=1)
    assert [(o["name"], o["data"]) for o in answer.json()["outputs"]] == [("OUTPUT0", [3] * 16), ("OUTPUT1", [1] * 16)]

    # binary_data_output is ignored once outputs are listed (SPEC §0).
    request = {**_simple_json(list(range(16)), [1] * 16), "outputs": [{"name": "OUTPUT1"}],
               "parameters": {"binary_data_output": True}}
    answer = post_infer(infer_server.url, "simple", request, version=1)
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["outputs"] == [
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": [i - 1 for i in range(16)]}]


def test_outputs_come_back_in_requested_order(client: Any) -> None:
    a = np.full((2, 16), 5, dtype=np.int32)
    b = np.full((2, 16), 2, dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
               httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    result = client.infer("simple", _simple_inputs(a, b), model_version="1", outputs=outputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1", "OUTPUT0"]
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


# ---------------------------------------------------------------------------------- classification


def _classify(client: Any, model: str, data: np.ndarray, count: int, binary: bool,
              datatype: str = "FP32") -> httpclient.InferResult:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=count)
    return client.infer(model, [tensor], outputs=[output])


def test_classification_batched_with_labels(client: Any) -> None:
    data = np.array([[0.1, 0.9, 0.3, 0.7, 0.5], [5, 4, 3, 2, 1]], dtype=np.float32)
    expected = [[b"0.900000:1:one", b"0.700000:3:three", b"0.500000:4:four"],
                [b"5.000000:0:zero", b"4.000000:1:one", b"3.000000:2:two"]]
    for binary in (True, False):
        result = _classify(client, "classify", data, 3, binary)
        output = result.get_output("OUTPUT0")
        assert (output["datatype"], output["shape"]) == ("BYTES", [2, 3])
        if binary:
            size = sum(4 + len(s) for row in expected for s in row)
            assert output["parameters"] == {"binary_data_size": size}
            assert result.as_numpy("OUTPUT0").tolist() == expected
        else:
            assert "parameters" not in output
            assert output["data"] == [s.decode() for row in expected for s in row]


def test_classification_count_past_the_elements_is_capped(client: Any) -> None:
    data = np.array([[2, -1, 0.25, 8, 8]], dtype=np.float32)
    result = _classify(client, "classify", data, 9, binary=False)
    assert result.get_output("OUTPUT0")["shape"] == [1, 5]
    assert result.get_output("OUTPUT0")["data"] == [
        "8.000000:3:three", "8.000000:4:four", "2.000000:0:zero", "0.250000:2:two", "-1.000000:1:one"]


def test_classification_non_batched_and_integer(client: Any) -> None:
    result = _classify(client, "idnb_fp32", np.array([1, 3, 2, -1], np.float32), 2, binary=False)
    output = result.get_output("OUTPUT0")
    assert (output["datatype"], output["shape"], output["data"]) == ("BYTES", [2], ["3.000000:1", "2.000000:2"])
    result = _classify(client, "id_int32", np.array([[7, 9, -4]], np.int32), 1, binary=True, datatype="INT32")
    assert result.as_numpy("OUTPUT0").tolist() == [[b"9.000000:1"]]


def test_classification_of_bytes_is_refused(client: Any, infer_server: Any) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"1", b"2"]], dtype=np.object_))
    output = httpclient.InferRequestedOutput("OUTPUT0", class_count=1)
    error = _error(client.infer, "id_bytes", [tensor], outputs=[output])
    assert (error.status(), error.message()) == (
        "400", "class result not available for output due to unsupported type 'BYTES'")
    assert_serves(infer_server.url)


# ---------------------------------------------------------------------------------- version routing


def test_version_routing(client: Any, infer_server: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 10, dtype=np.int32)
    v1 = client.infer("simple", _simple_inputs(a, b), model_version="1")
    assert v1.get_response()["model_version"] == "1"
    assert v1.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    v2 = client.infer("simple", _simple_inputs(a, b), model_version="2")
    assert v2.get_response()["model_version"] == "2"
    assert v2.as_numpy("OUTPUT0").tolist() == (a - b).tolist()
    latest = client.infer("simple", _simple_inputs(a, b))
    assert latest.get_response()["model_name"] == "simple"
    assert latest.get_response()["model_version"] == "2"
    assert latest.as_numpy("OUTPUT1").tolist() == (a + b).tolist()
    # Raw HTTP on /versions/1 and on the unversioned path.
    answer = post_infer(infer_server.url, "simple", _simple_json([1] * 16, [2] * 16), version=1)
    assert answer.json()["model_version"] == "1" and answer.json()["outputs"][0]["data"] == [3] * 16
    answer = post_infer(infer_server.url, "simple", _simple_json([1] * 16, [2] * 16))
    assert answer.json()["model_version"] == "2" and answer.json()["outputs"][0]["data"] == [-1] * 16


# ------------------------------------------------------------------------- request id and parameters


def test_request_id_is_echoed_only_when_non_empty(client: Any, infer_server: Any) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    assert client.infer("simple", _simple_inputs(a, a), request_id="req-42").get_response()["id"] == "req-42"
    assert "id" not in client.infer("simple", _simple_inputs(a, a)).get_response()
    answer = post_infer(infer_server.url, "simple", {**_simple_json([0] * 16, [0] * 16), "id": ""})
    assert answer.status == 200 and "id" not in answer.json()
    answer = post_infer(infer_server.url, "simple", {**_simple_json([0] * 16, [0] * 16), "id": "\u00e9\"x"})
    assert answer.json()["id"] == "\u00e9\"x"


def test_request_id_prefixes_inference_errors(client: Any) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput("NOPE")]
    error = _error(client.infer, "simple", _simple_inputs(a, a), outputs=outputs, request_id="abc")
    assert (error.status(), error.message()) == (
        "400", "[request id: abc] unexpected inference output 'NOPE' for model 'simple'")
    error = _error(client.infer, "simple", _simple_inputs(a, a), outputs=outputs)
    assert error.message() == "[request id: <id_unknown>] unexpected inference output 'NOPE' for model 'simple'"


def test_custom_request_parameters_are_accepted(client: Any, infer_server: Any) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    parameters = {"tenant": "blue", "beam": 4, "sampling": True, "temperature": 0.25}
    result = client.infer("simple", _simple_inputs(a, a), parameters=parameters, model_version="1")
    assert result.as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    assert "parameters" not in result.get_response()
    # The reserved scheduling / sequence keys with valid values are accepted too.
    request = {**_simple_json([1] * 16, [1] * 16),
               "parameters": {"priority": 0, "timeout": 1000000, "custom": "x", "n": -3}}
    assert post_infer(infer_server.url, "simple", request).status == 200


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_anything"])
def test_triton_prefixed_parameter_is_refused(infer_server: Any, key: str) -> None:
    # tritonclient refuses these client-side, so raw HTTP.
    request = {**_simple_json([1] * 16, [1] * 16), "parameters": {key: True}}
    answer = post_infer(infer_server.url, "simple", request)
    assert (answer.status, answer.error()) == (
        400, "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.")
    assert_serves(infer_server.url)


def test_client_refuses_triton_parameters_itself(client: Any) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException, match="reserved parameter"):
        client.infer("simple", _simple_inputs(a, a), parameters={"triton_x": 1})


# --------------------------------------------------------------------------------------- compression


def test_compressed_request_and_response(client: Any) -> None:
    data = np.linspace(0, 1, 40, dtype=np.float32).reshape(2, 20)
    for algorithm in ("gzip", "deflate"):
        tensor = httpclient.InferInput("INPUT0", [2, 20], "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("id_fp32", [tensor], request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)
        assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


# --------------------------------------------------------------------------------------- concurrency


def _identity_call(url: str, i: int) -> None:
    client = httpclient.InferenceServerClient(url)
    try:
        for j in range(5):
            data = np.full((1 + (i + j) % 4, 1 + i % 7), i * 100 + j, dtype=np.float32)
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data, binary_data=j % 2 == 0)
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=i % 2 == 0)]
            result = client.infer("id_fp32", [tensor], outputs=outputs, request_id=f"{i}-{j}")
            assert result.get_response()["id"] == f"{i}-{j}"
            assert result.as_numpy("OUTPUT0").tolist() == data.tolist()
    finally:
        client.close()


def _simple_call(url: str, i: int) -> None:
    client = httpclient.InferenceServerClient(url)
    try:
        for j in range(5):
            version = "1" if (i + j) % 2 else "2"
            a = np.arange(16, dtype=np.int32).reshape(1, 16) * i + j
            b = np.full((1, 16), i - j, dtype=np.int32)
            result = client.infer("simple", _simple_inputs(a, b, binary=j % 3 != 0), model_version=version)
            plus, minus = (a + b).tolist(), (a - b).tolist()
            expected = (plus, minus) if version == "1" else (minus, plus)
            assert (result.as_numpy("OUTPUT0").tolist(), result.as_numpy("OUTPUT1").tolist()) == expected
    finally:
        client.close()


def test_concurrent_threads(infer_server: Any) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        futures = [pool.submit(_identity_call if i % 2 else _simple_call, infer_server.url, i) for i in range(32)]
        for future in futures:
            future.result(timeout=60)


def test_sync_client_async_infer(infer_server: Any) -> None:
    client = httpclient.InferenceServerClient(infer_server.url, concurrency=8)
    try:
        pending = []
        for i in range(24):
            data = np.full((1, 3), i, dtype=np.int64)
            tensor = httpclient.InferInput("INPUT0", [1, 3], "INT64")
            tensor.set_data_from_numpy(data)
            pending.append((data, client.async_infer("id_int64", [tensor])))
        for data, request in pending:
            assert request.get_result(timeout=30).as_numpy("OUTPUT0").tolist() == data.tolist()
    finally:
        client.close()


# ------------------------------------------------------------------------------------ HTTP framing


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """The head and body of one HTTP response with a content-length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(_header(head, b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def _header(head: bytes, name: bytes) -> bytes:
    return next(line.split(b":")[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(name + b":"))


def test_chunked_request_body(infer_server: Any) -> None:
    raw = np.arange(8, dtype=np.float32).tobytes()
    host, port = infer_server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (raw[:5], raw[5:])) + b"0\r\n\r\n"
        sock.sendall(b"POST /v2/models/id_fp32/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Inference-Header-Content-Length: 0\r\n\r\n" + chunks)
        head, body = _read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(_header(head, b"inference-header-content-length"))
    assert body[length:] == raw


def test_pipelined_requests_are_answered_in_order(infer_server: Any) -> None:
    host, port = infer_server.url.rsplit(":", 1)
    requests = b""
    for k in range(4):
        document = json.dumps({"id": str(k), "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [k]}]}).encode()
        requests += (b"POST /v2/models/id_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                     % len(document) + document)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(requests)
        stream = sock.makefile("rb")  # the answers may come in one read: keep what follows each
        answers = [json.loads(_read_buffered_response(stream)) for _ in range(4)]
    assert [(a["id"], a["outputs"][0]["data"]) for a in answers] == [(str(k), [float(k)]) for k in range(4)]


def _read_buffered_response(stream: Any) -> bytes:
    """The body of the next HTTP response (with a content-length) on a buffered reader."""
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return stream.read(length)


def test_expect_100_continue_is_answered(infer_server: Any) -> None:
    """curl sends `Expect: 100-continue` for bodies over 1 MiB and waits a second for the interim
    answer before sending the body anyway; Triton (libevhtp) answers it at once."""
    document = json.dumps(fp32_request()).encode()
    host, port = infer_server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=1) as sock:
        sock.sendall(b"POST /v2/models/id_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                     b"Expect: 100-continue\r\n\r\n" % len(document))
        try:
            interim = sock.recv(1024)
        except TimeoutError:
            interim = b""
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n"), interim
        sock.settimeout(5)
        sock.sendall(document)
        head, body = _read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 ") and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_http_infer_refuses_a_decoupled_model_with_501(infer_server: Any) -> None:
    request = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}
    answer = post_infer(infer_server.url, "repeat_int32", request)
    assert answer.status == 501
    assert answer.error() == "HTTP end point doesn't support models with decoupled transaction policy"
    assert_serves(infer_server.url)
