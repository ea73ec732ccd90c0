"""PyTorch backend (config backend "pytorch").

Two model formats, chosen by the file (or the platform):
- TorchScript `model.pt` (platform "pytorch_libtorch"), loaded with `torch.jit.load`.
- torch.export programs in a PT2 archive `model.pt2` (platform "torch_aoti", the platform under
  which Triton loads PT2 archives), loaded with `torch.export.load`. Triton's torch_aoti runs
  AOTInductor-compiled packages; naiad runs the archive's exported program instead, so an archive
  holding only AOTInductor code fails to load with that reason.

Every instance loads its own copy of the module (stateful TorchScript models such as silero VAD
keep their state per instance) on its device: KIND_CPU -> cpu, KIND_GPU -> cuda:<gpu id>,
KIND_MODEL -> where the file put it (inputs stay on the CPU), as Triton does.

Triton's naming rules bind config tensors to the model (pytorch_naming.py); config parameters are
read in pytorch_settings.py. docs/pytorch_backend.md describes both for users.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.export.passes import move_to_device_pass
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, RequestResult
from naiad.backends.pytorch_naming import INDEXED, Argument, bind_inputs, bind_outputs, flatten_result
from naiad.backends.pytorch_safe_load import load_exported_safely
from naiad.backends.pytorch_settings import Settings, apply_inter_op_threads, parse_settings
from naiad.backends.threaded import ThreadedInstance
from naiad.config.autocomplete import ModelTensor, complete_io_from_model, model_file_path
from naiad.errors import InternalError, InvalidArgument, Unavailable
from naiad.types import DataType

log = logging.getLogger(__name__)

PT2_PLATFORM = "torch_aoti"
_TORCH_TYPES: dict[DataType, torch.dtype] = {
    DataType.BOOL: torch.bool,
    DataType.UINT8: torch.uint8,
    DataType.UINT16: torch.uint16,
    DataType.UINT32: torch.uint32,
    DataType.UINT64: torch.uint64,
    DataType.INT8: torch.int8,
    DataType.INT16: torch.int16,
    DataType.INT32: torch.int32,
    DataType.INT64: torch.int64,
    DataType.FP16: torch.float16,
    DataType.FP32: torch.float32,
    DataType.FP64: torch.float64,
    DataType.BF16: torch.bfloat16,
}
_FROM_TORCH = {dtype: datatype for datatype, dtype in _TORCH_TYPES.items()}
# forward() arguments that receive a one-element input as a Python number (silero VAD's `sr: int`).
# Triton's backend takes tensors only; naiad converts these instead of refusing the model.
_SCALAR_KINDS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool}


# --- loading -----------------------------------------------------------------------------------


def is_pt2(config: mc.ModelConfig, path: Path) -> bool:
    return config.platform == PT2_PLATFORM or path.suffix == ".pt2"


def load_torchscript(path: Path, device: torch.device | None) -> torch.jit.ScriptModule:
    try:
        module = torch.jit.load(str(path), map_location=device)
    except Exception as error:  # torch raises RuntimeError / ValueError with the reader's reason
        raise InvalidArgument(
            f"unable to load TorchScript model '{path}': {_reason(error)} (a model.pt must be "
            "written by torch.jit.script(...).save or torch.jit.trace(...).save)"
        ) from None
    module.eval()
    return module


# torch.export.load keeps its deserializer in a module global: models loading on several
# threads at once would trip over each other ("_CURRENT_DESERIALIZER is already set").
_export_load_lock = threading.Lock()


def load_exported(path: Path) -> torch.export.ExportedProgram:
    if _holds_only_aoti(path):
        raise InvalidArgument(
            f"unable to load '{path}': it holds an AOTInductor-compiled package (Triton's torch_aoti "
            "format) and no exported program; naiad's pytorch backend runs torch.export programs "
            "(write the program with torch.export.save instead of aoti_compile_and_package)"
        )
    try:
        with _export_load_lock:  # also: the pickle guard below changes process-wide state
            return load_exported_safely(path)
    except Exception as error:
        raise InvalidArgument(
            f"unable to load torch.export program '{path}': {_reason(error)} (a model.pt2 must be "
            "written by torch.export.save)"
        ) from None


def _holds_only_aoti(path: Path) -> bool:
    """A PT2 archive with compiled AOTInductor code (<archive>/data/aotinductor/...) but no
    exported program (<archive>/models/...)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False  # torch.export.load reports it
    parts = [name.split("/")[1:3] for name in names]
    return any(p == ["data", "aotinductor"] for p in parts) and not any(p[:1] == ["models"] for p in parts)


