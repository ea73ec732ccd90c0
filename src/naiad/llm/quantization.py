"""INT8 weight-only quantization of the LLM's linear layers (`quantization: "int8"`).

At load, each `nn.Linear` weight becomes int8 with one float32 scale per output channel
(symmetric: scale = max|w| / 127 over the row), so the weights take a quarter of their fp32
memory (half of bf16). Activations stay in the model's dtype. Decode-sized inputs (a few rows)
run on the C kernel in kernels/int8_linear.c, which reads the int8 weights directly: decode is
bound by reading weights, so it gets faster as well as smaller. Prefill-sized inputs are
compute-bound: they widen the weights once per call and use torch's matmul.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from naiad.llm import kernels

METHODS = ("none", "int8")
#: Up to this many rows per call the C kernel runs; above it, dequantize and let torch multiply.
KERNEL_MAX_ROWS = 16


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 per-row scale) with weight ≈ q * scale[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class Int8Linear(nn.Module):
    """`y = x @ W.T + b` with `W` held as int8 rows and their scales."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_rows(linear.weight)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows <= KERNEL_MAX_ROWS and kernels.supports(x):
            return kernels.int8_linear(x, self.qweight, self.scale, self.bias)
        weight = (self.qweight.to(torch.float32) * self.scale[:, None]).to(x.dtype)
        return F.linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))


def quantize_linears(model: nn.Module, method: str) -> int:
    """Swap every `nn.Linear` of `model` for its quantized form; returns how many were swapped."""
    if method not in METHODS:
        raise ValueError(f"quantization must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "none":
        return 0
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, nn.Linear)]
    for parent, name, child in swaps:
        setattr(parent, name, Int8Linear(child))
    return len(swaps)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (what its weights take in memory)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())
