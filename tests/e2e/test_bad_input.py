"""Bad inference requests: each gets its status code and message, and the server keeps serving
(SPEC §0, §1.1, §1.3, §1.4, §3)."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from typing import Any, NamedTuple

import numpy as np
import pytest

from e2e.infer_models import MAX_INPUT_SIZE, assert_serves, fp32_request, infer_path, post_infer
from e2e.infer_models import infer_server as infer_server  # the fixture
from e2e.raw_http import post

pytestmark = pytest.mark.e2e

PREFIX = "[request id: <id_unknown>] "
NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)
NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"


class Case(NamedTuple):
    model: str
    body: Any  # a JSON document, or bytes sent as they are
    status: int
    message: str
    binary: bytes = b""
    headers: dict[str, str] | None = None
    version: int | None = None
    prefix_only: bool = False  # the message tail comes from a third-party parser


def _bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _binary_input(datatype: str, shape: list[int], size: int, name: str = "INPUT0") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}


def _simple(*names: str) -> dict[str, Any]:
    return {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16} for n in names]}


_GOOD = fp32_request()
_GOOD_JSON = json.dumps(_GOOD).encode()

CASES: dict[str, Case] = {
    # ---------------------------------------------------------------- shape and datatype
    "shape rank": Case("id_fp32", fp32_request(shape=[3]), 400,
                       PREFIX + "unexpected shape for input 'INPUT0' for model 'id_fp32'. Expected [-1,-1], got [3]."
                       + NOTE),
    "shape fixed dim": Case("classify", fp32_request(values=[1.0] * 4), 400,
                            PREFIX + "unexpected shape for input 'INPUT0' for model 'classify'. Expected [-1,5], "
                            "got [1,4]." + NOTE),
    "shape non-batched": Case("idnb_fp32", fp32_request(), 400,
                              PREFIX + "unexpected shape for input 'INPUT0' for model 'idnb_fp32'. Expected [-1], "
                              "got [1,3]. "),
    "datatype": Case("id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]},
                     400, PREFIX + "inference input 'INPUT0' data-type is 'INT32', but model 'id_fp32' expects 'FP32'"),
    "unknown datatype": Case("id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "FP8", "shape": [1], "data": [1]}]},
                             400, "invalid datatype for input INPUT0"),
    "negative shape": Case("id_fp32", fp32_request(shape=[1, -3]), 500,
                           f"Unable to parse 'shape': {NOT_UINT} for input 'INPUT0'"),
    "fractional shape": Case("id_fp32", fp32_request(shape=[1, 1.5]), 500,
                             f"Unable to parse 'shape': {NOT_UINT} for input 'INPUT0'"),
    "element count overflow": Case("id_fp32", fp32_request(shape=[2**4, 2**60 + 2]), 400,
                                   "The shape [16,1152921504606846978] of input 'INPUT0' for model 'id_fp32' causes "
                                   "total element count to exceed maximum size of 9223372036854775807"),
    "element count overflow 2": Case("id_fp32", fp32_request(shape=[2**40, 2**40]), 400,
                                     "The shape [1099511627776,1099511627776] of input 'INPUT0' for model 'id_fp32' "
                                     "causes total element count to exceed maximum size of 9223372036854775807"),
    "byte size overflow": Case("id_fp32", fp32_request(shape=[2**2, 2**60 + 2]), 400,
                               "byte size overflow for input 'INPUT0' for model 'id_fp32'"),
    "batch over max": Case("id_fp32", fp32_request(values=[1.0] * 9, shape=[9, 1]), 400,
                           PREFIX + "inference request batch-size must be <= 8 for 'id_fp32'"),
    "batch zero": Case("id_fp32", fp32_request(values=[], shape=[0, 1]), 400,
                       PREFIX + "inference request batch-size must be >= 1 for 'id_fp32'"),
    "batch sizes differ": Case("simple", {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "data": [1] * 32}]}, 400,
        PREFIX + "input 'INPUT1' batch size does not match other inputs for 'simple'"),
    # ---------------------------------------------------------------- JSON data
    "data count short": Case("id_fp32", fp32_request(shape=[1, 4]), 400,
                             "Unable to parse 'data': Shape does not match true shape of 'data' field for input "
                             "'INPUT0' (shape [1,4] has 4 elements, 'data' has 3)"),
    "data count long": Case("id_fp32", fp32_request(shape=[1, 2]), 400,
                            "Unable to parse 'data': Shape does not match true shape of 'data' field for input "
                            "'INPUT0' (shape [1,2] has 2 elements, 'data' has 3)"),
    "data ragged": Case("id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2],
                                                "data": [[1, 2], [3]]}]}, 400,
                        "Unable to parse 'data': Shape does not match true shape of 'data' field for input "
                        "'INPUT0' (shape [2,2] has 4 elements, 'data' has 3)"),
    "string count json": Case("id_bytes", {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 3],
                                                       "data": ["a", "b"]}]}, 400,
                              "Unable to parse 'data': Shape does not match true shape of 'data' field for input "
                              "'INPUT0' (shape [1,3] has 3 elements, 'data' has 2)"),
    "data not array": Case("id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1],
                                                   "data": 1.0}]}, 400,
                           "Unable to parse 'data': attempt to access JSON non-array as array for input 'INPUT0'"),
    "bool as int": Case("id_bool", {"inputs": [{"name": "INPUT0", "datatype": "BOOL", "shape": [1, 1], "data": [1]}]},
                        400,
                        "Unable to parse 'data': attempt to access JSON non-boolean as boolean for input 'INPUT0'"),
    "uint8 out of range": Case("id_uint8", {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, 1],
                                                        "data": [256]}]}, 400,
                               "Unable to parse 'data': value 256 is out of range for UINT8 for input 'INPUT0'"),
    "int64 out of range": Case("id_int64", {"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1, 2],
                                                        "data": [1, 2**63]}]}, 400,
                               "Unable to parse 'data': value 9223372036854775808 is out of range for INT64 for input "
                               "'INPUT0'"),
    "unsigned negative": Case("id_uint32", {"inputs": [{"name": "INPUT0", "datatype": "UINT32", "shape": [1, 1],
                                                        "data": [-1]}]}, 400,
                              f"Unable to parse 'data': {NOT_UINT} for input 'INPUT0'"),
    "string as number": Case("id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1],
                                                     "data": ["1.0"]}]}, 400,
                             "Unable to parse 'data': attempt to access JSON non-number as double for input 'INPUT0'"),
    "number as string": Case("id_bytes", {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1],
                                                      "data": [1]}]}, 400,
                             "Unable to parse 'data': attempt to access JSON non-string as string for input 'INPUT0'"),
    "no data field": Case("id_fp32", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1]}]}, 400,
                          "Input must set only one of the following fields: 'data', 'binary_data_size' in "
                          "'parameters', 'shared_memory_region' in 'parameters'. But no field is set"),
    # ---------------------------------------------------------------- inputs and outputs
    "missing input": Case("simple", _simple("INPUT0"), 400,
                          PREFIX + "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
                          "but missing required input(s) ['INPUT1']. Please provide all required input(s)."),
    "no inputs": Case("simple", {"inputs": []}, 400,
                      PREFIX + "expected 2 inputs but got 0 inputs for model 'simple'. Got input(s) [], but missing "
                      "required input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."),
    "extra input": Case("simple", _simple("INPUT0", "INPUT1", "INPUT2"), 400,
                        PREFIX + "unexpected inference input 'INPUT2' for model 'simple'"),
    "duplicate input": Case("simple", _simple("INPUT0", "INPUT0", "INPUT1"), 400,
                            "input 'INPUT0' already exists in request"),
    "unknown output": Case("id_fp32", {**_GOOD, "outputs": [{"name": "OUTPUT9"}]}, 400,
                           PREFIX + "unexpected inference output 'OUTPUT9' for model 'id_fp32'"),
    "duplicate output": Case("id_fp32", {**_GOOD, "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]}, 400,
                             "output 'OUTPUT0' already exists in request"),
    "negative classification": Case("classify", {**fp32_request(values=[1.0] * 5), "outputs": [
        {"name": "OUTPUT0", "parameters": {"classification": -2}}]}, 400,
        f"Unable to set 'classification': {NOT_UINT}"),
    # ---------------------------------------------------------------- models and versions
    "unknown model": Case("nope", _GOOD, 404, "Request for unknown model: 'nope' is not found"),
    "unknown version": Case("simple", _simple("INPUT0", "INPUT1"), 404,
                            "Request for unknown model: 'simple' version 9 is not found", version=9),
    "unknown version of unversioned model": Case("id_fp32", _GOOD, 404,
                                                 "Request for unknown model: 'id_fp32' version 2 is not found",
                                                 version=2),
    # ---------------------------------------------------------------- JSON document
    "malformed JSON": Case("id_fp32", b'{"inputs": [', 400, "failed to parse the request JSON buffer: ",
                           prefix_only=True),
    "empty body": Case("id_fp32", b"", 400, "failed to parse the request JSON buffer: ", prefix_only=True),
    "no inputs member": Case("id_fp32", {"id": "x"}, 400,
                             "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    "document not an object": Case("id_fp32", b"[1, 2]", 400,
                                   "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    "id not a string": Case("id_fp32", {**_GOOD, "id": 7}, 400,
                            "Unable to parse 'id': attempt to access JSON non-string as string"),
    "triton_ parameter": Case("id_fp32", {**_GOOD, "parameters": {"triton_x": 1}}, 400,
                              "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
                              "be specified."),
    "binary_data_output not bool": Case("id_fp32", {**_GOOD, "parameters": {"binary_data_output": 1}}, 400,
                                        "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as "
                                        "boolean"),
    "null parameter": Case("id_fp32", {**_GOOD, "parameters": {"x": None}}, 400,
                           "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
    # ---------------------------------------------------------------- binary payloads
    "byte size mismatch": Case("id_fp32", {"inputs": [_binary_input("FP32", [1, 3], 8)]}, 400,
                               "input byte size mismatch for input 'INPUT0' for model 'id_fp32'. Expected 12, got 8",
                               binary=b"\x00" * 8),
    "truncated binary": Case("id_fp32", {"inputs": [_binary_input("FP32", [1, 3], 12)]}, 400,
                             "unexpected size for input 'INPUT0', expecting 4 additional bytes for model 'id_fp32'",
                             binary=b"\x00" * 8),
    "truncated second input": Case("simple", {"inputs": [_binary_input("INT32", [1, 16], 64),
                                                         _binary_input("INT32", [1, 16], 64, "INPUT1")]}, 400,
                                   "unexpected size for input 'INPUT1', expecting 1 additional bytes for model "
                                   "'simple'", binary=b"\x00" * 127),
    "extra binary bytes": Case("id_fp32", {"inputs": [_binary_input("FP32", [1, 3], 12)]}, 400,
                               "unexpected additional input data for model 'id_fp32'", binary=b"\x00" * 13),
    "binary after JSON-only inputs": Case("id_fp32", _GOOD, 400, "unexpected additional input data for model 'id_fp32'",
                                          binary=b"\x00" * 4),
    "binary without header length": Case("id_fp32", json.dumps({"inputs": [_binary_input("FP32", [1, 1], 4)]}).encode()
                                         + b"\x00" * 4, 400, "failed to parse the request JSON buffer: ",
                                         prefix_only=True),
    "binary size not an integer": Case("id_fp32", {"inputs": [_binary_input("FP32", [1, 1], -4)]}, 400,
                                       f"Unable to parse 'binary_data_size': {NOT_UINT} for input 'INPUT0'",
                                       binary=b"\x00" * 4),
    "data and binary": Case("id_fp32", {"inputs": [{**_binary_input("FP32", [1, 1], 4), "data": [1.0]}]}, 400,
                            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
                            "'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'",
                            binary=b"\x00" * 4),
    # ---------------------------------------------------------------- BYTES length prefixes
    "bytes prefix cut": Case("id_bytes", {"inputs": [_binary_input("BYTES", [1, 2], 7)]}, 400,
                             "element byte size indicator exceeds the end of the buffer for inference input 'INPUT0' "
                             "for model 'id_bytes'", binary=_bytes_elements(b"a") + b"\x01\x00"),
    "bytes length past end": Case("id_bytes", {"inputs": [_binary_input("BYTES", [1, 2], 11)]}, 400,
                                  "incomplete string data for inference input 'INPUT0' for model 'id_bytes', expecting "
                                  "string of length 100 but only 2 bytes available",
                                  binary=_bytes_elements(b"a") + struct.pack("<I", 100) + b"xy"),
    "bytes huge length": Case("id_bytes", {"inputs": [_binary_input("BYTES", [1, 1], 8)]}, 400,
                              "incomplete string data for inference input 'INPUT0' for model 'id_bytes', expecting "
                              "string of length 4294967295 but only 4 bytes available",
                              binary=b"\xff\xff\xff\xffabcd"),
    "bytes too few": Case("id_bytes", {"inputs": [_binary_input("BYTES", [1, 3], 10)]}, 400,
                          "expected 3 string elements for inference input 'INPUT0' for model 'id_bytes', got 2",
                          binary=_bytes_elements(b"a", b"b")),
    "bytes too many": Case("id_bytes", {"inputs": [_binary_input("BYTES", [1, 1], 10)]}, 400,
                           "unexpected number of string elements 2 for inference input 'INPUT0' for model 'id_bytes', "
                           "expecting 1", binary=_bytes_elements(b"a", b"b")),
    "string count simple_string": Case("simple_string", {"inputs": [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 16], "data": ["1"] * 16},
        _binary_input("BYTES", [1, 16], 14 * 5, "INPUT1")]}, 400,
        "expected 16 string elements for inference input 'INPUT1' for model 'simple_string', got 14",
        binary=_bytes_elements(*[b"1"] * 14)),
    # ---------------------------------------------------------------- Inference-Header-Content-Length
    "header length negative": Case("id_fp32", _GOOD_JSON, 400,
                                   f"inference header size should be in range (0, {len(_GOOD_JSON)}), got: -1",
                                   headers={"Inference-Header-Content-Length": "-1"}),
    "header length past body": Case("id_fp32", _GOOD_JSON, 400,
                                    f"inference header size should be in range (0, {len(_GOOD_JSON)}), got: 100000",
                                    headers={"Inference-Header-Content-Length": "100000"}),
    "header length huge": Case("id_fp32", _GOOD_JSON, 400,
                               f"inference header size should be in range (0, {len(_GOOD_JSON)}), got: "
                               "99999999999999999999999",
                               headers={"Inference-Header-Content-Length": "99999999999999999999999"}),
    "header length not a number": Case("id_fp32", _GOOD_JSON, 400, "Unable to parse inference header size, got: abc",
                                       headers={"Inference-Header-Content-Length": "abc"}),
    "header length cuts the JSON": Case("id_fp32", _GOOD_JSON, 400, "failed to parse the request JSON buffer: ",
                                        headers={"Inference-Header-Content-Length": str(len(_GOOD_JSON) - 1)},
                                        prefix_only=True),
    # ---------------------------------------------------------------- Content-Encoding
    "gzip garbage": Case("id_fp32", b"this is not gzip", 400, "failed to decompress the request body with 'gzip'",
                         headers={"Content-Encoding": "gzip"}),
    "gzip truncated": Case("id_fp32", gzip.compress(_GOOD_JSON)[:-12], 400,
                           "failed to decompress the request body with 'gzip'", headers={"Content-Encoding": "gzip"}),
    "deflate garbage": Case("id_fp32", b"this is not deflate", 400,
                            "failed to decompress the request body with 'deflate'",
                            headers={"Content-Encoding": "deflate"}),
    "gzip of garbage JSON": Case("id_fp32", gzip.compress(b"{nope"), 400, "failed to parse the request JSON buffer: ",
                                 headers={"Content-Encoding": "gzip"}, prefix_only=True),
    "gzip bomb": Case("id_fp32", gzip.compress(b"\x00" * (MAX_INPUT_SIZE + 1)), 400,
                      f"decompressed request body exceeds the maximum of {MAX_INPUT_SIZE} bytes",
                      headers={"Content-Encoding": "gzip"}),
    "unsupported encoding": Case("id_fp32", _GOOD_JSON, 400, "unsupported Content-Encoding 'br'",
                                 headers={"Content-Encoding": "br"}),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_request(infer_server: Any, case: Case) -> None:
    answer = post_infer(infer_server.url, case.model, case.body, case.binary, case.version, case.headers)
    assert answer.status == case.status, answer.body
    message = answer.error()
    if case.prefix_only:
        assert message.startswith(case.message) and len(message) > len(case.message), message
    else:
        assert message == case.message
    assert_serves(infer_server.url)


def test_bad_raw_request_gzip(infer_server: Any) -> None:
    """A raw binary request may be compressed too; a broken stream is refused."""
    values = np.arange(3, dtype=np.float32).tobytes()
    headers = {"Inference-Header-Content-Length": "0", "Content-Encoding": "deflate"}
    answer = post(infer_server.url, infer_path("id_fp32"), zlib.compress(values), headers)
    assert answer.status == 200, answer.body
    answer = post(infer_server.url, infer_path("id_fp32"), zlib.compress(values)[:-3], headers)
    assert (answer.status, answer.error()) == (400, "failed to decompress the request body with 'deflate'")
    assert_serves(infer_server.url)


def test_body_over_max_input_size(infer_server: Any) -> None:
    body = _GOOD_JSON + b" " * (MAX_INPUT_SIZE + 1 - len(_GOOD_JSON))
    answer = post(infer_server.url, infer_path("id_fp32"), body)
    assert (answer.status, answer.error()) == (
        400, f"request body size exceeds the maximum allowed value of {MAX_INPUT_SIZE} bytes; "
        "use --http-max-input-size to increase the limit")
    # A body of exactly the limit is fine.
    answer = post(infer_server.url, infer_path("id_fp32"), body[:-1])
    assert answer.status == 200, answer.body
    assert_serves(infer_server.url)


def test_error_bodies_are_json_and_never_compressed(infer_server: Any) -> None:
    """tritonclient.http.aio sends Accept-Encoding: gzip on every call but inflates only successful
    inference responses, as Triton compresses nothing else."""
    answer = post_infer(infer_server.url, "nope", _GOOD, headers={"Accept-Encoding": "gzip, deflate"})
    assert answer.status == 404 and "content-encoding" not in answer.headers
    assert answer.error() == "Request for unknown model: 'nope' is not found"
    answer = post_infer(infer_server.url, "id_fp32", _GOOD, headers={"Accept-Encoding": "gzip"})
    assert answer.status == 200 and answer.headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(answer.body))["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_server_survives_a_burst_of_bad_requests(infer_server: Any) -> None:
    for case in list(CASES.values())[::3]:
        post_infer(infer_server.url, case.model, case.body, case.binary, case.version, case.headers)
    assert_serves(infer_server.url)
    assert infer_server.process.poll() is None
    # Bad requests are answered, never logged as server failures.
    log = infer_server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
