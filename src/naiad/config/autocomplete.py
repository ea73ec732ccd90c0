"""Auto-complete a ModelConfig the way Triton does.

Three stages, in the order the core runs them:
1. `resolve_backend` — the core's `AutoCompleteBackendFields`: name, backend, platform and
   default_model_filename from what the config and the model directory say.
2. Backend auto-complete (when enabled), e.g. `complete_io_from_model` for ONNX Runtime.
3. `fill_defaults` — the core's normalisation, which runs even with auto-complete disabled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from naiad.config.model_config import ModelConfig
from naiad.errors import InvalidArgument
from naiad.types import DataType

ENSEMBLE_PLATFORM = "ensemble"

DEFAULT_MODEL_FILENAMES: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "openvino": "model.xml",
    "python": "model.py",
    "tensorflow": "model.savedmodel",
    "dali": "model.dali",
    "custom": "model.so",  # naiad's C ABI backend (docs/custom_backend.md)
}
"""backend -> the model file it loads when `default_model_filename` is not set."""

PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "torch_aoti": "pytorch",  # PT2 archives (model.pt2)
    ENSEMBLE_PLATFORM: "",
}
"""platform -> backend; ensembles have no backend ("")."""

BACKEND_PLATFORMS: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}
"""backend -> the platform filled in when only the backend is given (TensorFlow has two: it
takes its platform from the model file)."""

PLATFORM_MODEL_FILENAMES: dict[str, str] = {
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
    "torch_aoti": "model.pt2",
}

# TensorFlow (SavedModel / GraphDef) and PyTorch (TorchScript model.pt / PT2 archive model.pt2).
_FILE_PLATFORM_BACKENDS = frozenset({"tensorflow", "pytorch"})
# Triton's core fills default_model_filename only for these; other backends pick their own.
_CORE_FILENAME_BACKENDS = frozenset(
    {"onnxruntime", "pytorch", "tensorrt", "openvino", "python", "tensorflow"}
)
# Triton's SetDefaultInstanceCount: these run two CPU instances unless told otherwise.
_TWO_CPU_INSTANCE_BACKENDS = frozenset({"onnxruntime", "tensorflow"})
_TWO_CPU_INSTANCES = 2
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000


@dataclass(frozen=True, slots=True)
class _Candidate:
    backend: str
    platform: str
    filename: str
    kind: str  # "file", "dir" or "any": what the default model path must be


# Triton's order of detection; TensorFlow first, then TensorRT, ONNX, OpenVINO, PyTorch, Python.
_CANDIDATES = (
    _Candidate("tensorflow", "tensorflow_savedmodel", "model.savedmodel", "dir"),
    _Candidate("tensorflow", "tensorflow_graphdef", "model.graphdef", "file"),
    _Candidate("tensorrt", "tensorrt_plan", "model.plan", "file"),
    _Candidate("onnxruntime", "onnxruntime_onnx", "model.onnx", "any"),
    _Candidate("openvino", "", "model.xml", "any"),
    _Candidate("pytorch", "pytorch_libtorch", "model.pt", "file"),
    _Candidate("pytorch", "torch_aoti", "model.pt2", "file"),
    _Candidate("python", "", "model.py", "any"),
    _Candidate("dali", "", "model.dali", "any"),
)


# --- backend resolution ----------------------------------------------------------------------


def resolve_backend(
    config: ModelConfig,
    model_dir: Path,
    first_version_dir: Path | None,
    *,
    model_name: str | None = None,
) -> None:
    """Fill `name`, `backend`, `platform` and `default_model_filename` like Triton's core.

    The backend comes from the platform, else from default_model_filename (its name or
    extension), else from which default model file exists in `first_version_dir`, else from a
    model named `<model>.<backend>`. Fields already set are kept. `model_name` defaults to the
    directory name (a load with file overrides lives in a temporary directory).
    Raises InvalidArgument when no backend can be determined.
    """
    name = model_name or model_dir.name
    if not config.name:
        config.name = name
    if not config.backend:
        _detect_backend(config, first_version_dir, name)
    if not config.backend:
        if config.platform == ENSEMBLE_PLATFORM:
            return
        _raise_unknown_backend(config, name)
    if not config.platform:
        _fill_platform(config, first_version_dir)
    if not config.default_model_filename:
        _fill_default_filename(config)


def _detect_backend(config: ModelConfig, version_dir: Path | None, name: str) -> None:
    if config.platform:
        config.backend = PLATFORM_BACKENDS.get(config.platform, "")
        return
    if config.default_model_filename:
        candidate = _match_filename(config.default_model_filename)
    elif version_dir is not None:
        candidate = _match_version_dir(version_dir)
    else:
        candidate = None
    if candidate is not None:
        config.backend = candidate.backend
        config.platform = candidate.platform
    elif not config.default_model_filename:
        _backend_from_name(config, name)


def _match_filename(filename: str, backend: str | None = None) -> _Candidate | None:
    candidates = [c for c in _CANDIDATES if backend is None or c.backend == backend]
    for candidate in candidates:
        if filename == candidate.filename:
            return candidate
    suffix = Path(filename).suffix
    for candidate in candidates:
        if suffix and suffix == Path(candidate.filename).suffix:
            return candidate
    return None


def _match_version_dir(version_dir: Path, backend: str | None = None) -> _Candidate | None:
    for candidate in _CANDIDATES:
        if backend is not None and candidate.backend != backend:
            continue
        path = version_dir / candidate.filename
        if candidate.kind == "dir" and path.is_dir():
            return candidate
        if candidate.kind == "file" and path.is_file():
            return candidate
        if candidate.kind == "any" and path.exists():
            return candidate
    return None


def _backend_from_name(config: ModelConfig, name: str) -> None:
    # Triton lets a custom backend be named by the model: `mymodel.identity` -> backend identity.
    _, dot, backend = name.partition(".")
    if dot and backend:
        config.backend = backend
        config.default_model_filename = f"model.{backend}"


def _raise_unknown_backend(config: ModelConfig, name: str) -> None:
    if not config.platform and not config.default_model_filename and "." not in name:
        raise InvalidArgument(
            f"Invalid model name: Could not determine backend for model '{name}' with no backend "
            "in model configuration. Expected model name of the form 'model.<backend_name>'."
        )
    raise InvalidArgument(f"unexpected platform type '{config.platform}' for {name}")


def _fill_platform(config: ModelConfig, version_dir: Path | None) -> None:
    if config.backend in _FILE_PLATFORM_BACKENDS:
        # backends with several platforms take theirs from the model file
        candidate = None
        if config.default_model_filename:
            candidate = _match_filename(config.default_model_filename, config.backend)
        elif version_dir is not None:
            candidate = _match_version_dir(version_dir, config.backend)
        if candidate is not None:
            config.platform = candidate.platform
            return
    if config.backend in BACKEND_PLATFORMS:
        config.platform = BACKEND_PLATFORMS[config.backend]


def _fill_default_filename(config: ModelConfig) -> None:
    if config.platform in PLATFORM_MODEL_FILENAMES:
        config.default_model_filename = PLATFORM_MODEL_FILENAMES[config.platform]
    elif config.backend in _CORE_FILENAME_BACKENDS and config.backend != "tensorflow":
        config.default_model_filename = DEFAULT_MODEL_FILENAMES[config.backend]


def model_file_path(config: ModelConfig, version_dir: Path) -> Path:
    """The model file (or directory) a backend loads from `version_dir`."""
    filename = config.default_model_filename or _default_filename(config)
    return version_dir / filename


def _default_filename(config: ModelConfig) -> str:
    if config.platform in PLATFORM_MODEL_FILENAMES:
        return PLATFORM_MODEL_FILENAMES[config.platform]
    return DEFAULT_MODEL_FILENAMES.get(config.backend, f"model.{config.backend}")


# --- defaults --------------------------------------------------------------------------------


def fill_defaults(
    config: ModelConfig,
    default_instance_count: int = 1,
    *,
    gpus_available: bool = False,
    gpu_ids: Sequence[int] = (0,),
    add_dynamic_batching: bool = False,
) -> None:
    """Fill the defaults Triton's core fills even when auto-complete is disabled.

    - version_policy: latest { num_versions: 1 }.
    - `add_dynamic_batching` (the backend auto-completed a batching model): a model with
      max_batch_size > 1 and no scheduler gets `dynamic_batching {}`.
    - Batchers: preferred_batch_size defaults to [max_batch_size]; sequence idle time to 1 s.
    - Not for ensembles: input/output pinned memory enabled; one instance group when none is
      given (named after the model); each group gets a name (`<model>_<index>`), a kind
      (KIND_AUTO -> KIND_GPU on `gpu_ids` when `gpus_available`, else KIND_CPU) and a count.
      The count is `default_instance_count`, but at least 2 for CPU groups of onnxruntime and
      tensorflow models (Triton's rule).
    """
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1
    if add_dynamic_batching and config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
        config.dynamic_batching.SetInParent()
    _fill_batcher_defaults(config)
    if config.HasField("ensemble_scheduling") or config.platform == ENSEMBLE_PLATFORM:
        return
    _fill_pinned_memory(config)
    gpus = list(gpu_ids) if gpus_available else []
    _fill_instance_groups(config, default_instance_count, gpus)


def _fill_batcher_defaults(config: ModelConfig) -> None:
    max_batch_size = config.max_batch_size
    if config.HasField("dynamic_batching"):
        preferred = config.dynamic_batching.preferred_batch_size
        if not preferred and max_batch_size > 0:
            preferred.append(max_batch_size)
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(max_batch_size)


def _fill_pinned_memory(config: ModelConfig) -> None:
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def _fill_instance_groups(config: ModelConfig, default_count: int, gpus: list[int]) -> None:
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            on_gpu = bool(gpus) and all(gpu in gpus for gpu in group.gpus)
            group.kind = pb.ModelInstanceGroup.KIND_GPU if on_gpu else pb.ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            group.count = _default_count(group.kind, config.backend, default_count)
        if group.kind == pb.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def _default_count(kind: int, backend: str, default_count: int) -> int:
    if kind == pb.ModelInstanceGroup.KIND_CPU and backend in _TWO_CPU_INSTANCE_BACKENDS:
        return max(default_count, _TWO_CPU_INSTANCES)
    return default_count


# --- I/O from the model file -----------------------------------------------------------------

ModelTensor = tuple[str, DataType, tuple[int, ...]]
"""A model file's input or output: name, datatype and shape (-1 for a dynamic dimension)."""


def complete_io_from_model(
    config: ModelConfig,
    model_inputs: Sequence[ModelTensor],
    model_outputs: Sequence[ModelTensor],
    default_max_batch_size: int = 4,
) -> bool:
    """Complete inputs, outputs and max_batch_size from the model file's own I/O.

    Like Triton's ONNX Runtime backend: when the config does not list both inputs and outputs,
    a model whose every input and output has a dynamic first dimension batches, so a
    max_batch_size of 0 becomes `default_max_batch_size` and that first dimension leaves the
    config dims. (Unlike Triton, tensors the config already lists with the full model rank keep
    the model non-batching, since their dims would otherwise gain a second batch dimension.)
    An empty input or output list is filled from the model; listed tensors keep their settings
    and only get a missing data_type or dims. A scalar becomes dims [1] (plus an empty reshape
    when batching).

    Returns True when the model batches and the config was auto-completed: the case in which
    Triton adds `dynamic_batching {}` (pass it to `fill_defaults(add_dynamic_batching=...)`).
    Raises InvalidArgument when max_batch_size > 0 but the model cannot batch.
    """
    auto = not (config.input and config.output)
    tensors = [*model_inputs, *model_outputs]
    can_batch = all(shape and shape[0] == -1 for _, _, shape in tensors)
    if auto:
        if config.max_batch_size == 0 and can_batch and _listed_dims_allow_batching(config, tensors):
            config.max_batch_size = max(default_max_batch_size, 0)
        elif config.max_batch_size != 0 and not can_batch:
            raise InvalidArgument(
                f"autofill failed for model '{config.name}': model does not support batching while "
                "non-zero max_batch_size is specified"
            )
    batching = config.max_batch_size > 0
    _complete_tensors(config.input, model_inputs, batching)
    _complete_tensors(config.output, model_outputs, batching)
    return auto and can_batch


def _listed_dims_allow_batching(config: ModelConfig, tensors: Sequence[ModelTensor]) -> bool:
    ranks = {name: len(shape) for name, _, shape in tensors}
    for io in [*config.input, *config.output]:
        if io.name not in ranks or not (io.dims or io.HasField("reshape")):
            continue
        model_side = io.reshape.shape if io.HasField("reshape") else io.dims
        if len(model_side) != ranks[io.name] - 1:
            return False
    return True


def _complete_tensors(listed: Any, model_tensors: Sequence[ModelTensor], batching: bool) -> None:
    if not listed:
        for name, datatype, shape in model_tensors:
            io = listed.add(name=name, data_type=_config_type(datatype))
            _fill_dims(io, shape, batching)
        return
    by_name = {name: (datatype, shape) for name, datatype, shape in model_tensors}
    for io in listed:
        if io.name not in by_name:
            continue
        datatype, shape = by_name[io.name]
        if io.data_type == pb.TYPE_INVALID:
            io.data_type = _config_type(datatype)
        if not io.dims and not io.HasField("reshape"):
            _fill_dims(io, shape, batching)


def _fill_dims(io: pb.ModelInput | pb.ModelOutput, shape: tuple[int, ...], batching: bool) -> None:
    dims = shape[1:] if batching else shape
    if dims:
        io.dims.extend(dims)
        return
    io.dims.append(1)
    if batching:
        # An empty reshape on a batching model is Triton's way of saying "scalar per item".
        io.reshape.SetInParent()


def _config_type(datatype: DataType) -> int:
    return int(pb.DataType.Value(datatype.config_name))
