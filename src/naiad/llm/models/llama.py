"""The Llama family in plain torch: Llama 2/3, SmolLM2, Mistral, Qwen2 and Qwen3.

They share one shape — pre-norm decoder layers with RMSNorm, rotary position embeddings,
grouped-query attention and a SiLU-gated MLP — and differ in small ways that `LlamaArgs`
reads from a Hugging Face config.json: biases on the q/k/v projections (Qwen2), per-head
RMSNorm of q and k (Qwen3), tied embeddings (SmolLM2), rope theta and scaling.

The forward works on a flattened variable-length batch (see `attention`): the new tokens of
every scheduled sequence back to back, with their positions. The q/k/v projections are fused
into one `qkv_proj` and gate/up into one `gate_up_proj` (one GEMM each instead of three and
two); `load_weights` slices Hugging Face's separate tensors into them.

Under tensor parallelism (`naiad.llm.distributed.parallel`) each rank builds the model with its share of the
heads, MLP columns and vocabulary, and `load_weights` copies only that share of each tensor.
Under pipeline parallelism (`naiad.llm.distributed.pipeline`) each stage builds only its decoder layers
(numbered from 0 in `layers`, the checkpoint's `layer_range`), stage 0 the embedding and the last
stage the final norm and LM head; `load_weights` skips the other stages' tensors, and the forward
splits into `LlamaModel.embed`, `LlamaModel.run_layers` and `LlamaForCausalLM.compute_logits`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from naiad.llm import kernels
from naiad.llm.distributed.parallel import TensorParallel
from naiad.llm.layers.attention import AttentionMetadata, KVCache, paged_attention
from naiad.llm.models.fused_decode import FusedDecode, FusedHead

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Rotary scaling of the "linear" and "llama3" kinds (None of this means plain rope)."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class LlamaArgs:
    """The architecture of one model, read from a Hugging Face config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> LlamaArgs:
        """Read a config.json dict; raise ValueError for what this model cannot run."""
        model_type = config.get("model_type", "llama")
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not of the Llama family ({', '.join(MODEL_TYPES)})")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config['hidden_act']!r} is not supported (only silu)")
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        theta, scaling = _rope(config)
        bias = bool(config.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases (its config has no switch for them) and no o bias.
            qkv_bias=bias or model_type == "qwen2",
            o_bias=bias and model_type != "qwen2",
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            sliding_window=_sliding_window(config),
        )

    @property
    def max_model_len(self) -> int:
        """The longest context this model computes exactly (a sliding window does not shorten it)."""
        return self.max_position_embeddings


