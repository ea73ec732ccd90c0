"""Every datatype through identity models, JSON and binary both ways (SPEC §1.2, §1.3, §3)."""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from e2e.infer_models import DATATYPES, assert_serves, identity_name, post_infer, sample, split_binary
from e2e.infer_models import infer_server as infer_server  # the fixture

pytestmark = pytest.mark.e2e

ALL = list(DATATYPES)
FLOATS = ["FP16", "FP32", "FP64", "BF16"]


@pytest.fixture
def client(infer_server: Any) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(infer_server.url)


def _infer(client: httpclient.InferenceServerClient, datatype: str, data: np.ndarray, batched: bool,
           binary_in: bool, binary_out: bool | None) -> httpclient.InferResult:
    """One identity request; binary_out None asks for no output in particular."""
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary_in)
    outputs = None if binary_out is None else [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)]
    return client.infer(identity_name(datatype, batched), [tensor], outputs=outputs)


def _assert_same(datatype: str, got: np.ndarray, want: np.ndarray, json_out: bool) -> None:
    assert got.shape == want.shape
    if datatype == "BYTES":
        # tritonclient turns JSON strings into str and binary elements into bytes.
        items = [s.encode() for s in got.flat] if json_out else list(got.flat)
        assert items == list(want.flat)
        return
    assert got.dtype == want.dtype
    if datatype == "BF16":
        assert got.view(np.uint16).tolist() == want.view(np.uint16).tolist()
    else:
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("datatype", ALL)
def test_round_trip_json_and_binary(client: Any, datatype: str) -> None:
    for batched, shape in ((True, (3, 5)), (False, (7,))):
        data = sample(datatype, shape)
        for binary_in in (True, False):
            if datatype == "BF16" and not binary_in:
                continue  # tritonclient refuses BF16 as JSON (see test_bf16_json_input)
            for binary_out in (True, False):
                result = _infer(client, datatype, data, batched, binary_in, binary_out)
                output = result.get_output("OUTPUT0")
                where = f"{datatype} batched={batched} binary_in={binary_in} binary_out={binary_out}"
                assert output["datatype"] == datatype, where
                assert output["shape"] == list(shape), where
                # Binary outputs carry only their size; JSON outputs no parameters at all.
                if binary_out:
                    assert output["parameters"] == {"binary_data_size": len(_wire(datatype, data))}, where
                    assert "data" not in output, where
                else:
                    assert "parameters" not in output and "data" in output, where
                _assert_same(datatype, result.as_numpy("OUTPUT0"), data, json_out=not binary_out)


def _wire(datatype: str, data: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in data.flat)
    return data.tobytes()


@pytest.mark.parametrize("datatype", ALL)
def test_binary_data_output_default_makes_every_output_binary(client: Any, infer_server: Any, datatype: str) -> None:
    data = sample(datatype, (2, 4))
    # tritonclient sets binary_data_output when no outputs are listed.
    result = _infer(client, datatype, data, True, True, None)
    assert result.get_output("OUTPUT0")["parameters"] == {"binary_data_size": len(_wire(datatype, data))}
    _assert_same(datatype, result.as_numpy("OUTPUT0"), data, json_out=False)


def test_binary_data_output_raw_http(infer_server: Any) -> None:
    request = {"inputs": [{"name": "INPUT0", "datatype": "INT16", "shape": [1, 3], "data": [1, -2, 3]}]}
    plain = post_infer(infer_server.url, "id_int16", request)
    assert (plain.status, plain.headers["content-type"]) == (200, "application/json")
    assert "inference-header-content-length" not in plain.headers
    assert plain.json()["outputs"] == [{"name": "OUTPUT0", "datatype": "INT16", "shape": [1, 3], "data": [1, -2, 3]}]

    for flag, binary in ((True, True), (False, False)):
        answer = post_infer(infer_server.url, "id_int16", {**request, "parameters": {"binary_data_output": flag}})
        assert answer.status == 200
        if binary:
            assert answer.headers["content-type"] == "application/octet-stream"
            header, blob = split_binary(answer)
            assert header["outputs"][0]["parameters"] == {"binary_data_size": 6}
            assert blob == np.array([1, -2, 3], np.int16).tobytes()
            assert int(answer.headers["content-length"]) == len(answer.body)
        else:
            assert answer.json()["outputs"][0]["data"] == [1, -2, 3]


