"""Validate a config's sequence_batching control inputs and implicit states, with Triton's texts
(model_config_utils.cc GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties,
sequence_batch_scheduler.cc GenerateInitialStateData)."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as pb

from naiad.errors import InvalidArgument

_Control = pb.ModelSequenceBatching.Control
_BOOLEAN_KINDS = (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_READY)
_PAIRS = ("int32_false_true", "fp32_false_true", "bool_false_true")
WILDCARD_DIM = -1


def check_controls(sb: pb.ModelSequenceBatching, name: str) -> None:
    seen_tensors: set[str] = set()
    seen_kinds: set[int] = set()
    for control_input in sb.control_input:
        if not control_input.name:
            raise InvalidArgument(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_tensors:
            raise InvalidArgument(f"sequence batching control tensor '{control_input.name}' is specified for "
                                  f"multiple control kinds for {name}")
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            kind = _Control.Kind.Name(control.kind)
            if control.kind in seen_kinds:
                raise InvalidArgument(f"sequence batching specifies multiple {kind} tensors for {name}")
            seen_kinds.add(control.kind)
            pairs = [field for field in _PAIRS if len(getattr(control, field))]
            if control.kind not in _BOOLEAN_KINDS:
                if pairs:
                    raise InvalidArgument(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {kind} for {name}")
                continue
            if not pairs:
                raise InvalidArgument("sequence batching must specify either 'int32_false_true', 'fp32_false_true' "
                                      f"or 'bool_false_true' for {kind} for {name}")
            if len(pairs) > 1:
                raise InvalidArgument("sequence batching specifies more than one from 'int32_false_true', "
                                      f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}")
            if len(getattr(control, pairs[0])) != 2:
                raise InvalidArgument(f"sequence batching control '{pairs[0]}' must have exactly 2 entries for "
                                      f"{kind} for {name}")


def check_states(sb: pb.ModelSequenceBatching, name: str) -> None:
    inputs: set[str] = set()
    for state in sb.state:
        if not state.input_name or not state.output_name:
            raise InvalidArgument(f"sequence batching state must specify 'input_name' and 'output_name' for {name}")
        prefix = f"sequence batching state '{state.input_name}' for {name}"
        if state.input_name in inputs:
            raise InvalidArgument(f"State input name '{state.input_name}' specified more than once.")
        inputs.add(state.input_name)
        if state.data_type == pb.TYPE_INVALID:
            raise InvalidArgument(f"{prefix} must specify 'data_type'")
        if not state.dims:
            raise InvalidArgument(f"{prefix} must specify 'dims'")
        if any(d < 1 and d != WILDCARD_DIM for d in state.dims):
            raise InvalidArgument(f"{prefix} dimension must be integer >= 1, or -1 to indicate a variable-size "
                                  "dimension")
        _check_initial_state(state)


def _check_initial_state(state: pb.ModelSequenceBatching.State) -> None:
    name = state.input_name
    if len(state.initial_state) > 1:
        raise InvalidArgument(f"initial_state field for state input '{name}' must contain exactly one or zero "
                              f"element. Found '{len(state.initial_state)}' elements.")
    if not state.initial_state:
        return
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise InvalidArgument(f"The data type used for 'initial_state' field of state '{name}' does not match "
                              "the state data type.")
    if not initial.name:
        raise InvalidArgument(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(initial.dims) != len(state.dims):
        raise InvalidArgument(f"Number of dimensions in 'initial_state' doesn't match the size of 'state' "
                              f"dimensions for state input '{name}'. {len(initial.dims)} != {len(state.dims)}")
    for initial_dim, state_dim in zip(initial.dims, state.dims, strict=True):
        if initial_dim == WILDCARD_DIM:
            raise InvalidArgument(f"'initial_state' field for state input name '{name}' contains variable "
                                  "dimensions.")
        if state_dim != WILDCARD_DIM and initial_dim != state_dim:
            raise InvalidArgument(f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                                  f"description. {initial_dim} != {state_dim}")
    if initial.WhichOneof("state_data") is None:
        raise InvalidArgument(f"initial_state setting expects state'{name}' to have state_data set")
