"""The example C custom backends (examples/custom_backend) built for the tests: `make` with gcc,
once per test process, into a temporary directory (never into the tree, never committed)."""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from backends.conformance import mlp

SOURCES = Path(__file__).resolve().parents[2] / "examples" / "custom_backend"


@functools.cache
def build_dir() -> Path:
    """Where `make` put mlp.so, identity.so and faulty.so (raises with gcc's output on failure)."""
    out = Path(tempfile.mkdtemp(prefix="naiad-custom-"))
    atexit.register(shutil.rmtree, out, True)
    done = subprocess.run(["make", "-C", str(SOURCES), f"OUT={out}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the example custom backends failed:\n{done.stdout}\n{done.stderr}")
    return out


def install(name: str, version_dir: Path, filename: str = "model.so") -> Path:
    """Copy example `name` (mlp, identity, faulty) into `version_dir` as `filename`."""
    target = version_dir / filename
    # A new file renamed over the old one, never a copy into it: a process that has the old one
    # loaded keeps its (unchanged) mapping instead of crashing on rewritten pages.
    partial = version_dir / f".{filename}.partial"
    shutil.copy(build_dir() / f"{name}.so", partial)
    partial.replace(target)
    return target


def write_weights(version_dir: Path) -> Path:
    """The suite's MLP weights as mlp.c reads them: int32 sizes (in, hidden, out), then raw
    float32 W1, b1, W2, b2 in a row (the sizes follow mlp.resize)."""
    w = mlp.weights()
    path = version_dir / "weights.bin"
    sizes = np.array([mlp.IN, mlp.HIDDEN, mlp.OUT], dtype="<i4")
    values = np.concatenate([w[k].reshape(-1) for k in ("w1", "b1", "w2", "b2")]).astype("<f4")
    path.write_bytes(sizes.tobytes() + values.tobytes())
    return path


def compile_library(source: str, target: Path) -> Path:
    """Compile C `source` (against naiad_backend.h) into the shared library `target`."""
    header_dir = Path(__file__).resolve().parents[2] / "src" / "naiad" / "backends" / "custom"
    c_file = target.with_suffix(".c")
    c_file.write_text(source)
    done = subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{header_dir}", "-o", str(target), str(c_file)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"gcc failed on {c_file}:\n{done.stderr}")
    c_file.unlink()
    return target
