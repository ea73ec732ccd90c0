"""naiad as a wheel holds what naiad reads at run time: every file of src/naiad, and the C kernels
build from an unpacked wheel. The test suite runs the editable install, which reads src/ and so
cannot see a file the wheel leaves out (the kernels' `common.h` once was: every kernel build of a
pip-installed naiad failed). `make wheel-smoke` (in CI) goes further: a fresh venv, the extras, a
real `naiad serve`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "naiad"


def _package_files() -> set[str]:
    """Every file under src/naiad (bytecode caches aside), as the wheel names it."""
    return {path.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip install .` builds from what deploy/Dockerfile copies: pyproject.toml,
    README.md and src/naiad (never the worktree's build/ or egg-info, which could hide a gap)."""
    tree, dist = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("dist")
    shutil.copy(ROOT / "pyproject.toml", tree)
    shutil.copy(ROOT / "README.md", tree)
    shutil.copytree(PACKAGE, tree / "src" / "naiad", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist),
                    str(tree)], check=True, capture_output=True)
    [built] = dist.glob("naiad-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("naiad/")}
    assert _package_files() - shipped == set(), "files the wheel leaves out (pyproject.toml package-data)"
    assert shipped - _package_files() == set()


def test_the_kernels_build_from_the_unpacked_wheel(wheel: Path, tmp_path: Path) -> None:
    """The kernels' sources and header as installed: a fresh cache, so the build really happens."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "site")
    check = ("import naiad.llm.kernels as k; print(k.__file__); "
             "assert k.library() is not None, 'the kernels did not build'")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "NAIAD_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(tmp_path / "site")  # not the editable src/
    assert list((tmp_path / "cache" / "kernels").glob("cpu_kernels-*.so"))
