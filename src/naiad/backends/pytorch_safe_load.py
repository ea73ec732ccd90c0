"""Load torch.export (PT2) archives without running pickles from them.

torch.export.load unpickles parts of an archive with `torch.load(weights_only=False)` and plain
`pickle.loads` (weights and constants flagged `use_pickle`, "opaque object" constants, archives in
the older format). A pickle can run any code, and model files may come from a client through the
load API's `file:` overrides, so while naiad loads an archive:

- `torch.load` is forced to `weights_only=True` (TORCH_FORCE_WEIGHTS_ONLY_LOAD, which torch reads
  at each call): tensors, parameters and containers load, anything else is refused;
- plain `pickle.loads` in the archive reader refuses outright.

Archives written by torch.export.save from ordinary modules never need either: their weights are
raw tensor bytes. Callers hold a lock, as the environment variable is process-wide.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
REFUSED = "naiad does not unpickle Python objects from model files (pickles can run code)"


def _refuse(*_args: Any, **_kwargs: Any) -> Any:
    raise ValueError(f"the archive holds a pickled Python object: {REFUSED}")


# Stands in for the `pickle` module inside torch's archive reader while an archive loads.
_NO_PICKLE = types.SimpleNamespace(loads=_refuse, load=_refuse)


@contextlib.contextmanager
def _without_pickle() -> Iterator[None]:
    # Fail closed: a torch whose archive reader moved cannot be made safe here.
    from torch.export.pt2_archive import _package

    previous = os.environ.get(_FORCE)
    reader_pickle = _package.pickle
    os.environ[_FORCE] = "1"
    _package.pickle = _NO_PICKLE  # type: ignore[assignment]
    try:
        yield
    finally:
        _package.pickle = reader_pickle
        if previous is None:
            os.environ.pop(_FORCE, None)
        else:
            os.environ[_FORCE] = previous


def load_exported_safely(path: Path) -> torch.export.ExportedProgram:
    """torch.export.load(path), refusing every pickle in the archive."""
    with _without_pickle():
        try:
            return torch.export.load(str(path))
        except pickle.UnpicklingError:  # torch's weights-only refusal: long, and says how to bypass it
            raise ValueError(f"the archive holds a pickle that is not plain tensors: {REFUSED}") from None
