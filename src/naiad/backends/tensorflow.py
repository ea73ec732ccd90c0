"""TensorFlow backend (config backend "tensorflow", platform "tensorflow_savedmodel").

A version holds a SavedModel directory (`<version>/model.savedmodel/`). The model serves one of
its signatures: `serving_default` unless the config parameter TF_SIGNATURE_DEF names another,
from the meta graph tagged TF_GRAPH_TAG (default "serve") — Triton's parameters. As in Triton,
config input and output names are the signature's keys, not the graph's tensor names.

The SavedModel is loaded once per model version and its signature function is shared by every
instance: TF2 runs functions eagerly on one process-wide runtime (thread pools, devices), and a
loaded signature is safe to call from several threads at once (the weights are read-only
variables), so separate loads per instance would only duplicate the weights without adding any
parallelism. Each instance is a thread calling it; TF releases the GIL while the graph runs.

TF_NUM_INTRA_THREADS / TF_NUM_INTER_THREADS size TF's thread pools. In TF2 those pools are
process-wide and fixed once the runtime starts, so the first TensorFlow model loaded in a process
sets them; a later model asking for different values gets a warning in the log.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, RequestResult
from naiad.backends.threaded import ThreadedInstance
from naiad.config.autocomplete import ModelTensor, complete_io_from_model, model_file_path
from naiad.errors import InvalidArgument, Unavailable, Unsupported
from naiad.types import DataType

if TYPE_CHECKING:
    from tensorflow.core.protobuf import meta_graph_pb2

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAG = "serve"
SIGNATURE_PARAMETER = "TF_SIGNATURE_DEF"
TAG_PARAMETER = "TF_GRAPH_TAG"
INTRA_PARAMETER = "TF_NUM_INTRA_THREADS"
INTER_PARAMETER = "TF_NUM_INTER_THREADS"
# Triton parameters for TF1-style sessions, which TF2's eager runtime has no use for.
_IGNORED_PARAMETERS = {
    "TF_USE_PER_SESSION_THREADS": "TF2's thread pools are process-wide",
    "MAX_SESSION_SHARE_COUNT": "instances always share the one loaded SavedModel",
    "TF_INIT_OPS_FILE": "init ops belong to GraphDef models",
}

# TensorFlow dtype names (tf.dtypes.DType.name) -> V2 datatypes.
_TF_TYPES = {
    "bool": DataType.BOOL,
    "int8": DataType.INT8,
    "int16": DataType.INT16,
    "int32": DataType.INT32,
    "int64": DataType.INT64,
    "uint8": DataType.UINT8,
    "uint16": DataType.UINT16,
    "uint32": DataType.UINT32,
    "uint64": DataType.UINT64,
    "float16": DataType.FP16,
    "float32": DataType.FP32,
    "float64": DataType.FP64,
    "string": DataType.BYTES,
    "bfloat16": DataType.BF16,
}


_imported: dict[str, Any] = {}
_import_lock = threading.Lock()


def import_tensorflow() -> Any:
    """TensorFlow, imported once (models load on several threads at once: a second thread must
    not see a half-imported module) and without its start-up noise in the server log."""
    tf = _imported.get("tf")
    if tf is None:
        with _import_lock:
            if "tf" not in _imported:
                _imported["tf"] = _import_quietly()
            tf = _imported["tf"]
    return tf


def _import_quietly() -> Any:
    """TF_CPP_MIN_LOG_LEVEL=2 hides the C++ runtime's INFO and WARNING lines, but TF 2.21 prints its
    oneDNN notice (and absl's "before InitializeLog" warning) while its libraries load, whatever
    the level; stderr's file descriptor is pointed at /dev/null for the first import alone. Set
    TF_CPP_MIN_LOG_LEVEL=0 to see all of it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    quiet = "tensorflow" not in sys.modules and os.environ["TF_CPP_MIN_LOG_LEVEL"] not in ("0", "1")
    saved = os.dup(2) if quiet else -1
    try:
        if quiet:
            sys.stderr.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        import tensorflow as tf
        from tensorflow.core.protobuf import saved_model_pb2
    finally:
        if saved >= 0:
            os.dup2(saved, 2)
            os.close(saved)
    tf.get_logger().setLevel(logging.ERROR)
    _imported["saved_model_pb2"] = saved_model_pb2
    return tf


# --- reading the SavedModel's signature ---------------------------------------------------------


def _parameter(config: mc.ModelConfig, key: str, default: str = "") -> str:
    if key in config.parameters:
        return str(config.parameters[key].string_value)
    return default


def _saved_model_dir(config: mc.ModelConfig, version_dir: Path) -> Path:
    if config.platform == "tensorflow_graphdef":
        raise Unsupported(f"unable to load model '{config.name}': platform tensorflow_graphdef (a frozen GraphDef) "
                          "is not supported; export the model as a SavedModel (platform tensorflow_savedmodel)")
    path = model_file_path(config, version_dir)
    if not path.exists():
        raise Unavailable(f"unable to find '{path}' for model '{config.name}': a SavedModel directory is expected")
    if not path.is_dir():
        raise InvalidArgument(f"unable to load model '{config.name}': '{path}' is not a SavedModel directory")
    return path


def _read_signature(config: mc.ModelConfig, path: Path) -> meta_graph_pb2.SignatureDef:
    """The SignatureDef the config selects, read from saved_model.pb (no weights loaded)."""
    import_tensorflow()
    from google.protobuf.message import DecodeError

    saved_model_pb2 = _imported["saved_model_pb2"]
    pb_file = path / "saved_model.pb"
    if not pb_file.is_file():
        raise InvalidArgument(f"unable to load model '{config.name}': '{path}' holds no saved_model.pb")
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(pb_file.read_bytes())
    except DecodeError as error:
        raise InvalidArgument(f"unable to load model '{config.name}': '{pb_file}' is corrupt ({error})") from None
    if not saved.meta_graphs:
        raise InvalidArgument(f"unable to load model '{config.name}': '{pb_file}' holds no meta graph")
    tag = _parameter(config, TAG_PARAMETER, DEFAULT_TAG)
    graphs = [g for g in saved.meta_graphs if tag in g.meta_info_def.tags]
    if not graphs:
        found = "; ".join(",".join(g.meta_info_def.tags) or "(none)" for g in saved.meta_graphs)
        raise InvalidArgument(f"unable to load model '{config.name}': no meta graph tagged '{tag}' "
                              f"(set {TAG_PARAMETER}); its tag sets are: {found}")
    name = _parameter(config, SIGNATURE_PARAMETER, DEFAULT_SIGNATURE)
    signatures = graphs[0].signature_def
    if name not in signatures:
        available = ", ".join(sorted(signatures)) or "(none)"
        raise InvalidArgument(f"unable to load model '{config.name}': the SavedModel has no signature '{name}' "
                              f"(set {SIGNATURE_PARAMETER}); its signatures are: {available}")
    return signatures[name]


def _datatype(key: str, info: Any) -> DataType:
    tf = import_tensorflow()
    try:
        name = tf.dtypes.as_dtype(info.dtype).name
    except TypeError:
        name = str(info.dtype)
    if name not in _TF_TYPES:
        raise InvalidArgument(f"unsupported TensorFlow type '{name}' for tensor '{key}'")
    return _TF_TYPES[name]


def _shape(info: Any) -> tuple[int, ...] | None:
    """The tensor's dims (-1 where unknown), or None when even its rank is unknown."""
    if info.tensor_shape.unknown_rank:
        return None
    return tuple(int(d.size) if d.size >= 0 else -1 for d in info.tensor_shape.dim)


def _tensors(infos: Mapping[str, Any]) -> list[tuple[str, DataType, tuple[int, ...] | None]]:
    # A signature's inputs and outputs are a proto map: sort for a stable config order.
    return [(key, _datatype(key, infos[key]), _shape(infos[key])) for key in sorted(infos)]


# --- checking the config against the signature -------------------------------------------------


def _check_config_matches(config: mc.ModelConfig, signature: Any) -> None:
    """Fail the load, with Triton's messages, when the config and the signature disagree."""
    inputs = {key: (dt, shape) for key, dt, shape in _tensors(signature.inputs)}
    outputs = {key: (dt, shape) for key, dt, shape in _tensors(signature.outputs)}
    # Every signature input must be fed: by a config input, or by a tensor the server makes (batch
    # inputs, sequence controls, implicit state).
    sequence = config.sequence_batching
    fed = len(config.input) + len(config.batch_input) + len(sequence.control_input) + len(sequence.state)
    if fed != len(inputs):
        raise InvalidArgument(f"unable to load model '{config.name}', configuration expects {len(config.input)} "
                              f"inputs, model provides {len(inputs)}")
    batching = config.max_batch_size > 0
    for kind, listed, provided in (("input", config.input, inputs), ("output", config.output, outputs)):
        for tensor in listed:
            if tensor.name not in provided:
                allowed = ", ".join(provided)
                raise InvalidArgument(f"unexpected inference {kind} '{tensor.name}', allowed {kind}s are: {allowed}")
            datatype, shape = provided[tensor.name]
            expected = mc.DataType.Name(tensor.data_type)
            if datatype.config_name != expected:
                raise InvalidArgument(
                    f"unable to load model '{config.name}', configuration expects datatype {expected} for "
                    f"{kind} '{tensor.name}', model provides {datatype.config_name}")
            if shape is not None:
                dims = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)
                _check_dims(config.name, kind, tensor.name, shape, dims, batching)


