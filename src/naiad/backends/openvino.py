"""OpenVINO backend (config backend "openvino"; no platform, as in Triton).

Reads `<version>/model.xml` (+ `model.bin`), or whatever `default_model_filename` names that
OpenVINO's frontends read (`model.onnx`, `model.pdmodel`, `model.saved_model`, `model.tflite`),
as Triton's openvino backend does. The model is compiled once per device and shared by the
model's instances; each instance owns one synchronous infer request. The core already runs each
instance on its own thread and OpenVINO releases the GIL while it infers, so N instances over a
compiled model with N streams (NUM_STREAMS / PERFORMANCE_HINT THROUGHPUT) run N batches at once;
an AsyncInferQueue would only duplicate that queueing inside the instance.

Unlike Triton's backend, a batching model keeps a dynamic batch dimension (any batch up to
max_batch_size runs without padding); SKIP_OV_DYNAMIC_BATCHSIZE=YES restores Triton's static
batch of max_batch_size, with ENABLE_BATCH_PADDING=YES to pad smaller batches.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, RequestResult
from naiad.backends.openvino_options import OpenVinoOptions, parse_options
from naiad.backends.threaded import ThreadedInstance
from naiad.config.autocomplete import complete_io_from_model, model_file_path
from naiad.errors import InvalidArgument, Unavailable
from naiad.types import DataType

# OpenVINO element type name -> V2 datatype. bf16 is left out: OpenVINO's Python API has no
# numpy view of it, and Triton's openvino backend does not serve it either.
_OV_TYPES: dict[str, DataType] = {
    "boolean": DataType.BOOL,
    "u8": DataType.UINT8,
    "u16": DataType.UINT16,
    "u32": DataType.UINT32,
    "u64": DataType.UINT64,
    "i8": DataType.INT8,
    "i16": DataType.INT16,
    "i32": DataType.INT32,
    "i64": DataType.INT64,
    "f16": DataType.FP16,
    "f32": DataType.FP32,
    "f64": DataType.FP64,
    "string": DataType.BYTES,
}
_TO_OV: dict[DataType, ov.Type] = {
    DataType.BOOL: ov.Type.boolean,
    DataType.UINT8: ov.Type.u8,
    DataType.UINT16: ov.Type.u16,
    DataType.UINT32: ov.Type.u32,
    DataType.UINT64: ov.Type.u64,
    DataType.INT8: ov.Type.i8,
    DataType.INT16: ov.Type.i16,
    DataType.INT32: ov.Type.i32,
    DataType.INT64: ov.Type.i64,
    DataType.FP16: ov.Type.f16,
    DataType.FP32: ov.Type.f32,
    DataType.FP64: ov.Type.f64,
    DataType.BYTES: ov.Type.string,
}

ModelTensor = tuple[str, DataType, tuple[int, ...]]


class OpenVinoModel(Model):
    backend_name = "openvino"

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        model = _read_model(ov.Core(), model_file_path(config, version_dir), config.name)
        return complete_io_from_model(
            config,
            _signature(model.inputs, "input"),
            _signature(model.outputs, "output"),
            default_max_batch_size=int(options.get("default_max_batch_size", 4)),
        )

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        super().__init__(config, version_dir, version)
        self.path = model_file_path(config, version_dir)
        if not self.path.exists():
            raise Unavailable(f"unable to find '{self.path}' for model '{config.name}'")
        self.options = parse_options(config)
        self.core = ov.Core()
        if self.options.core_properties:
            self.core.set_property(self.options.core_properties)
        if self.options.extension_path:
            _add_extension(self.core, self.options.extension_path)
        self.model, self.plan = _prepare(_read_model(self.core, self.path, config.name), config, self.options)
        self._compiled: dict[str, tuple[ov.CompiledModel, dict[int, tuple[int, int]]]] = {}
        self._lock = threading.Lock()

    def compiled(self, device: str) -> tuple[ov.CompiledModel, dict[int, tuple[int, int]]]:
        """The model compiled for `device` (once; instances share it) and its narrowed inputs."""
        with self._lock:
            if device not in self._compiled:
                try:
                    compiled = self.core.compile_model(self.model, device, self.options.compile_properties)
                except RuntimeError as error:
                    raise InvalidArgument(
                        f"unable to compile model '{self.config.name}' for OpenVINO {device}: {_ov_message(error)}"
                    ) from None
                self._compiled[device] = (compiled, _narrowed_inputs(compiled))
            return self._compiled[device]

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        compiled, narrowed = self.compiled(_device(self.core, group, index, self.config.name))
        return OpenVinoInstance(compiled, self.plan, narrowed)

    def close(self) -> None:
        self._compiled.clear()


@dataclass(frozen=True, slots=True)
class _Plan:
    """How requests map onto the compiled model's ports, worked out once at load."""

    input_index: dict[str, int]  # every name of every input -> port index
    outputs: list[tuple[int, str]]  # (port index, name the config gives it)
    reshapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # config `reshape` per input
    string_inputs: frozenset[str] = frozenset()
    string_outputs: frozenset[int] = frozenset()
    static_batch: int = 0  # SKIP_OV_DYNAMIC_BATCHSIZE: the one batch size the model runs
    pad: bool = False


