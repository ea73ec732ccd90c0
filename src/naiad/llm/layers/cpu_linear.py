"""Linear layers with prepacked weights, for bf16 models on the CPU.

Where the CPU has AVX-512, naiad's own kernel (kernels/bf16_linear.c, `PanelLinear`; AVX512-BF16's
instruction where the CPU has it, two FMAs per pair of inputs elsewhere): decode steps multiply a
few rows by each weight, and there it reads the weights 1.3-2x faster than oneDNN's prepacked GEMV
below at one row, and is level with it from 16 to 512 rows on an AVX512-BF16 CPU; on an Ice Lake
Xeon without that extension a 123M Llama's decode step took 0.35-0.56x oneDNN's time at 1-64 rows
(the kernel also lets the fused decode take the step). Elsewhere oneDNN's (`PackedLinear`):

`nn.Linear` hands its weight to oneDNN in the plain row-major layout, which oneDNN reorders
into its blocked layout on every call. Reordering once at load (what torch.compile's freezing
pass does) and calling oneDNN's linear directly makes a single-row bf16 GEMV about twice as
fast here (the LM head of a 123M Llama: 8.1 ms → 4.3 ms on one core) with bit-identical
results. In fp32 the packed kernel rounds differently (about 1e-4), so fp32 stays plain.
oneDNN packs bf16 only on CPUs with bf16 conversions in hardware (AVX512-BW/VL/DQ or
AVX-NE-CONVERT); elsewhere (AVX2-only x86) bf16 models keep plain `nn.Linear`.
"""

from __future__ import annotations

import torch
from torch import nn

from naiad.llm import kernels

#: The batch size oneDNN tunes the packed layout for: decode steps have few rows per sequence.
_ROWS_HINT = 1


def native_bf16() -> bool:
    """Whether this CPU has bf16 conversions in hardware for oneDNN (AVX512-BW/VL/DQ or
    AVX-NE-CONVERT). Without them torch emulates bf16 matmuls: SmolLM2-135M decodes one stream at
    4.4 tok/s in bf16 against 20.7 in float32 on an AVX2-only EPYC."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def can_prepack(dtype: torch.dtype, device: torch.device) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and native_bf16()
    )


class PackedLinear(nn.Module):
    """`y = x @ W.T + b` with `W` kept only in oneDNN's layout (the plain copy is dropped)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # Buffers, not parameters: nothing trains them, and `named_parameters` keeps meaning
        # "the checkpoint's tensors".
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _ROWS_HINT)
        self.register_buffer("packed_weight", packed)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


class PanelLinear(nn.Module):
    """`y = x @ W.T + b` with `W` kept only in bf16_linear.c's panel layout (bf16 x, bf16 y)."""

    panels: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("panels", kernels.bf16_panels(linear.weight.detach()))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.bf16_linear(x, self.panels, self.bias, self.out_features)


def prepack_linears(model: nn.Module) -> int:
    """Swap every `nn.Linear` of `model` for a `PanelLinear` where the CPU runs bf16_linear, else
    for a `PackedLinear`; returns how many were swapped."""
    packed = PanelLinear if kernels.has_bf16_linear() else PackedLinear
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, packed(child))
    return len(swaps)
