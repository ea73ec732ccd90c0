"""PyTorch in the conformance suite: the MLP as a scripted TorchScript module (model.pt) and as a
torch.export program in a PT2 archive (model.pt2), with Triton's INPUT__0 / OUTPUT__0 names, and
an identity per datatype in each format (BYTES is no torch tensor type)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from backends.conformance import mlp
from backends.conformance.cases import ALL_DATATYPES, BackendCase

DATATYPES = tuple(t for t in ALL_DATATYPES if t != "BYTES")


def _torch_mlp():  # torch is imported only when a case runs (it is skipped without torch)
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = mlp.weights()
            self.w1 = torch.nn.Parameter(torch.from_numpy(w["w1"]), requires_grad=False)
            self.b1 = torch.nn.Parameter(torch.from_numpy(w["b1"]), requires_grad=False)
            self.w2 = torch.nn.Parameter(torch.from_numpy(w["w2"]), requires_grad=False)
            self.b2 = torch.nn.Parameter(torch.from_numpy(w["b2"]), requires_grad=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ self.w1 + self.b1) @ self.w2 + self.b2

    return MLP().eval()


def _identity_module():
    import torch

    class Identity(torch.nn.Module):
        # named like the config's input, so it binds by forward() argument name
        def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
            return INPUT0.clone()

    return Identity().eval()


def write_torchscript_mlp(version: Path) -> None:
    import torch

    torch.jit.script(_torch_mlp()).save(str(version / "model.pt"))


def write_exported_mlp(version: Path) -> None:
    import torch

    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(_torch_mlp(), (torch.zeros(2, mlp.IN),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(version / "model.pt2"))


def _sample(datatype: str):
    import torch

    dtype = np.bool_ if datatype == "BOOL" else np.dtype(datatype.lower().replace("fp", "float"))
    return torch.from_numpy(np.zeros((2, 3), dtype=dtype))


def write_torchscript_identity(version: Path, datatype: str) -> None:
    import torch

    torch.jit.script(_identity_module()).save(str(version / "model.pt"))


def write_exported_identity(version: Path, datatype: str) -> None:
    import torch

    dims = {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("n", min=1)}
    program = torch.export.export(_identity_module(), (_sample(datatype),), dynamic_shapes=(dims,))
    torch.export.save(program, str(version / "model.pt2"))


def in_process_pytorch(version: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The TorchScript MLP run by torch in this process as a naiad instance runs it."""
    import torch

    return _on_calling_thread(torch.jit.load(str(version / "model.pt"), map_location="cpu").eval())


def in_process_pytorch_export(version: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The exported MLP run as naiad's backend runs a PT2 archive: `torch.export.load`, the
    program's module."""
    import torch

    return _on_calling_thread(torch.export.load(str(version / "model.pt2")).module())


def _on_calling_thread(module: Any) -> Callable[[np.ndarray], np.ndarray]:
    """`module` as a naiad instance calls it: inference mode, one intra-op thread (the backend's
    default), on the calling thread."""
    import torch

    torch.set_num_threads(1)  # per calling thread with torch's OpenMP build, as in the backend

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return run


CASES = [
    BackendCase("pytorch", "pytorch", "pytorch_libtorch", write_torchscript_mlp, "model.pt",
                input_name="INPUT__0", output_name="OUTPUT__0", write_identity=write_torchscript_identity,
                datatypes=DATATYPES, requires=("torch",), in_process=in_process_pytorch),
    BackendCase("pytorch_export", "pytorch", "torch_aoti", write_exported_mlp, "model.pt2",
                input_name="INPUT__0", output_name="OUTPUT__0", write_identity=write_exported_identity,
                datatypes=DATATYPES, autocomplete=True, requires=("torch",), in_process=in_process_pytorch_export),
]