def _reason(error: BaseException) -> str:
    """One line of torch's often long message: its first line and, where the cause follows a
    traceback (TorchScript's "The following operation failed..."), its last."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def torchscript_arguments(module: torch.jit.ScriptModule) -> list[Argument]:
    """forward()'s arguments after self; refuses types the backend cannot feed."""
    schema_args = module.forward.schema.arguments[1:]  # type: ignore[attr-defined]  # a ScriptMethod
    if len(schema_args) == 1 and str(schema_args[0].type) == "Dict[str, Tensor]":
        # Triton's other form: one dict argument, keyed by the config's input names
        return [Argument(schema_args[0].name, "dict")]
    arguments = []
    for arg in schema_args:
        kind = arg.type.kind()
        if kind == "TensorType":
            arguments.append(Argument(arg.name, "tensor"))
        elif kind in ("IntType", "FloatType", "BoolType"):
            arguments.append(Argument(arg.name, kind[:-4].lower()))
        else:
            raise InvalidArgument(
                f"forward() argument '{arg.name}' has type {arg.type}: the pytorch backend feeds "
                "Tensor arguments (and int/float/bool from one-element inputs), or one Dict[str, Tensor]"
            )
    return arguments


def exported_signature(program: torch.export.ExportedProgram) -> tuple[list[ModelTensor], list[ModelTensor]]:
    """The program's positional tensor inputs and flattened tensor outputs as (name, type, shape)
    with -1 for dynamic dimensions. Inputs carry the forward() argument names, outputs their
    position. Raises InvalidArgument for what the backend cannot feed (kwargs, nested inputs,
    non-tensor values)."""
    in_spec = program.call_spec.in_spec
    parts = in_spec.children() if in_spec is not None else []
    if len(parts) != 2 or parts[1].num_leaves or any(not child.is_leaf() for child in parts[0].children()):
        raise InvalidArgument("the torch.export program must take positional tensor arguments only")
    names = list(program.module_call_graph[0].signature.forward_arg_names)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = []
    for i, user_input in enumerate(program.graph_signature.user_inputs):
        value = placeholders[user_input].meta.get("val") if isinstance(user_input, str) else None
        name = names[i] if i < len(names) else str(user_input)
        inputs.append(_tensor_spec(name, value))
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    user_count = len(program.graph_signature.user_outputs)
    values = list(output_node.args[0])[-user_count:] if user_count else []
    outputs = [_tensor_spec(f"OUTPUT__{i}", getattr(v, "meta", {}).get("val")) for i, v in enumerate(values)]
    return inputs, outputs


def _tensor_spec(name: str, value: Any) -> ModelTensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidArgument(f"the torch.export program's '{name}' is not a tensor ({type(value).__name__})")
    if value.dtype not in _FROM_TORCH:
        raise InvalidArgument(f"the torch.export program's '{name}' has unsupported dtype {value.dtype}")
    dims = tuple(d if isinstance(d, int) else -1 for d in value.shape)
    return name, _FROM_TORCH[value.dtype], dims


def _check_datatypes(config: mc.ModelConfig) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            name = mc.DataType.Name(tensor.data_type)
            supported = name != "TYPE_STRING" and name in {t.config_name for t in _TORCH_TYPES}
            if not supported:
                raise InvalidArgument(
                    f"unsupported datatype {name} for {kind} '{tensor.name}' of model '{config.name}' "
                    "(the pytorch backend takes numeric and BOOL tensors; BYTES are not supported)"
                )


# --- the model ---------------------------------------------------------------------------------


