"""check_steps: an ensemble's steps against its composing models' configs."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.ensemble import check_steps
from naiad.errors import InvalidArgument

ADD = """
name: "add"
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _ensemble(step: str, output_type: str = "TYPE_FP32", input_type: str = "TYPE_FP32") -> mc.ModelConfig:
    return _config(f"""
name: "e"
platform: "ensemble"
input [ {{ name: "X" data_type: {input_type} dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: {output_type} dims: [ 4 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "add" {step} }} ] }}
""")


GOOD = 'input_map { key: "A" value: "X" } output_map { key: "SUM" value: "Y" }'


def test_a_fitting_step_passes_and_optional_inputs_may_stay_unmapped() -> None:
    check_steps(_ensemble(GOOD), {0: _config(ADD)})


@pytest.mark.parametrize(("step", "message"), [
    ('input_map { key: "C" value: "X" } output_map { key: "SUM" value: "Y" }', "model 'add' has no input 'C'"),
    ('input_map { key: "A" value: "X" } output_map { key: "DIFF" value: "Y" }', "model 'add' has no output 'DIFF'"),
    ('input_map { key: "B" value: "X" } output_map { key: "SUM" value: "Y" }',
     "input(s) A of model 'add' are not mapped"),
])
def test_maps_must_fit_the_model(step: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_steps(_ensemble(step), {0: _config(ADD)})


def test_a_tensor_keeps_one_data_type() -> None:
    with pytest.raises(InvalidArgument, match="ensemble tensor 'Y' is TYPE_FP32 as output 'SUM' of model 'add' "
                                              "but TYPE_INT32 as ensemble output 'Y'"):
        check_steps(_ensemble(GOOD, output_type="TYPE_INT32"), {0: _config(ADD)})
    with pytest.raises(InvalidArgument, match="ensemble tensor 'X' is TYPE_INT64 as ensemble input 'X'"):
        check_steps(_ensemble(GOOD, input_type="TYPE_INT64"), {0: _config(ADD)})
