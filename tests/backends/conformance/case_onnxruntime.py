"""onnxruntime in the conformance suite: the MLP and the identities as ONNX graphs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from backends.conformance import mlp
from backends.conformance.cases import ALL_DATATYPES, BackendCase


def _mlp(version: Path) -> None:
    mlp.write_onnx(version / "model.onnx")


def _identity(version: Path, datatype: str) -> None:
    import build_models
    from onnx import TensorProto

    elem = TensorProto.STRING if datatype == "BYTES" else getattr(TensorProto, {
        "FP16": "FLOAT16", "FP32": "FLOAT", "FP64": "DOUBLE"}.get(datatype, datatype))
    build_models.identity(version / "model.onnx", elem)


def in_process_onnxruntime(version: Path) -> Callable[[np.ndarray], np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # as naiad's instance runs it by default
    session = ort.InferenceSession(str(version / "model.onnx"), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"INPUT0": x})[0]


CASES = [BackendCase("onnxruntime", "onnxruntime", "onnxruntime_onnx", _mlp, write_identity=_identity,
                     datatypes=ALL_DATATYPES, autocomplete=True, requires=("onnxruntime",),
                     in_process=in_process_onnxruntime)]
