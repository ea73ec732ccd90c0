"""`decode_layers` and `decode_head` (decoder.c): a decode step's decoder layers in one C call, and
a greedy step's final norm, LM head and argmax in another, from Python.

The structures mirror decoder.c's; `Linear`, `DecoderLayer` and `DecodeShape` are filled once
per model (weights' addresses do not move once loaded) by naiad.llm.models.fused_decode, which
decides when a step may take this path.
"""

from __future__ import annotations

import ctypes

import torch

from naiad.llm.kernels import _DTYPES, _check, _lib, check_bf16_weights, q8_columns, vnni_wanted

#: decoder.c's linear kinds
LINEAR_Q8, LINEAR_BF16 = 0, 1


class Linear(ctypes.Structure):
    """One linear layer: 8-bit as q8_linear takes it, or bf16 panels as bf16_linear takes them."""

    _fields_ = [
        ("packed", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("columns", ctypes.c_void_p),
        ("column_weights", ctypes.c_void_p),
        ("ncols", ctypes.c_int64),
        ("in_features", ctypes.c_int64),
        ("in_pad", ctypes.c_int64),
        ("out_features", ctypes.c_int64),
        ("scale_kind", ctypes.c_int64),
        ("kind", ctypes.c_int64),
    ]


class DecoderLayer(ctypes.Structure):
    """One decoder layer: its norms' weights, this layer's KV cache and its four linears."""

    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
        ("qkv", Linear),
        ("o", Linear),
        ("gate_up", Linear),
        ("down", Linear),
    ]


