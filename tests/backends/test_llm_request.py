"""The llm backend's request reading: settings by name, unknown parameters, stop strings."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from naiad.backends.llm_request import RequestValues, StopStrings, check_parameters, guide
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


# -- request parameters, stop strings ------------------------------------------------------------


def test_unknown_parameters_are_refused_but_the_servers_own_pass() -> None:
    allowed = {"max_tokens": 3, "stop": "x", "priority": 1, "timeout": 5, "sequence_id": 2, "binary_data_output": True,
               "triton_enable_empty_final_response": True, "id": "a", "return_finish_reason": True}
    check_parameters(_request(allowed))
    with pytest.raises(InvalidArgument, match="unknown parameter 'best_of'"):
        check_parameters(_request({**allowed, "best_of": 2}))


@pytest.mark.parametrize(("value", "expected"), [
    (None, []),
    ("###", ["###"]),
    ('["a", "b c"]', ["a", "b c"]),
    ("[not json", ["[not json"]),
    (["x", "y"], ["x", "y"]),
])
def test_stop_is_a_string_or_an_array_of_strings(value: object, expected: list[str]) -> None:
    parameters = {} if value is None else {"stop": value}
    assert RequestValues(_request(parameters)).strings("stop") == expected


@pytest.mark.parametrize("value", ['["a", 1]', '[""]', "", 3])
def test_bad_stop_values(value: object) -> None:
    with pytest.raises(InvalidArgument, match="'stop' must be"):
        RequestValues(_request({"stop": value})).strings("stop")


def test_stop_token_ids_are_an_integer_or_an_array() -> None:
    assert RequestValues(_request({"stop_token_ids": "[1, 2]"})).integers("stop_token_ids") == [1, 2]
    assert RequestValues(_request({"stop_token_ids": 7})).integers("stop_token_ids") == [7]
    with pytest.raises(InvalidArgument, match="'stop_token_ids' must be"):
        RequestValues(_request({"stop_token_ids": "[1.5]"})).integers("stop_token_ids")


def _run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    """What goes out after each piece (the last piece is the sequence's end) and whether it stopped."""
    stop = StopStrings(stops)
    out = []
    for i, piece in enumerate(pieces):
        text, stopped = stop.push(piece, final=i == len(pieces) - 1)
        out.append(text)
        if stopped:
            return out, True
    return out, False


def test_a_stop_string_within_one_piece_cuts_it_and_what_follows() -> None:
    assert _run(["\n\n"], ["Paris.\n\nAnd", " more"]) == (["Paris."], True)


def test_a_stop_string_split_across_pieces_is_held_back_then_cut() -> None:
    # "END" arrives as "E" + "N" + "D": nothing of it goes out, and the text before it does.
    assert _run(["END"], ["one E", "N", "D two", "x"]) == (["one ", "", ""], True)


def test_held_back_text_goes_out_once_it_cannot_be_a_stop_string() -> None:
    assert _run(["END"], ["one E", "Nx", " tail"]) == (["one ", "ENx", " tail"], False)
    assert _run(["END"], ["one E", "N"]) == (["one ", "EN"], False)  # the sequence ended: all goes


def test_the_earliest_of_several_stop_strings_wins() -> None:
    assert _run(["b", "a"], ["xxab"]) == (["xx"], True)


def test_include_stop_str_keeps_the_stop_string_and_cuts_after_it() -> None:
    stops = StopStrings(["END"], include=True)
    assert stops.push("one EN") == ("one ", False)  # could still become END: held back
    assert stops.push("D two") == ("END", True)
    shortest = StopStrings(["ab", "abc"], include=True)
    assert shortest.push("xxabcd") == ("xxab", True)  # of two starting at one place, the shorter ends first


def test_a_mapping_is_a_json_object_given_as_a_string() -> None:
    values = RequestValues(_request({"chat_template_kwargs": '{"enable_thinking": false}', "bad": "[1]",
                                     "broken": "{"}))
    assert values.mapping("chat_template_kwargs") == {"enable_thinking": False}
    assert values.mapping("absent") == {}
    for name in ("bad", "broken"):
        with pytest.raises(InvalidArgument, match=f"'{name}' must be a JSON object"):
            values.mapping(name)


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, None),
    ({"guided_json": '{"type": "object"}'}, ("json_schema", '{"type": "object"}')),
    ({"guided_json_object": True}, ("json_object", "")),
    ({"guided_json_object": False}, None),
    ({"guided_regex": "[a-z]+"}, ("regex", "[a-z]+")),
    ({"guided_choice": '["a", "b"]'}, ("choice", '["a", "b"]')),
    ({"guided_grammar": 'start: "x"'}, ("grammar", 'start: "x"')),
])
def test_the_guide_from_vllms_guided_parameters(parameters: dict[str, object],
                                                expected: tuple[str, str] | None) -> None:
    check_parameters(_request(parameters))  # known names
    assert guide(RequestValues(_request(parameters))) == expected


@pytest.mark.parametrize(("parameters", "message"), [
    ({"guided_json": "[1]"}, "'guided_json' must be a JSON object"),
    ({"guided_json": "{}"}, "non-empty JSON object"),
    ({"guided_regex": ""}, "must not be empty"),
    ({"guided_choice": "[1]"}, "array of non-empty strings"),
    ({"guided_json_object": "yes"}, "must be true or false"),
    ({"guided_regex": "a", "guided_grammar": "b"}, "at most one of"),
])
def test_bad_guided_parameters_are_invalid_arguments(parameters: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        guide(RequestValues(_request(parameters)))
