"""8-bit linear layers for the LLM engine: `quantization: "int8"` (quantized at load) and the
8-bit blocks of a GGUF file kept as they are (`quantization: "gguf"`, see gguf.py / loader.py).

"int8": each `nn.Linear` weight becomes int8 with one float32 scale per output channel
(symmetric: scale = max|w| / 127 over the row), a quarter of its fp32 memory (half of bf16).
"gguf": a GGUF tensor in Q8_0, Q4_0 or Q4_1 keeps its values as int8 (exactly: Q4's 4-bit values
fit a byte), its float16 scale per block of 32 inputs and Q4_1's float16 minimum per block.

Both are stored in the panel layout of kernels/q8_linear.c (`pack`), which multiplies them
by activations quantized to int8 per block of 32 with AVX512-VNNI (a portable C loop where the
CPU lacks it). Decode is bound by reading the weights, so reading a byte per weight rather
than two (bf16) is what makes it faster. With VNNI the kernel also takes prefill: 64 int8
multiply-adds per instruction beat widening the weights for torch's matmul (a 2304x768 layer
on 128 rows: 6 ms against 18 ms for the bf16 matmul alone). Without VNNI, inputs of more rows
than `KERNEL_MAX_ROWS` widen the weights once per call and use torch's matmul.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from naiad.llm import kernels

#: "none", "int8" (per-channel INT8 quantized at load), "gguf" (a GGUF file's Q8_0 / Q4 blocks kept
#: as they are, see loader.py: only the loader can do that, here it changes nothing).
METHODS = ("none", "int8", "gguf")
#: Without VNNI, up to this many rows per call the C kernel runs; above, torch multiplies.
KERNEL_MAX_ROWS = 16
PANEL, BLOCK = 16, 32  # q8_linear.c's output channels per panel and inputs per block


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 per-row scale) with weight ≈ q * scale[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return F.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


def pack(q: torch.Tensor) -> torch.Tensor:
    """int8 `[out, in]` → q8_linear.c's uint8 panels `[panels, in_pad / 4, 16, 4]` (w + 128),
    zero weights padding `out` to 16 and `in` to 32."""
    out, inp = q.shape
    panels, in_pad = -(-out // PANEL), -(-inp // BLOCK) * BLOCK
    padded = _pad(q.to(torch.int16), panels * PANEL, in_pad) + 128
    return padded.to(torch.uint8).reshape(panels, PANEL, in_pad // 4, 4).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, out: int, inp: int) -> torch.Tensor:
    """The int8 `[out, in]` weight of `pack`'s panels (`pack`'s inverse)."""
    panels, quads = packed.shape[:2]
    rows = packed.transpose(1, 2).reshape(panels * PANEL, quads * 4)[:out, :inp]
    return (rows.to(torch.int16) - 128).to(torch.int8)


class _PackedLinear(nn.Module):
    """What the 8-bit layers share: the kernel for few rows, dequantize-and-matmul for many."""

    scale_kind: int
    in_features: int
    out_features: int
    packed: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def dequantized(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if kernels.supports(x) and (rows <= KERNEL_MAX_ROWS or kernels.has_vnni()):
            return kernels.q8_linear(x, self.packed, self.scales, self.scale_kind, self.bias, self.out_features)
        weight = self.dequantized().to(x.dtype)
        return F.linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Linear(_PackedLinear):
    """`y = x @ W.T + b` with `W` quantized at load to int8 rows and their float32 scales."""

    scale_kind = kernels.SCALE_CHANNEL_F32

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_rows(linear.weight)
        self.register_buffer("packed", pack(q))
        self.register_buffer("scales", F.pad(scale, (0, self.packed.shape[0] * PANEL - scale.shape[0])))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().contiguous())

    def dequantized(self) -> torch.Tensor:
        q = unpack(self.packed, self.out_features, self.in_features)
        return q.to(torch.float32) * self.scales[: self.out_features, None]


class Q8BlockLinear(_PackedLinear):
    """`y = x @ W.T + b` with `W` in 8-bit blocks of 32 inputs, as GGUF stores them: int8 values
    and a float16 scale per block (Q8_0, and Q4_0 whose values -8..7 fit int8 as they are), and
    optionally a float16 minimum per block (Q4_1: w = d * q + m with q in 0..15)."""

    def __init__(
        self,
        q: torch.Tensor,
        block_scales: torch.Tensor,
        bias: torch.Tensor | None = None,
        block_mins: torch.Tensor | None = None,
    ) -> None:
        """`q` int8 `[out, in]` (0..15 with `block_mins`), `block_scales` (and `block_mins`)
        float16 `[out, in / 32]`."""
        super().__init__()
        self.out_features, self.in_features = q.shape
        if q.dtype != torch.int8 or self.in_features % BLOCK:
            raise ValueError(f"block weights are int8 with a multiple of {BLOCK} inputs, "
                             f"got {q.dtype} {tuple(q.shape)}")
        for what in (block_scales, block_mins):
            if what is not None and what.shape != (self.out_features, self.in_features // BLOCK):
                raise ValueError(f"block scales of shape {tuple(what.shape)} do not fit weights {tuple(q.shape)}")
        # With minimums the kernel takes q - 8 (see q8_linear.c: centred values round better).
        self.register_buffer("packed", pack(q if block_mins is None else q - 8))
        panels, blocks = self.packed.shape[0], self.in_features // BLOCK

        def by_panel(t: torch.Tensor) -> torch.Tensor:
            # [panels, blocks, 16]: the 16 values of a panel's block side by side, as the kernel reads them
            return _pad(t.to(torch.float16), panels * PANEL, blocks).reshape(panels, PANEL, blocks).transpose(1, 2)

        if block_mins is None:
            self.scale_kind = kernels.SCALE_BLOCK_F16
            scales = by_panel(block_scales)
        else:
            self.scale_kind = kernels.SCALE_BLOCK_F16_MIN
            scales = torch.stack([by_panel(block_scales), by_panel(block_mins)], dim=2)  # [panels, blocks, 2, 16]
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def _per_block(self, t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(-1, self.in_features // BLOCK)[: self.out_features].float()[..., None]

    def dequantized(self) -> torch.Tensor:
        q = unpack(self.packed, self.out_features, self.in_features).to(torch.float32)
        blocks = q.reshape(self.out_features, -1, BLOCK)
        if self.scale_kind == kernels.SCALE_BLOCK_F16:
            return (blocks * self._per_block(self.scales)).reshape(q.shape)
        scales, mins = self.scales[:, :, 0], self.scales[:, :, 1]
        return ((blocks + 8) * self._per_block(scales) + self._per_block(mins)).reshape(q.shape)


def quantize_linears(model: nn.Module, method: str) -> int:
    """Swap every `nn.Linear` of `model` for its quantized form; returns how many were swapped.

    "gguf" swaps nothing here: the loader already put the file's 8-bit blocks in place.
    """
    if method not in METHODS:
        raise ValueError(f"quantization must be one of {', '.join(METHODS)}, got {method!r}")
    if method in ("none", "gguf"):
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