class OpenVinoInstance(ThreadedInstance):
    def __init__(self, compiled: ov.CompiledModel, plan: _Plan, narrowed: dict[int, tuple[int, int]]) -> None:
        self.compiled = compiled
        self.plan = plan
        self.narrowed = narrowed
        self.request = compiled.create_infer_request()

    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        plan = self.plan
        try:
            feeds = {plan.input_index[name]: self._feed(name, array) for name, array in batch.inputs().items()}
            size = batch.size if batch.batched else 0
            if plan.static_batch and batch.batched:
                feeds = _fit_static_batch(feeds, size, plan)
        except (InvalidArgument, KeyError) as error:  # bad request data, not a broken instance
            failure = error if isinstance(error, InvalidArgument) else InvalidArgument(
                f"unexpected inference input {error}")
            return [failure] * len(batch.requests)
        try:
            self.request.infer(feeds, share_inputs=True, share_outputs=False)
        except RuntimeError as error:  # OpenVINO refused these shapes/values; the request stays usable
            return [InvalidArgument(f"OpenVINO inference failed: {_ov_message(error)}")] * len(batch.requests)
        outputs = {name: self._output(index, size) for index, name in plan.outputs}
        return list(batch.split(outputs))

    def _feed(self, name: str, array: np.ndarray) -> np.ndarray:
        shape = self.plan.reshapes.get(name)
        if shape is not None:
            array = array.reshape((array.shape[0], *shape) if array.ndim > len(shape) else shape)
        if name in self.plan.string_inputs:
            return _to_ov_strings(name, array)
        limits = self.narrowed.get(self.plan.input_index[name])
        if limits is not None and array.size and (array.min() < limits[0] or array.max() > limits[1]):
            raise InvalidArgument(
                f"input '{name}' holds values outside [{limits[0]}, {limits[1]}]: OpenVINO's CPU plugin "
                f"computes {array.dtype} inputs in 32 bits"
            )
        return np.ascontiguousarray(array)

    def _output(self, index: int, size: int) -> np.ndarray:
        tensor = self.request.get_output_tensor(index)
        array = _from_ov_strings(tensor) if index in self.plan.string_outputs else tensor.data.copy()
        if self.plan.static_batch and size and array.shape[0] != size:
            array = array[:size]  # drop the padding rows
        return array

    def close(self) -> None:
        super().close()  # the instance's thread ends (its last batch done) before the request goes
        del self.request  # its buffers go now, not whenever the instance object does


# --- reading and preparing the model ---------------------------------------------------------