def _rope(config: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    # transformers 5 writes `rope_parameters` (theta inside); older configs `rope_theta` and
    # `rope_scaling` with "rope_type" or the older "type".
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ("linear", "llama3"):
        raise ValueError(f"rope scaling {rope_type!r} is not supported (default, linear and llama3 are)")
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return theta, RopeScaling(rope_type, **{name: params[name] for name in fields if name in params})


def _sliding_window(config: Mapping[str, Any]) -> int | None:
    window = config.get("sliding_window")
    # Qwen2/Qwen3 configs carry a window that only applies with use_sliding_window.
    if window is None or not config.get("use_sliding_window", True):
        return None
    return int(window)


def rope_inv_freq(args: LlamaArgs) -> torch.Tensor:
    """The rotary frequencies, float32 on the CPU, with the config's scaling applied."""
    dim = args.head_dim
    # On the CPU explicitly: models are built under `torch.device("meta")`, which would make
    # this a tensor without data.
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / (args.rope_theta**exponents)
    scaling = args.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding:
    """cos/sin tables for a batch's positions, computed once per forward and shared by layers."""

    def __init__(self, args: LlamaArgs) -> None:
        # A plain tensor, not a buffer: the model is built on the meta device and the
        # checkpoint does not carry it. Moved to the positions' device on first use.
        self.inv_freq = rope_inv_freq(args)
        self.max_positions = args.max_position_embeddings
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, dtype: torch.dtype, length: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[positions, head_dim]` in `dtype` on the CPU for positions 0 to at least
        `length` - 1, row p what `self` gives position p (the same elementwise operations);
        kept, and grown by doubling from 1,024 positions up to the model's maximum."""
        have = self._tables.get(dtype)
        if have is None or have[0].shape[0] < length:
            doubled = max(1024, 2 * have[0].shape[0] if have is not None else 0)
            size = max(length, min(doubled, self.max_positions))
            cos, sin = self(torch.arange(size), dtype)
            have = self._tables[dtype] = (cos.reshape(size, -1).contiguous(), sin.reshape(size, -1).contiguous())
        return have

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [tokens, 1, head_dim]: broadcast over heads
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `[tokens, heads, head_dim]` by its positions' angles (the half-split layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernels.supports(x):
            return kernels.rms_norm(x, self.weight, self.eps)[0]
        return self._reference(x)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Norm of `x + residual`, and that sum (the residual stream of the next sub-layer)."""
        if kernels.supports(x):
            normed, summed = kernels.rms_norm(x, self.weight, self.eps, residual)
            assert summed is not None
            return normed, summed
        summed = x + residual
        return self._reference(summed), summed

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 and the weight applied after the cast back, as the reference does, so
        # that bf16 and fp16 round the same way.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs, tp: TensorParallel) -> None:
        super().__init__()
        # This rank's heads: qkv_proj column-parallel, o_proj row-parallel (summed in forward).
        self.tp = tp
        self.num_heads, self.num_kv_heads = args.num_heads // tp.size, args.num_kv_heads // tp.size
        self.head_dim = args.head_dim
        self.q_size = self.num_heads * args.head_dim
        self.kv_size = self.num_kv_heads * args.head_dim
        self.scale = args.head_dim**-0.5
        self.sliding_window = args.sliding_window
        self.qkv_proj = nn.Linear(args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, args.hidden_size, bias=args.o_bias)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
        self.qk_norm = args.qk_norm

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, cache: KVCache
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if kernels.supports(q):
            kernels.rotary_(q, k, *rope)  # in place, in the qkv output
        else:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = paged_attention(q, k, v, cache, meta, self.scale, self.sliding_window)
        return self.tp.all_reduce(self.o_proj(out.flatten(1)))


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs, tp: TensorParallel) -> None:
        super().__init__()
        # This rank's columns: gate_up_proj column-parallel, down_proj row-parallel.
        self.tp = tp
        intermediate = args.intermediate_size // tp.size
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * intermediate, bias=args.mlp_bias)
        self.down_proj = nn.Linear(intermediate, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if kernels.supports(gate_up):
            return self.tp.all_reduce(self.down_proj(kernels.silu_mul(gate_up)))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.tp.all_reduce(self.down_proj(F.silu(gate) * up))


class DecoderLayer(nn.Module):
    def __init__(self, args: LlamaArgs, tp: TensorParallel) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, tp)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args, tp)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`x + residual` is the layer's input (`x` alone for the first layer); returns the MLP's
        output and the residual stream before it, whose sum is the layer's output. Deferring the
        add lets the next norm fuse it (as vLLM's layers do); the sums are the reference's."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, rope, meta, cache)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, args: LlamaArgs, tp: TensorParallel) -> None:
        super().__init__()
        self.tp, self.vocab_size = tp, args.vocab_size
        stage = tp.pipeline
        # The checkpoint's layers this pipeline stage holds (all of them on one stage).
        self.layer_range = stage.layers(args.num_layers)
        # Vocab-parallel: this rank's rows of the vocabulary (all of them on one rank).
        self.embed_tokens: nn.Embedding | None = (
            nn.Embedding(tp.padded_vocab(args.vocab_size), args.hidden_size) if stage.first else None
        )
        self.layers = nn.ModuleList(DecoderLayer(args, tp) for _ in self.layer_range)
        self.norm: RMSNorm | None = RMSNorm(args.hidden_size, args.rms_norm_eps) if stage.last else None
        self.rotary = RotaryEmbedding(args)
        #: decode steps' layers as one C call (fused_decode.py), set by the runner once the
        #: weights are loaded and quantized; None: layer by layer
        self.fused_decode: FusedDecode | None = None

    def forward(
        self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_caches: list[KVCache]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's output as (MLP output, residual stream): their sum, before the final norm."""
        fused = self.fused_tokens(token_ids, positions, meta, kv_caches)
        if fused is not None:
            return fused
        return self.run_layers(self.embed(token_ids), None, positions, meta, kv_caches)

    def fused_tokens(
        self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_caches: list[KVCache]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`forward` as one C call from the token ids (FusedDecode.run_tokens), or None where that
        path does not take the step (nothing is computed then)."""
        fused, embedding = self.fused_decode, self.embed_tokens
        if fused is None or embedding is None or not fused.takes_tokens(token_ids, meta, embedding.weight):
            return None
        return fused.run_tokens(token_ids, positions, meta, kv_caches, embedding.weight, self.rotary)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The first stage's input to its layers."""
        assert self.embed_tokens is not None, "only the first pipeline stage embeds"
        return self.tp.embed(self.embed_tokens.weight, token_ids, self.vocab_size)

    def run_layers(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This stage's layers over `x + residual` (`x` alone on the first stage); returns the pair
        the next stage (or the final norm) takes."""
        rope = self.rotary(positions, x.dtype)
        if self.fused_decode is not None and self.fused_decode.applies(x, meta):
            return self.fused_decode.run(x, residual, rope, meta, kv_caches)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, meta, cache)
        assert residual is not None, "a model without layers"
        return x, residual


# Hugging Face's separate projections → (fused module, which part of its output rows).
_PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """The model and its LM head; parameter names follow Hugging Face's, fused where noted."""

    def __init__(self, args: LlamaArgs, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.args = args
        self.tp = tp = tp or TensorParallel.single()
        self.model = LlamaModel(args, tp)
        # Vocab-parallel: this rank's vocabulary columns of the logits, gathered on rank 0.
        self.lm_head: nn.Linear | None = (
            nn.Linear(args.hidden_size, tp.padded_vocab(args.vocab_size), bias=False) if tp.pipeline.last else None
        )
        self.tie_weights()
        #: a greedy decode step's final norm, LM head and argmax as one C call (fused_decode.py),
        #: set by the runner with the fused layers; None: compute_logits, then the sampler
        self.fused_head: FusedHead | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (a norm's weight: never quantized, on every stage)."""
        first: DecoderLayer = self.model.layers[0]  # type: ignore[assignment]  # ModuleList items are Modules to mypy
        return first.input_layernorm.weight.dtype

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the config ties them.

        Again after `to_empty`, which gives each module its own new tensor. Under pipeline
        parallelism the last stage's LM head is its own copy, loaded from the embedding's tensor.
        """
        if self.args.tie_word_embeddings and self.lm_head is not None and self.model.embed_tokens is not None:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor | None:
        """Logits `[len(logits_indices), vocab]` for the flattened tokens at `logits_indices`
        (None on tensor-parallel ranks other than 0, which sample nothing).

        Every token's K/V is written to `kv_caches`; only the rows that sample need logits,
        and the final norm and LM head run on those rows alone.
        """
        hidden, residual = self.model(token_ids, positions, meta, kv_caches)
        return self.compute_logits(hidden, residual, logits_indices)

    def greedy_tokens(
        self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_caches: list[KVCache]
    ) -> torch.Tensor | None:
        """A decode step whose every row takes its most likely token: those tokens (int64 `[rows]`),
        the layers and the head each one C call; None where the fused path does not take the step
        (nothing is computed then: the caller runs `forward` and samples)."""
        if self.fused_head is None:
            return None
        layers = self.model.fused_tokens(token_ids, positions, meta, kv_caches)
        return None if layers is None else self.fused_head.greedy(*layers)

    def compute_logits(
        self, hidden: torch.Tensor, residual: torch.Tensor, logits_indices: torch.Tensor
    ) -> torch.Tensor | None:
        """The last stage's logits at `logits_indices` from its layers' output, gathered on the
        stage's first tensor-parallel rank (None on the others)."""
        assert self.model.norm is not None and self.lm_head is not None, "only the last pipeline stage has the head"
        normed, _ = self.model.norm.add_forward(hidden[logits_indices], residual[logits_indices])
        return self.tp.gather_logits(self.lm_head(normed), self.args.vocab_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face tensors into the parameters (casting to their dtype); check that all came."""
        params = dict(self.named_parameters())
        expected = {name: self._num_parts(name) for name in params}
        loaded: dict[str, set[int]] = {name: set() for name in params}
        for hf_name, tensor in weights:
            if hf_name.endswith("rotary_emb.inv_freq") or (
                self.args.tie_word_embeddings and hf_name == "lm_head.weight"
            ):
                continue  # computed here, or the same tensor as the embedding
            stage_name = self._stage_name(hf_name)
            if stage_name is None:
                continue  # another pipeline stage's
            name, part = self._locate(stage_name)
            if name not in params:
                raise ValueError(f"unexpected weight {hf_name!r} for a {self.args.model_type} model")
            dest = self._part(name, params[name].data, part)
            full = self._full_shape(name, dest)
            if full != tuple(tensor.shape):
                raise ValueError(f"weight {hf_name!r} has shape {tuple(tensor.shape)}, expected {full}")
            self._copy_shard(name, dest, tensor)
            loaded[name].add(part)
        missing = sorted(name for name, parts in loaded.items() if len(parts) != expected[name])
        if missing:
            raise ValueError(f"the checkpoint lacks weights for {', '.join(missing)}")

    def _stage_name(self, hf_name: str) -> str | None:
        """The name of the parameter `hf_name` fills on this pipeline stage (its layers numbered
        from the stage's first), or None when another stage holds it."""
        if hf_name.startswith("model.layers."):
            index, rest = hf_name[len("model.layers."):].split(".", 1)
            layers = self.model.layer_range
            if index.isdigit() and int(index) < self.args.num_layers:
                return f"model.layers.{int(index) - layers.start}.{rest}" if int(index) in layers else None
            return hf_name  # not a layer of this model: load_weights says so
        if hf_name == "model.embed_tokens.weight":
            if self.model.embed_tokens is not None:
                return hf_name
            # Tied: the last stage's own LM head is the embedding's matrix.
            return "lm_head.weight" if self.args.tie_word_embeddings and self.lm_head is not None else None
        if hf_name == "model.norm.weight":
            return hf_name if self.model.norm is not None else None
        if hf_name == "lm_head.weight":
            return hf_name if self.lm_head is not None else None
        return hf_name

    @staticmethod
    def _locate(hf_name: str) -> tuple[str, int]:
        for hf_part, (fused, index) in _PACKED.items():
            if f".{hf_part}." in hf_name:
                return hf_name.replace(hf_part, fused), index
        return hf_name, 0

    @staticmethod
    def _num_parts(name: str) -> int:
        if ".qkv_proj." in name:
            return 3
        return 2 if ".gate_up_proj." in name else 1

    def _part(self, name: str, param: torch.Tensor, part: int) -> torch.Tensor:
        """The rows of a fused parameter that one Hugging Face tensor fills (all of the others)."""
        if ".qkv_proj." in name:
            attn: Attention = self.model.layers[0].self_attn  # type: ignore[assignment]  # submodules are Modules to mypy
            return param.split([attn.q_size, attn.kv_size, attn.kv_size])[part]
        if ".gate_up_proj." in name:
            return param.chunk(2)[part]
        return param

    # The dimension each tensor-parallel weight is split along (the others are whole on every rank).
    _VOCAB = ("model.embed_tokens.weight", "lm_head.weight")

    @staticmethod
    def row_parallel(module: str) -> bool:
        """Whether the linear layer named `module` ("model.layers.0.mlp.down_proj") holds a share
        of its input columns under tensor parallelism."""
        return LlamaForCausalLM._split_dim(f"{module}.weight") == 1

    @staticmethod
    def _split_dim(name: str) -> int | None:
        if ".qkv_proj." in name or ".gate_up_proj." in name:
            return 0  # column-parallel: output rows (weight and bias)
        if (".o_proj." in name or ".down_proj." in name) and name.endswith(".weight"):
            return 1  # row-parallel: input columns
        return None

    def _full_shape(self, name: str, dest: torch.Tensor) -> tuple[int, ...]:
        """The checkpoint's shape of the tensor whose shard `dest` is on this rank."""
        shape = list(dest.shape)
        if name in self._VOCAB:
            shape[0] = self.args.vocab_size
        elif (dim := self._split_dim(name)) is not None:
            shape[dim] *= self.tp.size
        return tuple(shape)

    def _copy_shard(self, name: str, dest: torch.Tensor, tensor: torch.Tensor) -> None:
        """Copy this rank's share of the checkpoint's `tensor` into `dest`."""
        tp = self.tp
        if not tp.active:
            dest.copy_(tensor)
        elif name in self._VOCAB:
            first, end = tp.vocab_rows(self.args.vocab_size)
            dest.zero_()  # the last rank's padding rows: zero logits, never looked up
            dest[: end - first].copy_(tensor[first:end])
        elif (dim := self._split_dim(name)) is not None:
            dest.copy_(tp.shard(tensor, dim))
        elif (".o_proj." in name or ".down_proj." in name) and tp.rank != 0:
            dest.zero_()  # a row-parallel bias: added once to the sum, by rank 0
        else:
            dest.copy_(tensor)
