"""Every public pb_utils entry point takes what Triton's pybind11 bindings take (python_backend
`pb_stub.cc`): bytes where a C++ std::string is declared, numpy integers and bools where an integer
is, numpy numbers where a double is, any sequence (tuple, numpy array) where a std::vector is, and
refuses what pybind11 refuses (a str for an integer or a number, a float for an integer, a str
where a list is)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from backends.python.pb_fakes import FakeRuntime, MetricRuntime

from naiad.backends.python import pb_args, pb_metrics, pb_utils

E = pb_utils.TritonModelException
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def tensor(name: Any = "IN") -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.zeros(2, np.float32))


def received(**fields: Any) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest._received(
        inputs=[tensor()], request_id="r", correlation_id=0, flags=0, timeout=0, parameters="{}",
        requested_output_names=["OUT"], model_name="m", model_version=1, handle="h", **fields)


# -- the conversions ---------------------------------------------------------------------------


def test_string_arguments_take_str_and_utf8_bytes() -> None:
    for value in ("add_sub", b"add_sub", bytearray(b"add_sub"), np.str_("add_sub"), np.bytes_(b"add_sub"),
                  np.array([b"add_sub"], dtype=np.object_)[0]):
        converted = pb_args.as_str(value, "x")
        assert converted == "add_sub" and type(converted) is str
    for value in (None, 1, ["add_sub"]):
        with pytest.raises(TypeError, match="x must be str or bytes"):
            pb_args.as_str(value, "x")
    with pytest.raises(TypeError, match="not UTF-8"):  # pybind11 would copy them; a name must be text
        pb_args.as_str(b"\xff\xfe", "x")


def test_integer_arguments_take_ints_bools_and_numpy_integers() -> None:
    for value, expected in ((3, 3), (True, 1), (np.int64(3), 3), (np.uint32(3), 3), (np.int8(-3), -3)):
        converted = pb_args.as_int(value, "x")
        assert converted == expected and type(converted) is int
    for value in (1.0, np.float64(1.0), "1", b"1", None, [1]):
        with pytest.raises(TypeError, match="x must be int"):
            pb_args.as_int(value, "x")
    with pytest.raises(TypeError, match="x must be an unsigned 32-bit integer, got -1"):
        pb_args.as_int(-1, "x", bits=32, signed=False)
    with pytest.raises(TypeError, match="unsigned 32-bit"):
        pb_args.as_int(np.uint64(2**32), "x", bits=32, signed=False)


def test_bool_number_and_list_arguments() -> None:
    for value, expected in ((True, True), (np.bool_(True), True), (0, False), (np.int64(2), True), (0.0, False)):
        assert pb_args.as_bool(value, "x") is expected
    for value in ("true", None, [True]):
        with pytest.raises(TypeError, match="x must be bool"):
            pb_args.as_bool(value, "x")
    for value, expected in ((2, 2.0), (np.float32(0.5), 0.5), (np.int64(7), 7.0), (True, 1.0)):
        assert pb_args.as_float(value, "x") == expected
    for value in ("1.5", b"1", None, [1.0]):
        with pytest.raises(TypeError, match="x must be a number"):
            pb_args.as_float(value, "x")
    assert pb_args.as_str_list(("A", b"B", np.str_("C")), "x") == ["A", "B", "C"]
    assert pb_args.as_str_list(np.array(["A", "B"]), "x") == ["A", "B"]
    assert pb_args.as_str_list(np.array([b"A"], dtype=np.object_), "x") == ["A"]
    for value in ("AB", b"AB", {"A": 1}, None, 5):
        with pytest.raises(TypeError, match="x must be a list"):
            pb_args.as_list(value, "x")


# -- one test per entry point --------------------------------------------------------------------


def test_tensor_and_from_dlpack_take_a_bytes_name() -> None:
    assert tensor(b"OUT").name() == "OUT" and tensor(np.str_("OUT")).name() == "OUT"
    assert pb_utils.Tensor.from_dlpack(b"D", np.arange(3)).name() == "D"
    with pytest.raises(TypeError):
        tensor(7)


def test_triton_error_takes_a_bytes_message_and_a_numpy_code() -> None:
    error = pb_utils.TritonError(b"not found", np.int64(2))
    assert (error.message(), error.code()) == ("not found", pb_utils.TritonError.NOT_FOUND)
    with pytest.raises(TypeError):
        pb_utils.TritonError(404)  # type: ignore[arg-type]


def test_bls_inference_request_takes_converted_arguments() -> None:
    inputs = (tensor("INPUT0"), tensor("INPUT1"))  # a tuple: std::vector takes any sequence
    request = pb_utils.InferenceRequest(
        model_name=np.array([b"add_sub"], dtype=np.object_)[0], inputs=inputs,
        requested_output_names=np.array(["OUTPUT0", "OUTPUT1"]), request_id=b"7", correlation_id=np.uint64(9),
        model_version=np.int64(2), flags=np.uint32(1), timeout=np.int32(50), parameters={"k": "v"})
    assert (request.model_name(), request.request_id(), request.correlation_id()) == ("add_sub", "7", 9)
    assert type(request.model_name()) is str and request.requested_output_names() == {"OUTPUT0", "OUTPUT1"}
    assert (request.model_version(), request.flags(), request.timeout()) == (2, 1, 50)
    assert request.inputs() == list(inputs)
    assert pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[b"A"],
                                     correlation_id=True).correlation_id() == 1  # bool is an int
    refused: list[dict[str, Any]] = [
        {"model_name": None}, {"model_name": 5}, {"model_version": "2"}, {"model_version": 2.0},
        {"flags": -1}, {"timeout": 1.5}, {"requested_output_names": "OUTPUT0"}, {"requested_output_names": [1]},
        {"inputs": tensor()}, {"request_id": 1},
    ]
    for change in refused:
        arguments: dict[str, Any] = {"model_name": "m", "inputs": [], "requested_output_names": [], **change}
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**arguments)
    with pytest.raises(E, match="Correlation ID must be integer or string"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=b"7")


def test_request_flag_setters_and_exec_take_numpy_values(runtime: FakeRuntime) -> None:
    request = received()
    request.set_flags(np.uint32(2))
    request.set_release_flags(np.int64(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE))
    assert (request.flags(), request._release_flags) == (2, 2)
    for bad in (1.0, "2", None):
        with pytest.raises(TypeError):
            request.set_release_flags(bad)  # type: ignore[arg-type]
    call = pb_utils.InferenceRequest(model_name=b"m", inputs=[], requested_output_names=[])
    call.exec(decoupled=np.bool_(True))
    asyncio.run(call.async_exec(decoupled=0))
    assert [decoupled for _, decoupled in runtime.execs] == [True, False]
    with pytest.raises(TypeError):
        call.exec(decoupled="yes")  # type: ignore[arg-type]


def test_inference_response_takes_a_tuple_of_tensors() -> None:
    out = tensor("OUT")
    assert pb_utils.InferenceResponse(output_tensors=(out,)).output_tensors() == [out]
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=out)  # type: ignore[arg-type]


def test_response_sender_takes_numpy_flags(runtime: FakeRuntime) -> None:
    sender = received(decoupled=True).get_response_sender()
    sender.send(pb_utils.InferenceResponse([tensor("OUT")]), flags=np.uint32(0))
    sender.send(flags=np.uint32(FINAL))
    assert [flags for _, _, flags in runtime.sent] == [0, FINAL]
    with pytest.raises(TypeError):
        received(decoupled=True).get_response_sender().send(flags=1.0)  # type: ignore[arg-type]


def test_preferred_memory_takes_numpy_integers() -> None:
    memory = pb_utils.PreferredMemory(np.int64(pb_utils.TRITONSERVER_MEMORY_CPU), np.int32(1))
    assert (memory.preferred_memory_type, memory.preferred_device_id) == (1, 1)
    with pytest.raises(TypeError):
        pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0.5)  # type: ignore[arg-type]


def test_logger_takes_bytes(runtime: FakeRuntime) -> None:
    pb_utils.Logger.log_info(b"from bytes")
    pb_utils.Logger.log(b"\xffnot utf-8", np.int64(pb_utils.Logger.ERROR))
    assert [(level, message) for level, message, _, _ in runtime.logs] == [(0, "from bytes"), (2, "\ufffdnot utf-8")]


def test_model_control_takes_bytes_names(runtime: FakeRuntime) -> None:
    pb_utils.load_model(b"onnx", config=b"{}", files={b"file:1/model.onnx": np.bytes_(b"\x08")})
    pb_utils.unload_model(np.str_("onnx"), unload_dependents=np.bool_(True))
    assert pb_utils.is_model_ready(b"onnx", model_version=b"2") is True
    assert runtime.calls == [("load", "onnx", "{}", {"file:1/model.onnx": b"\x08"}), ("unload", "onnx", True),
                             ("ready", "onnx", "2")]
    with pytest.raises(TypeError):  # upstream casts file contents to py::bytes: str is refused
        pb_utils.load_model("onnx", config="{}", files={"file:1/model.onnx": "text"})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        pb_utils.unload_model("onnx", unload_dependents="yes")  # type: ignore[arg-type]


def test_metric_family_and_metric_take_converted_arguments() -> None:
    hook = MetricRuntime()
    pb_utils._set_runtime(hook)
    family = pb_utils.MetricFamily(b"t_bytes_family", b"from bytes", np.int64(pb_utils.MetricFamily.GAUGE))
    gauge = family.Metric(labels={np.str_("k"): np.str_("v")})
    gauge.set(np.int64(3))
    gauge.increment(np.float32(0.5))
    assert gauge.value() == 3.5 and hook.values_asked == [gauge._series.id]
    latency = pb_utils.MetricFamily("t_numpy_buckets", "h", pb_utils.MetricFamily.HISTOGRAM)
    histogram = latency.Metric(buckets=[np.float32(0.5), 1, np.int64(2)])
    histogram.observe(np.float64(0.75))
    assert histogram._series.buckets == [0.5, 1.0, 2.0] and histogram._series.bucket_counts == [0, 1, 0, 0]
    for operation in (lambda: gauge.set("1"), lambda: gauge.increment(None), lambda: histogram.observe(b"1")):
        with pytest.raises(TypeError):
            operation()
    with pytest.raises(TypeError):
        latency.Metric(buckets=["1.0"])
    changes = pb_metrics.take_changes()
    assert changes[0] == pb_metrics.FamilyDeclared("t_bytes_family", "from bytes", "gauge")
    assert json.dumps(changes[1].labels) == '{"k": "v"}'