def _read_model(core: ov.Core, path: Path, name: str) -> ov.Model:
    if not path.exists():
        raise Unavailable(f"unable to find '{path}' for model '{name}'")
    if path.suffix == ".xml" and not path.with_suffix(".bin").exists():
        raise InvalidArgument(f"unable to load model '{name}': the IR '{path.name}' has no weights file "
                              f"'{path.with_suffix('.bin').name}' next to it")
    try:
        return core.read_model(str(path))
    except RuntimeError as error:
        raise InvalidArgument(f"unable to load model '{name}': OpenVINO cannot read '{path.name}': "
                              f"{_ov_message(error)}") from None


def _add_extension(core: ov.Core, path: str) -> None:
    try:
        core.add_extension(path)
    except RuntimeError as error:
        raise InvalidArgument(f"unable to load the CPU extension '{path}' (CPU_EXTENSION_PATH): "
                              f"{_ov_message(error)}") from None


def _signature(ports: Sequence[ov.Output], kind: str) -> list[ModelTensor]:
    """Name, datatype and shape (-1 when dynamic) of each port, for auto-complete. A port whose
    layout names the batch as its first dimension counts as batching even when that dim is fixed."""
    signature = []
    for port in ports:
        name = port.get_any_name()
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic:
            raise InvalidArgument(f"{kind} '{name}' has a dynamic rank: list its dims in the model configuration")
        dims = [d.get_length() if d.is_static else -1 for d in shape]
        layout = ov.layout_helpers.get_layout(port)
        if dims and ov.layout_helpers.has_batch(layout) and ov.layout_helpers.batch_idx(layout) in (0, -len(dims)):
            dims[0] = -1
        signature.append((name, _datatype(port.get_element_type(), name), tuple(dims)))
    return signature


def _datatype(element: ov.Type, name: str) -> DataType:
    datatype = _OV_TYPES.get(element.get_type_name())
    if datatype is None:
        raise InvalidArgument(f"unsupported OpenVINO element type '{element.get_type_name()}' for tensor '{name}'")
    return datatype


def _find_port(ports: Sequence[ov.Output], name: str, kind: str) -> int:
    for index, port in enumerate(ports):
        if name in port.get_names():
            return index
    allowed = ", ".join(port.get_any_name() for port in ports)
    raise InvalidArgument(f"unexpected inference {kind} '{name}', allowed {kind}s are: {allowed}")


def _prepare(model: ov.Model, config: mc.ModelConfig, options: OpenVinoOptions) -> tuple[ov.Model, _Plan]:
    """Check the config against the model, convert element types the config asks for (as Triton does,
    with a pre/post-processing step), give a batching model its batch dimension, and plan the I/O."""
    if config.input and len(config.input) != len(model.inputs):
        raise InvalidArgument(f"unable to load model '{config.name}', configuration expects {len(config.input)} "
                              f"inputs, model provides {len(model.inputs)}")
    model = _convert_types(model, config)
    batching = config.max_batch_size > 0
    static_batch = config.max_batch_size if batching and options.skip_dynamic_batch else 0
    shapes: dict[int, ov.PartialShape] = {}
    for io in config.input:
        index = _find_port(model.inputs, io.name, "input")
        dims = list(io.reshape.shape if io.HasField("reshape") else io.dims)
        wanted = _input_shape(config, io.name, model.inputs[index].get_partial_shape(), dims, options, static_batch)
        if wanted is not None:
            shapes[index] = wanted
    if shapes:
        try:
            model.reshape({model.inputs[i]: shape for i, shape in shapes.items()})
        except RuntimeError as error:
            raise InvalidArgument(
                f"unable to load model '{config.name}': OpenVINO cannot reshape its inputs to "
                f"{ {model.inputs[i].get_any_name(): str(s) for i, s in shapes.items()} }: {_ov_message(error)}"
                + ("" if options.skip_dynamic_batch or not batching else
                   " (SKIP_OV_DYNAMIC_BATCHSIZE=YES keeps the batch dimension static)")
            ) from None
    for io in config.output:
        index = _find_port(model.outputs, io.name, "output")
        dims = list(io.reshape.shape if io.HasField("reshape") else io.dims)
        _check_dims(config, io.name, model.outputs[index].get_partial_shape(), dims, batching)
    return model, _plan(model, config, static_batch, options.batch_padding)


