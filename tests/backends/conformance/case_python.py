"""Python models in the conformance suite: the MLP in numpy (weights from an .npz) and one
identity model.py for every datatype."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from backends.conformance import mlp
from backends.conformance.cases import ALL_DATATYPES, HERE, BackendCase

PYTHON_MODELS = HERE / "python_models"


def _mlp(version: Path) -> None:
    shutil.copy(PYTHON_MODELS / "mlp.py", version / "model.py")
    mlp.save_npz(version / "weights.npz")


def _identity(version: Path, datatype: str) -> None:
    shutil.copy(PYTHON_MODELS / "identity.py", version / "model.py")


def in_process_python(version: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The model.py's own arithmetic, numpy in this process (what its execute() computes)."""
    w = np.load(version / "weights.npz")
    w1, b1, w2, b2 = w["w1"], w["b1"], w["w2"], w["b2"]
    return lambda x: np.maximum(x @ w1 + b1, 0) @ w2 + b2


CASES = [BackendCase("python", "python", "python", _mlp, "model.py", write_identity=_identity,
                     datatypes=ALL_DATATYPES, in_process=in_process_python)]
