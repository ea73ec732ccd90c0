"""Pipeline parallelism: the decoder layers in stages on different processes, micro-batches flowing through.

`pipeline_parallel_size` P splits the layers into P contiguous stages (`parallel.stage_layers`);
stage 0 also holds the embedding, the last stage the final norm and the LM head. Every stage is a
process per tensor-parallel rank (world `tp x P`, stage-major: rank 0, the engine, is stage 0's
first rank), and every rank receives the same `StepPlan` from rank 0 (`naiad.llm.distributed.workers`).

One step runs GPipe's forward: its rows split into up to P micro-batches (contiguous rows, about
the same number of tokens each, `split_plan`); each stage takes them in order — receive the
micro-batch's hidden states from the stage before (stage 0: embed its tokens), run its layers,
hand the result to the next stage with a non-blocking send and go straight on to the next
micro-batch. So stage s works on micro-batch m while stage s+1 works on m-1. Hidden states travel
as one `[2, tokens, hidden]` tensor (the layers' output and the residual stream, whose sum the
next layer's norm takes) by torch.distributed point-to-point, between the matching tensor-parallel
ranks of adjacent stages: gloo on the CPU, NCCL on CUDA — no pickling, and the receiver knows every
shape from the plan. The last stage sends the logits of each micro-batch's sampling rows (only
those) to rank 0, which samples: the sampler's state (seeded generators, penalties' histories,
logprobs) stays with the scheduler in the engine, and a step's logits are rows x vocab, small
next to the hidden states already moved.

Micro-batches keep rows whole and in order: a row's new tokens attend to its own earlier ones in
the same forward, and a stage writes micro-batch m's K/V to its layers before it runs m+1.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # the runner imports this module
    from naiad.llm.distributed.parallel import TensorParallel
    from naiad.llm.engine.model_runner import StepInputs, StepPlan
    from naiad.llm.layers.attention import KVCache
    from naiad.llm.models.llama import LlamaForCausalLM


def split_rows(num_tokens: list[int], count: int) -> list[range]:
    """The rows cut into `min(count, rows)` contiguous, non-empty runs of about equal tokens: each
    cut where the tokens before it come closest to its share of the step's."""
    rows = len(num_tokens)
    count = min(count, rows)
    prefix = list(itertools.accumulate(num_tokens, initial=0))
    bounds = [0]
    for cut in range(1, count):
        share = prefix[-1] * cut / count
        # After the previous cut, and early enough to leave a row for every later run.
        candidates = range(bounds[-1] + 1, rows - (count - cut) + 1)
        bounds.append(min(candidates, key=lambda end: abs(prefix[end] - share)))
    bounds.append(rows)
    return [range(start, end) for start, end in itertools.pairwise(bounds)]


def split_plan(plan: StepPlan, count: int) -> list[StepPlan]:
    """One step's plan as up to `count` micro-batch plans (their logits rows in the step's order)."""
    runs = split_rows(plan.num_tokens, count)
    if len(runs) == 1:
        return [plan]
    starts = [0]
    for n in plan.num_tokens:
        starts.append(starts[-1] + n)
    plans = []
    for rows in runs:
        first, end = starts[rows.start], starts[rows.stop]
        plans.append(dataclasses.replace(
            plan,
            token_ids=plan.token_ids[first:end],
            positions=plan.positions[first:end],
            num_tokens=plan.num_tokens[rows.start:rows.stop],
            context_lens=plan.context_lens[rows.start:rows.stop],
            block_tables=plan.block_tables[rows.start:rows.stop],
            logits_indices=[i - first for i in plan.logits_indices if first <= i < end],
        ))
    return plans


class PipelineStage:
    """This rank's stage of the model: runs each step's micro-batches through its layers and
    passes the hidden states on (made by the runner, with what a stage needs of it)."""

    def __init__(self, model: LlamaForCausalLM, tp: TensorParallel, kv_caches: list[KVCache],
                 inputs: Callable[[StepPlan], StepInputs], micro_batches: int | None) -> None:
        self.model, self.tp, self.kv_caches, self.inputs = model, tp, kv_caches, inputs
        self.stage = tp.pipeline
        self.micro_batches = micro_batches or self.stage.size
        self.hidden_size, self.vocab_size = model.args.hidden_size, model.args.vocab_size
        self.dtype, self.device = model.dtype, kv_caches[0][0].device

    def forward(self, plan: StepPlan) -> torch.Tensor | None:
        """This rank's stage of one step; the step's logits on rank 0 (None elsewhere)."""
        tp, stage, model = self.tp, self.stage, self.model
        batches = split_plan(plan, self.micro_batches)
        previous = stage.rank_of(stage.stage - 1, tp.rank)
        following = stage.rank_of(stage.stage + 1, tp.rank)
        sending: list[tuple[dist.Work, torch.Tensor]] = []  # kept until done: the sends read them
        for batch in batches:
            inputs = self.inputs(batch)
            residual: torch.Tensor | None = None
            if stage.first:
                x = model.model.embed(inputs.token_ids)
            else:
                received = torch.empty((2, len(batch.token_ids), self.hidden_size), dtype=self.dtype,
                                       device=self.device)
                dist.recv(received, src=previous)
                x, residual = received[0], received[1]
            x, residual = model.model.run_layers(x, residual, inputs.positions, inputs.meta, self.kv_caches)
            if not stage.last:
                out = torch.stack((x, residual))
                sending.append((_isend(out, following), out))
            elif batch.logits_indices:  # the same on every rank of the stage: all run the gather, or none
                logits = model.compute_logits(x, residual, inputs.logits_indices)
                if logits is not None:  # the stage's first rank: the gathered logits go to rank 0
                    logits = logits.to(self.dtype).contiguous()  # the dtype rank 0 receives into
                    sending.append((_isend(logits, 0), logits))
        result = self._receive_logits(batches) if stage.first and tp.rank == 0 else None
        for work, _ in sending:
            work.wait()
        return result

    def _receive_logits(self, batches: list[StepPlan]) -> torch.Tensor:
        """Rank 0: each micro-batch's logits from the last stage, in order, as the step's."""
        source = self.stage.rank_of(self.stage.size - 1, 0)
        parts = []
        for batch in batches:
            if batch.logits_indices:
                part = torch.empty((len(batch.logits_indices), self.vocab_size), dtype=self.dtype,
                                   device=self.device)
                dist.recv(part, src=source)
                parts.append(part)
        if not parts:
            return torch.empty((0, self.vocab_size), dtype=self.dtype, device=self.device)
        return torch.cat(parts)


def _isend(tensor: torch.Tensor, dst: int) -> dist.Work:
    work = dist.isend(tensor, dst=dst)
    assert work is not None, "a point-to-point send within the group"
    return work