def _convert_types(model: ov.Model, config: mc.ModelConfig) -> ov.Model:
    ppp = None
    for kind, listed, ports in (("input", config.input, model.inputs), ("output", config.output, model.outputs)):
        for io in listed:
            port = ports[_find_port(ports, io.name, kind)]
            try:
                wanted = _TO_OV[DataType.from_config(mc.DataType.Name(io.data_type))]
            except (KeyError, ValueError):
                raise InvalidArgument(f"unsupported datatype {mc.DataType.Name(io.data_type)} for {kind} '{io.name}' "
                                      f"of model '{config.name}'") from None
            have = port.get_element_type()
            if wanted == have:
                continue
            if ov.Type.string in (wanted, have):
                raise InvalidArgument(
                    f"unable to load model '{config.name}', configuration expects datatype "
                    f"{mc.DataType.Name(io.data_type)} for {kind} '{io.name}', model provides "
                    f"{_datatype(have, io.name).config_name}")
            ppp = ppp or ov.preprocess.PrePostProcessor(model)
            step = ppp.input(io.name) if kind == "input" else ppp.output(io.name)
            step.tensor().set_element_type(wanted)
    return ppp.build() if ppp is not None else model


def _input_shape(config: mc.ModelConfig, name: str, shape: ov.PartialShape, dims: list[int],
                 options: OpenVinoOptions, static_batch: int) -> ov.PartialShape | None:
    """The shape to give input `name`, or None to keep the model's."""
    batching = config.max_batch_size > 0
    if options.reshape_io:
        full = ([static_batch or -1] if batching else []) + dims
        return ov.PartialShape([ov.Dimension(d) if d > 0 else ov.Dimension() for d in full])
    _check_dims(config, name, shape, dims, batching)
    if not batching or shape.rank.is_dynamic:
        return None
    first = shape[0]
    if static_batch:
        if first.is_static and first.get_length() == static_batch:
            return None
        return ov.PartialShape([ov.Dimension(static_batch), *list(shape)[1:]])
    if first.is_dynamic:
        return None
    return ov.PartialShape([ov.Dimension(), *list(shape)[1:]])


def _check_dims(config: mc.ModelConfig, name: str, shape: ov.PartialShape, dims: list[int], batching: bool) -> None:
    if shape.rank.is_dynamic:
        return
    model_dims = [d.get_length() if d.is_static else -1 for d in shape]
    expected = ([-1] if batching else []) + dims
    fits = len(model_dims) == len(expected) and all(
        m == -1 or e == -1 or m == e for m, e in zip(model_dims[1:] if batching else model_dims,
                                                     dims, strict=False))
    if not fits:
        batch_note = (" (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor "
                      "shape)" if batching else "")
        raise InvalidArgument(
            f"model '{config.name}', tensor '{name}': the model expects {len(model_dims)} dimensions (shape "
            f"{model_dims}) but the model configuration specifies {len(expected)} dimensions{batch_note} "
            f"(shape {expected})")


def _plan(model: ov.Model, config: mc.ModelConfig, static_batch: int, pad: bool) -> _Plan:
    input_index = {n: i for i, port in enumerate(model.inputs) for n in port.get_names()}
    if config.output:
        outputs = [(_find_port(model.outputs, io.name, "output"), io.name) for io in config.output]
    else:
        outputs = [(i, port.get_any_name()) for i, port in enumerate(model.outputs)]
    reshapes = {io.name: tuple(io.reshape.shape) for io in config.input if io.HasField("reshape")}
    strings = frozenset(n for n, i in input_index.items() if model.inputs[i].get_element_type() == ov.Type.string)
    string_outputs = frozenset(i for i, _ in outputs if model.outputs[i].get_element_type() == ov.Type.string)
    return _Plan(input_index, outputs, reshapes, strings, string_outputs, static_batch, pad)


# --- devices ---------------------------------------------------------------------------------


