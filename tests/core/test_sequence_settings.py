"""The sequence batcher's settings read from a model config: controls, states, initial values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.sequence_settings import sequence_inputs, sequence_settings, state_output_specs
from naiad.errors import InvalidArgument
from naiad.types import DataType, TensorSpec

CONFIG = """
name: "m"
max_batch_size: %d
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 2500
  %s
  control_input [
    { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ -1, 2.5 ] } ] },
    { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [
    { input_name: "H" output_name: "H_OUT" data_type: TYPE_FP32 dims: [ -1, 3 ] },
    { input_name: "Z" output_name: "Y" data_type: TYPE_INT32 dims: [ 2 ]
      initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: "zeros" } },
    { input_name: "F" output_name: "F_OUT" data_type: TYPE_INT64 dims: [ 2 ]
      initial_state { data_type: TYPE_INT64 dims: [ 2 ] data_file: "f.bin" name: "from file" } }
  ]
}
"""


def _config(max_batch_size: int = 4, strategy: str = "direct { max_queue_delay_microseconds: 7 }") -> mc.ModelConfig:
    return text_format.Parse(CONFIG % (max_batch_size, strategy), mc.ModelConfig())


def _model_dir(tmp_path: Path) -> Path:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "f.bin").write_bytes(np.array([5, 6], dtype=np.int64).tobytes())
    return tmp_path


def test_direct_settings(tmp_path: Path) -> None:
    settings = sequence_settings(_config(), _model_dir(tmp_path))
    assert (settings.slots, settings.max_batch_size, settings.batched, settings.oldest) == (4, 4, True, False)
    assert settings.max_queue_delay_ns == 7000 and settings.max_sequence_idle_ns == 2_500_000
    assert [(c.name, c.kind, c.datatype, c.false_true) for c in settings.controls] == [
        ("S", "START", DataType.FP32, (-1.0, 2.5)), ("R", "READY", DataType.BOOL, (False, True)),
        ("C", "CORRID", DataType.BYTES, (0, 1))]
    hidden, zeros, from_file = settings.states
    assert hidden.initial.shape == (1, 1, 3) and hidden.initial.dtype == np.float32  # -1 becomes 1
    assert zeros.initial.tolist() == [[0, 0]] and zeros.initial.dtype == np.int32
    assert from_file.initial.tolist() == [[5, 6]]
    assert settings.outputs == ("Y",)


def test_oldest_settings_and_a_non_batching_model(tmp_path: Path) -> None:
    config = _config(0, "oldest { max_candidate_sequences: 3 preferred_batch_size: [ 1 ] preserve_ordering: true }")
    settings = sequence_settings(config, _model_dir(tmp_path))
    assert (settings.slots, settings.oldest, settings.preserve_ordering, settings.batched) == (3, True, True, False)
    assert settings.preferred_batch_sizes == (1,)
    assert settings.states[2].initial.shape == (2,)


def test_a_missing_initial_state_file_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"failed to read initial_state file .*f\.bin' for state input 'F'"):
        sequence_settings(_config(), tmp_path)


def test_a_short_initial_state_file_fails_the_load(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "f.bin").write_bytes(b"abc")
    with pytest.raises(InvalidArgument) as raised:
        sequence_settings(_config(), tmp_path)
    assert raised.value.message == ("initial_state setting expects 16 bytes, but the data provided from f.binonly "
                                    "has 3 bytes.")


def test_server_filled_inputs_and_undeclared_state_outputs() -> None:
    config = _config()
    assert sequence_inputs(config) == {"S", "R", "C", "H", "Z", "F"}
    assert state_output_specs(config) == [TensorSpec("H_OUT", DataType.FP32, (-1, -1, 3)),
                                          TensorSpec("F_OUT", DataType.INT64, (-1, 2))]
