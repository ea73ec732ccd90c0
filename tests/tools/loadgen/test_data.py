"""Request data for the load generator: generated from a model's inputs, or read from files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from naiad.tools.loadgen.data import DataError, bytes_payload, generate, load_file, parse_shapes
from naiad.tools.loadgen.spec import spec_from_config

CONFIG = {
    "name": "m", "max_batch_size": 8,
    "input": [{"name": "IDS", "data_type": "TYPE_INT64", "dims": [-1]},
              {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]},
              {"name": "F", "data_type": "TYPE_FP16", "dims": [2, 3]},
              {"name": "OPT", "data_type": "TYPE_FP32", "dims": [1], "optional": True}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}],
}


def test_spec_reads_the_served_config() -> None:
    spec = spec_from_config(CONFIG)
    assert spec.max_batch_size == 8
    assert [(i.name, str(i.datatype), i.dims) for i in spec.inputs] == [
        ("IDS", "INT64", (-1,)), ("TEXT", "BYTES", (1,)), ("F", "FP16", (2, 3)), ("OPT", "FP32", (1,))]
    assert spec.inputs[3].optional and not spec.is_llm


def test_generated_tensors_follow_dims_shapes_and_batch() -> None:
    (entry,) = generate(spec_from_config(CONFIG), 4, parse_shapes(["IDS:7"]), string_length=5)
    assert set(entry) == {"IDS", "TEXT", "F"}  # optional inputs only when asked for
    assert entry["IDS"].shape == (4, 7) and entry["IDS"].dtype == np.int64
    assert entry["IDS"].min() >= 0 and entry["IDS"].max() < 100  # valid ids for most embeddings
    assert entry["F"].shape == (4, 2, 3) and entry["F"].dtype == np.float16
    assert entry["TEXT"].shape == (4, 1) and all(len(v) == 5 for v in entry["TEXT"].ravel())


def test_zero_data_and_default_dynamic_dims() -> None:
    (entry,) = generate(spec_from_config(CONFIG), 1, {}, zero=True)
    assert entry["IDS"].shape == (1, 1) and not entry["IDS"].any()


@pytest.mark.parametrize(("shapes", "batch", "message"), [
    (["IDS:3,4"], 1, "does not fit"), (["NOPE:3"], 1, "names no input"), ([], 9, "max_batch_size 8"),
])
def test_bad_requests_for_data_say_why(shapes: list[str], batch: int, message: str) -> None:
    with pytest.raises(DataError, match=message):
        generate(spec_from_config(CONFIG), batch, parse_shapes(shapes))


def test_bad_shape_flags_are_refused() -> None:
    for value in ("IDS", "IDS:", "IDS:a,b", "IDS:-1"):
        with pytest.raises(DataError, match="--shape expects"):
            parse_shapes([value])


def test_perf_analyzer_json_input_data(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"data": [
        {"IDS": [1, 2, 3], "TEXT": ["hello"], "F": {"content": [0, 1, 2, 3, 4, 5], "shape": [2, 3]}},
        {"IDS": {"content": [5, 6], "shape": [2]}, "TEXT": {"b64": "aGk="}, "F": [1, 2, 3, 4, 5, 6]},
    ]}))
    first, second = load_file(path, spec_from_config(CONFIG), 2)
    assert first["IDS"].tolist() == [[1, 2, 3], [1, 2, 3]]  # one sample, repeated to the batch size
    assert first["TEXT"].tolist() == [[b"hello"], [b"hello"]]
    assert second["F"].shape == (2, 2, 3) and second["TEXT"].ravel().tolist() == [b"hi", b"hi"]


def test_numpy_files(tmp_path: Path) -> None:
    spec = spec_from_config({"name": "one", "max_batch_size": 0,
                             "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}], "output": []})
    np.save(tmp_path / "x.npy", np.arange(3, dtype=np.float32))
    (entry,) = load_file(tmp_path / "x.npy", spec, 1)
    assert entry["X"].tolist() == [0.0, 1.0, 2.0]
    np.savez(tmp_path / "x.npz", X=np.ones(3, np.float32))
    assert load_file(tmp_path / "x.npz", spec, 1)[0]["X"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(DataError, match="shape"):
        np.save(tmp_path / "bad.npy", np.ones((2, 2), np.float32))
        load_file(tmp_path / "bad.npy", spec, 1)


def test_bytes_payload_prefixes_each_element_with_its_length() -> None:
    assert bytes_payload(np.array([b"ab", b""], dtype=object)) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert bytes_payload(np.array([1, 2], np.int32)) == b"\x01\x00\x00\x00\x02\x00\x00\x00"
