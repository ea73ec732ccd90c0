"""ONNX Runtime backend (config backend "onnxruntime", platform "onnxruntime_onnx").

One InferenceSession per instance, so instances run truly in parallel (ORT releases the GIL).
On CPU each session defaults to one intra-op thread: with several instances on a small
machine, more threads than cores cut throughput sharply. Reduced precision (TensorRT EP flags,
fp16 / int8 model variants) is in `onnxruntime_precision`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, RequestResult
from naiad.backends.onnxruntime_precision import model_precision, precision_variant, tensorrt_options
from naiad.backends.threaded import ThreadedInstance
from naiad.config.autocomplete import complete_io_from_model, model_file_path
from naiad.errors import InvalidArgument, NaiadError, Unavailable
from naiad.types import DataType

_ORT_TYPES = {
    "tensor(bool)": DataType.BOOL,
    "tensor(uint8)": DataType.UINT8,
    "tensor(uint16)": DataType.UINT16,
    "tensor(uint32)": DataType.UINT32,
    "tensor(uint64)": DataType.UINT64,
    "tensor(int8)": DataType.INT8,
    "tensor(int16)": DataType.INT16,
    "tensor(int32)": DataType.INT32,
    "tensor(int64)": DataType.INT64,
    "tensor(float16)": DataType.FP16,
    "tensor(float)": DataType.FP32,
    "tensor(double)": DataType.FP64,
    "tensor(string)": DataType.BYTES,
    "tensor(bfloat16)": DataType.BF16,
}
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16
_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}


def _io_signature(nodes: list[Any]) -> list[tuple[str, DataType, tuple[int, ...]]]:
    signature = []
    for node in nodes:
        if node.type not in _ORT_TYPES:
            raise InvalidArgument(f"unsupported ONNX type '{node.type}' for tensor '{node.name}'")
        dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
        signature.append((node.name, _ORT_TYPES[node.type], dims))
    return signature


def _parameter(config: mc.ModelConfig, key: str, default: str = "") -> str:
    if key in config.parameters:
        return str(config.parameters[key].string_value)
    return default


class OnnxRuntimeModel(Model):
    backend_name = "onnxruntime"

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        path = model_file_path(config, version_dir)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return complete_io_from_model(
            config,
            _io_signature(session.get_inputs()),
            _io_signature(session.get_outputs()),
            default_max_batch_size=int(options.get("default_max_batch_size", 4)),
        )

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        super().__init__(config, version_dir, version)
        self.path = model_file_path(config, version_dir)
        if not self.path.exists():
            raise Unavailable(f"unable to find '{self.path}' for model '{config.name}'")
        _check_accelerators(config)
        self.precision = model_precision({k: v.string_value for k, v in config.parameters.items()}, config.name)
        # The file the sessions load: the model itself, or its fp16 / int8 variant in the cache.
        self.session_path = precision_variant(self.path, self.precision, config.name)

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        try:
            return OnnxRuntimeInstance(self.session_path, self.config, group, index)
        except NaiadError:
            raise
        except Exception as error:  # onnxruntime's own errors (Fail, NotImplemented, ...)
            if self.precision == "fp32":
                raise
            # e.g. an op with no fp16 kernel on this execution provider
            raise InvalidArgument(f"unable to load the {self.precision} variant of model "
                                  f"'{self.config.name}': {error}") from error


class OnnxRuntimeInstance(ThreadedInstance):
    def __init__(self, path: Path, config: mc.ModelConfig, group: mc.ModelInstanceGroup, index: int) -> None:
        options = self._session_options(config)
        providers = self._providers(config, group, index)
        available = set(ort.get_available_providers())
        missing = [p if isinstance(p, str) else p[0] for p in providers]
        missing = [p for p in missing if p not in available]
        if missing:
            raise Unavailable(f"execution provider(s) {missing} are not available in this onnxruntime build")
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        _check_config_matches(config, self.session)
        self.input_types = {i.name: i.type for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.model_shapes = {i.name: tuple(i.reshape.shape) for i in config.input if i.HasField("reshape")}
        self.run_options = ort.RunOptions()
        # An InferenceSession may run on any thread. On the CPU alone, one intra-op thread and
        # sequential execution, a run is the calling thread's own work: nothing tied to the
        # instance's thread (a CUDA stream), no pool to wait for.
        self.runs_anywhere = (providers == ["CPUExecutionProvider"] and options.intra_op_num_threads == 1
                              and options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL)

    @staticmethod
    def _session_options(config: mc.ModelConfig) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(_parameter(config, "intra_op_thread_count", "1"))
        options.inter_op_num_threads = int(_parameter(config, "inter_op_thread_count", "1"))
        level = config.optimization.graph.level if config.optimization.HasField("graph") else 0
        options.graph_optimization_level = _GRAPH_LEVELS.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        if _parameter(config, "execution_mode") == "1":
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        return options

    @staticmethod
    def _providers(config: mc.ModelConfig, group: mc.ModelInstanceGroup, index: int) -> list[Any]:
        providers: list[Any] = []
        accelerators = config.optimization.execution_accelerators
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            device = group.gpus[index % len(group.gpus)] if group.gpus else 0
            cuda: dict[str, Any] = {"device_id": device}
            for acc in accelerators.gpu_execution_accelerator:
                if acc.name == "tensorrt":
                    providers.append(("TensorrtExecutionProvider", tensorrt_options(acc.parameters, device)))
                elif acc.name == "cuda":  # Triton passes these through to the CUDA EP as they are
                    cuda.update(acc.parameters)
            providers.append(("CUDAExecutionProvider", cuda))
        for acc in accelerators.cpu_execution_accelerator:
            if acc.name == "openvino":
                providers.append("OpenVINOExecutionProvider")
        providers.append("CPUExecutionProvider")
        return providers

    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        try:
            feeds = {name: self._feed(name, array) for name, array in batch.inputs().items()}
        except InvalidArgument as error:  # bad request data, not a broken instance
            return [error] * len(batch.requests)
        if any(isinstance(v, ort.OrtValue) for v in feeds.values()):
            outputs = self._run_ort_values(feeds)
        else:
            arrays = self.session.run(self.output_names, feeds, self.run_options)
            outputs = {n: _from_ort(a) for n, a in zip(self.output_names, arrays, strict=True)}
        return list(batch.split(outputs))

    def _feed(self, name: str, array: np.ndarray) -> Any:
        shape = self.model_shapes.get(name)
        if shape is not None:
            array = array.reshape((array.shape[0], *shape) if array.ndim > len(shape) else shape)
        kind = self.input_types.get(name)
        if kind == "tensor(string)":
            return np.array([_to_str(name, b) for b in array.reshape(-1)], dtype=object).reshape(array.shape)
        if kind == "tensor(bfloat16)":
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(array), _ONNX_BFLOAT16
            )
        return array

    def _run_ort_values(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        values = {
            n: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
            for n, v in feeds.items()
        }
        results = self.session.run_with_ort_values(self.output_names, values, self.run_options)
        return {n: _ortvalue_to_numpy(v) for n, v in zip(self.output_names, results, strict=True)}


def _check_accelerators(config: mc.ModelConfig) -> None:
    """Fail the load, as Triton does, on an accelerator or TensorRT parameter it does not know,
    whatever the instance kind, so that a typo shows on a machine without a GPU too."""
    accelerators = config.optimization.execution_accelerators
    for acc in accelerators.gpu_execution_accelerator:
        if acc.name == "tensorrt":
            tensorrt_options(acc.parameters, 0)
        elif acc.name != "cuda":
            raise InvalidArgument(f"unknown Execution Accelerator '{acc.name}' is requested")
    for acc in accelerators.cpu_execution_accelerator:
        if acc.name != "openvino":
            raise InvalidArgument(f"unknown Execution Accelerator '{acc.name}' is requested")


def _check_config_matches(config: mc.ModelConfig, session: ort.InferenceSession) -> None:
    """Fail the load, as Triton does, when the config names tensors or types the model lacks."""
    for kind, listed, nodes in (("input", config.input, session.get_inputs()),
                                ("output", config.output, session.get_outputs())):
        provided = {node.name: _ORT_TYPES.get(node.type) for node in nodes}
        for tensor in listed:
            if tensor.name not in provided:
                allowed = ", ".join(provided)
                raise InvalidArgument(f"unexpected inference {kind} '{tensor.name}', allowed {kind}s are: {allowed}")
            expected = mc.DataType.Name(tensor.data_type)
            actual = provided[tensor.name]
            if actual is not None and actual.config_name != expected:
                raise InvalidArgument(
                    f"unable to load model '{config.name}', configuration expects datatype {expected} for "
                    f"{kind} '{tensor.name}', model provides {actual.config_name}"
                )


def _to_str(name: str, value: Any) -> str:
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        # onnxruntime's Python API only builds string tensors from valid UTF-8.
        raise InvalidArgument(
            f"input '{name}' holds BYTES that are not valid UTF-8, which the onnxruntime backend "
            "cannot pass to a string tensor"
        ) from None


def _from_ort(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        flat = [s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s for s in array.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(array.shape)
    return array


def _ortvalue_to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return _from_ort(value.numpy())
    shape = tuple(value.shape())
    out = np.empty(shape, dtype=np.uint16)
    ctypes.memmove(out.ctypes.data, value.data_ptr(), out.nbytes)
    return out
