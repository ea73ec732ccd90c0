"""Sequence batching control inputs and implicit states are validated with Triton's texts."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from naiad.config.model_config import parse_config_text
from naiad.config.sequence import check_controls, check_states
from naiad.config.validate import validate_config
from naiad.errors import InvalidArgument

START = "{ name: \"S\" control [ { kind: CONTROL_SEQUENCE_START %s } ] }"
STATE = "{ input_name: \"IN\" output_name: \"OUT\" data_type: TYPE_INT32 dims: [ %s ] %s }"


def _batching(text: str) -> pb.ModelSequenceBatching:
    return text_format.Parse(text, pb.ModelSequenceBatching())


def test_valid_controls_and_states_pass() -> None:
    check_controls(_batching(
        "control_input [ " + START % "int32_false_true: [ 0, 1 ]" + ", "
        "{ name: \"E\" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] }, "
        "{ name: \"C\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]"), "m")
    check_states(_batching("state [ " + STATE % ("-1", "initial_state { data_type: TYPE_INT32 dims: [ 3 ] "
                                                 "zero_data: true name: \"zeros\" }") + " ]"), "m")


@pytest.mark.parametrize(("controls", "message"), [
    ("{ control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }",
     "sequence batching control tensor must have a name for m"),
    (START % "int32_false_true: [ 0, 1 ]" + ", " + START % "int32_false_true: [ 0, 1 ]",
     "sequence batching control tensor 'S' is specified for multiple control kinds for m"),
    (START % "" , "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_START for m"),
    (START % "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ]",
     "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
     "'bool_false_true' for CONTROL_SEQUENCE_START for m"),
    (START % "fp32_false_true: [ 1 ]",
     "sequence batching control 'fp32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m"),
    ("{ name: \"C\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ] } ] }",
     "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
     "CONTROL_SEQUENCE_CORRID for m"),
    ("{ name: \"A\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }, "
     "{ name: \"B\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }",
     "sequence batching specifies multiple CONTROL_SEQUENCE_READY tensors for m"),
])
def test_bad_controls(controls: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_controls(_batching(f"control_input [ {controls} ]"), "m")
    assert raised.value.message == message


@pytest.mark.parametrize(("states", "message"), [
    ("{ input_name: \"IN\" data_type: TYPE_INT32 dims: [ 1 ] }",
     "sequence batching state must specify 'input_name' and 'output_name' for m"),
    (STATE % ("1", "") + ", " + STATE % ("1", ""), "State input name 'IN' specified more than once."),
    ("{ input_name: \"IN\" output_name: \"OUT\" dims: [ 1 ] }",
     "sequence batching state 'IN' for m must specify 'data_type'"),
    ("{ input_name: \"IN\" output_name: \"OUT\" data_type: TYPE_INT32 }",
     "sequence batching state 'IN' for m must specify 'dims'"),
    (STATE % ("0", ""), "sequence batching state 'IN' for m dimension must be integer >= 1, or -1 to indicate a "
     "variable-size dimension"),
    (STATE % ("2", "initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: \"a\" } "
              "initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: \"b\" }"),
     "initial_state field for state input 'IN' must contain exactly one or zero element. Found '2' elements."),
    (STATE % ("2", "initial_state { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true name: \"a\" }"),
     "The data type used for 'initial_state' field of state 'IN' does not match the state data type."),
    (STATE % ("2", "initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true }"),
     "Field 'name' must be set when using initial_state for state input 'IN'."),
    (STATE % ("2", "initial_state { data_type: TYPE_INT32 dims: [ 2, 1 ] zero_data: true name: \"a\" }"),
     "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
     "'IN'. 2 != 1"),
    (STATE % ("-1", "initial_state { data_type: TYPE_INT32 dims: [ -1 ] zero_data: true name: \"a\" }"),
     "'initial_state' field for state input name 'IN' contains variable dimensions."),
    (STATE % ("2", "initial_state { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true name: \"a\" }"),
     "'initial_state' dim for input name 'IN' doesn't match 'state' dim description. 3 != 2"),
    (STATE % ("2", "initial_state { data_type: TYPE_INT32 dims: [ 2 ] name: \"a\" }"),
     "initial_state setting expects state'IN' to have state_data set"),
])
def test_bad_states(states: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_states(_batching(f"state [ {states} ]"), "m")
    assert raised.value.message == message


def test_validate_config_runs_these_checks() -> None:
    config = parse_config_text(
        'name: "m" backend: "python" max_batch_size: 1 '
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        'sequence_batching { control_input [ ' + START % "" + " ] }", "config.pbtxt")
    with pytest.raises(InvalidArgument, match="must specify either 'int32_false_true'"):
        validate_config(config, "m")