class PyTorchModel(Model):
    backend_name = "pytorch"

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        path = model_file_path(config, version_dir)
        if not is_pt2(config, path):
            # Like Triton: a TorchScript file has no reliable signature (types and shapes are not
            # recorded), so its inputs and outputs must be in the config.
            log.info("model '%s': auto-complete skipped, TorchScript models list inputs and outputs "
                     "in their config", config.name)
            return False
        program = load_exported(path)  # a file that cannot load fails here, with its reason
        try:
            inputs, outputs = exported_signature(program)
        except InvalidArgument as error:
            log.info("model '%s': auto-complete skipped: %s", config.name, error)
            return False
        # Ordinal names (Triton's INPUT__<i>) so that auto-completed and written configs agree.
        inputs = [(f"INPUT__{i}", datatype, dims) for i, (_, datatype, dims) in enumerate(inputs)]
        return complete_io_from_model(config, inputs, outputs,
                                      default_max_batch_size=int(options.get("default_max_batch_size", 4)))

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        super().__init__(config, version_dir, version)
        self.path = model_file_path(config, version_dir)
        if not self.path.is_file():
            raise Unavailable(f"unable to find '{self.path}' for model '{config.name}'")
        for kind, tensors in (("input", config.input), ("output", config.output)):
            if not tensors:
                hint = ("auto-complete fills them from a torch.export program whose arguments are "
                        "positional tensors, when it is enabled" if is_pt2(config, self.path) else
                        "a TorchScript file records no signature: list them in config.pbtxt")
                raise InvalidArgument(
                    f"model configuration of '{config.name}' must contain at least one {kind}, none were "
                    f"specified ({hint})"
                )
        _check_datatypes(config)
        self.settings = parse_settings(config)
        if self.settings.inter_op_threads is not None:
            apply_inter_op_threads(config.name, self.settings.inter_op_threads)

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        return PyTorchInstance(self.path, self.config, self.settings, group, index)


def instance_device(group: mc.ModelInstanceGroup, index: int) -> torch.device | None:
    """cpu, cuda:<id>, or None for KIND_MODEL (the module stays where the file put it)."""
    if group.kind == mc.ModelInstanceGroup.KIND_MODEL:
        return None
    if group.kind != mc.ModelInstanceGroup.KIND_GPU:
        return torch.device("cpu")
    gpu = group.gpus[index % len(group.gpus)] if group.gpus else 0
    if not torch.cuda.is_available():
        raise Unavailable(f"instance group '{group.name}' is KIND_GPU but torch {torch.__version__} has no "
                          "usable CUDA device (use KIND_CPU, or a CUDA build of torch on a GPU machine)")
    if gpu >= torch.cuda.device_count():
        raise Unavailable(f"instance group '{group.name}' asks for GPU {gpu}, torch sees "
                          f"{torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", gpu)


