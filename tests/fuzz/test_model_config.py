"""Fuzz the config.pbtxt load path (core.loader.prepare_config: read the file, resolve the
backend, fill defaults, validate): configs built from random field values, written as text and
then perhaps mutated, and files of random bytes. Each loads, or fails with a NaiadError that has
a message; a config that loads gives tensor specs and its /config JSON."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from hypothesis import event, given, note
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from fuzz.strategies import check_error, fuzz_settings, mutated
from naiad.config.model_config import config_to_json, read_model_config, tensor_specs
from naiad.config.options import ServerOptions
from naiad.core.loader import prepare_config
from naiad.errors import NaiadError

# Each field mostly gets a value a real config would have, sometimes an odd one: a config that
# is wrong in one or two places reaches deeper checks than one that is wrong everywhere.
_BACKENDS = (st.sampled_from(["identity", "repeat", "python"]), st.sampled_from(["", "nope"]))
_PLATFORMS = (st.just(""), st.sampled_from(["ensemble", "onnxruntime_onnx", "tensorflow_graphdef", "bogus"]))
_NAMES = (st.sampled_from(["fuzzed", ""]), st.sampled_from(["other", "a.identity"]))
_TENSOR_NAMES = (st.sampled_from(["IN", "IN2", "OUT", "OUT2"]), st.sampled_from(["", "X", "IN"]))
_DIMS = (st.lists(st.sampled_from([-1, 1, 2, 3]), min_size=1, max_size=3),
         st.lists(st.sampled_from([-2, -1, 0, 1, 2**31, 2**62]), max_size=3))
_DATA_TYPES = (st.sampled_from([v for v in pb.DataType.values() if v != pb.TYPE_INVALID]), st.sampled_from([0, 99]))
_INTS = (st.integers(0, 8), st.sampled_from([-1, 2**31 - 1]))
_UINTS = (st.integers(0, 8), st.sampled_from([2**31 - 1, 2**32 - 1]))


def _pick(draw: st.DrawFn, choices: tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]) -> Any:
    good, odd = choices
    return draw(odd) if draw(st.integers(0, 7)) == 0 else draw(good)


@st.composite
def configs(draw: st.DrawFn) -> pb.ModelConfig:
    config = pb.ModelConfig(name=_pick(draw, _NAMES), backend=_pick(draw, _BACKENDS),
                            platform=_pick(draw, _PLATFORMS), max_batch_size=_pick(draw, _INTS))
    for group, io_kind in ((config.input, pb.ModelInput), (config.output, pb.ModelOutput)):
        for _ in range(draw(st.integers(0, 2))):
            io = group.add(name=_pick(draw, _TENSOR_NAMES), data_type=_pick(draw, _DATA_TYPES), dims=_pick(draw, _DIMS))
            if draw(st.integers(0, 5)) == 0:
                io.reshape.shape.extend(_pick(draw, _DIMS))
            if io_kind is pb.ModelInput and draw(st.integers(0, 5)) == 0:
                io.allow_ragged_batch = True
    _scheduling(draw, config)
    for _ in range(draw(st.integers(0, 2))):
        kinds = (st.sampled_from([pb.ModelInstanceGroup.KIND_AUTO, pb.ModelInstanceGroup.KIND_CPU]),
                 st.sampled_from([pb.ModelInstanceGroup.KIND_GPU, pb.ModelInstanceGroup.KIND_MODEL, 9]))
        config.instance_group.add(kind=_pick(draw, kinds), count=_pick(draw, _INTS),
                                  gpus=_pick(draw, (st.just([]), st.lists(st.integers(-1, 3), max_size=2))))
    choice = draw(st.sampled_from(["none", "none", "latest", "all", "specific"]))
    if choice == "latest":
        config.version_policy.latest.num_versions = _pick(draw, _UINTS)
    elif choice == "all":
        config.version_policy.all.SetInParent()
    elif choice == "specific":
        config.version_policy.specific.versions.extend(draw(st.lists(st.integers(-2, 3), max_size=3)))
    if draw(st.integers(0, 4)) == 0:
        warmup = config.model_warmup.add(name=draw(st.sampled_from(["w", ""])), batch_size=_pick(draw, _UINTS))
        data = warmup.inputs[_pick(draw, _TENSOR_NAMES)]
        data.data_type = _pick(draw, _DATA_TYPES)
        data.dims.extend(_pick(draw, _DIMS))
        data.zero_data = draw(st.booleans())
    return config


def _scheduling(draw: st.DrawFn, config: pb.ModelConfig) -> None:
    choice = draw(st.sampled_from(["none", "dynamic", "sequence", "ensemble"]))
    if choice == "dynamic":
        batching = config.dynamic_batching
        batching.preferred_batch_size.extend(_pick(draw, (st.lists(st.integers(1, 8), max_size=2), st.just([-1]))))
        batching.priority_levels = _pick(draw, _UINTS)
        batching.default_priority_level = _pick(draw, _UINTS)
        batching.preserve_ordering = draw(st.booleans())
    elif choice == "sequence":
        sequence = config.sequence_batching
        sequence.max_sequence_idle_microseconds = _pick(draw, _UINTS)
        for _ in range(draw(st.integers(0, 2))):
            control = sequence.control_input.add(name=draw(st.sampled_from(["START", "READY", "IN", ""])))
            kind = draw(st.sampled_from(list(pb.ModelSequenceBatching.Control.Kind.values())))
            control.control.add(kind=kind, int32_false_true=_pick(draw, (st.just([0, 1]), st.lists(_INTS[1]))),
                                data_type=_pick(draw, _DATA_TYPES))
        if draw(st.booleans()):
            sequence.oldest.max_candidate_sequences = _pick(draw, _INTS)
    elif choice == "ensemble":
        for _ in range(draw(st.integers(0, 3))):
            step = config.ensemble_scheduling.step.add(model_name=_pick(draw, _NAMES), model_version=-1)
            step.input_map[_pick(draw, _TENSOR_NAMES)] = _pick(draw, _TENSOR_NAMES)
            step.output_map[_pick(draw, _TENSOR_NAMES)] = _pick(draw, _TENSOR_NAMES)


def _load(text: bytes, auto_complete: bool) -> None:
    note(f"config.pbtxt={text!r} auto_complete={auto_complete}")
    with tempfile.TemporaryDirectory() as root:
        model_dir = Path(root) / "fuzzed"
        model_dir.mkdir()
        (model_dir / "config.pbtxt").write_bytes(text)
        options = ServerOptions(model_repositories=(root,), auto_complete_config=auto_complete)
        try:
            read_model_config(model_dir)
            config, _ = prepare_config("fuzzed", model_dir, options)
        except NaiadError as error:
            check_error(error)
            return
    event("loaded")
    inputs, outputs = tensor_specs(config)
    assert len(inputs) == len(config.input) and len(outputs) == len(config.output)
    as_json: Any = config_to_json(config)
    assert as_json["name"] == config.name


@given(configs(), st.booleans())
@fuzz_settings(400)
def test_generated_configs(config: pb.ModelConfig, auto_complete: bool) -> None:
    _load(text_format.MessageToString(config).encode(), auto_complete)


@given(configs().flatmap(lambda config: mutated(text_format.MessageToString(config).encode())), st.booleans())
@fuzz_settings(300)
def test_mutated_config_text(text: bytes, auto_complete: bool) -> None:
    _load(text, auto_complete)


@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
@fuzz_settings(150)
def test_random_files(text: bytes) -> None:
    _load(text, True)
