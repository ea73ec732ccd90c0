"""Ragged batching end to end: requests of different lengths batch together and a real ONNX
model uses the BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO descriptor to sum each one apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from e2e.concurrency import in_threads
from e2e.repo_builder import write_model

CONFIG = """
name: "ragged_sum"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "INDEX"
                data_type: TYPE_INT32 source_input: "INPUT" } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 2000000 }
"""


def _segment_sum_model(path: Path) -> None:
    """SUM[b] = INPUT[INDEX[b]:INDEX[b+1]].sum(), from a prefix sum with a leading zero."""
    const = helper.make_tensor
    nodes = [
        helper.make_node("CumSum", ["INPUT", "axis"], ["cumsum"]),
        helper.make_node("Concat", ["zero", "cumsum"], ["prefix"], axis=0),
        helper.make_node("Gather", ["prefix", "INDEX"], ["at"]),
        helper.make_node("Slice", ["at", "one", "big"], ["ends"]),
        helper.make_node("Slice", ["at", "zero_i", "minus_one"], ["starts"]),
        helper.make_node("Sub", ["ends", "starts"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "one"], ["SUM"]),
    ]
    initializers = [
        const("axis", TensorProto.INT64, [], [0]), const("zero", TensorProto.FLOAT, [1], [0.0]),
        const("one", TensorProto.INT64, [1], [1]), const("big", TensorProto.INT64, [1], [2**62]),
        const("zero_i", TensorProto.INT64, [1], [0]), const("minus_one", TensorProto.INT64, [1], [-1]),
    ]
    graph = helper.make_graph(
        nodes, "ragged_sum",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["b1"])],
        [helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["b", 1])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import running_server

    repo = tmp_path_factory.mktemp("ragged")
    write_model(repo, "ragged_sum", CONFIG, {1: _segment_sum_model})
    with running_server(["--model-repository", str(repo)], repo / "naiad.log") as running:
        yield running


def _sum(url: str, values: list[float]) -> float:
    tensor = httpclient.InferInput("INPUT", [1, len(values)], "FP32")
    tensor.set_data_from_numpy(np.array([values], dtype=np.float32))
    with httpclient.InferenceServerClient(url) as client:
        return float(client.infer("ragged_sum", [tensor]).as_numpy("SUM")[0, 0])


def test_requests_of_different_lengths_batch_together_and_each_gets_its_own_sum(server: Any) -> None:
    rows = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0], [100.0] * 5]
    results = in_threads(*[lambda row=row: _sum(server.url, row) for row in rows])
    assert results == [6.0, 100.0, 500.0]
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("ragged_sum")["model_stats"][0]
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(3, 1)]
