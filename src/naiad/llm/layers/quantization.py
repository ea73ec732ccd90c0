"""8-bit linear layers for the LLM engine: `quantization: "int8"` (quantized at load) and the
8-bit blocks of a GGUF file kept as they are (`quantization: "gguf"`, see gguf.py / loader.py).

"int8": each `nn.Linear` weight becomes int8 with a float16 scale per block of 32 inputs
(symmetric: scale = max|w| / 127 over the block, GGUF's Q8_0), and up to `OUTLIER_COLUMNS` input
columns stay float16: those whose inputs were largest in a calibration forward at load
(calibration.py). A handful of channels carry inputs 10-50x the others (SmolLM2's residual
stream, like most LLMs'), so their weights' rounding error is multiplied by the largest inputs.
About 1.1 bytes per weight: a little over a quarter of fp32's memory, half of bf16's.
"gguf": a GGUF tensor in Q8_0, Q4_0 or Q4_1 keeps its values as int8 (exactly: Q4's 4-bit values
fit a byte), its float16 scale per block of 32 inputs and Q4_1's float16 minimum per block.

Both are stored in the panel layout of kernels/q8_linear.c (`pack`), which multiplies them by
the activations quantized to 15 bits per block of 32 (with AVX512-VNNI, or a portable C loop
where the CPU lacks it). Decode is bound by reading the weights, so reading a byte per weight
rather than two (bf16) is what makes it faster. With VNNI the kernel also takes prefill;
without it, inputs of more rows than `KERNEL_MAX_ROWS` widen the weights once per call and use
torch's matmul on activations rounded as the kernel rounds them (`kernel_activations`), so that
every path computes the same products.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from naiad.llm import kernels

#: "none", "int8" (INT8 blocks quantized at load), "gguf" (a GGUF file's Q8_0 / Q4 blocks kept
#: as they are, see loader.py: only the loader can do that, here it changes nothing).
METHODS = ("none", "int8", "gguf", "auto")  # "auto": loader.resolve_quantization picks "gguf" or "none"
#: Without VNNI, up to this many rows per call the C kernel runs; above, torch multiplies.
KERNEL_MAX_ROWS = 16
PANEL, BLOCK = 16, 32  # q8_linear.c's output channels per panel and inputs per block
ACTIVATION_MAX = 16383  # q8_linear.c's QMAX: activations as 15-bit integers per block
#: Input columns per "int8" layer kept in float16 (measured on SmolLM2-135M: 4 take the
#: weights' share of the KL divergence from fp32 from 1.1e-3 to 4.4e-4, 8 to 3.9e-4, 16 to 3.7e-4).
OUTLIER_COLUMNS = 8


def quantize_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 `[out, in_pad]`, float16 scales `[out, in_pad / 32]`), `in` zero-padded to a multiple
    of 32, with weight ≈ q * scale per block of 32 inputs (the scale rounded to float16 first)."""
    w = weight.detach().float()
    out, inp = w.shape
    blocks = F.pad(w, (0, -inp % BLOCK)).reshape(out, -1, BLOCK)
    scale = (blocks.abs().amax(dim=2) / 127.0).half()
    wide = scale.float()[..., None]
    q = torch.where(wide > 0, torch.round(blocks / wide), torch.zeros_like(blocks)).clamp(-127, 127)
    return q.to(torch.int8).reshape(out, -1).contiguous(), scale.contiguous()