def _check_dims(model: str, kind: str, name: str, shape: tuple[int, ...], dims: tuple[int, ...],
                batching: bool) -> None:
    full = ((-1, *dims) if batching else dims)
    if batching and (not shape or shape[0] != -1):
        raise InvalidArgument(f"unable to load model '{model}', {kind} '{name}': max_batch_size > 0 needs a "
                              f"variable first dimension, the model's shape is {list(shape)}")
    matches = len(shape) == len(full) and all(m == -1 or c == -1 or m == c for m, c in zip(shape, full, strict=True))
    if not matches:
        raise InvalidArgument(f"unable to load model '{model}', {kind} '{name}': the model's shape {list(shape)} "
                              f"does not match the configuration's {list(full)}"
                              + (" (batch dimension first, as max_batch_size > 0)" if batching else ""))


# --- the backend ---------------------------------------------------------------------------------


class TensorFlowModel(Model):
    backend_name = "tensorflow"

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        signature = _read_signature(config, _saved_model_dir(config, version_dir))
        model_inputs = _known_shapes(config, config.input, _tensors(signature.inputs))
        model_outputs = _known_shapes(config, config.output, _tensors(signature.outputs))
        return complete_io_from_model(config, model_inputs, model_outputs,
                                      default_max_batch_size=int(options.get("default_max_batch_size", 4)))

    def __init__(self, config: mc.ModelConfig, version_dir: Path, version: int) -> None:
        super().__init__(config, version_dir, version)
        self.path = _saved_model_dir(config, version_dir)
        self.signature_name = _parameter(config, SIGNATURE_PARAMETER, DEFAULT_SIGNATURE)
        signature = _read_signature(config, self.path)
        _check_config_matches(config, signature)
        for key, why in _IGNORED_PARAMETERS.items():
            if key in config.parameters:
                log.warning("model '%s': parameter %s is ignored (%s)", config.name, key, why)
        tf = import_tensorflow()
        _set_threads(tf, config)
        tag = _parameter(config, TAG_PARAMETER, DEFAULT_TAG)
        try:
            self.saved = tf.saved_model.load(str(self.path), tags=[tag])
        except Exception as error:  # TF raises many kinds for a damaged SavedModel; all mean "cannot load"
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise InvalidArgument(f"unable to load model '{config.name}' from '{self.path}': {reason}") from None
        # The signature function holds the loaded object's variables; keep both alive together.
        self.function: Callable[..., Mapping[str, Any]] = self.saved.signatures[self.signature_name]

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        return TensorFlowInstance(self, _device(group, index))

    def close(self) -> None:
        self.function = None  # type: ignore[assignment]
        self.saved = None


