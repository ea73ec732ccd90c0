"""pb_utils.ModelConfig, the object auto_complete_config edits: upstream's behaviour and messages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from naiad.backends.python import pb_utils

E = pb_utils.TritonModelException
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


# -- auto-complete config --------------------------------------------------------------------

BASE = {"name": "m", "max_batch_size": 0, "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": []}


def test_model_config_builds_and_completes() -> None:
    source = json.loads(json.dumps(BASE))
    config = pb_utils.ModelConfig(source)
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    config.add_input({"name": "IN2", "data_type": "TYPE_INT32", "dims": [-1]})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    result = config.as_dict()
    assert result["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True},
                               {"name": "IN2", "data_type": "TYPE_INT32", "dims": [-1]}]
    assert result["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]
    assert (result["max_batch_size"], result["dynamic_batching"]) == (8, {})
    assert pb_utils.using_decoupled_model_transaction_policy(result) is True
    assert pb_utils.get_input_config_by_name(result, "IN2")["data_type"] == "TYPE_INT32"
    assert pb_utils.get_output_config_by_name(result, "OUT")["dims"] == [4]
    assert pb_utils.get_input_config_by_name(result, "X") is None
    assert pb_utils.get_output_config_by_name({}, "X") is None
    assert source == BASE  # the model edits its own copy
    assert pb_utils.ModelConfig(json.dumps(BASE)).as_dict() == BASE  # upstream's form: JSON text
    not_decoupled = {"model_transaction_policy": {"decoupled": False}}
    assert pb_utils.using_decoupled_model_transaction_policy(not_decoupled) is False
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False
    # a TYPE_INVALID / dims-less entry from a config without types takes the model's
    untyped = pb_utils.ModelConfig({"name": "m", "max_batch_size": 0, "input": [
        {"name": "IN", "data_type": "TYPE_INVALID", "dims": []}], "output": []})
    untyped.add_input({"name": "IN", "data_type": "TYPE_FP16", "dims": [2]})
    assert untyped.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_FP16", "dims": [2]}]


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": 1}),
     "input 'X' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type', "
     "'dims' and 'optional'."),
    (lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "optional": True}),
     "output 'Y' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type' "
     "and 'dims'."),
    (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}),
     "input in auto-complete-config function for model 'm' is missing 'name' property."),
    (lambda c: c.add_output({"name": "Y", "dims": [1]}),
     "output 'Y' in auto-complete-config function for model 'm' is missing 'data_type' property."),
    (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32"}),
     "input 'X' in auto-complete-config function for model 'm' is missing 'dims' property."),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [4]}),
     "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT8"),
    (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2, 2]}),
     "model 'm', tensor 'IN': the model expects dims [2, 2] but the model configuration specifies dims [4]"),
    (lambda c: c.set_max_batch_size(4),
     "configuration specified max_batch_size 8, but in auto-complete-config function for model 'm' specified "
     "max_batch_size 4"),
    (lambda c: c.set_dynamic_batching(),
     "Configuration specified scheduling_choice as 'sequence_batching', but auto-complete-config function for model "
     "'m' tries to set scheduling_choice as 'dynamic_batching'"),
    (lambda c: c.set_model_transaction_policy({"decoupled": True, "other": 1}),
     "model transaction property in auto-complete-config function for model 'm' contains property other than "
     "'decoupled'."),
    (lambda c: c.set_model_transaction_policy({"decoupled": True}),
     "trying to change decoupled property in auto-complete-config for model 'm', which is already set to 'False'."),
])
def test_model_config_refusals(call: Any, message: str) -> None:
    config = pb_utils.ModelConfig({**BASE, "max_batch_size": 8, "sequence_batching": {},
                                   "model_transaction_policy": {"decoupled": False}})
    with pytest.raises(ValueError) as raised:
        call(config)
    assert str(raised.value) == message


def test_model_config_optional_conflict() -> None:
    config = pb_utils.ModelConfig({**BASE, "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4],
                                                      "optional": False}]})
    with pytest.raises(ValueError, match=r"^model 'm', tensor 'IN': the model expects optional True but the model "
                                         r"configuration specifies optional False$"):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
