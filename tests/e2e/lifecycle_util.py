"""Helpers for the endpoint and lifecycle e2e tests: raw HTTP, bounded waits, small ONNX models,
and repository edits that a polling server never sees half-done."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import build_models
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from e2e.raw_http import post_json
from e2e.repo_builder import write_model


def wait_for(condition: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def index_by_name(url: str) -> dict[str, list[dict[str, Any]]]:
    """The repository index grouped by model name."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for entry in post_json(url, "/v2/repository/index", {}).json():
        grouped.setdefault(entry["name"], []).append(entry)
    return grouped


# ------------------------------------------------------------------------------------- models

TAGGED_CONFIG = """
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
{extra}
"""

SLOW_CONFIG = """
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def tagged_config(extra: str = "") -> str:
    """Config of a `tagged` model; `extra` adds fields such as a version_policy."""
    return TAGGED_CONFIG.format(extra=extra)


def tagged(tag: int) -> Callable[[Path], None]:
    """A writer of OUTPUT0 = INPUT0 + tag (INT32 [batch, 4]): the answer tells which file served."""

    def write(path: Path) -> None:
        graph = helper.make_graph(
            [helper.make_node("Add", ["INPUT0", "TAG"], ["OUTPUT0"])],
            f"tagged_{tag}",
            [helper.make_tensor_value_info("INPUT0", TensorProto.INT32, ["batch", 4])],
            [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, ["batch", 4])],
            initializer=[numpy_helper.from_array(np.array([tag], np.int32), "TAG")],
        )
        build_models._finish(graph, path)

    return write


def broken(path: Path) -> None:
    """A model file onnxruntime cannot parse."""
    path.write_bytes(b"this is not an onnx model")


def slow(path: Path, size: int = 256) -> None:
    """OUT = sum(tanh(S @ W) applied N times): the input N sets how long one request computes."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["s_in", "W"], ["product"]),
            helper.make_node("Tanh", ["product"], ["s_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "step",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [size, size]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [size, size]),
        ],
    )
    weights = np.eye(size, dtype=np.float32) * 0.5 + 0.01
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["N", "scalar"], ["trips"]),
            helper.make_node("Loop", ["trips", "keep_going", "S0"], ["S"], body=body),
            helper.make_node("ReduceSum", ["S"], ["total"], keepdims=0),
            helper.make_node("Reshape", ["total", "one"], ["OUT"]),
        ],
        "slow",
        [helper.make_tensor_value_info("N", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, [1])],
        initializer=[
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(np.ones((size, size), np.float32), "S0"),
            numpy_helper.from_array(np.array(True), "keep_going"),
            numpy_helper.from_array(np.array([], np.int64), "scalar"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
        ],
    )
    build_models._finish(graph, path)


# --------------------------------------------------------------------- atomic repository edits


def add_model(repo: Path, name: str, config: str | None, versions: dict[int, Callable[[Path], None]]) -> Path:
    """Build the model under a hidden name (ignored by discovery), then rename it into place."""
    staging = write_model(repo, f".staging-{name}", config, versions)
    target = repo / name
    os.replace(staging, target)
    return target


def add_version(model_dir: Path, version: int, writer: Callable[[Path], None]) -> None:
    """Write a version under a non-numeric name (ignored), then rename it to its number."""
    staging = model_dir / f"staging-{version}"
    staging.mkdir()
    writer(staging / "model.onnx")
    os.replace(staging, model_dir / str(version))


def replace_file(path: Path, writer: Callable[[Path], None]) -> None:
    """Write next to `path`, then rename over it."""
    staging = path.with_name(f".staging-{path.name}")
    writer(staging)
    os.replace(staging, path)


def write_text_atomic(path: Path, text: str) -> None:
    replace_file(path, lambda staging: staging.write_text(text))


def remove_model(repo: Path, name: str) -> None:
    """Hide the model in one rename, then delete it."""
    hidden = repo / f".removed-{name}"
    os.replace(repo / name, hidden)
    shutil.rmtree(hidden)
