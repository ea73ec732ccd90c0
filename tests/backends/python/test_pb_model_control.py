"""pb_utils' model control (pb_model_control) against a fake runtime: load, unload and readiness go
through the runtime, with upstream's checks and messages."""

from __future__ import annotations

import pytest
from backends.python.pb_fakes import FakeRuntime

from naiad.backends.python import pb_utils

E = pb_utils.TritonModelException


def test_model_control_goes_through_the_runtime(runtime: FakeRuntime) -> None:
    pb_utils.load_model("onnx")
    pb_utils.load_model(model_name="onnx", config='{"backend": "onnxruntime"}', files={"file:1/model.onnx": b"\x08"})
    pb_utils.unload_model("onnx", unload_dependents=True)
    assert pb_utils.is_model_ready("onnx") is True
    assert pb_utils.is_model_ready("onnx", model_version="2") is True
    assert runtime.calls == [
        ("load", "onnx", "", None), ("load", "onnx", '{"backend": "onnxruntime"}', {"file:1/model.onnx": b"\x08"}),
        ("unload", "onnx", True), ("ready", "onnx", ""), ("ready", "onnx", "2")]
    with pytest.raises(E, match=r"^failed to load model 'onnx', files should be a dictionary of file paths and file "
                                r"contents$"):
        pb_utils.load_model("onnx", config="{}", files=[("file:1/model.onnx", b"")])  # type: ignore[arg-type]
    with pytest.raises(E, match=r"^Failed to check model readiness: failed to get model version from specified "
                                r"version string 'latest' \(details: stol\), version should be an integral value > 0$"):
        pb_utils.is_model_ready("onnx", "latest")
    with pytest.raises(E, match=r"version string '-1', version should be an integral value > 0$"):
        pb_utils.is_model_ready("onnx", "-1")
    runtime.fail_with = RuntimeError("load failed: not in explicit mode")
    with pytest.raises(E, match=r"^Failed to load model: load failed: not in explicit mode$"):
        pb_utils.load_model("onnx")
    with pytest.raises(E, match=r"^Failed to unload model: "):
        pb_utils.unload_model("onnx")
    with pytest.raises(E, match=r"^Failed to check model readiness: "):
        pb_utils.is_model_ready("onnx")


def test_model_control_without_runtime() -> None:
    with pytest.raises(E, match=r"^Failed to load model: no naiad runtime"):
        pb_utils.load_model("m")
    with pytest.raises(E, match=r"^Failed to unload model: no naiad runtime"):
        pb_utils.unload_model("m")
    with pytest.raises(E, match=r"^Failed to check model readiness: no naiad runtime"):
        pb_utils.is_model_ready("m")
