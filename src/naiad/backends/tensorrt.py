"""The "tensorrt" backend: serialized TensorRT engines (`model.plan`, platform tensorrt_plan) on
NVIDIA GPUs, through the `tensorrt` package with torch's CUDA tensors as device buffers.

An engine is built for one GPU architecture; each instance deserializes it on its own GPU and
keeps one execution context. Inputs may have dynamic dimensions within an optimization profile:
an instance uses the profiles its instance group names (`profile: ["1"]`, Triton's rule) or all
of them, and each batch runs on the first profile whose [min, max] shapes admit it. On a machine
without a GPU (or without the tensorrt package) loading fails with a reason saying so, and the
rest of the repository serves.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, RequestResult
from naiad.backends.threaded import ThreadedInstance
from naiad.errors import InvalidArgument, Unavailable
from naiad.types import DataType

NO_PACKAGE = ("the tensorrt package is not installed: TensorRT models need it and an NVIDIA GPU "
              "(pip install 'naiad[tensorrt]')")
NO_GPU = "TensorRT models need an NVIDIA GPU and none is available on this machine"
_LOCK = threading.Lock()  # TensorRT's runtime objects are created one at a time


def _runtime() -> tuple[Any, Any]:
    """(tensorrt, torch) once both are importable and CUDA has a device; else Unavailable."""
    try:
        import tensorrt as trt
    except ImportError:
        raise Unavailable(NO_PACKAGE) from None
    import torch

    if not torch.cuda.is_available():
        raise Unavailable(NO_GPU)
    return trt, torch


def _engine(path: Path, device: int) -> Any:
    trt, torch = _runtime()
    if not path.is_file():
        raise Unavailable(f"unable to find TensorRT engine '{path.name}' in {path.parent}")
    with _LOCK, torch.cuda.device(device):
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise Unavailable(f"'{path.name}' is not a TensorRT engine this TensorRT version and GPU can run "
                          "(engines are built for one TensorRT version and GPU architecture)")
    return engine


def _datatype(trt: Any, dtype: Any) -> DataType:
    names = {trt.bool: DataType.BOOL, trt.uint8: DataType.UINT8, trt.int8: DataType.INT8,
             trt.int32: DataType.INT32, trt.int64: DataType.INT64, trt.float16: DataType.FP16,
             trt.float32: DataType.FP32, trt.bfloat16: DataType.BF16}
    if dtype not in names:
        raise Unavailable(f"TensorRT data type {dtype} has no Triton datatype")
    return names[dtype]


class TensorRTModel(Model):
    backend_name = "tensorrt"

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        """Inputs and outputs from the engine's I/O tensors (it must be deserialized, so only on a
        GPU); a config that already names them is left alone, and loads or fails later."""
        if config.input and config.output:
            return False
        path = version_dir / (config.default_model_filename or "model.plan")
        engine = _engine(path, 0)
        trt, _ = _runtime()
        batching = False
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            shape = list(engine.get_tensor_shape(name))
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            target = config.input if is_input else config.output
            if any(t.name == name for t in target):
                continue
            tensor = target.add()
            tensor.name = name
            tensor.data_type = mc.DataType.Value(_datatype(trt, engine.get_tensor_dtype(name)).config_name)
            if shape and shape[0] == -1 and config.max_batch_size == 0:
                batching = True
            tensor.dims.extend(shape[1:] if batching else shape)
        if batching:
            profile_max = max(engine.get_tensor_profile_shape(config.input[0].name, p)[2][0]
                              for p in range(engine.num_optimization_profiles))
            config.max_batch_size = int(profile_max)
        return batching

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        trt, torch = _runtime()
        if group.kind != mc.ModelInstanceGroup.KIND_GPU:
            raise Unavailable(f"model '{self.config.name}': TensorRT instances run on GPUs only (instance group "
                              f"'{group.name}' is {mc.ModelInstanceGroup.Kind.Name(group.kind)})")
        device = group.gpus[index % len(group.gpus)] if group.gpus else 0
        path = self.version_dir / (self.config.default_model_filename or "model.plan")
        engine = _engine(path, device)
        profiles = [int(p) for p in group.profile] or list(range(engine.num_optimization_profiles))
        for profile in profiles:
            if not 0 <= profile < engine.num_optimization_profiles:
                raise InvalidArgument(f"model '{self.config.name}': optimization profile {profile} does not exist "
                                      f"(the engine has {engine.num_optimization_profiles})")
        _check_config_matches(self.config, engine, trt)
        return TensorRTInstance(trt, torch, engine, device, profiles)


def _check_config_matches(config: mc.ModelConfig, engine: Any, trt: Any) -> None:
    """Every config input and output is an engine tensor of the same datatype."""
    tensors = {engine.get_tensor_name(i): engine.get_tensor_mode(engine.get_tensor_name(i))
               for i in range(engine.num_io_tensors)}
    for specs, mode, kind in ((config.input, trt.TensorIOMode.INPUT, "input"),
                              (config.output, trt.TensorIOMode.OUTPUT, "output")):
        for spec in specs:
            if tensors.get(spec.name) != mode:
                raise InvalidArgument(f"model '{config.name}': the engine has no {kind} '{spec.name}' "
                                      f"(its tensors: {', '.join(sorted(tensors))})")
            actual = _datatype(trt, engine.get_tensor_dtype(spec.name))
            if mc.DataType.Name(spec.data_type) != actual.config_name:
                raise InvalidArgument(f"model '{config.name}': {kind} '{spec.name}' is {actual.config_name} in the "
                                      f"engine but {mc.DataType.Name(spec.data_type)} in the config")


class TensorRTInstance(ThreadedInstance):
    def __init__(self, trt: Any, torch: Any, engine: Any, device: int, profiles: list[int]) -> None:
        self.trt, self.torch = trt, torch
        self.engine = engine
        self.device = torch.device("cuda", device)
        self.profiles = profiles
        with torch.cuda.device(device):
            self.context = engine.create_execution_context()
            self.stream = torch.cuda.Stream(device=self.device)
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: _datatype(trt, engine.get_tensor_dtype(n)) for n in names}
        self.profile: int | None = None

    def _choose_profile(self, shapes: dict[str, tuple[int, ...]]) -> int:
        for profile in self.profiles:
            fits = True
            for name, shape in shapes.items():
                low, _, high = self.engine.get_tensor_profile_shape(name, profile)
                if len(low) != len(shape) or any(d < lo or d > hi for d, lo, hi in zip(shape, low, high, strict=True)):
                    fits = False
                    break
            if fits:
                return profile
        raise InvalidArgument(f"input shapes {shapes} fit none of the engine's optimization profiles "
                              f"{self.profiles}")

    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        torch = self.torch
        arrays = batch.inputs()
        missing = [n for n in self.inputs if n not in arrays]
        if missing:
            return [InvalidArgument(f"the engine needs input(s) {', '.join(missing)}")] * len(batch.requests)
        shapes = {n: tuple(arrays[n].shape) for n in self.inputs}
        try:
            profile = self._choose_profile(shapes) if self.engine.num_optimization_profiles > 1 else 0
        except InvalidArgument as error:
            return [error] * len(batch.requests)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            if profile != self.profile:
                self.context.set_optimization_profile_async(profile, self.stream.cuda_stream)
                self.profile = profile
            keep = []  # device buffers stay alive until the stream is done with them
            for name in self.inputs:
                host = np.ascontiguousarray(arrays[name], dtype=self.dtypes[name].numpy)
                if self.dtypes[name] is DataType.BF16:  # raw bits in naiad, bfloat16 on the GPU
                    device = torch.from_numpy(host.view(np.int16)).to(self.device).view(torch.bfloat16)
                else:
                    device = torch.from_numpy(host).to(self.device)
                keep.append(device)
                self.context.set_input_shape(name, tuple(host.shape))
                self.context.set_tensor_address(name, device.data_ptr())
            results = {}
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                dtype = getattr(torch, _TORCH_DTYPES[self.dtypes[name]])
                out = torch.empty(shape, dtype=dtype, device=self.device)
                self.context.set_tensor_address(name, out.data_ptr())
                results[name] = out
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT failed to enqueue the batch")
            self.stream.synchronize()
        outputs = {name: self._to_numpy(tensor) for name, tensor in results.items()}
        return batch.split(outputs)

    def _to_numpy(self, tensor: Any) -> np.ndarray:
        if tensor.dtype == self.torch.bfloat16:  # numpy has no bfloat16: naiad carries its raw bits
            return tensor.view(self.torch.int16).cpu().numpy().view(np.uint16)
        return tensor.cpu().numpy()


_TORCH_DTYPES = {DataType.BOOL: "bool", DataType.UINT8: "uint8", DataType.INT8: "int8", DataType.INT32: "int32",
                 DataType.INT64: "int64", DataType.FP16: "float16", DataType.FP32: "float32",
                 DataType.BF16: "bfloat16"}

