"""Tensor parallelism: which slice of every weight a rank holds, and the collectives that join them.

Megatron's split, as vLLM's ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding:

- column-parallel (`qkv_proj`, `gate_up_proj`): each rank holds a contiguous share of the output
  rows — of q, k and v separately (whole heads; with GQA, rank r's query heads use exactly
  rank r's kv heads), of gate and up separately — so its attention heads and MLP columns need
  nothing from the others;
- row-parallel (`o_proj`, `down_proj`): each rank holds the matching share of the input columns
  and produces a partial sum, which an all-reduce completes (the bias is added once, by rank 0);
- vocab-parallel embedding and LM head: each rank holds `ceil(vocab / size)` rows of the
  vocabulary (the last padded with zeros); a lookup is masked to the rank's rows and all-reduced,
  and the logits are gathered to rank 0, the only rank that samples.

The linears stay plain `nn.Linear` of the shard's shape (the collectives live in the model's
forward), so that the swaps after load (`cpu_linear.prepack_linears`, `quantization`) apply to
them unchanged. `TensorParallel.single()` is the one-process case: every collective is a no-op.
Collectives go through torch.distributed (gloo on the CPU, NCCL on CUDA): one process group per
process, so one tensor-parallel engine per process.

Under pipeline parallelism (`naiad.llm.distributed.pipeline`) the world is `tp x pp` ranks, stage-major (rank
`stage * tp + tp_rank`); each stage's ranks are one tensor-parallel group of their own
(`torch.distributed.new_group`), and `TensorParallel.pipeline` says which stage this process is.
The stage travels inside `TensorParallel` so that the loader, which builds the model from it,
builds only the stage's layers.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F

if TYPE_CHECKING:  # the model imports this module
    from naiad.llm.models.llama import LlamaArgs

#: How long a collective may wait for the other ranks: they run the same step, so only a hung
#: or dead peer makes one wait long (a dead one usually fails the collective at once on gloo).
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class PipelineParallel:
    """This process's pipeline stage: `stage` of `size`, each stage `tp_size` ranks wide."""

    stage: int = 0
    size: int = 1
    tp_size: int = 1

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def first(self) -> bool:
        """Stage 0 holds the embedding (and rank 0, the engine, which samples)."""
        return self.stage == 0

    @property
    def last(self) -> bool:
        """The last stage holds the final norm and the LM head."""
        return self.stage == self.size - 1

    def rank_of(self, stage: int, tp_rank: int) -> int:
        """The global rank of tensor-parallel rank `tp_rank` of `stage`."""
        return stage * self.tp_size + tp_rank

    def layers(self, num_layers: int) -> range:
        """The decoder layers this stage holds."""
        return stage_layers(num_layers, self.size)[self.stage]


def stage_layers(num_layers: int, size: int) -> list[range]:
    """`num_layers` split into `size` contiguous ranges as even as possible (the first stages take
    the one extra layer: the last one also runs the final norm and the LM head)."""
    check_stages(num_layers, size)
    base, extra = divmod(num_layers, size)
    ranges, start = [], 0
    for stage in range(size):
        end = start + base + (stage < extra)
        ranges.append(range(start, end))
        start = end
    return ranges


