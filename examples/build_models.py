"""Write the ONNX models of naiad's bundled example repository with ``onnx.helper``.

Every builder takes the destination path and writes one self-contained ``.onnx`` file
(opset 17, IR version 8, so any onnxruntime >= 1.14 loads it). Nothing here needs torch
or transformers: the MiniLM encoder is assembled op by op from its safetensors weights.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
INT32 = TensorProto.INT32
INT64 = TensorProto.INT64
FLOAT = TensorProto.FLOAT
STRING = TensorProto.STRING

#: Every ONNX element type that :func:`identity` is tested with (Triton's TYPE_* all map onto these).
IDENTITY_TYPES: tuple[int, ...] = (
    TensorProto.BOOL,
    TensorProto.INT8,
    TensorProto.INT16,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.UINT8,
    TensorProto.UINT16,
    TensorProto.UINT32,
    TensorProto.UINT64,
    TensorProto.FLOAT16,
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.BFLOAT16,
    TensorProto.STRING,
)

Dim = int | str


# --------------------------------------------------------------------------- helpers


def _dims(dims: Sequence[int], batched: bool = True) -> list[Dim]:
    """Turn Triton-style dims (``-1`` = variable) into ONNX dims, with a leading ``batch`` dim."""
    onnx_dims: list[Dim] = [f"d{i}" if d < 0 else d for i, d in enumerate(dims)]
    return (["batch"] if batched else []) + onnx_dims


def _finish(graph: onnx.GraphProto, path: str | os.PathLike[str]) -> Path:
    """Wrap ``graph`` in a model, check it and write it atomically to ``path``."""
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="naiad-examples",
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model)
    return save_atomic(model, path)


def save_atomic(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Serialize ``model`` to ``path`` via a temporary file, so readers never see half a file."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(model.SerializeToString())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


# --------------------------------------------------------------------------- toy models


def add_sub(
    path: str | os.PathLike[str],
    swap: bool = False,
    dtype: int = INT32,
    dims: Sequence[int] = (16,),
) -> Path:
    """Triton's ``simple`` model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.

    ``swap=True`` exchanges the two outputs (the example repository serves it as version 2,
    so a client can tell the versions apart). The batch dimension is dynamic.
    """
    shape = _dims(dims)
    inputs = [helper.make_tensor_value_info(n, dtype, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, dtype, shape) for n in ("OUTPUT0", "OUTPUT1")]
    add_out, sub_out = ("OUTPUT1", "OUTPUT0") if swap else ("OUTPUT0", "OUTPUT1")
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], [add_out], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], [sub_out], name="sub"),
    ]
    name = "add_sub_swapped" if swap else "add_sub"
    return _finish(helper.make_graph(nodes, name, inputs, outputs), path)


def string_add_sub(path: str | os.PathLike[str], dims: Sequence[int] = (16,)) -> Path:
    """Triton's ``simple_string``: like :func:`add_sub` on decimal integers held as strings.

    The inputs are parsed with ``Cast(string -> int32)``, added and subtracted, and the results
    are formatted back with ``Cast(int32 -> string)``.
    """
    shape = _dims(dims)
    inputs = [helper.make_tensor_value_info(n, STRING, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, STRING, shape) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["in0_i32"], to=INT32),
        helper.make_node("Cast", ["INPUT1"], ["in1_i32"], to=INT32),
        helper.make_node("Add", ["in0_i32", "in1_i32"], ["sum_i32"]),
        helper.make_node("Sub", ["in0_i32", "in1_i32"], ["diff_i32"]),
        helper.make_node("Cast", ["sum_i32"], ["OUTPUT0"], to=STRING),
        helper.make_node("Cast", ["diff_i32"], ["OUTPUT1"], to=STRING),
    ]
    return _finish(helper.make_graph(nodes, "string_add_sub", inputs, outputs), path)


def identity(path: str | os.PathLike[str], onnx_elem_type: int, batched: bool = True) -> Path:
    """INPUT0 -> OUTPUT0 unchanged, shape ``[batch, n]`` (``batched``) or ``[n]``, any element type."""
    shape: list[Dim] = ["batch", "n"] if batched else ["n"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        f"identity_{TensorProto.DataType.Name(onnx_elem_type).lower()}",
        [helper.make_tensor_value_info("INPUT0", onnx_elem_type, shape)],
        [helper.make_tensor_value_info("OUTPUT0", onnx_elem_type, shape)],
    )
    return _finish(graph, path)


# --------------------------------------------------------------------------- MiniLM encoder


@dataclass(frozen=True)
class BertConfig:
    """The few BERT hyper-parameters the graph needs (read from HF ``config.json``)."""

    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> BertConfig:
        """Load the fields above from a Hugging Face ``config.json``."""
        raw = json.loads(Path(path).read_text())
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only exact (erf) GELU is supported, got {raw['hidden_act']!r}")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(**{f: raw[f] for f in cls.__dataclass_fields__ if f in raw})

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads


class _GraphBuilder:
    """Accumulates nodes and initializers; hands out unique tensor names."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._const_names: set[str] = set()
        self._counter = 0

    def fresh(self, hint: str) -> str:
        """A new unique tensor name."""
        self._counter += 1
        return f"{hint}_{self._counter}"

    def const(self, name: str, value: np.ndarray) -> str:
        """Add an initializer (once per name; later calls reuse it) and return its name."""
        if name not in self._const_names:
            self._const_names.add(name)
            self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, key: str, transpose: bool = False) -> str:
        """Add the safetensors tensor ``key`` (optionally transposed) as an initializer."""
        value = self.weights[key].astype(np.float32)
        return self.const(key + (".T" if transpose else ""), value.T if transpose else value)

    def op(self, op_type: str, inputs: Sequence[str], out: str | None = None, **attrs: object) -> str:
        """Append one node with a single output and return the output name."""
        out = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def linear(self, x: str, prefix: str) -> str:
        """``x @ W.T + b`` for a torch ``nn.Linear`` stored under ``prefix``."""
        y = self.op("MatMul", [x, self.weight(f"{prefix}.weight", transpose=True)])
        return self.op("Add", [y, self.weight(f"{prefix}.bias")])

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        """LayerNormalization over the last axis (an opset-17 op)."""
        scale, bias = self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias")
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=eps)


