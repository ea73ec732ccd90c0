"""The llm backend's request settings: inputs of the config first, else request parameters."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from naiad.backends.llm import RequestValues
from naiad.errors import InvalidArgument
from naiad.types import DataType, InferRequest, Tensor


def _request(parameters: dict[str, object], **inputs: np.ndarray) -> InferRequest:
    tensors = [Tensor(name, DataType.from_numpy(array.dtype), array.shape, array) for name, array in inputs.items()]
    return InferRequest("m", None, tensors, parameters=parameters)


def test_inputs_come_before_parameters() -> None:
    values = RequestValues(_request({"max_tokens": 3, "temperature": 0.5},
                              text_input=np.array([b"hi"], dtype=object), max_tokens=np.array([7], dtype=np.int32),
                              stream=np.array([True])))
    assert values.text("text_input") == "hi"
    assert values.integer("max_tokens", 16) == 7
    assert values.number("temperature", 1.0) == 0.5
    assert values.boolean("stream", False) is True
    assert values.optional_integer("seed") is None


@pytest.mark.parametrize(("parameters", "call", "message"), [
    ({}, lambda v: v.text("text_input"), "input 'text_input' is required"),
    ({"max_tokens": 1.5}, lambda v: v.integer("max_tokens", 16), "'max_tokens' must be an integer"),
    ({"seed": True}, lambda v: v.optional_integer("seed"), "'seed' must be an integer"),
    ({"top_p": "x"}, lambda v: v.number("top_p", 1.0), "'top_p' must be a number"),
    ({"stream": "yes"}, lambda v: v.boolean("stream", False), "'stream' must be true or false"),
])
def test_bad_values_are_invalid_arguments(
    parameters: dict[str, object], call: Callable[[RequestValues], object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        call(RequestValues(_request(parameters)))


def test_an_input_must_hold_one_element() -> None:
    with pytest.raises(InvalidArgument, match="must hold one element"):
        RequestValues(_request({}, max_tokens=np.array([1, 2], dtype=np.int32))).integer("max_tokens", 16)