def kernel_activations(x: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
    """`x` (float32) as q8_linear.c multiplies it: each row's blocks of 32 rounded to 15-bit steps
    of max|x| / 16383, after taking the outlier `columns` out (kept exact)."""
    inp = x.shape[-1]
    x = x.float().reshape(-1, inp)
    outliers = columns if columns is not None and columns.numel() > 0 else None
    rest = x.clone() if outliers is None else x.index_fill(1, outliers, 0.0)
    if inp % BLOCK:
        rest = F.pad(rest, (0, -inp % BLOCK))
    blocks = rest.view(x.shape[0], -1, BLOCK)
    step = blocks.abs().amax(dim=2, keepdim=True).clamp_min_(1e-30).div_(ACTIVATION_MAX)  # a zero block stays 0
    blocks.div_(step).round_().mul_(step)
    rounded = rest[:, :inp]
    if outliers is not None:
        rounded.index_copy_(1, outliers, x[:, outliers])
    return rounded


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


def by_panel(t: torch.Tensor, panels: int) -> torch.Tensor:
    """`[out, k]` → float16 `[panels, k, 16]`: each panel's 16 values of a column side by side, as
    the kernel reads block scales and outlier columns."""
    return _pad(t.to(torch.float16), panels * PANEL, t.shape[1]).reshape(panels, PANEL, -1).transpose(1, 2)


def from_panels(t: torch.Tensor, out: int) -> torch.Tensor:
    """`by_panel`'s inverse, as float32 `[out, k]`."""
    panels, k = t.shape[:2]
    return t.transpose(1, 2).reshape(panels * PANEL, k)[:out].float()


class _PackedLinear(nn.Module):
    """What the 8-bit layers share: the kernel for few rows, dequantize-and-matmul for many."""

    scale_kind: int
    in_features: int
    out_features: int
    packed: torch.Tensor
    scales: torch.Tensor
    columns: torch.Tensor  # int64 [ncols]: the outlier columns, in float16 beside the blocks
    column_weights: torch.Tensor  # float16 [panels, ncols, 16]
    bias: torch.Tensor | None

    def dequantized(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if kernels.supports(x) and (rows <= KERNEL_MAX_ROWS or kernels.has_vnni()):
            return kernels.q8_linear(x, self.packed, self.scales, self.scale_kind, self.bias, self.out_features,
                                     self.columns, self.column_weights)
        rounded = kernel_activations(x, self.columns).to(x.dtype).reshape(x.shape)
        weight = self.dequantized().to(x.dtype)
        return F.linear(rounded, weight, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"outlier_columns={self.columns.numel()}")

    def _store_blocks(self, q: torch.Tensor, scales: torch.Tensor) -> None:
        """The packed int8 `[out, in]` and its block scales `[out, in_pad / 32]` (or, with Q4_1's
        minimums, `[panels, blocks, 2, 16]` already by panel)."""
        self.register_buffer("packed", pack(q))
        if scales.dim() == 2:
            scales = by_panel(scales, self.packed.shape[0])
        self.register_buffer("scales", scales.contiguous())

    def _store_columns(self, columns: torch.Tensor, weights: torch.Tensor) -> None:
        """The outlier `columns` and their float weights `[out, ncols]`."""
        self.register_buffer("columns", columns.to(torch.int64).contiguous())
        self.register_buffer("column_weights", by_panel(weights, self.packed.shape[0]).contiguous())

    def _block_weight(self) -> torch.Tensor:
        """The int8 blocks times their scales, float32 `[out, in]` (the outlier columns zero)."""
        q = unpack(self.packed, self.out_features, self.packed.shape[1] * 4).float()
        blocks = q.reshape(self.out_features, -1, BLOCK) * from_panels(self.scales, self.out_features)[..., None]
        return blocks.reshape(self.out_features, -1)[:, : self.in_features]


class Int8Linear(_PackedLinear):
    """`y = x @ W.T + b` with `W` quantized at load to int8 blocks of 32 inputs with float16 scales,
    and the input `columns` (when given: calibration.outlier_columns) in float16."""

    scale_kind = kernels.SCALE_BLOCK_F16

    def __init__(self, linear: nn.Linear, columns: torch.Tensor | None = None) -> None:
        """`columns`: indices of the inputs whose weights stay float16 (at most `OUTLIER_COLUMNS`
        are meant, the kernel takes up to 64)."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        columns = torch.zeros(0, dtype=torch.int64) if columns is None else columns.to(torch.int64).cpu()
        if columns.numel() and (columns.min() < 0 or columns.max() >= self.in_features
                                or columns.unique().numel() != columns.numel()):
            raise ValueError(f"outlier columns {columns.tolist()} are not distinct inputs of {self.in_features}")
        columns = columns.sort().values.to(weight.device)
        q, scales = quantize_blocks(weight.index_fill(1, columns, 0.0))
        self._store_blocks(q, scales)
        self._store_columns(columns, weight[:, columns])
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().contiguous())

    def dequantized(self) -> torch.Tensor:
        weight = self._block_weight()
        return weight.index_copy(1, self.columns, from_panels(self.column_weights, self.out_features))


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
        if block_mins is None:
            self.scale_kind = kernels.SCALE_BLOCK_F16
            self._store_blocks(q, block_scales)
        else:
            # The kernel takes q - 8 (see q8_linear.c: centred values round better).
            self.scale_kind = kernels.SCALE_BLOCK_F16_MIN
            panels = -(-self.out_features // PANEL)
            self._store_blocks(q - 8, torch.stack([by_panel(block_scales, panels), by_panel(block_mins, panels)],
                                                  dim=2))  # [panels, blocks, 2, 16]
        self._store_columns(torch.zeros(0, dtype=torch.int64), torch.zeros(self.out_features, 0))
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def dequantized(self) -> torch.Tensor:
        if self.scale_kind == kernels.SCALE_BLOCK_F16:
            return self._block_weight()
        q = unpack(self.packed, self.out_features, self.in_features).float().reshape(self.out_features, -1, BLOCK)
        scales = from_panels(self.scales[:, :, 0], self.out_features)[..., None]
        mins = from_panels(self.scales[:, :, 1], self.out_features)[..., None]
        return ((q + 8) * scales + mins).reshape(self.out_features, self.in_features)


def quantize_linears(model: nn.Module, method: str, columns: Mapping[str, torch.Tensor] | None = None) -> int:
    """Swap every `nn.Linear` of `model` for its quantized form; returns how many were swapped.

    `columns` (calibration.outlier_columns, by module name): the input columns each "int8" layer
    keeps in float16; a layer missing there keeps none.
    "gguf" swaps nothing here: the loader already put the file's 8-bit blocks in place.
    """
    if method not in METHODS:
        raise ValueError(f"quantization must be one of {', '.join(METHODS)}, got {method!r}")
    if method in ("none", "gguf"):
        return 0
    names = {id(module): name for name, module in model.named_modules()}
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, nn.Linear)]
    for parent, name, child in swaps:
        setattr(parent, name, Int8Linear(child, (columns or {}).get(names[id(child)])))
    return len(swaps)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (what its weights take in memory)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())