def test_mixed_json_and_binary_in_one_request(client: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    result = client.infer("simple", inputs, outputs=outputs, model_version="1")
    first, second = result.get_response()["outputs"]
    assert first["data"] == (a + b).ravel().tolist() and "parameters" not in first
    assert second["parameters"] == {"binary_data_size": 64} and "data" not in second
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


@pytest.mark.parametrize("datatype", ALL)
def test_empty_tensors(client: Any, datatype: str) -> None:
    for batched, shape in ((True, (1, 0)), (True, (3, 0)), (False, (0,))):
        data = sample(datatype, shape)
        for binary_in in (True, False):
            if datatype == "BF16" and not binary_in:
                continue
            for binary_out in (True, False):
                result = _infer(client, datatype, data, batched, binary_in, binary_out)
                output = result.get_output("OUTPUT0")
                assert output["shape"] == list(shape)
                if binary_out:
                    assert output["parameters"] == {"binary_data_size": 0}
                else:
                    assert output["data"] == []
                got = result.as_numpy("OUTPUT0")
                assert got.shape == shape and got.size == 0


def test_bytes_keep_nul_and_utf8(client: Any) -> None:
    words = [b"", b"\x00", b"a\x00b\x00", "na\u00efve \u00e9t\u00e9 \u2603 \U0001f600".encode(), b"\x00\x00\x00\x00"]
    data = np.array(words, dtype=np.object_).reshape(1, -1)
    for binary_in in (True, False):
        for binary_out in (True, False):
            got = _infer(client, "BYTES", data, True, binary_in, binary_out).as_numpy("OUTPUT0")
            _assert_same("BYTES", got, data, json_out=not binary_out)
    # A str array goes out as UTF-8 and comes back as the same bytes.
    text = np.array([["\u00e9", "\u4e2d\u6587", "x"]], dtype=np.object_)
    got = _infer(client, "BYTES", text, True, True, True).as_numpy("OUTPUT0")
    assert got.tolist() == [[s.encode() for s in text[0]]]


def test_bytes_json_raw_http_non_ascii(infer_server: Any) -> None:
    words = ["\u00e9\u00e8", "\u2603", "a\u0000b", ""]
    request = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 2], "data": [words[:2], words[2:]]}]}
    answer = post_infer(infer_server.url, "id_bytes", request)
    assert answer.status == 200, answer.body
    assert answer.json()["outputs"][0] == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [2, 2], "data": words}


def test_bytes_that_are_not_utf8_are_refused_by_onnxruntime(client: Any, infer_server: Any) -> None:
    data = np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_)
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, "BYTES", data, True, True, True)
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        "input 'INPUT0' holds BYTES that are not valid UTF-8, which the onnxruntime backend cannot pass "
        "to a string tensor"
    )
    assert_serves(infer_server.url)


def test_bf16_uses_ml_dtypes_in_tritonclient(client: Any) -> None:
    data = np.array([[1.0, -2.5, 0.0, 3.140625]], dtype=ml_dtypes.bfloat16)
    for binary_out in (True, False):
        got = _infer(client, "BF16", data, True, True, binary_out).as_numpy("OUTPUT0")
        assert got.dtype == ml_dtypes.bfloat16
        assert got.view(np.uint16).tolist() == data.view(np.uint16).tolist()
    # The pre-r26.06 float32-backed form is refused by the installed client, before any request.
    tensor = httpclient.InferInput("INPUT0", [1, 2], "BF16")
    with pytest.raises(InferenceServerException, match=r"BF16 inputs must use ml_dtypes\.bfloat16"):
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))


def test_bf16_json_input(client: Any, infer_server: Any) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 2], "BF16")
    with pytest.raises(InferenceServerException, match="BF16 inputs must be sent as binary data over HTTP"):
        tensor.set_data_from_numpy(np.ones((1, 2), ml_dtypes.bfloat16), binary_data=False)
    # naiad itself takes JSON numbers for BF16 and rounds them to nearest even.
    request = {"inputs": [{"name": "INPUT0", "datatype": "BF16", "shape": [1, 3], "data": [1.0, 1.00390625, -3.5]}],
               "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    header, blob = split_binary(post_infer(infer_server.url, "id_bf16", request))
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 6}
    assert np.frombuffer(blob, np.uint16).tolist() == [0x3F80, 0x3F80, 0xC060]


@pytest.mark.parametrize("datatype", FLOATS)
def test_non_finite_floats(client: Any, datatype: str) -> None:
    dtype = ml_dtypes.bfloat16 if datatype == "BF16" else np.dtype(datatype.replace("FP", "float"))
    data = np.array([[np.nan, np.inf, -np.inf, -0.0, 1.5]], dtype=dtype)
    for binary_out in (True, False):
        got = _infer(client, datatype, data, True, True, binary_out).as_numpy("OUTPUT0").astype(np.float64)
        assert np.isnan(got[0, 0]) and got[0, 1:].tolist() == [np.inf, -np.inf, 0.0, 1.5]
        assert np.signbit(got[0, 3])


def test_integer_limits_in_json(infer_server: Any) -> None:
    for datatype in ("INT64", "UINT64", "INT8", "UINT32"):
        info = np.iinfo(np.dtype(datatype.lower()))
        values = [int(info.min), int(info.max), 0]
        request = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 3], "data": values}]}
        answer = post_infer(infer_server.url, identity_name(datatype), request)
        assert answer.status == 200, answer.body
        assert answer.json()["outputs"][0]["data"] == values
