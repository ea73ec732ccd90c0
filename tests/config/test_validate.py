"""validate_config: each check raises InvalidArgument naming the field."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from naiad.config.model_config import ModelConfig, parse_config_text
from naiad.config.validate import validate_config
from naiad.errors import InvalidArgument

BASE = """
name: "simple"
backend: "onnxruntime"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy { latest { num_versions: 1 } }
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
instance_group [ { name: "simple_0" kind: KIND_CPU count: 1 } ]
"""

ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 8
version_policy { latest { num_versions: 1 } }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "pre" model_version: -1
      input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" }
    },
    {
      model_name: "net" model_version: -1
      input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" }
    }
  ]
}
"""


def _base() -> ModelConfig:
    return parse_config_text(BASE, "base")


def _ensemble() -> ModelConfig:
    return parse_config_text(ENSEMBLE, "ensemble")


def _error(config: ModelConfig, model_name: str = "simple") -> str:
    with pytest.raises(InvalidArgument) as info:
        validate_config(config, model_name)
    return str(info.value)


def test_valid_config_passes():
    validate_config(_base(), "simple")


def test_empty_name_is_allowed():
    config = _base()
    config.name = ""

    validate_config(config, "simple")


def test_name_must_equal_directory():
    assert _error(_base(), "other") == (
        "unexpected directory name 'other' for model 'simple', directory name must equal model name"
    )


def test_unknown_platform_without_backend():
    config = _base()
    config.backend = ""
    config.platform = "caffe2_netdef"

    assert _error(config) == "unexpected platform type 'caffe2_netdef' for simple"


def test_platform_backend_pair_must_match():
    config = _base()
    config.platform = "pytorch_libtorch"

    assert _error(config) == "unexpected 'platform' and 'backend' pair, got:pytorch_libtorch, onnxruntime"


def test_custom_backend_allows_any_platform():
    config = _base()
    config.backend = "identity"
    config.platform = "anything"

    validate_config(config, "simple")


def test_max_batch_size_non_negative():
    config = _base()
    config.max_batch_size = -1

    assert _error(config) == "'max_batch_size' must be non-negative value for simple"


def test_specific_versions_must_be_positive():
    config = _base()
    config.version_policy.specific.versions.extend([1, 0])

    assert "'version_policy' specific versions must be integers >= 1" in _error(config)


def _set(field: str, value: object) -> Callable[[ModelConfig], None]:
    def mutate(config: ModelConfig) -> None:
        message, name = field.rsplit(".", 1)
        target = config
        for part in message.split("."):
            target = target[int(part)] if part.isdigit() else getattr(target, part)
        if isinstance(value, list):
            getattr(target, name)[:] = value
        else:
            setattr(target, name, value)

    return mutate


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set("input.0.name", ""), "model input must specify 'name' for simple"),
        (
            _set("input.0.data_type", pb.TYPE_INVALID),
            "model input 'INPUT0' must specify 'data_type' for simple",
        ),
        (_set("output.1.dims", []), "model output 'OUTPUT1' must specify 'dims' for simple"),
        (
            _set("input.1.dims", [16, 0]),
            "model input 'INPUT1' dimension must be integer >= 1, or -1 to indicate a variable-size "
            "dimension for simple",
        ),
        (_set("output.0.dims", [-2]), "model output 'OUTPUT0' dimension must be integer >= 1"),
        (_set("input.1.name", "INPUT0"), "model input 'INPUT0' is specified more than once for simple"),
        (_set("output.1.name", "OUTPUT0"), "model output 'OUTPUT0' is specified more than once for simple"),
        (_set("input.0.is_shape_tensor", True), "shape tensors are only supported for TensorRT platform"),
        (_set("input.0.format", pb.ModelInput.FORMAT_NCHW), "model input NHWC/NCHW require 3 dims"),
    ],
)
def test_io_errors(mutate: Callable[[ModelConfig], None], expected: str):
    config = _base()
    mutate(config)

    assert expected in _error(config)


def test_empty_dims_allowed_with_reshape():
    config = _base()
    del config.input[0].dims[:]
    config.input[0].reshape.shape.extend([1])

    validate_config(config, "simple")


def test_scalar_with_empty_reshape_on_batching_model():
    config = _base()
    config.input[0].dims[:] = [1]
    config.input[0].reshape.SetInParent()

    validate_config(config, "simple")


