"""Validate a (completed) ModelConfig the way Triton's core does before loading a model.

Error texts follow Triton's `model_config_utils.cc` wherever Triton has a check; checks Triton
does not make (duplicate tensor names, warmup limits, specific versions) use texts in the same
style. Every message names the offending field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from naiad.config.model_config import ModelConfig
from naiad.config.sequence import check_controls, check_states
from naiad.errors import InvalidArgument

ENSEMBLE_PLATFORM = "ensemble"
TENSORRT_PLATFORM = "tensorrt_plan"
WILDCARD_DIM = -1

# Backends whose platform must match (Triton's GetBackendType / GetBackendTypeFromPlatform);
# any platform is allowed with other (custom) backends.
_KNOWN_BACKEND_PLATFORMS = {
    "tensorflow": {"tensorflow_graphdef", "tensorflow_savedmodel"},
    "tensorrt": {"tensorrt_plan"},
    "onnxruntime": {"onnxruntime_onnx"},
    "pytorch": {"pytorch_libtorch", "torch_aoti"},
}
_CORRID_TYPES = {pb.TYPE_UINT64, pb.TYPE_INT64, pb.TYPE_UINT32, pb.TYPE_INT32, pb.TYPE_STRING}
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")  # Prometheus' rule for label names
#: Labels the metrics page sets itself (observability/metrics.py): a metric tag may not take them.
RESERVED_LABELS = ("model", "version", "reason", "le", "quantile")


def validate_config(config: ModelConfig, model_name: str, *, gpus: Collection[int] | None = None) -> None:
    """Raise InvalidArgument naming the field when `config` cannot be loaded as `model_name`.

    Call it after auto-complete and `fill_defaults`. `gpus` are the usable GPU ids; when None,
    GPU ids listed in instance groups are not checked against the machine.
    """
    name = config.name or model_name
    _check_name(config, model_name)
    _check_platform(config, name)
    if config.max_batch_size < 0:
        raise InvalidArgument(f"'max_batch_size' must be non-negative value for {name}")
    _check_version_policy(config, name)
    _check_dynamic_batching(config, name)
    _check_sequence_batching(config, name)
    _check_ensemble(config, name)
    _check_response_cache(config, name)
    _check_model_metrics(config)
    _check_metric_tags(config, name)
    _check_io(config, name)
    _check_instance_groups(config, name, gpus)
    _check_warmup(config, name)


def check_model_filenames(config: ModelConfig, name: str) -> None:
    """The model file names a config gives stay inside the version directory: a config can come
    from a client (the load API's `config`), and backends open, or run, the file it names.
    Triton documents no such check. Run before auto-complete, which opens the file."""
    named = {"default_model_filename": config.default_model_filename,
             **{f"cc_model_filenames[{key}]": value for key, value in config.cc_model_filenames.items()}}
    for field, filename in named.items():
        parts = filename.replace("\\", "/").split("/")
        if filename.startswith(("/", "\\")) or ".." in parts or (len(filename) > 1 and filename[1] == ":"):
            raise InvalidArgument(
                f"model '{name}': {field} '{filename}' must name a file inside the version directory "
                "(no absolute path, no '..')"
            )


def _check_name(config: ModelConfig, model_name: str) -> None:
    if config.name and config.name != model_name:
        raise InvalidArgument(
            f"unexpected directory name '{model_name}' for model '{config.name}', "
            "directory name must equal model name"
        )


def _check_platform(config: ModelConfig, name: str) -> None:
    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise InvalidArgument(f"unexpected platform type '{config.platform}' for {name}")
    elif config.platform == ENSEMBLE_PLATFORM:
        raise InvalidArgument(
            f"Ensemble model '{name}' must have platform type '{config.platform}' and empty backend type"
        )
    allowed = _KNOWN_BACKEND_PLATFORMS.get(config.backend)
    if allowed is not None and config.platform not in allowed:
        raise InvalidArgument(
            f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}"
        )


def _check_version_policy(config: ModelConfig, name: str) -> None:
    if config.version_policy.WhichOneof("policy_choice") != "specific":
        return
    for version in config.version_policy.specific.versions:
        if version < 1:
            raise InvalidArgument(
                f"'version_policy' specific versions must be integers >= 1 for {name}, got {version}"
            )


def _check_dynamic_batching(config: ModelConfig, name: str) -> None:
    if not config.HasField("dynamic_batching"):
        return
    # max_batch_size 0 with dynamic_batching is legal in Triton (queue policies still apply),
    # so only the preferred sizes are bounded by it.
    db = config.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise InvalidArgument(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise InvalidArgument(f"dynamic batching preferred size must be <= max batch size for {name}")
    _check_priorities(db, name)
    if db.preserve_ordering:
        _check_preserve_ordering(db, name)


def _check_priorities(db: pb.ModelDynamicBatching, name: str) -> None:
    levels = db.priority_levels
    if levels == 0:
        return
    if not 1 <= db.default_priority_level <= levels:
        raise InvalidArgument(f"default priority level must be in range [1, {levels}] for {name}")
    for level in db.priority_queue_policy:
        if not 1 <= level <= levels:
            raise InvalidArgument(
                f"priority queue policy must have priority level in range [1, {levels}] for {name}"
            )


def _check_preserve_ordering(db: pb.ModelDynamicBatching, name: str) -> None:
    if db.priority_levels > 1:
        raise InvalidArgument(
            f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
        )
    policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
    for policy in policies:
        if policy.default_timeout_microseconds != 0 and policy.timeout_action == pb.ModelQueuePolicy.DELAY:
            raise InvalidArgument(
                "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
                f"true for {name}"
            )


def _check_sequence_batching(config: ModelConfig, name: str) -> None:
    if not config.HasField("sequence_batching"):
        return
    sb = config.sequence_batching
    if config.response_cache.enable:
        raise InvalidArgument(
            f"Response Cache does not currently support model {name} with sequence batching "
            "scheduler. Please disable the response cache."
        )
    _check_corrid(sb, name)
    check_controls(sb, name)
    check_states(sb, name)
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                raise InvalidArgument(f"sequence batching preferred batch size must be positive for {name}")
            if size > config.max_batch_size:
                raise InvalidArgument(
                    f"sequence batching preferred batch size must be <= max batch size for {name}"
                )
    if sb.HasField("direct") and not 0.0 <= sb.direct.minimum_slot_utilization <= 1.0:
        raise InvalidArgument(
            f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
        )


def _check_corrid(sb: pb.ModelSequenceBatching, name: str) -> None:
    for control_input in sb.control_input:
        for control in control_input.control:
            if (
                control.kind == pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
                and control.data_type not in _CORRID_TYPES
            ):
                raise InvalidArgument(
                    f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed "
                    "data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
                )


def _check_response_cache(config: ModelConfig, name: str) -> None:
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise InvalidArgument(
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )


def _check_model_metrics(config: ModelConfig) -> None:
    for control in config.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise InvalidArgument("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise InvalidArgument("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise InvalidArgument("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise InvalidArgument("histogram options must specify non-empty 'buckets'")


def _check_metric_tags(config: ModelConfig, name: str) -> None:
    """Each tag becomes a label on every series of the model: a name Prometheus refuses, or one
    the page sets itself, would break /metrics for every model."""
    for key in config.metric_tags:
        if not _LABEL_NAME.match(key) or key.startswith("__"):
            raise InvalidArgument(f"model '{name}': metric_tags key '{key}' is not a valid Prometheus label name "
                                  "(letters, digits and '_', not starting with a digit or '__')")
        if key in RESERVED_LABELS:
            raise InvalidArgument(f"model '{name}': metric_tags key '{key}' is reserved (the metrics page sets "
                                  f"{', '.join(RESERVED_LABELS)} itself)")


# --- ensembles -------------------------------------------------------------------------------


def _check_ensemble(config: ModelConfig, name: str) -> None:
    has_scheduling = config.HasField("ensemble_scheduling")
    if not has_scheduling:
        if config.platform == ENSEMBLE_PLATFORM:
            raise InvalidArgument(
                f"ensemble scheduling must be set for ensemble {name} whose platform is ensemble"
            )
        return
    if config.platform != ENSEMBLE_PLATFORM:
        raise InvalidArgument(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not ensemble"
        )
    if config.instance_group:
        raise InvalidArgument(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise InvalidArgument(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise InvalidArgument(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise InvalidArgument(f"must specify 'step' for ensemble '{name}'")
    _check_ensemble_flow(config, name)


def _check_ensemble_flow(config: ModelConfig, name: str) -> None:
    """Every output must be computable from the inputs and every tensor must be used."""
    producers: dict[str, set[str]] = {}  # tensor -> inputs of the step that writes it
    consumed: set[str] = set()
    for index, step in enumerate(config.ensemble_scheduling.step):
        _check_step_fields(step, index, name)
        step_inputs = set(step.input_map.values())
        consumed |= step_inputs
        for tensor in step.output_map.values():
            if tensor in producers:
                raise InvalidArgument(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}"
                )
            producers[tensor] = step_inputs
    inputs = [io.name for io in config.input]
    for tensor in inputs:
        if tensor not in consumed and tensor not in producers:
            raise InvalidArgument(f"ensemble input '{tensor}' for ensemble {name}' is not used")
    ready = _ready_tensors(inputs, producers)
    outputs = {io.name for io in config.output}
    for tensor in outputs:
        if tensor not in producers and tensor not in consumed:
            raise InvalidArgument(f"ensemble output '{tensor}' for ensemble {name}' is not used")
        if tensor not in ready:
            raise InvalidArgument(f"output '{tensor}' for ensemble '{name}' is not written")
    for tensor in consumed | producers.keys():
        if tensor in outputs:
            continue
        if tensor not in ready or tensor not in consumed:
            raise InvalidArgument(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _check_step_fields(step: Any, index: int, name: str) -> None:
    for field in ("model_name", "input_map", "output_map"):
        if not getattr(step, field):
            raise InvalidArgument(f"must specify '{field}' in step {index} of ensemble '{name}'")


def _ready_tensors(inputs: Iterable[str], producers: dict[str, set[str]]) -> set[str]:
    ready = set(inputs)
    changed = True
    while changed:
        changed = False
        for tensor, needed in producers.items():
            if tensor not in ready and needed <= ready:
                ready.add(tensor)
                changed = True
    return ready


# --- inputs and outputs ----------------------------------------------------------------------


def _check_io(config: ModelConfig, name: str) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for io in tensors:
            _check_io_shape(io, kind, config.max_batch_size, name)
            if io.name in seen:
                raise InvalidArgument(f"model {kind} '{io.name}' is specified more than once for {name}")
            seen.add(io.name)
            _check_io_platform(io, kind, config.platform, name)
    _check_batch_io(config, name)


def _check_io_shape(io: Any, kind: str, max_batch_size: int, name: str) -> None:
    prefix = f"model {kind} "
    if not io.name:
        raise InvalidArgument(f"{prefix}must specify 'name' for {name}")
    prefix += f"'{io.name}' "
    if io.data_type == pb.TYPE_INVALID or io.data_type not in pb.DataType.values():
        raise InvalidArgument(f"{prefix}must specify 'data_type' for {name}")
    has_reshape = io.HasField("reshape")
    # Scalars are written as dims [1] + empty reshape; empty dims are allowed only when a
    # reshape gives the model shape, or for shape tensors.
    if not io.dims and not has_reshape and not io.is_shape_tensor:
        raise InvalidArgument(f"{prefix}must specify 'dims' for {name}")
    if has_reshape and not io.reshape.shape and max_batch_size == 0:
        raise InvalidArgument(
            f"{prefix}cannot have empty reshape for non-batching model as scalar tensors are "
            f"not supported for {name}"
        )
    if any(d < 1 and d != WILDCARD_DIM for d in io.dims):
        raise InvalidArgument(
            f"{prefix}dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a "
            f"variable-size dimension for {name}"
        )
    if has_reshape:
        _check_reshape(list(io.dims), list(io.reshape.shape), prefix, name)


def _check_reshape(dims: list[int], shape: list[int], prefix: str, name: str) -> None:
    if any(d < 1 and d != WILDCARD_DIM for d in shape):
        raise InvalidArgument(
            f"{prefix}reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate a "
            f"variable-size dimension for {name}"
        )
    dims_variable = WILDCARD_DIM in dims
    shape_variable = WILDCARD_DIM in shape
    if dims_variable != shape_variable:
        raise InvalidArgument(f"{prefix}has different size for dims and reshape for {name}")
    if not dims_variable:
        dims_count, shape_count = math.prod(dims), math.prod(shape)
        # An empty reshape is a scalar: it must come from dims of one element.
        if dims_count != shape_count and not (not shape and dims_count == 1):
            raise InvalidArgument(f"{prefix}has different size for dims and reshape for {name}")
        return
    # With variable dims, the fixed runs between the -1s must hold equal element counts,
    # e.g. [2, 4, -1, 6] -> [8, -1, 1, 6] is valid.
    dims_runs, shape_runs = _fixed_runs(dims), _fixed_runs(shape)
    if len(dims_runs) != len(shape_runs):
        raise InvalidArgument(
            f"{prefix}has different number of variable-size dimensions for dims and reshape for {name}"
        )
    if dims_runs != shape_runs:
        raise InvalidArgument(f"{prefix}has different size for dims and reshape for {name}")


def _fixed_runs(dims: list[int]) -> list[int]:
    runs, count = [], 1
    for d in dims:
        if d == WILDCARD_DIM:
            runs.append(count)
            count = 1
        else:
            count *= d
    runs.append(count)
    return runs


def _check_io_platform(io: Any, kind: str, platform: str, name: str) -> None:
    image_format = kind == "input" and io.format in (pb.ModelInput.FORMAT_NHWC, pb.ModelInput.FORMAT_NCHW)
    if image_format and len(io.dims) != 3:
        raise InvalidArgument(f"model input NHWC/NCHW require 3 dims for {name}")
    if io.is_shape_tensor and platform != TENSORRT_PLATFORM:
        raise InvalidArgument(f"shape tensors are only supported for TensorRT platform for {name}")
    if io.is_non_linear_format_io:
        if platform != TENSORRT_PLATFORM:
            raise InvalidArgument(
                f"Non-linear IO format is only supported for the TensorRT platform for {name}"
            )
        if len(io.dims) != 3:
            raise InvalidArgument(f"Non-linear IO format {kind} requires 3 dims for {name}")


def _check_batch_io(config: ModelConfig, name: str) -> None:
    input_names = {io.name for io in config.input}
    output_names = {io.name for io in config.output}
    for batch_input in config.batch_input:
        kind = pb.BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise InvalidArgument(
                f"batch input kind '{kind}' expects 1 source input, got "
                f"{len(batch_input.source_input)} for {name}"
            )
        if batch_input.data_type not in (pb.TYPE_INT32, pb.TYPE_FP32):
            raise InvalidArgument(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {name}")
        _check_sources(batch_input.source_input, input_names, name)
    for batch_output in config.batch_output:
        kind = pb.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise InvalidArgument(
                f"batch output kind '{kind}' expects 1 source input, got "
                f"{len(batch_output.source_input)} for {name}"
            )
        _check_sources(batch_output.source_input, input_names, name)
        _check_targets(batch_output.target_name, output_names, name)


def _check_sources(sources: Iterable[str], input_names: set[str], name: str) -> None:
    for source in sources:
        if source not in input_names:
            raise InvalidArgument(f"unknown source input name '{source}' for {name}")


def _check_targets(targets: Iterable[str], output_names: set[str], name: str) -> None:
    seen: set[str] = set()
    for target in targets:
        if target not in output_names:
            raise InvalidArgument(f"unknown target output name '{target}' for {name}")
        if target in seen:
            raise InvalidArgument(f"target output name '{target}' can only be specified once for {name}")
        seen.add(target)


# --- instance groups and warmup --------------------------------------------------------------


def _check_instance_groups(config: ModelConfig, name: str, gpus: Collection[int] | None) -> None:
    if config.platform == ENSEMBLE_PLATFORM:
        return
    if not config.instance_group:
        raise InvalidArgument(f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        prefix = f"instance group {group.name} of model {name}"
        _check_group_kind(group, prefix, gpus)
        if group.count < 1:
            raise InvalidArgument(f"{prefix} must specify a 'count' >= 1, got {group.count}")
        if group.profile and config.platform != TENSORRT_PLATFORM:
            raise InvalidArgument(
                f"{prefix} and platform {config.platform} specifies profile field which is only "
                "supported for TensorRT models"
            )


def _check_group_kind(group: Any, prefix: str, gpus: Collection[int] | None) -> None:
    kind = group.kind
    if kind in (pb.ModelInstanceGroup.KIND_CPU, pb.ModelInstanceGroup.KIND_MODEL):
        if group.gpus:
            kind_name = pb.ModelInstanceGroup.Kind.Name(kind)
            raise InvalidArgument(f"{prefix} has kind {kind_name} but specifies one or more GPUs")
    elif kind == pb.ModelInstanceGroup.KIND_GPU:
        _check_group_gpus(group, prefix, gpus)
    elif kind == pb.ModelInstanceGroup.KIND_AUTO:
        raise InvalidArgument(f"{prefix} has unexpected kind KIND_AUTO")
    else:
        raise InvalidArgument(f"{prefix} has unexpected kind {kind}")


def _check_group_gpus(group: Any, prefix: str, gpus: Collection[int] | None) -> None:
    if not group.gpus:
        if gpus is not None and not gpus:
            raise InvalidArgument(f"{prefix} has kind KIND_GPU but no GPUs are available")
        raise InvalidArgument(f"{prefix} has kind KIND_GPU but specifies no GPUs")
    if gpus is None:
        return
    for gpu in group.gpus:
        if gpu not in gpus:
            available = ", ".join(str(g) for g in sorted(gpus))
            raise InvalidArgument(
                f"{prefix} specifies invalid or unsupported gpu id {gpu}. Available GPUs are: {available}"
            )


def _check_warmup(config: ModelConfig, name: str) -> None:
    allowed_inputs = _warmup_input_names(config)
    limit = config.max_batch_size if config.max_batch_size > 0 else 1
    for warmup in config.model_warmup:
        prefix = f"warmup setting '{warmup.name}' for model '{name}'"
        if warmup.batch_size > limit:
            raise InvalidArgument(
                f"{prefix} has 'batch_size' {warmup.batch_size}, which must be <= {limit} "
                f"(max_batch_size {config.max_batch_size})"
            )
        for input_name, data in warmup.inputs.items():
            _check_warmup_input(input_name, data, allowed_inputs, prefix)


def _warmup_input_names(config: ModelConfig) -> set[str]:
    # Sequence control and implicit-state inputs are fed by warmup too (Triton's override inputs).
    names = {io.name for io in config.input}
    names.update(ci.name for ci in config.sequence_batching.control_input)
    names.update(state.input_name for state in config.sequence_batching.state)
    return names


def _check_warmup_input(input_name: str, data: Any, allowed: set[str], prefix: str) -> None:
    if input_name not in allowed:
        raise InvalidArgument(f"{prefix} specifies unknown input '{input_name}'")
    if data.WhichOneof("input_data_type") is None:
        raise InvalidArgument(f"warmup setting expects input '{input_name}' to have input_data_type set")
    if WILDCARD_DIM in data.dims:
        raise InvalidArgument(
            f"warmup setting expects all variable-size dimensions are specified for input '{input_name}'"
        )
