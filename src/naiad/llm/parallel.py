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
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

if TYPE_CHECKING:  # the model imports this module
    from naiad.llm.models.llama import LlamaArgs

#: How long a collective may wait for the other ranks: they run the same step, so only a hung
#: or dead peer makes one wait long (a dead one usually fails the collective at once on gloo).
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """This process's place in the tensor-parallel group: rank `rank` of `size`."""

    rank: int = 0
    size: int = 1

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
            dist.all_reduce(x)
        return x

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
        """The full logits on rank 0 (None elsewhere) from every rank's vocabulary columns."""
        if not self.active:
            return logits
        logits = logits.contiguous()
        parts = [torch.empty_like(logits) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(logits, parts, dst=0)
        if parts is None:
            return None
        return torch.cat(parts, dim=-1)[..., :vocab_size]

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest of the ranks' `value`s (the KV block count all ranks can hold)."""
        if not self.active:
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


def check_devices(device: str, size: int) -> None:
    """Raise ValueError when a CUDA group would need GPUs that torch does not see."""
    parsed = torch.device(device)
    if parsed.type == "cuda":
        last = (parsed.index or 0) + size - 1
        if last >= torch.cuda.device_count():
            raise ValueError(
                f"tensor_parallel_size {size} on {device} needs GPUs up to cuda:{last}, "
                f"and torch sees {torch.cuda.device_count()}"
            )


def check_no_group() -> None:
    """Raise RuntimeError if this process is in a group already (one per process)."""
    if dist.is_initialized():
        raise RuntimeError(
            "this process already runs a tensor-parallel engine (one torch.distributed group per process): "
            "run each engine core in its own process (the llm backend's engine_process: true, the default)"
        )


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_group(rank: int, size: int, port: int, device: torch.device) -> TensorParallel:
    """Join the group (blocks until every rank has): gloo on the CPU, NCCL on CUDA."""
    check_no_group()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT
    )
    return TensorParallel(rank, size)


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