def check_stages(num_layers: int, size: int) -> None:
    """Raise ValueError when the model's layers cannot make `size` stages of at least one layer."""
    if size < 1:
        raise ValueError(f"pipeline_parallel_size must be at least 1, got {size}")
    if size > num_layers:
        raise ValueError(
            f"pipeline_parallel_size {size} exceeds the model's {num_layers} decoder layers: "
            f"every stage needs at least one layer (choose at most {num_layers})"
        )


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """This process's place in the tensor-parallel group: rank `rank` of `size`; under pipeline
    parallelism, of its stage's group (`group`, whose rank 0 is global rank `root`)."""

    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup; None: the whole world
    root: int = 0
    pipeline: PipelineParallel = PipelineParallel()

    @classmethod
    def single(cls) -> TensorParallel:
        return cls(0, 1)

    @property
    def active(self) -> bool:
        return self.size > 1

    # ------------------------------------------------------------------ weight slices

    def shard(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's contiguous share of `tensor` along `dim` (whose size `size` divides)."""
        if not self.active:
            return tensor
        length = tensor.shape[dim] // self.size
        return tensor.narrow(dim, self.rank * length, length)

    def vocab_rows(self, vocab_size: int) -> tuple[int, int]:
        """(first, end) of the vocabulary rows this rank holds; `end - first` may fall short of
        the shard's padded size on the last rank."""
        per_rank = -(-vocab_size // self.size)
        first = min(self.rank * per_rank, vocab_size)
        return first, min(first + per_rank, vocab_size)

    def padded_vocab(self, vocab_size: int) -> int:
        """Rows of a rank's embedding / LM head shard."""
        return -(-vocab_size // self.size)

    # ------------------------------------------------------------------ collectives

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of the ranks' partial results (row-parallel linears, the vocab-parallel lookup)."""
        if self.active:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` (the same shape on each; on the device the backend needs), concatenated
        along dim 0 in rank order."""
        if not self.active:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts)

    def embed(self, weight: torch.Tensor, token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """The embedding of `token_ids` from this rank's rows of it, completed by the others'."""
        if not self.active:
            return F.embedding(token_ids, weight)
        first, end = self.vocab_rows(vocab_size)
        outside = (token_ids < first) | (token_ids >= end)
        local = F.embedding((token_ids - first).masked_fill(outside, 0), weight)
        local.masked_fill_(outside[:, None], 0)
        return self.all_reduce(local)

    def gather_logits(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
        """The full logits on the group's rank 0 (None elsewhere) from every rank's vocabulary columns."""
        if not self.active:
            return logits
        logits = logits.contiguous()
        parts = [torch.empty_like(logits) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(logits, parts, dst=self.root, group=self.group)
        if parts is None:
            return None
        return torch.cat(parts, dim=-1)[..., :vocab_size]

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest of all ranks' `value`s, every stage's included (the KV block count all ranks
        can hold: the scheduler's block tables are the same on every rank)."""
        if not (self.active or self.pipeline.active):
            return value
        # gloo reduces CPU tensors, NCCL device tensors.
        tensor = torch.tensor([value], dtype=torch.long, device=device if device.type == "cuda" else "cpu")
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return int(tensor.item())


def check_shardable(args: LlamaArgs, size: int) -> None:
    """Raise ValueError, naming the numbers, when the model cannot be split `size` ways."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {size}")
    for what, count in (
        ("attention heads", args.num_heads),
        ("key/value heads", args.num_kv_heads),
        ("MLP columns (intermediate_size)", args.intermediate_size),
    ):
        if count % size:
            raise ValueError(
                f"tensor_parallel_size {size} does not divide the model's {count} {what}: "
                f"each rank must hold whole heads and an equal share (choose a divisor of {count})"
            )


def rank_device(device: str, rank: int) -> str:
    """Rank `rank`'s device: on CUDA, the GPU `rank` places after the engine's (cuda:0 → cuda:1...);
    the CPU is shared."""
    parsed = torch.device(device)
    if parsed.type != "cuda":
        return device
    return f"cuda:{(parsed.index or 0) + rank}"


def check_devices(device: str, size: int, what: str = "tensor_parallel_size") -> None:
    """Raise ValueError when a CUDA group would need GPUs that torch does not see."""
    parsed = torch.device(device)
    if parsed.type == "cuda":
        last = (parsed.index or 0) + size - 1
        if last >= torch.cuda.device_count():
            raise ValueError(
                f"{what} {size} on {device} needs GPUs up to cuda:{last}, "
                f"and torch sees {torch.cuda.device_count()}"
            )


def check_no_group() -> None:
    """Raise RuntimeError if this process is in a group already (one per process)."""
    if dist.is_initialized():
        raise RuntimeError(
            "this process already runs a tensor-parallel engine (one torch.distributed group per process): "
            "run each engine core in its own process (the llm backend's engine_process: true, the default)"
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, for the process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def init_group(
    rank: int, size: int, port: int, device: torch.device, tp_size: int | None = None, host: str = "127.0.0.1"
) -> TensorParallel:
    """Join the group of `size` ranks (blocks until every rank has): gloo on the CPU, NCCL on CUDA.
    They meet at rank 0's `host`:`port` (another address than loopback when ranks run on other
    nodes, `naiad.llm.distributed.nodes`).

    With `tp_size` < `size`, the ranks make `size // tp_size` pipeline stages of `tp_size` ranks,
    each stage its own tensor-parallel group."""
    check_no_group()
    tp_size = tp_size or size
    if size % tp_size:
        raise ValueError(f"{size} ranks do not make stages of {tp_size}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://{_url_host(host)}:{port}", rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT
    )
    stage, tp_rank = divmod(rank, tp_size)
    pipeline = PipelineParallel(stage, size // tp_size, tp_size)
    group = None
    if pipeline.active and tp_size > 1:
        # new_group must be called by every process for every group, in the same order.
        for other in range(pipeline.size):
            stage_group = dist.new_group([pipeline.rank_of(other, r) for r in range(tp_size)])
            if other == stage:
                group = stage_group
    return TensorParallel(tp_rank, tp_size, group, pipeline.rank_of(stage, 0), pipeline)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # an IPv6 address goes in brackets in a URL


def leave_process(status: int) -> NoReturn:
    """End a rank's process now, without tearing its group down or running library teardown: a
    failed rank so that its peers' collectives fail fast, a finished one because gloo's threads
    made a clean stop abort now and then in that teardown ("terminate called without an active
    exception", exit status 6, after every step had matched; CI, 2026-12-05). Nothing of a rank
    outlives its process; rank 0 leaves the group itself once its workers have exited."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