class PyTorchInstance(ThreadedInstance):
    def __init__(self, path: Path, config: mc.ModelConfig, settings: Settings, group: mc.ModelInstanceGroup,
                 index: int) -> None:
        self.settings = settings
        self.device = instance_device(group, index)
        self.torchscript = not is_pt2(config, path)
        if self.torchscript:
            self.module: Any = load_torchscript(path, self.device)
            arguments = torchscript_arguments(self.module)
        else:
            program = load_exported(path)
            inputs, outputs = exported_signature(program)
            _check_program_types(config, inputs, outputs)
            arguments = [Argument(name, "tensor") for name, _, _ in inputs]
            if self.device is not None:
                # rewrites the device constants export recorded too, not only the weights
                program = move_to_device_pass(program, self.device)
            self.module = program.module()
        self.dict_input = [a.name for a in arguments if a.kind == "dict"]
        tensor = Argument("", "tensor")
        self.inputs = ([(t.name, tensor) for t in config.input] if self.dict_input
                       else bind_inputs(config, arguments))
        self.input_device = self.device if self.device is not None else torch.device("cpu")
        self.bf16_inputs = frozenset(t.name for t in config.input if t.data_type == mc.TYPE_BF16)
        self.reshapes = {t.name: tuple(t.reshape.shape) for t in config.input if t.HasField("reshape")}
        self.output_names = [tensor.name for tensor in config.output]
        self.output_types = [DataType.from_config(mc.DataType.Name(t.data_type)) for t in config.output]
        self.output_positions: list[int] | None = None  # bound on the first result (its structure)
        self.model_name = config.name
        self._threads_set_on: int | None = None  # the thread whose intra-op thread count is set

    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        count = len(batch.requests)
        arrays = batch.inputs()
        try:
            args = [self._argument(name, argument, arrays.get(name)) for name, argument in self.inputs]
            if self.dict_input:
                args = [{name: arg for (name, _), arg in zip(self.inputs, args, strict=True)}]
        except InvalidArgument as error:  # bad request data, not a broken instance
            return [error] * count
        try:
            with self._mode():
                result = self.module(*args)
        except Exception as error:  # the model refused this batch: fail its requests, serve on
            return [InternalError(f"PyTorch execute failure: {_reason(error)}")] * count
        try:
            outputs = self._outputs(result)
        except InvalidArgument as error:
            return [error] * count
        if self.settings.cache_cleaning and self.input_device.type == "cuda":
            torch.cuda.empty_cache()
        return list(batch.split(outputs))

    @contextlib.contextmanager
    def _mode(self) -> Iterator[None]:
        # The intra-op thread count of torch's OpenMP pool is kept per calling thread, so each
        # instance sets its own on the thread that runs it (and again if that thread changes).
        if self._threads_set_on != threading.get_ident():
            torch.set_num_threads(self.settings.intra_op_threads)
            self._threads_set_on = threading.get_ident()
        grad = torch.inference_mode() if self.settings.inference_mode else torch.no_grad()
        with grad:
            if self.torchscript:
                # thread-local in torch: other instances keep their own setting
                with torch.jit.optimized_execution(self.settings.optimized_execution):
                    yield
            else:
                yield

    def _argument(self, name: str, argument: Argument, array: np.ndarray | None) -> Any:
        if array is None:
            raise InvalidArgument(f"expected input '{name}' for model '{self.model_name}'")
        if argument.kind != "tensor":
            if array.size != 1:
                raise InvalidArgument(f"input '{name}' feeds forward() argument '{argument.name}' of type "
                                      f"{argument.kind} and must hold one element, got shape {list(array.shape)}")
            return _SCALAR_KINDS[argument.kind](array.reshape(-1)[0].item())
        shape = self.reshapes.get(name)
        if shape is not None:
            array = array.reshape((array.shape[0], *shape) if array.ndim > len(shape) else shape)
        if not array.flags.writeable:
            # torch tensors are writable; a model may change its input in place, the request's
            # buffer must not change
            array = array.copy()
        tensor = torch.from_numpy(array)
        if name in self.bf16_inputs:  # BF16 arrives as uint16 raw bits
            tensor = tensor.view(torch.bfloat16)
        return tensor.to(self.input_device, non_blocking=True) if self.input_device.type != "cpu" else tensor

    def _outputs(self, result: Any) -> dict[str, np.ndarray]:
        leaves = flatten_result(result)
        if self.output_positions is None:
            self.output_positions = bind_outputs(self.output_names, leaves)
        outputs = {}
        for name, datatype, position in zip(self.output_names, self.output_types, self.output_positions,
                                            strict=True):
            if position >= len(leaves):
                raise InvalidArgument(f"the model returned {len(leaves)} output tensor(s): none at "
                                      f"position {position} for output '{name}'")
            tensor = leaves[position][1]
            actual = _FROM_TORCH.get(tensor.dtype)
            if actual is not datatype:
                raise InvalidArgument(
                    f"output '{name}' of model '{self.model_name}' is {tensor.dtype}, configuration "
                    f"expects {datatype.config_name}"
                )
            tensor = tensor.detach().cpu()
            if datatype is DataType.BF16:
                tensor = tensor.view(torch.uint16)  # numpy has no bfloat16: pass the raw bits
            outputs[name] = tensor.numpy()
        return outputs

    def close(self) -> None:
        super().close()  # the instance's thread ends (its last batch done) before the module goes
        self.module = None
        if self.input_device.type == "cuda":
            torch.cuda.empty_cache()


def _check_program_types(config: mc.ModelConfig, inputs: list[ModelTensor], outputs: list[ModelTensor]) -> None:
    """Fail the load, as for ONNX, when the config's types disagree with the exported program's."""
    for kind, listed, provided in (("input", config.input, inputs), ("output", config.output, outputs)):
        if len(listed) != len(provided):
            raise InvalidArgument(f"unable to load model '{config.name}', configuration expects {len(listed)} "
                                  f"{kind}s, model provides {len(provided)}")
        names = [name for name, _, _ in provided]
        for i, tensor in enumerate(listed):
            match = INDEXED.search(tensor.name)
            position = names.index(tensor.name) if tensor.name in names else (int(match.group(1)) if match else i)
            if position >= len(provided):
                continue  # bind_inputs / bind_outputs report it
            expected = mc.DataType.Name(tensor.data_type)
            actual = provided[position][1]
            if actual.config_name != expected:
                raise InvalidArgument(
                    f"unable to load model '{config.name}', configuration expects datatype {expected} for "
                    f"{kind} '{tensor.name}', model provides {actual.config_name}"
                )