def _known_shapes(config: mc.ModelConfig, listed: Any,
                  tensors: list[tuple[str, DataType, tuple[int, ...] | None]]) -> list[ModelTensor]:
    """Signature tensors with a known rank; an unknown-rank one takes the config's dims, if any."""
    by_name = {io.name: io for io in listed}
    known: list[ModelTensor] = []
    for key, datatype, shape in tensors:
        if shape is None:
            io = by_name.get(key)
            if io is None or not io.dims:
                raise InvalidArgument(f"unable to auto-complete model '{config.name}': the signature does not give "
                                      f"the rank of '{key}'; list it in the config with its dims")
            shape = ((-1, *io.dims) if config.max_batch_size > 0 else tuple(io.dims))
        known.append((key, datatype, shape))
    return known


def _set_threads(tf: Any, config: mc.ModelConfig) -> None:
    for key, setter, getter in (
        (INTRA_PARAMETER, tf.config.threading.set_intra_op_parallelism_threads,
         tf.config.threading.get_intra_op_parallelism_threads),
        (INTER_PARAMETER, tf.config.threading.set_inter_op_parallelism_threads,
         tf.config.threading.get_inter_op_parallelism_threads),
    ):
        value = _parameter(config, key)
        if not value:
            continue
        try:
            count = int(value)
        except ValueError:
            raise InvalidArgument(f"unable to load model '{config.name}': {key} must be an integer, "
                                  f"got '{value}'") from None
        if count < 0:
            raise InvalidArgument(f"unable to load model '{config.name}': {key} must not be negative")
        if getter() == count:
            continue
        try:
            setter(count)
        except RuntimeError:  # the runtime already runs: its pools are fixed for this process
            log.warning("model '%s': %s=%d not applied, TensorFlow's thread pools already run with %d "
                        "(they are process-wide; the first TensorFlow model loaded sets them)",
                        config.name, key, count, getter())


