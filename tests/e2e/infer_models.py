"""The inference e2e tests' model repository and server, plus raw-HTTP helpers.

One repository holds an identity model per datatype (batched `id_<type>` and non-batched
`idnb_<type>`), Triton's `simple` (v1 add/sub, v2 swapped) and `simple_string`, and a few models
shaped for one case each. `infer_server` serves it, one server for all the modules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import build_models
import ml_dtypes
import numpy as np
import pytest
from conftest import ServerProcess
from onnx import TensorProto

from e2e.raw_http import Answer, post
from e2e.repo_builder import write_model

#: V2 datatype name → ONNX element type of its identity model.
DATATYPES: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BF16": TensorProto.BFLOAT16,
    "BYTES": TensorProto.STRING,
}
LABELS = ["zero", "one", "two", "three", "four"]
MAX_BATCH = 8

_IO = """
input [ {{ name: "INPUT0" data_type: {type} dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: {type} dims: {dims} {label} }} ]
"""
_SIMPLE = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: {{ all {{ }} }}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
input [
  {{ name: "INPUT0" data_type: {type} dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: {type} dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: {type} dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: {type} dims: [ 16 ] }}
]
"""


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def identity_name(datatype: str, batched: bool = True) -> str:
    return f"{'id' if batched else 'idnb'}_{datatype.lower()}"


def _identity_config(datatype: str, max_batch_size: int, dims: str = "[ -1 ]", label: str = "",
                     instances: int = 1) -> str:
    head = (f'backend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
            f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n")
    label_line = f'label_filename: "{label}"' if label else ""
    return head + _IO.format(type=config_type(datatype), dims=dims, label=label_line)


def _identity_writer(onnx_type: int, batched: bool) -> Any:
    return lambda path: build_models.identity(path, onnx_type, batched=batched)


def build_repository(repo: Path) -> Path:
    """Write every model the inference e2e tests use into `repo`."""
    for datatype, onnx_type in DATATYPES.items():
        instances = 2 if datatype in ("FP32", "BYTES") else 1
        write_model(repo, identity_name(datatype), _identity_config(datatype, MAX_BATCH, instances=instances),
                    {1: _identity_writer(onnx_type, True)})
        write_model(repo, identity_name(datatype, False), _identity_config(datatype, 0),
                    {1: _identity_writer(onnx_type, False)})
    write_model(repo, "simple", _SIMPLE.format(name="simple", type="TYPE_INT32"),
                {1: build_models.add_sub, 2: lambda p: build_models.add_sub(p, swap=True)})
    write_model(repo, "simple_string", _SIMPLE.format(name="simple_string", type="TYPE_STRING"),
                {1: build_models.string_add_sub})
    # Classification: FP32 [batch, 5] with labels on OUTPUT0.
    classify = write_model(repo, "classify", _identity_config("FP32", MAX_BATCH, "[ 5 ]", "labels.txt"),
                           {1: _identity_writer(TensorProto.FLOAT, True)})
    (classify / "labels.txt").write_text("\n".join(LABELS) + "\n")
    # A raw BYTES request needs input shape [1].
    write_model(repo, "bytes_one", _identity_config("BYTES", MAX_BATCH, "[ 1 ]"),
                {1: _identity_writer(TensorProto.STRING, True)})
    # Two variable dims: a raw request cannot deduce the shape.
    write_model(repo, "fp32_2d", _identity_config("FP32", 0, "[ -1, -1 ]"),
                {1: _identity_writer(TensorProto.FLOAT, True)})
    # A decoupled model (the repeat backend needs no model file).
    write_model(repo, "repeat_int32", REPEAT_CONFIG, {1: lambda path: None})
    return repo


REPEAT_CONFIG = """
name: "repeat_int32"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] optional: true } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""


#: The shared server's --http-max-input-size: small, so an oversized body is cheap to send.
MAX_INPUT_SIZE = 1 << 20
_SHARED: dict[str, ServerProcess] = {}


@pytest.fixture(scope="module")
def infer_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """The server on the inference repository (--http-max-input-size MAX_INPUT_SIZE).

    Module-scoped, but started once for every module that uses it and stopped when the session
    ends: a server start costs more than all of one module's requests.
    """
    server = _SHARED.get("server")
    if server is None or server.process.poll() is not None:
        repo = build_repository(tmp_path_factory.mktemp("infer_repo"))
        args = ["--model-repository", str(repo), "--http-max-input-size", str(MAX_INPUT_SIZE)]
        server = ServerProcess(args, repo.parent / "infer-server.log")
        request.config.add_cleanup(server.stop)
        server.wait_live()
        _SHARED["server"] = server
    return server


# ------------------------------------------------------------------------------------ test data


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic data of `datatype` covering its edge values where the shape allows."""
    count = int(np.prod(shape))
    if datatype == "BOOL":
        return (np.arange(count) % 3 == 0).reshape(shape)
    if datatype == "BYTES":
        words = [b"", b"a\x00b", "h\u00e9llo \u2603 \U0001f600".encode(), b"plain", b"\x00"]
        return np.array([words[i % len(words)] for i in range(count)], dtype=np.object_).reshape(shape)
    if datatype == "BF16":
        values = np.array([1.0, -2.5, 0.0, 3.140625, -0.0078125, 65280.0], dtype=np.float32)
        return np.resize(values, count).astype(ml_dtypes.bfloat16).reshape(shape)
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype)
    if dtype is not None:
        values = np.array([1.5, -2.25, 0.0, 1e4, -3.0e-3, 7.0], dtype=np.float64)
        return np.resize(values, count).astype(dtype).reshape(shape)
    info = np.iinfo(np.dtype(datatype.lower()))
    values = np.array([info.min, info.max, 0, 1, info.max // 3], dtype=np.dtype(datatype.lower()))
    return np.resize(values, count).reshape(shape)


# ------------------------------------------------------------------------------------- raw HTTP


def infer_path(model: str, version: int | None = None) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "") + "/infer"


def post_infer(url: str, model: str, document: Any, binary: bytes = b"", version: int | None = None,
               headers: dict[str, str] | None = None) -> Answer:
    """POST a JSON infer request, followed by `binary` (then with Inference-Header-Content-Length)."""
    header = document if isinstance(document, bytes) else json.dumps(document).encode()
    extra = dict(headers or {})
    if binary:
        extra.setdefault("Inference-Header-Content-Length", str(len(header)))
    return post(url, infer_path(model, version), header + binary, extra)


def split_binary(answer: Answer) -> tuple[dict[str, Any], bytes]:
    """The JSON header and binary section of a binary infer response."""
    length = int(answer.headers["inference-header-content-length"])
    return json.loads(answer.body[:length]), answer.body[length:]


def fp32_request(name: str = "INPUT0", values: list[float] | None = None, shape: list[int] | None = None) -> dict:
    data = values if values is not None else [1.0, 2.0, 3.0]
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": shape or [1, len(data)], "data": data}]}


def assert_serves(url: str) -> None:
    """The server still answers a good request correctly after a bad one."""
    answer = post_infer(url, "id_fp32", fp32_request(values=[4.0, 5.0]))
    assert answer.status == 200, answer.body
    assert answer.json()["outputs"][0]["data"] == [4.0, 5.0]