def _embeddings(g: _GraphBuilder, cfg: BertConfig) -> str:
    """word + position + token-type embeddings, then LayerNorm."""
    words = g.op("Gather", [g.weight("embeddings.word_embeddings.weight"), "input_ids"])
    types = g.op("Gather", [g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"])
    # Slice the first seq rows of the position table (equivalent to gathering arange(seq)).
    seq_len = g.op("Shape", ["input_ids"], out="seq_len", start=1, end=2)
    zero = g.const("zero_1d_i64", np.array([0], np.int64))
    pos_table = g.weight("embeddings.position_embeddings.weight")
    pos = g.op("Slice", [pos_table, zero, seq_len, zero])
    summed = g.op("Add", [g.op("Add", [words, types]), pos])
    return g.layer_norm(summed, "embeddings.LayerNorm", cfg.layer_norm_eps)


def _attention_bias(g: _GraphBuilder) -> str:
    """``(1 - mask) * -10000`` shaped ``[batch, 1, 1, seq]``, added to the attention scores."""
    mask = g.op("Cast", ["attention_mask"], out="mask_f32", to=FLOAT)
    inverted = g.op("Sub", [g.const("one_f32", np.array(1.0, np.float32)), mask])
    bias = g.op("Mul", [inverted, g.const("mask_neg", np.array(-10000.0, np.float32))])
    return g.op("Unsqueeze", [bias, g.const("axes_1_2", np.array([1, 2], np.int64))], out="attn_bias")


def _split_heads(g: _GraphBuilder, x: str, cfg: BertConfig) -> str:
    """``[b, s, h*d] -> [b, h, s, d]``."""
    shape = g.const("heads_shape", np.array([0, 0, cfg.num_attention_heads, cfg.head_dim], np.int64))
    return g.op("Transpose", [g.op("Reshape", [x, shape])], perm=[0, 2, 1, 3])


def _self_attention(g: _GraphBuilder, x: str, bias: str, prefix: str, cfg: BertConfig) -> str:
    """Multi-head scaled-dot-product self-attention (before the output projection)."""
    q = _split_heads(g, g.linear(x, f"{prefix}.query"), cfg)
    k = _split_heads(g, g.linear(x, f"{prefix}.key"), cfg)
    v = _split_heads(g, g.linear(x, f"{prefix}.value"), cfg)
    k_t = g.op("Transpose", [k], perm=[0, 1, 3, 2])
    scale = g.const("attn_scale", np.array(1.0 / math.sqrt(cfg.head_dim), np.float32))
    scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k_t]), scale]), bias])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    merged = g.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    shape = g.const("merge_shape", np.array([0, 0, cfg.hidden_size], np.int64))
    return g.op("Reshape", [merged, shape])