def _device(group: mc.ModelInstanceGroup, index: int) -> str:
    if group.kind != mc.ModelInstanceGroup.KIND_GPU:
        return "/CPU:0"
    gpu = group.gpus[index % len(group.gpus)] if group.gpus else 0
    found = import_tensorflow().config.list_physical_devices("GPU")
    if gpu >= len(found):
        raise Unavailable(f"instance group '{group.name}' asks for GPU {gpu}, but TensorFlow sees "
                          f"{len(found)} GPU(s) (tensorflow-cpu has none)")
    return f"/GPU:{gpu}"


class TensorFlowInstance(ThreadedInstance):
    def __init__(self, model: TensorFlowModel, device: str) -> None:
        self.tf = import_tensorflow()
        self.function = model.function
        self.device = device
        config = model.config
        self.input_types = {i.name: DataType.from_config(mc.DataType.Name(i.data_type)) for i in config.input}
        self.input_shapes = {i.name: tuple(i.reshape.shape) for i in config.input if i.HasField("reshape")}
        # Only the outputs the config lists are fetched (Triton ignores the signature's others).
        self.outputs = [(o.name, tuple(o.dims) if o.HasField("reshape") else None) for o in config.output]

    def execute(self, batch: Batch) -> Sequence[RequestResult]:
        tf = self.tf
        try:
            feeds = {name: self._feed(name, array) for name, array in batch.inputs().items()}
            with tf.device(self.device):
                results = self.function(**feeds)
        except (tf.errors.InvalidArgumentError, TypeError, ValueError) as error:
            # Data the graph refuses (a shape its ops cannot take, a missing input) fails these
            # requests; the instance itself is fine.
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return [InvalidArgument(f"TensorFlow refused the input: {reason}")] * len(batch.requests)
        outputs = {name: self._fetch(results[name], dims, batch) for name, dims in self.outputs}
        return list(batch.split(outputs))

    def _feed(self, name: str, array: np.ndarray) -> Any:
        shape = self.input_shapes.get(name)
        if shape is not None:
            array = array.reshape((array.shape[0], *shape) if array.ndim > len(shape) else shape)
        if self.input_types.get(name) is DataType.BF16:
            # naiad carries bfloat16 as its raw uint16 bits; TF reinterprets them without a copy.
            return self.tf.bitcast(self.tf.constant(array, dtype=self.tf.uint16), self.tf.bfloat16)
        return array

    def _fetch(self, tensor: Any, dims: tuple[int, ...] | None, batch: Batch) -> np.ndarray:
        if tensor.dtype == self.tf.bfloat16:
            tensor = self.tf.bitcast(tensor, self.tf.uint16)
        array: np.ndarray = tensor.numpy()
        if dims is not None:  # the output's config reshape: give clients the config's dims back
            array = array.reshape((batch.size, *dims) if batch.batched else dims)
        return array
