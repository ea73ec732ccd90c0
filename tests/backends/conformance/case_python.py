"""Python models in the conformance suite: the MLP in numpy (weights from an .npz) and one
identity model.py for every datatype."""

from __future__ import annotations

import shutil
from pathlib import Path

from backends.conformance import mlp
from backends.conformance.cases import ALL_DATATYPES, HERE, BackendCase

PYTHON_MODELS = HERE / "python_models"


def _mlp(version: Path) -> None:
    shutil.copy(PYTHON_MODELS / "mlp.py", version / "model.py")
    mlp.save_npz(version / "weights.npz")


def _identity(version: Path, datatype: str) -> None:
    shutil.copy(PYTHON_MODELS / "identity.py", version / "model.py")


CASES = [BackendCase("python", "python", "python", _mlp, "model.py", write_identity=_identity,
                     datatypes=ALL_DATATYPES)]
