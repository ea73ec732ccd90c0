"""What each backend brings to the conformance suite: how to write the suite's MLP (and, where it
can, an identity model per datatype) in its own model format. Adding a backend to naiad means
adding a module `case_<backend>.py` next to this one with a `CASES` list of `BackendCase`, and
passing tests/backends/conformance/test_conformance.py.

Every case serves the same models, built by `write_repository`:
  mlp           the MLP of conformance/mlp.py, max_batch_size 8, no batcher
  mlp_batched   the same with dynamic batching (a queue delay long enough to batch)
  mlp_auto      the same with only `backend` in its config, when the backend auto-completes
  identity_<T>  OUTPUT0 = INPUT0 for each datatype T the backend supports
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from backends.conformance import mlp

HERE = Path(__file__).parent
#: every datatype the suite knows (BF16 has its own backend tests: numpy has no bfloat16)
ALL_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                 "FP16", "FP32", "FP64", "BYTES")


@dataclass(frozen=True)
class BackendCase:
    name: str
    backend: str
    platform: str  # what model metadata reports
    write_mlp: Callable[[Path], None]  # writes the MLP's file(s) into a version directory
    model_file: str = "model.onnx"  # the file (or directory) name a version holds
    input_name: str = "INPUT0"
    output_name: str = "OUTPUT0"
    write_identity: Callable[[Path, str], None] | None = None  # (version dir, V2 datatype)
    datatypes: tuple[str, ...] = ()
    autocomplete: bool = False
    requires: tuple[str, ...] = ()  # modules the backend imports: without them the case is skipped
    model_parameters: dict[str, str] = field(default_factory=dict)
    #: bench/framework_backends.py's ceiling: given the MLP's version directory, a function running the
    #: framework directly (in this process) on an FP32 [batch, mlp.IN] array
    in_process: Callable[[Path], Callable[[np.ndarray], np.ndarray]] | None = None

    def available(self) -> bool:
        return all(importlib.util.find_spec(module) is not None for module in self.requires)


def _config(name: str, case: BackendCase, body: str) -> str:
    parameters = "".join(f' parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
                         for k, v in case.model_parameters.items())
    return f'name: "{name}"\nbackend: "{case.backend}"\n{body}{parameters}\n'


def _mlp_body(case: BackendCase) -> str:
    return (f"max_batch_size: 8\n"
            f'input [ {{ name: "{case.input_name}" data_type: TYPE_FP32 dims: [ {mlp.IN} ] }} ]\n'
            f'output [ {{ name: "{case.output_name}" data_type: TYPE_FP32 dims: [ {mlp.OUT} ] }} ]\n')


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def write_repository(case: BackendCase, repo: Path, only: frozenset[str] | None = None) -> None:
    """The suite's models for `case` in `repo` (all of them, or those named in `only`)."""

    def model(name: str, config: str, writer: Callable[[Path], None]) -> None:
        if only is not None and name not in only:
            return
        version = repo / name / "1"
        version.mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        writer(version)

    model("mlp", _config("mlp", case, _mlp_body(case)), case.write_mlp)
    model("mlp_batched", _config("mlp_batched", case, _mlp_body(case) + (
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 500000 }\n")), case.write_mlp)
    if case.autocomplete:
        model("mlp_auto", _config("mlp_auto", case, ""), case.write_mlp)
    if case.write_identity is not None:
        for datatype in case.datatypes:
            name = f"identity_{datatype.lower()}"
            body = (f"max_batch_size: 8\n"
                    f'input [ {{ name: "INPUT0" data_type: {config_type(datatype)} dims: [ -1 ] }} ]\n'
                    f'output [ {{ name: "OUTPUT0" data_type: {config_type(datatype)} dims: [ -1 ] }} ]\n')
            writer = case.write_identity
            model(name, _config(name, case, body), lambda version, t=datatype, w=writer: w(version, t))


def all_cases() -> list[BackendCase]:
    """Every `case_*.py` module's CASES, in file-name order."""
    found: list[BackendCase] = []
    for path in sorted(HERE.glob("case_*.py")):
        module = importlib.import_module(f"backends.conformance.{path.stem}")
        found.extend(module.CASES)
    return found
