"""The llm backend's request settings: inputs of the config first, else request parameters."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.llm import LLMModel, RequestValues, StopStrings, check_parameters
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


def _model(parameters: dict[str, str], tmp_path) -> LLMModel:
    config = mc.ModelConfig(name="m", backend="llm")
    for key, value in {"model": "weights", **parameters}.items():
        config.parameters[key].string_value = value
    return LLMModel(config, tmp_path, 1)


def test_engine_settings_come_from_config_parameters(tmp_path) -> None:
    config = _model({"dtype": "bf16", "kv_cache_fraction": "0.25", "max_num_seqs": "8", "enforce_eager": "true",
                     "enable_prefix_caching": "false"}, tmp_path).engine_config()
    assert config.model == tmp_path / "weights"  # relative to the version directory
    assert (config.dtype, config.kv_cache_fraction, config.max_num_seqs) == ("bf16", 0.25, 8)
    assert config.enforce_eager is True and config.enable_prefix_caching is False
    assert config.device == "cpu"


@pytest.mark.parametrize(("parameters", "message"), [
    ({"max_num_seqs": "many"}, "must be an integer"),
    ({"kv_cache_fraction": "half"}, "must be a number"),
    ({"enforce_eager": "maybe"}, "must be true or false"),
])
def test_bad_engine_settings_are_invalid_arguments(parameters: dict[str, str], message: str, tmp_path) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _model(parameters, tmp_path).engine_config()


def test_a_gpu_instance_runs_on_its_groups_gpu(tmp_path) -> None:
    model = _model({}, tmp_path)
    group = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[2, 3])
    assert model.engine_config(group, 0).device == "cuda:2"
    assert model.engine_config(group, 1).device == "cuda:3"
    assert model.engine_config(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU), 0).device == "cpu"
    pinned = _model({"device": "cuda:1"}, tmp_path)
    assert pinned.engine_config(group, 0).device == "cuda:1"  # an explicit device wins


def test_llm_metrics_count_tokens_and_time_them() -> None:
    from naiad.backends.llm import LLMMetrics, _Request
    from naiad.llm.engine_core import EngineStats

    metrics = LLMMetrics("llm_0")
    metrics.add_prompt(12)
    request = _Request(lambda *a: None, lambda: False, [1] * 12, 8, None, False, False, None)  # type: ignore[arg-type]
    request.arrival = 100.0
    metrics.tokens_out(request, 1, 100.375)  # first token after 0.375 s (times exact in binary)
    metrics.tokens_out(request, 1, 100.4375)  # the next 0.0625 s later
    metrics.tokens_out(request, 2, 100.5)
    rows = {row.name: row for row in metrics.rows()}
    assert rows["nv_llm_prompt_tokens"].value == 12 and rows["nv_llm_generation_tokens"].value == 4
    ttft = dict(rows["nv_llm_time_to_first_token_seconds"].buckets)
    assert ttft["0.25"] == 0 and ttft["0.5"] == 1 and ttft["+Inf"] == 1
    itl = dict(rows["nv_llm_inter_token_latency_seconds"].buckets)
    assert itl["+Inf"] == 2 and itl["0.05"] == 0 and itl["0.075"] == 2
    assert "nv_llm_kv_cache_usage" not in rows  # no engine step seen yet
    metrics.engine = EngineStats(num_used_blocks=25, num_blocks=100, num_preemptions=3, prefix_cache_queries=200,
                                 prefix_cache_hits=50)
    rows = {row.name: row for row in metrics.rows()}
    assert rows["nv_llm_kv_cache_usage"].value == 0.25
    assert rows["nv_llm_prefix_cache_hit_rate"].value == 0.25
    assert rows["nv_llm_preemptions"].value == 3 and rows["nv_llm_preemptions"].kind == "counter"
    assert all(row.labels == (("instance", "llm_0"),) for row in rows.values())
