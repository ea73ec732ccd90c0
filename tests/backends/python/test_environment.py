"""EXECUTION_ENV_PATH: which interpreter runs a model's processes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.python.environment import ENV_PARAMETER, python_for
from naiad.errors import InvalidArgument


def _config(path: str | None) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", backend="python")
    if path is not None:
        config.parameters[ENV_PARAMETER].string_value = path
    return config


def pack_env(archive: Path, marker: str) -> None:
    """A packed "environment" whose bin/python3 runs this interpreter with a marker variable set."""
    script = f'#!/bin/sh\nexport NAIAD_PACKED_ENV={marker}\nexec "{sys.executable}" "$@"\n'.encode()
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("bin/python3")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))


def test_without_the_parameter_the_server_s_interpreter_runs_the_model(tmp_path: Path) -> None:
    assert python_for(_config(None), tmp_path) == (sys.executable, None)


def test_a_packed_environment_is_unpacked_once_and_its_python_used(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))
    pack_env(tmp_path / "env.tar.gz", "packed")
    python, env = python_for(_config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"), tmp_path)
    assert python.startswith(str(tmp_path / "cache")) and python.endswith("bin/python3")
    assert env is not None
    probe = "import os, naiad.backends.python.stub; print(os.environ['NAIAD_PACKED_ENV'])"
    done = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "packed"  # and naiad's stub is importable there
    again, _ = python_for(_config(str(tmp_path / "env.tar.gz")), tmp_path)
    assert again == python
    assert len(os.listdir(tmp_path / "cache" / "python-envs")) == 2  # one unpacked env + naiad's path shim


def test_an_unpacked_directory_works_too(tmp_path: Path) -> None:
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python").symlink_to(sys.executable)
    python, _ = python_for(_config(str(tmp_path / "env")), tmp_path)
    assert python == str(tmp_path / "env" / "bin" / "python")


def test_missing_or_broken_environments_are_load_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(InvalidArgument, match="does not exist"):
        python_for(_config(str(tmp_path / "nope.tar.gz")), tmp_path)
    (tmp_path / "bad.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(InvalidArgument, match="unable to unpack"):
        python_for(_config(str(tmp_path / "bad.tar.gz")), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="has no bin/python"):
        python_for(_config(str(tmp_path / "empty")), tmp_path)
