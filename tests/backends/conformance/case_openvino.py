"""openvino in the conformance suite: the MLP converted from ONNX to OpenVINO IR (model.xml +
model.bin), and an identity IR built with OpenVINO's own opset for each datatype.

INT64 is left out of the identities: OpenVINO's CPU plugin computes 64-bit integer inputs in 32 bits
(its compiled graph starts with an i64 -> i32 Convert), so the suite's full-range INT64 values are
refused by the backend (tests/backends/test_openvino.py checks that). UINT64 and FP64 pass through
the Identity op untouched; BYTES goes through a Reshape (see write_identity_ir).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from backends.conformance import mlp
from backends.conformance.cases import ALL_DATATYPES, BackendCase

DATATYPES = tuple(t for t in ALL_DATATYPES if t != "INT64")
_OV_TYPES = {"BOOL": "boolean", "FP16": "f16", "FP32": "f32", "FP64": "f64", "BYTES": "string"}


def write_mlp_ir(version: Path, name: str = "model") -> Path:
    """The suite's MLP as OpenVINO IR, converted from its ONNX graph."""
    import openvino as ov

    onnx_path = mlp.write_onnx(version / f"{name}.source.onnx")
    try:
        # Core.read_model rather than ov.convert_model: the same ONNX frontend, without the
        # converter's usage telemetry (which forks processes that try to reach the network).
        model = ov.Core().read_model(str(onnx_path))
    finally:
        onnx_path.unlink()
    xml = version / f"{name}.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)  # FP16 weights would miss the suite's tolerance
    return xml


def write_identity_ir(version: Path, datatype: str, name: str = "model") -> Path:
    """INPUT0 -> OUTPUT0 unchanged, shape [batch, n], element type of V2 `datatype`."""
    import openvino as ov
    import openvino.opset16 as ops

    element = getattr(ov.Type, _OV_TYPES.get(datatype, datatype.lower().replace("uint", "u").replace("int", "i")))
    parameter = ops.parameter(ov.PartialShape([-1, -1]), element, name="INPUT0")
    parameter.output(0).get_tensor().set_names({"INPUT0"})
    if element == ov.Type.string:
        # The CPU plugin's Identity corrupts the heap on string tensors (a crash at the next free:
        # OpenVINO 2026.4); a Reshape to its own shape passes strings through cleanly.
        passed = ops.reshape(parameter, ops.shape_of(parameter), special_zero=False)
    else:
        passed = ops.identity(parameter)  # unlike Reshape, keeps UINT64 and FP64 exact
    result = ops.result(passed)
    result.input_value(0).get_tensor().set_names({"OUTPUT0"})
    xml = version / f"{name}.xml"
    ov.save_model(ov.Model([result], [parameter], f"identity_{datatype.lower()}"), str(xml))
    return xml


def in_process_openvino(version: Path) -> Callable[[np.ndarray], np.ndarray]:
    """OpenVINO directly on the MLP's IR: one compiled model, one infer request (as one naiad
    instance runs it)."""
    import openvino as ov

    # f32 as naiad compiles it by default (OpenVINO would pick bf16 on CPUs that have it)
    compiled = ov.Core().compile_model(str(version / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()

    def run(x: np.ndarray) -> np.ndarray:
        request.infer({0: x}, share_inputs=True)
        return request.get_output_tensor(0).data.copy()

    return run


def _mlp(version: Path) -> None:
    write_mlp_ir(version)


def _identity(version: Path, datatype: str) -> None:
    write_identity_ir(version, datatype)


CASES = [BackendCase("openvino", "openvino", "openvino", _mlp, model_file="model.xml", write_identity=_identity,
                     datatypes=DATATYPES, autocomplete=True, requires=("openvino",),
                     in_process=in_process_openvino)]