def _gelu(g: _GraphBuilder, x: str) -> str:
    """Exact GELU ``0.5 * x * (1 + erf(x / sqrt(2)))`` (the Gelu op only arrives in opset 20)."""
    inv_sqrt2 = g.const("inv_sqrt2", np.array(1.0 / math.sqrt(2.0), np.float32))
    erf = g.op("Erf", [g.op("Mul", [x, inv_sqrt2])])
    one_plus = g.op("Add", [erf, g.const("one_f32", np.array(1.0, np.float32))])
    half = g.const("half_f32", np.array(0.5, np.float32))
    return g.op("Mul", [g.op("Mul", [x, half]), one_plus])


def _encoder_layer(g: _GraphBuilder, x: str, bias: str, i: int, cfg: BertConfig) -> str:
    """One post-LN BERT block: attention + residual + LN, FFN + residual + LN."""
    p = f"encoder.layer.{i}"
    ctx = _self_attention(g, x, bias, f"{p}.attention.self", cfg)
    attn = g.op("Add", [g.linear(ctx, f"{p}.attention.output.dense"), x])
    attn = g.layer_norm(attn, f"{p}.attention.output.LayerNorm", cfg.layer_norm_eps)
    hidden = _gelu(g, g.linear(attn, f"{p}.intermediate.dense"))
    out = g.op("Add", [g.linear(hidden, f"{p}.output.dense"), attn])
    return g.layer_norm(out, f"{p}.output.LayerNorm", cfg.layer_norm_eps)


def _mean_pool_normalize(g: _GraphBuilder, hidden: str) -> str:
    """Mask-weighted mean over tokens, then L2 normalisation (sentence-transformers' pipeline)."""
    mask = g.op("Unsqueeze", ["mask_f32", g.const("axes_last", np.array([-1], np.int64))])
    axis1 = g.const("axis_1", np.array([1], np.int64))
    summed = g.op("ReduceSum", [g.op("Mul", [hidden, mask]), axis1], keepdims=0)
    count = g.op("ReduceSum", [mask, axis1], keepdims=0)
    count = g.op("Max", [count, g.const("count_eps", np.array(1e-9, np.float32))])
    mean = g.op("Div", [summed, count])
    norm = g.op("ReduceL2", [mean], axes=[-1], keepdims=1)
    norm = g.op("Max", [norm, g.const("norm_eps", np.array(1e-12, np.float32))])
    return g.op("Div", [mean, norm], out="sentence_embedding")


def load_bert_weights(weights_dir: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], BertConfig]:
    """Read ``model.safetensors`` and ``config.json`` from a Hugging Face BERT checkpoint folder."""
    from safetensors.numpy import load_file

    wdir = Path(weights_dir)
    weights = load_file(str(wdir / "model.safetensors"))
    # Some exports prefix every key with "bert."; the graph uses the bare BertModel names.
    weights = {k.removeprefix("bert."): v for k, v in weights.items()}
    return weights, BertConfig.from_json(wdir / "config.json")


def minilm_encoder(
    path: str | os.PathLike[str], weights_dir: str | os.PathLike[str], pooling: bool = True
) -> Path:
    """The all-MiniLM-L6-v2 sentence encoder (any BERT checkpoint works) as one ONNX graph.

    Inputs ``input_ids``, ``attention_mask``, ``token_type_ids``: INT64 ``[batch, seq]``.
    Outputs ``last_hidden_state`` FP32 ``[batch, seq, hidden]`` and, with ``pooling``,
    ``sentence_embedding`` FP32 ``[batch, hidden]`` (masked mean pooling followed by L2
    normalisation). ``pooling=False`` is the encoder alone, for a pipeline that pools elsewhere.
    """
    weights, cfg = load_bert_weights(weights_dir)
    g = _GraphBuilder(weights)
    bias = _attention_bias(g)
    x = _embeddings(g, cfg)
    for i in range(cfg.num_hidden_layers):
        x = _encoder_layer(g, x, bias, i, cfg)
    g.op("Identity", [x], out="last_hidden_state")

    tokens = ["batch", "seq"]
    inputs = [
        helper.make_tensor_value_info(n, INT64, tokens)
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outputs = [helper.make_tensor_value_info("last_hidden_state", FLOAT, [*tokens, cfg.hidden_size])]
    if pooling:
        _mean_pool_normalize(g, "last_hidden_state")
        outputs.append(helper.make_tensor_value_info("sentence_embedding", FLOAT, ["batch", cfg.hidden_size]))
    graph = helper.make_graph(g.nodes, "minilm_encoder", inputs, outputs, initializer=g.initializers)
    return _finish(graph, path)
