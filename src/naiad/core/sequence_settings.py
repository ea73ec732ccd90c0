"""The sequence batcher's settings from a model config: control inputs, implicit states with their
initial values (zeros, or `initial_state/<data_file>` in the model directory), strategy knobs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidArgument
from naiad.scheduling.sequence import Control, SequenceSettings, State
from naiad.types import DataType, TensorSpec

_US = 1000
_KINDS = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
INITIAL_STATE_FOLDER = "initial_state"


def sequence_settings(config: mc.ModelConfig, model_dir: Path | None) -> SequenceSettings:
    sb = config.sequence_batching
    oldest = sb.HasField("oldest")
    batched = config.max_batch_size > 0
    slots = max(config.max_batch_size, 1)
    if oldest and sb.oldest.max_candidate_sequences > 0:
        slots = sb.oldest.max_candidate_sequences
    return SequenceSettings(
        model_name=config.name,
        batched=batched,
        max_batch_size=max(config.max_batch_size, 1),
        slots=slots,
        oldest=oldest,
        max_queue_delay_ns=(sb.oldest.max_queue_delay_microseconds if oldest
                            else sb.direct.max_queue_delay_microseconds) * _US,
        minimum_slot_utilization=sb.direct.minimum_slot_utilization,
        preferred_batch_sizes=tuple(sb.oldest.preferred_batch_size),
        preserve_ordering=oldest and sb.oldest.preserve_ordering,
        max_sequence_idle_ns=sb.max_sequence_idle_microseconds * _US,
        controls=tuple(_controls(sb)),
        states=tuple(_state(s, batched, model_dir) for s in sb.state),
        outputs=tuple(o.name for o in config.output),
    )


def sequence_inputs(config: mc.ModelConfig) -> frozenset[str]:
    """Inputs the sequence batcher fills itself: clients may not send them."""
    sb = config.sequence_batching
    return frozenset([c.name for c in sb.control_input] + [s.input_name for s in sb.state])


def state_output_specs(config: mc.ModelConfig) -> list[TensorSpec]:
    """Implicit-state outputs the config does not declare as outputs: responses carry them from
    the backend to the sequence batcher (which never passes them on to the client)."""
    declared = {o.name for o in config.output}
    batch = (-1,) if config.max_batch_size > 0 else ()
    return [TensorSpec(s.output_name, DataType.from_config(mc.DataType.Name(s.data_type)), batch + tuple(s.dims))
            for s in config.sequence_batching.state if s.output_name not in declared]


def _controls(sb: mc.ModelSequenceBatching) -> list[Control]:
    controls = []
    for control_input in sb.control_input:
        for control in control_input.control:
            kind = _KINDS[control.kind]
            if kind == "CORRID":
                datatype = DataType.from_config(mc.DataType.Name(control.data_type))
                controls.append(Control(control_input.name, kind, datatype))
            elif control.int32_false_true:
                controls.append(Control(control_input.name, kind, DataType.INT32, tuple(control.int32_false_true)))
            elif control.fp32_false_true:
                controls.append(Control(control_input.name, kind, DataType.FP32, tuple(control.fp32_false_true)))
            else:
                controls.append(Control(control_input.name, kind, DataType.BOOL, tuple(control.bool_false_true)))
    return controls


def _state(state: mc.ModelSequenceBatching.State, batched: bool, model_dir: Path | None) -> State:
    """The state and its value at START: `initial_state` when given, else zeros with every
    variable dimension 1 (Triton leaves it uninitialized; zeros keep runs reproducible)."""
    datatype = DataType.from_config(mc.DataType.Name(state.data_type))
    lead = (1,) if batched else ()
    if not state.initial_state:
        shape = lead + tuple(1 if d == -1 else d for d in state.dims)
        return State(state.input_name, state.output_name, datatype, _zeros(datatype, shape))
    initial = state.initial_state[0]
    shape = lead + tuple(initial.dims)
    if initial.WhichOneof("state_data") == "data_file":
        if model_dir is None:
            raise InvalidArgument(f"initial_state for state input '{state.input_name}' needs the model directory")
        data = _read_initial(model_dir / INITIAL_STATE_FOLDER / initial.data_file, datatype, shape, state.input_name)
    else:
        data = _zeros(datatype, shape)
    return State(state.input_name, state.output_name, datatype, data)


def _zeros(datatype: DataType, shape: tuple[int, ...]) -> np.ndarray:
    if datatype is DataType.BYTES:
        array = np.empty(shape, dtype=object)
        array.fill(b"")
        return array
    return np.zeros(shape, dtype=datatype.numpy)


def _read_initial(path: Path, datatype: DataType, shape: tuple[int, ...], name: str) -> np.ndarray:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InvalidArgument(f"failed to read initial_state file '{path}' for state input '{name}': "
                              f"{error.strerror}") from None
    if datatype is DataType.BYTES:  # one string: the file's contents
        array = np.empty(shape, dtype=object)
        array.fill(raw)
        return array
    needed = int(np.prod(shape)) * datatype.itemsize
    if len(raw) < needed:
        raise InvalidArgument(f"initial_state setting expects {needed} bytes, but the data provided from "
                              f"{path.name}only has {len(raw)} bytes.")  # Triton's text, missing space too
    return np.frombuffer(raw[:needed], dtype=datatype.numpy).reshape(shape).copy()
