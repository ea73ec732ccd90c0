"""Custom (C ABI) backends in the conformance suite: examples/custom_backend's mlp.c (weights read
by create() from a raw float32 weights.bin) and identity.c for every numeric datatype, built
with gcc by `make` at test time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from backends import custom_examples
from backends.conformance import mlp
from backends.conformance.cases import ALL_DATATYPES, BackendCase

from naiad.backends.custom import library


def _mlp(version: Path) -> None:
    custom_examples.install("mlp", version)
    custom_examples.write_weights(version)


def _identity(version: Path, datatype: str) -> None:
    custom_examples.install("identity", version)


def in_process_custom(version: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The library loaded with ctypes in this process (no model process, no shared memory): what
    one execute of one request costs through the ABI."""
    config = {"name": "mlp", "max_batch_size": 8,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [mlp.IN]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [mlp.OUT]}]}
    instance = library.load(version / "model.so").create(
        json.dumps(config), version, 0, {"OUTPUT0": library.OutputSpec("FP32", (mlp.OUT,))}, batched=True)

    def run(x: np.ndarray) -> np.ndarray:
        (result,) = instance.execute([library.Request({"INPUT0": x}, ["OUTPUT0"])])
        if isinstance(result, str):
            raise RuntimeError(result)
        return result["OUTPUT0"]

    return run


CASES = [BackendCase("custom", "custom", "custom", _mlp, "model.so", write_identity=_identity,
                     datatypes=tuple(t for t in ALL_DATATYPES if t != "BYTES"), in_process=in_process_custom)]
