"""Candidates written into model configs, and which changes apply in place."""

from __future__ import annotations

from naiad.config.model_config import parse_config_text
from naiad.tools.tune.space import OFF, SpaceOptions, apply, candidate, llm_space, model_space, only_in_place

MLP = parse_config_text("""
name: "mlp" backend: "onnxruntime" max_batch_size: 64
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 256 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 200 }
""", "mlp")


def test_the_start_is_the_config_and_its_values_are_in_the_space() -> None:
    dims, start = model_space(MLP, SpaceOptions(max_instances=3, queue_delays_us=(OFF, 0, 500)))
    assert dict(start) == {"instances": 2, "max_batch_size": 64, "queue_delay_us": 200, "preferred": "none"}
    by_name = {d.name: d for d in dims}
    assert by_name["queue_delay_us"].values == (OFF, 0, 200, 500)  # the config's own delay joins the list
    assert by_name["max_batch_size"].values == (1, 2, 4, 8, 16, 32, 64)
    assert by_name["instances"].in_place and not by_name["max_batch_size"].in_place


def test_apply_writes_each_dimension() -> None:
    dims, _ = model_space(MLP, SpaceOptions())
    config = apply(MLP, dims, candidate({"instances": 3, "max_batch_size": 16, "queue_delay_us": 1000,
                                         "preferred": "half,max"}))
    assert config.instance_group[0].count == 3 and config.max_batch_size == 16
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16]
    assert MLP.instance_group[0].count == 2  # the original is untouched
    off = apply(MLP, dims, candidate({"instances": 2, "max_batch_size": 64, "queue_delay_us": OFF, "preferred": "max"}))
    assert not off.HasField("dynamic_batching")


def test_only_instance_changes_apply_in_place() -> None:
    dims, start = model_space(MLP, SpaceOptions())
    more = candidate({**dict(start), "instances": 4})
    bigger = candidate({**dict(start), "max_batch_size": 32})
    assert only_in_place(dims, start, more)
    assert not only_in_place(dims, start, bigger)


def test_a_model_that_does_not_batch_has_instances_only() -> None:
    config = parse_config_text('name: "m" backend: "python" max_batch_size: 0', "m")
    dims, start = model_space(config, SpaceOptions(max_instances=2))
    assert [d.name for d in dims] == ["instances"] and dict(start) == {"instances": 1}


def test_llm_engine_settings_are_parameters() -> None:
    config = parse_config_text('name: "llm" backend: "llm" '
                               'parameters { key: "max_num_seqs" value: { string_value: "48" } }', "llm")
    dims, start = llm_space(config, ("max_num_seqs", "dtype"))
    assert dict(start) == {"max_num_seqs": 48, "dtype": "auto"}
    assert 48 in dims[0].values and dims[0].values == tuple(sorted(dims[0].values))
    written = apply(config, dims, candidate({"max_num_seqs": 16, "dtype": "bf16"}))
    assert written.parameters["max_num_seqs"].string_value == "16"
    assert written.parameters["dtype"].string_value == "bf16"
