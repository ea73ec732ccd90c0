"""The one model every backend serves in the conformance suite and the backend benchmark: a
small MLP, FP32 [batch, 16] -> relu(x W1 + b1) W2 + b2 -> FP32 [batch, 8], with fixed weights
so that each backend's answer can be checked against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

IN, HIDDEN, OUT = 16, 32, 8


def resize(inputs: int, hidden: int, outputs: int) -> None:
    """Change the MLP's sizes for what is written next (bench/framework_backends.py serves a
    larger one, so that the framework's compute, not the server, dominates). Writers read the
    sizes when they run."""
    global IN, HIDDEN, OUT
    IN, HIDDEN, OUT = inputs, hidden, outputs


def weights(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.standard_normal((IN, HIDDEN)).astype(np.float32) / 4,
        "b1": rng.standard_normal(HIDDEN).astype(np.float32) / 4,
        "w2": rng.standard_normal((HIDDEN, OUT)).astype(np.float32) / 4,
        "b2": rng.standard_normal(OUT).astype(np.float32) / 4,
    }


def reference(x: np.ndarray, w: dict[str, np.ndarray] | None = None) -> np.ndarray:
    w = w or weights()
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]


def save_npz(path: Path) -> Path:
    """The weights as an .npz file (for backends that read them at load: python, the C example)."""
    np.savez(path, **weights())
    return path


def write_onnx(path: Path, input_name: str = "INPUT0", output_name: str = "OUTPUT0") -> Path:
    """The MLP as an ONNX graph (the onnxruntime case; OpenVINO can read it too)."""
    import build_models
    from onnx import TensorProto, helper, numpy_helper

    w = weights()
    initializers = [numpy_helper.from_array(w[name], name) for name in ("w1", "b1", "w2", "b2")]
    nodes = [
        helper.make_node("MatMul", [input_name, "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["o0"]),
        helper.make_node("Add", ["o0", "b2"], [output_name]),
    ]
    inputs = [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", IN])]
    outputs = [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", OUT])]
    graph = helper.make_graph(nodes, "mlp", inputs, outputs, initializers)
    return build_models._finish(graph, path)