def _device(core: ov.Core, group: mc.ModelInstanceGroup, index: int, name: str) -> str:
    if group.kind in (mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_AUTO):
        return "CPU"
    devices = list(core.available_devices)
    if group.kind == mc.ModelInstanceGroup.KIND_GPU:
        gpu = group.gpus[index % len(group.gpus)] if group.gpus else 0
        wanted = f"GPU.{gpu}"
        gpus = [d for d in devices if d.startswith("GPU")]
        if wanted in gpus or (gpu == 0 and gpus == ["GPU"]):
            return wanted if wanted in gpus else "GPU"
        raise Unavailable(
            f"unable to load model '{name}': KIND_GPU needs an OpenVINO GPU device (an Intel GPU with its "
            f"OpenCL driver); OpenVINO sees {', '.join(devices) or 'no device'} here, so use KIND_CPU")
    raise Unavailable(f"unable to load model '{name}': the openvino backend does not support instance group kind "
                      f"{mc.ModelInstanceGroup.Kind.Name(group.kind)}")


def _narrowed_inputs(compiled: ov.CompiledModel) -> dict[int, tuple[int, int]]:
    """Inputs the compiled graph converts from 64-bit to 32-bit integers first (the CPU plugin does
    this for i64 / u64 that feed computation), with the value range that survives the conversion."""
    narrowed: dict[int, tuple[int, int]] = {}
    runtime = compiled.get_runtime_model()
    for index, parameter in enumerate(runtime.get_parameters()):
        source = parameter.get_output_element_type(0)
        if source not in (ov.Type.i64, ov.Type.u64):
            continue
        for target in parameter.output(0).get_target_inputs():
            node = target.get_node()
            info = node.get_rt_info()
            kind = info["layerType"].astype(str) if "layerType" in info else ""
            narrow = node.get_output_element_type(0)
            if kind == "Convert" and narrow.is_integral() and narrow.bitwidth < source.bitwidth:
                info_dtype = np.iinfo(narrow.to_dtype())
                low = max(int(info_dtype.min), 0 if source == ov.Type.u64 else int(info_dtype.min))
                narrowed[index] = (low, int(info_dtype.max))
    return narrowed


# --- batches and strings ---------------------------------------------------------------------


def _fit_static_batch(feeds: dict[int, np.ndarray], size: int, plan: _Plan) -> dict[int, np.ndarray]:
    if size == plan.static_batch:
        return feeds
    if not plan.pad or size > plan.static_batch:
        raise InvalidArgument(
            f"expected requests with batch size '{plan.static_batch}', got '{size}'... this error can be avoided "
            "by setting 'ENABLE_BATCH_PADDING' parameter in model configuration to 'YES' at a performance cost.")
    padded = {}
    for index, array in feeds.items():
        pad = np.zeros((plan.static_batch - size, *array.shape[1:]), dtype=array.dtype)
        padded[index] = np.concatenate([array, pad])
    return padded


def _to_ov_strings(name: str, array: np.ndarray) -> np.ndarray:
    flat = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
    # OpenVINO's Python API moves strings through numpy's fixed-width bytes, which drops trailing
    # NUL bytes: refuse them instead of changing the data.
    if any(v.endswith(b"\x00") for v in flat):
        raise InvalidArgument(f"input '{name}' holds BYTES ending in a NUL byte, which OpenVINO string tensors "
                              "cannot carry")
    return np.array(flat, dtype=np.bytes_).reshape(array.shape)


def _from_ov_strings(tensor: ov.Tensor) -> np.ndarray:
    data = tensor.bytes_data
    out = np.empty(data.size, dtype=object)
    out[:] = [bytes(v) for v in data.reshape(-1)]
    return out.reshape(data.shape)


def _ov_message(error: BaseException) -> str:
    """OpenVINO's message without its 'Exception from <file>:<line>' and 'Check ... failed' lines."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [line for line in lines if line and not line.startswith(("Exception from ", "Check '"))]
    return " ".join(kept) or str(error).strip()
