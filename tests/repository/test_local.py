"""naiad.repository.local: model discovery, version directories, version policies, fingerprints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.repository.local import discover, fingerprint, select_versions, version_dirs


def _model(repo: Path, name: str, *versions: str) -> Path:
    model_dir = repo / name
    model_dir.mkdir(parents=True)
    for version in versions:
        (model_dir / version).mkdir()
        (model_dir / version / "model.onnx").write_bytes(b"onnx")
    return model_dir


def _policy(text: str) -> mc.ModelVersionPolicy:
    return text_format.Parse(text, mc.ModelVersionPolicy())


# ---------------------------------------------------------------------------- discover


def test_discover_finds_model_directories_only(tmp_path: Path) -> None:
    _model(tmp_path, "a", "1")
    _model(tmp_path, "b")
    (tmp_path / "README.md").write_text("not a model")
    (tmp_path / ".hidden").mkdir()
    found = discover([tmp_path])
    assert sorted(found.models) == ["a", "b"]
    assert found.models["a"].path == tmp_path / "a"
    assert found.models["a"].repository == tmp_path
    assert found.duplicates == {}


def test_discover_reports_a_name_in_two_repositories_as_duplicate(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _model(first, "shared", "1")
    _model(first, "only_first", "1")
    _model(second, "shared", "1")
    _model(second, "only_second", "1")
    found = discover([first, second])
    assert sorted(found.models) == ["only_first", "only_second"]
    assert found.duplicates == {"shared": [first, second]}
    assert found.models["only_second"].repository == second


def test_discover_skips_missing_repositories(tmp_path: Path) -> None:
    _model(tmp_path / "real", "a", "1")
    found = discover([tmp_path / "missing", tmp_path / "real"])
    assert list(found.models) == ["a"]


# ------------------------------------------------------------------------ version dirs


def test_version_dirs_keep_numeric_names_without_a_leading_zero(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "m", "1", "2", "10", "0", "01", "v3", "latest")
    (model_dir / "7").write_text("a file, not a directory")
    assert version_dirs(model_dir) == {1: model_dir / "1", 2: model_dir / "2", 10: model_dir / "10"}


def test_version_dirs_of_a_missing_or_empty_model(tmp_path: Path) -> None:
    assert version_dirs(tmp_path / "missing") == {}
    assert version_dirs(_model(tmp_path, "empty")) == {}


# ---------------------------------------------------------------------- version policy


@pytest.mark.parametrize(("policy", "available", "expected"), [
    ("", [1, 2, 3], [3]),
    ("latest { num_versions: 1 }", [3, 1, 2], [3]),
    ("latest { num_versions: 2 }", [1, 2, 3], [2, 3]),
    ("latest { num_versions: 5 }", [1, 2], [1, 2]),
    ("all {}", [3, 1, 2], [1, 2, 3]),
    ("specific { versions: [3, 1] }", [1, 2, 3], [1, 3]),
    ("specific { versions: [4] }", [1, 2, 3], [4]),  # missing versions fail later, at load
    ("", [], []),
    ("all {}", [], []),
])
def test_select_versions(policy: str, available: list[int], expected: list[int]) -> None:
    assert select_versions(_policy(policy), available) == expected


# ------------------------------------------------------------------------ fingerprint


def test_fingerprint_is_stable_without_changes(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "m", "1", "2")
    (model_dir / "config.pbtxt").write_text("max_batch_size: 8")
    assert fingerprint(model_dir) == fingerprint(model_dir)
    assert {entry[0] for entry in fingerprint(model_dir)} == {
        "config.pbtxt", os.path.join("1", "model.onnx"), os.path.join("2", "model.onnx")}


def test_fingerprint_changes_with_content_size_time_and_files(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "m", "1")
    config = model_dir / "config.pbtxt"
    config.write_text("max_batch_size: 8")
    original = fingerprint(model_dir)

    config.write_text("max_batch_size: 16")  # size changes
    assert fingerprint(model_dir) != original
    changed = fingerprint(model_dir)

    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # same size, newer
    assert fingerprint(model_dir) != changed
    touched = fingerprint(model_dir)

    (model_dir / "2").mkdir()
    (model_dir / "2" / "model.onnx").write_bytes(b"new")
    assert fingerprint(model_dir) != touched


def test_fingerprint_of_a_single_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"abc")
    ((name, size, _),) = fingerprint(path)
    assert (name, size) == ("model.onnx", 3)
