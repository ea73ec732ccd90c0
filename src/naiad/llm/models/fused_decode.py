"""A decode step's decoder layers as one C call (kernels/decoder.c), where the model allows it.

SmolLM2's 30 narrow layers spent about as long in Python (a dozen module and ctypes calls a
layer) as in the kernels at one stream. `decode_layers` runs the same kernels in the same order
with no Python between them, so a step's logits are bit for bit the layer-by-layer forward's
(tests/llm/test_fused_decode.py).

It applies to a model on the CPU whose linears are all 8-bit (`quantization` "int8", "gguf", or
"auto" where that keeps a GGUF file's blocks) or all bf16 panels (a bf16 model where the CPU runs
kernels/bf16_linear.c: cpu_linear.PanelLinear), on one tensor-parallel rank, without per-head q/k
norms (Qwen3), and to steps whose rows are all decode rows (prefill chunks keep the layer-by-layer
forward). `NAIAD_LLM_FUSED_DECODE=0` turns it off, to compare.

A step that starts from token ids (the first pipeline stage, every step without pipeline
parallelism) looks up its embedding and rotary rows in the same call (`run_tokens`), and a greedy
step whose rows need nothing but their argmax ends in one more (`FusedHead`: the final norm, the
LM head and the argmax). What is left in Python is each step's bookkeeping: on one stream every
Python-level call ran 5-10x slower than warm, on caches the step's weights had swept.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from naiad.llm import kernels
from naiad.llm.kernels import decoder
from naiad.llm.layers.attention import AttentionMetadata, KVCache
from naiad.llm.layers.cpu_linear import PanelLinear
from naiad.llm.layers.quantization import KERNEL_MAX_ROWS, _PackedLinear

if TYPE_CHECKING:
    from naiad.llm.models.llama import DecoderLayer, LlamaModel, RMSNorm, RotaryEmbedding


class FusedDecode:
    """The ctypes view of a model's layers that `decoder.decode_layers` takes, built once."""

    def __init__(self, model: LlamaModel, bf16: bool = False) -> None:
        self.bf16 = bf16  # the linears are bf16 panels (else 8-bit)
        layers = _layers(model)
        first = layers[0]
        attention = first.self_attn
        self.dtype = first.input_layernorm.weight.dtype
        self.shape = decoder.DecodeShape(
            hidden=first.input_layernorm.weight.numel(), heads=attention.num_heads,
            kv_heads=attention.num_kv_heads, head_dim=attention.head_dim,
            inter=first.mlp.gate_up_proj.out_features // 2, window=attention.sliding_window or 0,
            scale=attention.scale, eps=first.input_layernorm.eps,
        )
        self.layers = (decoder.DecoderLayer * len(layers))()
        for slot, layer in zip(self.layers, layers, strict=True):
            slot.input_norm = layer.input_layernorm.weight.data_ptr()
            slot.post_norm = layer.post_attention_layernorm.weight.data_ptr()
            slot.qkv = _linear(layer.self_attn.qkv_proj)
            slot.o = _linear(layer.self_attn.o_proj)
            slot.gate_up = _linear(layer.mlp.gate_up_proj)
            slot.down = _linear(layer.mlp.down_proj)
        self._caches: tuple[int, ...] = ()

    @staticmethod
    def build(model: LlamaModel) -> FusedDecode | None:
        """The fused path for `model`, or None where it does not apply (see the module's doc)."""
        if os.environ.get("NAIAD_LLM_FUSED_DECODE", "1") == "0" or not len(model.layers) or model.tp.active:
            return None
        if kernels.library() is None:
            return None
        kinds: set[str | None] = set()
        for layer in _layers(model):
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            kinds |= {_kind(linear) for linear in linears}
            if layer.self_attn.qk_norm or None in kinds or len(kinds) > 1:
                return None
            if kinds == {"bf16"} and norms[0].dtype != torch.bfloat16:  # panels take bf16 activations
                return None
            if not all(kernels.supports(norm) and norm.is_contiguous() for norm in norms):
                return None
        return FusedDecode(model, kinds.pop() == "bf16")

    def applies(self, x: torch.Tensor, meta: AttentionMetadata) -> bool:
        """Whether this step can run fused: decode rows only, in the layers' dtype, and few enough
        rows for the 8-bit kernel where the CPU lacks VNNI (as _PackedLinear decides per call; bf16
        panels take any number)."""
        return self._takes(x.shape[0], x, meta)

    def run(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layers over `x + residual`, as `LlamaModel.run_layers` returns them."""
        self._bind(kv_caches)
        return decoder.decode_layers(self.shape, self.layers, x, residual, *rope, meta.slot_mapping,
                                     meta.decode_block_tables, meta.decode_context_lens)

    def takes_tokens(self, token_ids: torch.Tensor, meta: AttentionMetadata, embedding: torch.Tensor) -> bool:
        """Whether `run_tokens` can run this step: `applies`, with the rows still token ids and the
        embedding a plain table in the layers' dtype."""
        return embedding.dim() == 2 and embedding.is_contiguous() and self._takes(token_ids.shape[0], embedding, meta)

    def _takes(self, rows: int, activations: torch.Tensor, meta: AttentionMetadata) -> bool:
        """Decode rows only, activations in the layers' dtype on the CPU, and few enough rows for
        the 8-bit kernel where the CPU lacks VNNI."""
        return (not meta.prefills and rows == len(meta.decode_tokens) and activations.dtype == self.dtype
                and activations.device.type == "cpu" and (self.bf16 or rows <= KERNEL_MAX_ROWS or kernels.has_vnni()))

    def run_tokens(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        embedding: torch.Tensor,
        rotary: RotaryEmbedding,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layers from the rows' token ids (`takes_tokens`), as `run_layers(embed(token_ids),
        None, ...)` returns them: the embedding and the rotary rows are looked up in C, from
        `rotary`'s tables (a step's own rotary and embedding calls were ~0.2 ms at one stream, on
        caches the weights had swept; docs/benchmarks.md, 2026-12-06 05:58)."""
        self._bind(kv_caches)

        def call(tables: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
            return decoder.decode_tokens(self.shape, self.layers, token_ids, positions, embedding, tables,
                                         meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens)

        out = call(rotary.tables(self.dtype))
        if out is None:  # a position past the tables: grow them to it
            out = call(rotary.tables(self.dtype, int(positions.max()) + 1))
        assert out is not None, "the rotary tables were grown past every position"
        return out

    def _bind(self, kv_caches: list[KVCache]) -> None:
        """Point the layers' table at `kv_caches` (once, and again if the caches move)."""
        caches = tuple(t.data_ptr() for cache in kv_caches for t in cache)
        if caches != self._caches:
            first = kv_caches[0][0]
            self.shape.block_size = first.shape[1]
            for slot, (keys, values) in zip(self.layers, kv_caches, strict=True):
                if not (keys.is_contiguous() and values.is_contiguous() and keys.dtype == self.dtype):
                    raise ValueError("the fused decode needs contiguous KV caches in the model's dtype")
                slot.k_cache, slot.v_cache = keys.data_ptr(), values.data_ptr()
            self._caches = caches


class FusedHead:
    """A greedy decode step's final norm, LM head and argmax as one C call (decoder.decode_head),
    after the fused layers: at one stream the dozen Python-level calls it replaces (the rows'
    selection, the norm's and the head's wrappers, torch's max) took ~0.3 ms a step, their code and
    data evicted from the caches by the step's weights (docs/benchmarks.md, 2026-12-06 05:58)."""

    def __init__(self, layers: FusedDecode, norm: torch.Tensor, head: nn.Module, vocab_size: int) -> None:
        self.layers = layers  # its shape (hidden size, eps, threads) serves the head too
        self.norm = norm
        self.head = _linear(head)
        self.vocab_size = vocab_size

    @staticmethod
    def build(layers: FusedDecode | None, norm: RMSNorm | None, head: nn.Module | None,
              vocab_size: int) -> FusedHead | None:
        """The fused head, where the layers are fused and the LM head is of their kind (its
        activations in their dtype); else None."""
        if layers is None or norm is None or head is None or _kind(head) != ("bf16" if layers.bf16 else "q8"):
            return None
        weight = norm.weight
        if weight.dtype != layers.dtype or not (kernels.supports(weight) and weight.is_contiguous()):
            return None
        return FusedHead(layers, weight, head, vocab_size)

    def greedy(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Each row's token (int64 `[rows]`) from the fused layers' output, as `compute_logits`
        followed by the sampler's argmax would give it."""
        return decoder.decode_head(self.layers.shape, self.norm, self.head, x, residual, self.vocab_size)


def _layers(model: LlamaModel) -> list[DecoderLayer]:
    return cast("list[DecoderLayer]", list(model.layers))  # a ModuleList's items are Modules to mypy


def _kind(linear: nn.Module) -> str | None:
    """How decoder.c runs `linear`: "q8" (8-bit blocks) or "bf16" (panels); None where it cannot."""
    if isinstance(linear, _PackedLinear):
        return "q8"
    return "bf16" if isinstance(linear, PanelLinear) else None


def _linear(linear: nn.Module) -> decoder.Linear:
    if isinstance(linear, PanelLinear):
        return decoder.bf16_layer(linear.panels, linear.bias, linear.in_features, linear.out_features)
    assert isinstance(linear, _PackedLinear), "build() checked that every linear is 8-bit or bf16 panels"
    return decoder.q8_layer(linear.packed, linear.scales, linear.scale_kind, linear.bias, linear.in_features,
                            linear.out_features, linear.columns, linear.column_weights)