def test_empty_reshape_rejected_without_batching():
    config = _base()
    config.max_batch_size = 0
    config.input[0].dims[:] = [1]
    config.input[0].reshape.SetInParent()

    assert "'INPUT0' cannot have empty reshape for non-batching model" in _error(config)


def test_reshape_element_count_must_match():
    config = _base()
    config.input[0].reshape.shape.extend([4, 5])

    assert _error(config) == "model input 'INPUT0' has different size for dims and reshape for simple"


def test_reshape_with_matching_count_is_valid():
    config = _base()
    config.input[0].reshape.shape.extend([4, 4])
    config.output[0].dims[:] = [2, 4, -1, 6]
    config.output[0].reshape.shape.extend([8, -1, 1, 6])

    validate_config(config, "simple")


def test_reshape_variable_runs_must_match():
    config = _base()
    config.input[0].dims[:] = [2, -1, 3]
    config.input[0].reshape.shape.extend([3, -1, 2])

    assert "'INPUT0' has different size for dims and reshape" in _error(config)


def test_reshape_variable_dim_count_must_match():
    config = _base()
    config.input[0].dims[:] = [-1, 4, -1]
    config.input[0].reshape.shape.extend([-1, 4])

    assert "'INPUT0' has different number of variable-size dimensions" in _error(config)


def test_reshape_zero_rejected():
    config = _base()
    config.input[0].reshape.shape.extend([0, 16])

    assert "'INPUT0' reshape dimensions must be integer >= 1" in _error(config)


def test_preferred_batch_size_positive():
    config = _base()
    config.dynamic_batching.preferred_batch_size.append(0)

    assert _error(config) == "dynamic batching preferred size must be positive for simple"


def test_preferred_batch_size_at_most_max_batch_size():
    config = _base()
    config.dynamic_batching.preferred_batch_size.extend([4, 16])

    assert _error(config) == "dynamic batching preferred size must be <= max batch size for simple"


def test_dynamic_batching_without_batching_is_allowed():
    # Triton accepts it: the queue policies still apply to a non-batching model.
    config = _base()
    config.max_batch_size = 0
    config.dynamic_batching.SetInParent()

    validate_config(config, "simple")


def test_preferred_batch_size_rejected_without_batching():
    config = _base()
    config.max_batch_size = 0
    config.dynamic_batching.preferred_batch_size.append(1)

    assert "preferred size must be <= max batch size" in _error(config)


def test_default_priority_level_in_range():
    config = _base()
    config.dynamic_batching.priority_levels = 2

    assert _error(config) == "default priority level must be in range [1, 2] for simple"


def test_preserve_ordering_with_delay_policy():
    config = _base()
    db = config.dynamic_batching
    db.preserve_ordering = True
    db.default_queue_policy.timeout_action = pb.ModelQueuePolicy.DELAY
    db.default_queue_policy.default_timeout_microseconds = 10

    assert "Queue policy can not have DELAY as timeout action" in _error(config)


def test_sequence_batching_corrid_type():
    config = _base()
    control = config.sequence_batching.control_input.add(name="CORRID").control.add()
    control.kind = pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
    control.data_type = pb.TYPE_FP32

    assert "unexpected data type for control CONTROL_SEQUENCE_CORRID for simple" in _error(config)


def test_response_cache_not_with_decoupled():
    config = _base()
    config.model_transaction_policy.decoupled = True
    config.response_cache.enable = True

    assert "Response Cache does not currently support model simple with 'decoupled'" in _error(config)


def test_instance_group_required():
    config = _base()
    del config.instance_group[:]

    assert _error(config) == "must specify one or more 'instance group's for simple"


def test_instance_group_count_at_least_one():
    config = _base()
    config.instance_group[0].count = 0

    assert _error(config) == "instance group simple_0 of model simple must specify a 'count' >= 1, got 0"


def test_instance_group_kind_auto_unresolved():
    config = _base()
    config.instance_group[0].kind = pb.ModelInstanceGroup.KIND_AUTO

    assert _error(config) == "instance group simple_0 of model simple has unexpected kind KIND_AUTO"


def test_instance_group_cpu_with_gpus():
    config = _base()
    config.instance_group[0].gpus.append(0)

    assert "has kind KIND_CPU but specifies one or more GPUs" in _error(config)


def test_instance_group_gpu_needs_gpus():
    config = _base()
    config.instance_group[0].kind = pb.ModelInstanceGroup.KIND_GPU

    assert "has kind KIND_GPU but specifies no GPUs" in _error(config)
    with pytest.raises(InvalidArgument, match="has kind KIND_GPU but no GPUs are available"):
        validate_config(config, "simple", gpus=[])