class DecodeShape(ctypes.Structure):
    _fields_ = [
        ("rows", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("inter", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("max_blocks", ctypes.c_int64),
        ("window", ctypes.c_int64),
        ("threads", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("dtype", ctypes.c_int),
        ("vnni", ctypes.c_int),
    ]


def q8_layer(
    packed: torch.Tensor,
    scales: torch.Tensor,
    scale_kind: int,
    bias: torch.Tensor | None,
    in_features: int,
    out_features: int,
    columns: torch.Tensor | None,
    column_weights: torch.Tensor | None,
) -> Linear:
    """A linear's q8_linear arguments, checked as kernels.q8_linear checks them; kept across calls,
    so the tensors must also be contiguous and the bias float32 here."""
    ncols, columns_at, column_weights_at = q8_columns(packed, scales, columns, column_weights)
    if bias is not None and bias.dtype != torch.float32:
        raise ValueError("q8_linear's bias is float32")
    for tensor in (packed, scales, bias, columns, column_weights):
        if tensor is not None and not tensor.is_contiguous():
            raise ValueError("q8_linear's weights must be contiguous")
    return Linear(packed.data_ptr(), scales.data_ptr(), None if bias is None else bias.data_ptr(), columns_at,
                  column_weights_at, ncols, in_features, packed.shape[1] * 4, out_features, scale_kind, LINEAR_Q8)


def bf16_layer(panels: torch.Tensor, bias: torch.Tensor | None, in_features: int, out_features: int) -> Linear:
    """A linear's bf16_linear arguments (see kernels.bf16_linear), kept across calls."""
    check_bf16_weights(panels, bias, in_features, out_features)
    return Linear(panels.data_ptr(), None, None if bias is None else bias.data_ptr(), None, None, 0, in_features,
                  panels.shape[1] * 2, out_features, 0, LINEAR_BF16)


def decode_layers(
    shape: DecodeShape,
    layers: ctypes.Array[DecoderLayer],
    x: torch.Tensor,
    residual: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer of `layers` over `x + residual` (`x` alone when `residual` is None), one token
    per row; returns (the last MLP's output, the residual stream before it), as the layers one by
    one would. `shape.rows` and `shape.max_blocks` are set here; cos / sin `[rows, head_dim]`."""
    rows = x.shape[0]
    out = x.clone(memory_format=torch.contiguous_format)  # written in place by the layers
    stream = torch.empty_like(out) if residual is None else residual.clone(memory_format=torch.contiguous_format)
    tables, lens, slot_ids = _int64(block_tables), _int64(context_lens), _int64(slots)
    cos, sin = cos.reshape(rows, -1).contiguous(), sin.reshape(rows, -1).contiguous()
    _set_call(shape, rows, x.dtype, tables)
    status = _lib().decode_layers(ctypes.byref(shape), layers, len(layers), out.data_ptr(), stream.data_ptr(),
                                  int(residual is None), cos.data_ptr(), sin.data_ptr(), slot_ids.data_ptr(),
                                  tables.data_ptr(), lens.data_ptr())
    _raise_for(status, "decode_layers")
    return out, stream


class DecodeTokens(ctypes.Structure):
    """A decode step's rows as token ids and positions, with the tables decode_tokens reads them in."""

    _fields_ = [
        ("tokens", ctypes.c_void_p),
        ("embedding", ctypes.c_void_p),
        ("vocab", ctypes.c_int64),
        ("positions", ctypes.c_void_p),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("table_len", ctypes.c_int64),
    ]


def decode_tokens(
    shape: DecodeShape,
    layers: ctypes.Array[DecoderLayer],
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    embedding: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`decode_layers` from int64 token ids and positions: each row's embedding (`embedding`
    `[vocab, hidden]`) and its position's rows of the rotary tables (cos, sin `[positions,
    head_dim]`) are looked up in C. None when a position lies past the tables (grow them and call
    again); `embedding` and the tables must be contiguous and in the layers' dtype."""
    token_ids, positions, slots = _int64(token_ids), _int64(positions), _int64(slots)
    tables, context_lens = _int64(block_tables), _int64(context_lens)
    rows = token_ids.shape[0]
    x = torch.empty((rows, embedding.shape[1]), dtype=embedding.dtype)
    stream = torch.empty_like(x)
    cos, sin = rotary
    _set_call(shape, rows, embedding.dtype, tables)
    inputs = DecodeTokens(token_ids.data_ptr(), embedding.data_ptr(), embedding.shape[0], positions.data_ptr(),
                          cos.data_ptr(), sin.data_ptr(), cos.shape[0])
    status = _lib().decode_tokens(ctypes.byref(shape), layers, len(layers), ctypes.byref(inputs), x.data_ptr(),
                                  stream.data_ptr(), slots.data_ptr(), tables.data_ptr(), context_lens.data_ptr())
    if status == -4:
        return None
    if status == -5:
        raise ValueError("a token id outside the embedding")
    _raise_for(status, "decode_tokens")
    return x, stream


def decode_head(
    shape: DecodeShape, norm: torch.Tensor, head: Linear, x: torch.Tensor, residual: torch.Tensor, vocab: int
) -> torch.Tensor:
    """Each row's greedy token (int64 `[rows]`) from the last layer's output `x + residual`: the
    final norm (weight `norm`), the LM head `head`, and the first largest of each row's first
    `vocab` logits, as the layer-by-layer forward and torch's max would give it."""
    rows = x.shape[0]
    x, residual = x.contiguous(), residual.contiguous()
    logits = torch.empty((rows, head.out_features), dtype=x.dtype)
    tokens = torch.empty(rows, dtype=torch.int64)
    _set_call(shape, rows, x.dtype)
    status = _lib().decode_head(ctypes.byref(shape), norm.data_ptr(), ctypes.byref(head), x.data_ptr(),
                                residual.data_ptr(), logits.data_ptr(), vocab, tokens.data_ptr())
    _raise_for(status, "decode_head")
    return tokens


def _set_call(shape: DecodeShape, rows: int, dtype: torch.dtype, block_tables: torch.Tensor | None = None) -> None:
    """The per-call part of `shape`: the rows, the threads and the activations' dtype (and the
    block tables' width, for the calls that run attention)."""
    shape.rows, shape.threads, shape.dtype = rows, torch.get_num_threads(), _DTYPES[dtype]
    shape.vnni = int(vnni_wanted())
    if block_tables is not None:
        shape.max_blocks = block_tables.shape[1] if block_tables.dim() == 2 else 0


def _raise_for(status: int, what: str) -> None:
    if status == -3:
        raise RuntimeError(f"{what} was given bf16 weights where bf16_linear does not run")
    _check(status, what)


def _int64(t: torch.Tensor) -> torch.Tensor:
    """`t` as the contiguous int64 array C reads (itself when it is one already: the usual case)."""
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()