def test_instance_group_gpu_id_must_exist():
    config = _base()
    config.instance_group[0].kind = pb.ModelInstanceGroup.KIND_GPU
    config.instance_group[0].gpus.append(3)

    validate_config(config, "simple")  # not checked without the machine's GPUs
    with pytest.raises(InvalidArgument, match="invalid or unsupported gpu id 3"):
        validate_config(config, "simple", gpus=[0, 1])


def test_warmup_batch_size_at_most_max_batch_size():
    config = _base()
    config.model_warmup.add(name="w", batch_size=9)

    assert "warmup setting 'w' for model 'simple' has 'batch_size' 9, which must be <= 8" in _error(config)


def test_warmup_batch_size_one_without_batching():
    config = _base()
    config.max_batch_size = 0
    config.model_warmup.add(name="w", batch_size=2)

    assert "has 'batch_size' 2, which must be <= 1" in _error(config)


def test_warmup_inputs_must_exist():
    config = _base()
    warmup = config.model_warmup.add(name="w", batch_size=1)
    warmup.inputs["NOPE"].zero_data = True

    assert _error(config) == "warmup setting 'w' for model 'simple' specifies unknown input 'NOPE'"


def test_warmup_input_valid():
    config = _base()
    warmup = config.model_warmup.add(name="w", batch_size=8)
    warmup.inputs["INPUT0"].zero_data = True
    warmup.inputs["INPUT0"].dims.append(16)

    validate_config(config, "simple")


def test_warmup_input_needs_fixed_dims():
    config = _base()
    warmup = config.model_warmup.add(name="w", batch_size=1)
    warmup.inputs["INPUT0"].random_data = True
    warmup.inputs["INPUT0"].dims.append(-1)

    assert "warmup setting expects all variable-size dimensions are specified for input 'INPUT0'" in (
        _error(config)
    )


def test_batch_input_source_must_exist():
    config = _base()
    batch_input = config.batch_input.add(target_name=["COUNT"], data_type=pb.TYPE_INT32)
    batch_input.source_input.append("MISSING")

    assert "unknown source input name 'MISSING'" in _error(config)


def test_valid_ensemble_passes_without_instance_groups():
    validate_config(_ensemble(), "ens")


def test_ensemble_skips_instance_group_requirement_but_rejects_groups():
    config = _ensemble()
    config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)

    assert _error(config, "ens") == "instance group should not be specified for ensemble 'ens'"


def test_ensemble_platform_needs_scheduling():
    config = _ensemble()
    config.ClearField("ensemble_scheduling")

    assert (
        _error(config, "ens") == "ensemble scheduling must be set for ensemble ens whose platform is ensemble"
    )


def test_ensemble_with_backend_rejected():
    config = _ensemble()
    config.backend = "python"

    assert "must have platform type 'ensemble' and empty backend type" in _error(config, "ens")


def test_ensemble_output_must_be_written():
    config = _ensemble()
    config.ensemble_scheduling.step[1].input_map["X"] = "elsewhere"

    assert _error(config, "ens").startswith("output 'OUT' for ensemble 'ens' is not written")


def test_ensemble_step_needs_model_name():
    config = _ensemble()
    config.ensemble_scheduling.step[0].model_name = ""

    assert _error(config, "ens") == "must specify 'model_name' in step 0 of ensemble 'ens'"


def test_ensemble_intermediate_tensor_must_be_used():
    config = _ensemble()
    config.ensemble_scheduling.step[0].output_map["Z"] = "dangling"

    assert _error(config, "ens") == "ensemble tensor 'dangling' is unused in ensemble 'ens'"


def test_ensemble_io_still_validated():
    config = _ensemble()
    del config.input[0].dims[:]

    assert _error(config, "ens") == "model input 'IN' must specify 'dims' for ens"


@pytest.mark.parametrize("key", ["reason", "le", "quantile", "model", "version", "my-tag", "1st", "__name", ""])
def test_metric_tags_that_would_break_the_metrics_page_are_refused(key: str) -> None:
    config = parse_config_text(BASE + f'metric_tags {{ key: "{key}" value: "x" }}\n', "tags")
    with pytest.raises(InvalidArgument, match="metric_tags key"):
        validate_config(config, "simple")


def test_metric_tags_with_label_names_are_fine() -> None:
    validate_config(parse_config_text(BASE + 'metric_tags { key: "team_2" value: "search" }\n', "tags"), "simple")
