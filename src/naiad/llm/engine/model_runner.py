"""The engine's torch side: the model, the KV cache tensors, and one step's execution.

`execute(scheduler_output)` turns the scheduler's rows into a flattened batch, runs the
model and samples a token for every row that reaches its sequence's end. The block tables
and the computed-token counts it reads are the scheduler's: the runner keeps no per-sequence
state besides the generators of seeded requests.

Under tensor parallelism every rank has a runner over its shard of the model and its own KV
cache (its kv heads, the same block count on every rank). Rank 0's runner turns each step into
a `StepPlan`, hands it to `send_step` (the workers' channel, `naiad.llm.distributed.workers`) with its block
tables as changes since the last step (`naiad.llm.distributed.step_sync`) and runs the same forward; the
workers' runners run `forward_plan` on the plan rebuilt from what they receive. Only rank 0 samples.
Under pipeline parallelism each stage's runner holds its layers and their KV cache, and
`forward_plan` runs the stage's share of the step in micro-batches (`naiad.llm.distributed.pipeline`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from naiad.llm.distributed.parallel import TensorParallel
from naiad.llm.distributed.pipeline import PipelineStage
from naiad.llm.distributed.step_sync import TableSender, WireStep
from naiad.llm.engine.block_manager import num_blocks_for
from naiad.llm.engine.cuda_graphs import DecodeGraphs
from naiad.llm.engine.guided import MaskFiller
from naiad.llm.engine.scheduler import SchedulerOutput
from naiad.llm.engine.sequence import Sequence, TokenLogprobs
from naiad.llm.kernels import triton_attention
from naiad.llm.layers import huge_pages
from naiad.llm.layers.attention import AttentionMetadata, allocate_kv_caches
from naiad.llm.layers.calibration import calibration_tokens, input_rms, outlier_columns
from naiad.llm.layers.cpu_linear import can_prepack, prepack_linears
from naiad.llm.layers.quantization import quantize_linears, weight_bytes
from naiad.llm.layers.sampler import SamplingBatch, logprobs, sample
from naiad.llm.loading.loader import load_model, resolve_quantization
from naiad.llm.models.fused_decode import FusedDecode, FusedHead

#: What `execute` returns for rows that sample nothing (prefill chunks with more to come).
NO_TOKEN = -1


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """The model to load and the memory its KV cache may take: `kv_cache_memory` bytes, else
    `kv_cache_fraction` of the free memory (see `kv_cache_budget`)."""

    model: str | Path
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    kv_cache_memory: int | None = None
    kv_cache_fraction: float | None = None
    #: on CUDA, replay decode steps of up to `max_num_seqs` rows from CUDA graphs unless this is set
    enforce_eager: bool = False
    max_num_seqs: int = 256
    #: "int8": INT8 linears quantized at load; "gguf": a GGUF file's Q8_0 / Q4 blocks kept (quantization.py);
    #: "auto": "gguf" for a GGUF file where its kernel is fast, else "none" (loader.resolve_quantization)
    quantization: str = "none"
    #: under pipeline parallelism, at most this many micro-batches a step (None: one per stage;
    #: 1 turns micro-batching off, to measure what it brings)
    pipeline_micro_batches: int | None = None


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step's inputs as plain lists: what rank 0 sends every tensor-parallel worker."""

    token_ids: list[int]
    positions: list[int]
    num_tokens: list[int]  # new tokens of each row
    context_lens: list[int]
    block_tables: list[list[int]]
    logits_indices: list[int]


@dataclass(slots=True)
class StepInputs:
    """One step as tensors: the flattened tokens, their positions, and what attention needs."""

    token_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [sampling rows]: the last token of each row that samples


#: The share of free memory the KV cache takes by default: a GPU is the engine's own; the
#: host's memory is shared with the server and everything else on the machine.
DEFAULT_KV_FRACTION = {"cuda": 0.9, "cpu": 0.1}


def kv_cache_budget(config: RunnerConfig, device: torch.device) -> int:
    """The KV cache's bytes: `kv_cache_memory`, else a fraction of the memory free now (after the
    model was loaded, so the weights are not counted twice)."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    fraction = config.kv_cache_fraction
    if fraction is None:
        fraction = DEFAULT_KV_FRACTION.get(device.type, 0.1)
    if not 0 < fraction <= 1:
        raise ValueError(f"kv_cache_fraction must be in (0, 1], got {fraction}")
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_host_memory()
    return int(free * fraction)


def available_host_memory() -> int:
    """MemAvailable from /proc/meminfo (what can be had without swapping), else physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def release_freed_heap() -> None:
    """Hand the heap memory that loading freed (the checkpoint's tensors, the weights before
    packing) back to the system: glibc keeps freed heap memory for later allocations, 137 MiB of
    the 870 MiB the 123M model's engine process held after loading. Nothing to do elsewhere."""
    with contextlib.suppress(AttributeError, OSError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


class ModelRunner:
    """Owns torch: the model, `num_blocks` KV blocks per layer, and the sampler's generators."""

    def __init__(
        self,
        config: RunnerConfig,
        tp: TensorParallel | None = None,
        send_step: Callable[[WireStep], None] | None = None,
    ) -> None:
        self.config = config
        self.tp = tp = tp or TensorParallel.single()
        self.send_step = send_step  # rank 0 of a tensor-parallel group: sends each step to the workers
        self.tables = TableSender() if send_step is not None else None  # block tables as changes
        self.device = torch.device(config.device)
        #: the method in use: `config.quantization`, or what "auto" chose for this model and machine
        self.quantization = quantization = resolve_quantization(config.quantization, config.model, self.device, tp)
        self.model = load_model(config.model, config.dtype, self.device, tp, quantization)
        self.args = self.model.args
        self.dtype = self.model.dtype
        self.block_size = config.block_size
        packed = quantization != "none"  # the linears in a kernel's layout: the fused decode applies
        if packed:
            columns = None
            if quantization == "int8":
                # gloo exchanges CPU tensors, NCCL device ones
                device = self.device if self.device.type == "cuda" else torch.device("cpu")
                columns = outlier_columns(self._calibrate(), tp, self.model.row_parallel, device)
            quantize_linears(self.model, quantization, columns)
        elif can_prepack(self.dtype, self.device):
            prepack_linears(self.model)
            packed = True
        if self.device.type == "cpu":
            # Weights in their final layout onto huge pages (a step at one stream reads them all),
            # before the fused decode's table takes their addresses.
            huge_pages.place(self.model)
        if packed:
            self.model.model.fused_decode = FusedDecode.build(self.model.model)
            self.model.fused_head = FusedHead.build(self.model.model.fused_decode, self.model.model.norm,
                                                    self.model.lm_head, self.args.vocab_size)
        release_freed_heap()
        self.kv_cache_memory = kv_cache_budget(config, self.device)
        # This rank's kv heads of its stage's layers; every rank of every stage must have the same
        # blocks (the block tables are shared).
        num_kv_heads = self.args.num_kv_heads // tp.size
        num_layers = len(self.model.model.layers)
        self.num_blocks = tp.min_int(
            num_blocks_for(self.kv_cache_memory, config.block_size, num_layers, num_kv_heads,
                           self.args.head_dim, self.dtype.itemsize),
            self.device,
        )
        if self.num_blocks < 1:
            raise ValueError(f"the KV cache's {self.kv_cache_memory} bytes do not hold one KV block")
        # Not under tensor or pipeline parallelism: the workers would have to replay the same graphs.
        use_graphs = (self.device.type == "cuda" and not config.enforce_eager and not tp.active
                      and not tp.pipeline.active and triton_attention.triton is not None)
        # The graphs' padded rows need a block of their own, past those the block manager owns.
        self.kv_caches = allocate_kv_caches(
            num_layers,
            self.num_blocks + 1 if use_graphs else self.num_blocks,
            config.block_size,
            num_kv_heads,
            self.args.head_dim,
            self.dtype,
            self.device,
        )
        self._generators: dict[str, torch.Generator] = {}
        self.masks = MaskFiller(self.args.vocab_size)  # structured outputs' token masks
        # Under pipeline parallelism, this rank's stage runs the forward (micro-batches, sends).
        self.stage = (PipelineStage(self.model, tp, self.kv_caches, self.inputs, config.pipeline_micro_batches)
                      if tp.pipeline.active else None)
        self.graphs: DecodeGraphs | None = None
        if use_graphs:
            max_len = min(self.args.max_model_len, self.num_blocks * config.block_size)
            self.graphs = DecodeGraphs(self.model, self.kv_caches, config.max_num_seqs,
                                       -(-max_len // config.block_size), config.block_size, self.num_blocks,
                                       self.device)

    def kv_cache_bytes(self) -> int:
        """The KV cache's bytes over every rank: each layer's keys and values, all kv heads."""
        args = self.args
        return (self.num_blocks * 2 * self.config.block_size * args.num_layers * args.num_kv_heads
                * args.head_dim * self.dtype.itemsize)

    def _calibrate(self) -> dict[str, torch.Tensor]:
        """Each linear layer's input columns' root mean square over one prefill of the fixed
        calibration tokens, in a KV cache of its own (the int8 layers keep the largest in float16,
        calibration.outlier_columns). Every rank runs it at this point of its start, so the
        forward's collectives meet."""
        tokens = calibration_tokens(self.args.vocab_size)
        count, blocks = len(tokens), -(-len(tokens) // self.config.block_size)
        caches = allocate_kv_caches(len(self.model.model.layers), blocks, self.config.block_size,
                                    self.args.num_kv_heads // self.tp.size, self.args.head_dim, self.dtype, self.device)
        plan = StepPlan(tokens, list(range(count)), [count], [count], [list(range(blocks))], list(range(count)))
        if self.tp.pipeline.active:  # each stage its layers, the hidden states handed on as in a step
            stage = PipelineStage(self.model, self.tp, caches, self.inputs, self.config.pipeline_micro_batches)
            return input_rms(self.model, lambda: stage.forward(plan))
        inputs = self.inputs(plan)
        return input_rms(self.model, lambda: self.model(inputs.token_ids, inputs.positions, inputs.meta, caches,
                                                        inputs.logits_indices))

    def weight_bytes(self) -> int:
        """The bytes of the model's tensors in this process (a tied tensor once)."""
        return weight_bytes(self.model)

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> tuple[list[int], list[TokenLogprobs | None] | None]:
        """Run one scheduled step: one token per row (`NO_TOKEN` where `output.sample` is False),
        and, when some sampling row asks for logprobs, one entry per row (None for the others)."""
        for seq_id in output.finished_seq_ids:
            self._generators.pop(seq_id, None)
        if self.tables is not None:
            self.tables.finished(output.finished_seq_ids)
        if not output.seqs:
            return [], None
        sampling = [seq for seq, row_samples in zip(output.seqs, output.sample, strict=True) if row_samples]
        # Structured outputs: their masks are filled while the model runs.
        guided = [(row, seq.grammar) for row, seq in enumerate(sampling) if seq.grammar is not None]
        masks = self.masks.start(guided) if guided else None
        batch = self._sampling_batch(sampling)
        if masks is None and batch.argmax_only:
            greedy = self._greedy_step(output)
            if greedy is not None:
                return greedy, None
        logits = self._forward(output)
        if len(logits) > len(sampling):  # past the sampling rows: the prompt positions asked for
            self._record_prompt_logprobs(output, logits[len(sampling):])
            logits = logits[: len(sampling)]
        if masks is not None:
            rows, bits = masks.result()
            batch.allowed = (self._tensor(rows), torch.from_numpy(bits).to(self.device))
        sampled = sample(logits, batch)
        tokens = iter(sampled.tolist())
        token_ids = [next(tokens) if row_samples else NO_TOKEN for row_samples in output.sample]
        if batch.logprob_rows is None:
            return token_ids, None
        # The asking rows' logprobs, each cut to its own N, at their rows of the output.
        own, top_ids, top_logprobs = (t.tolist() for t in logprobs(logits, sampled, batch))
        asking = iter(zip(own, top_ids, top_logprobs, strict=True))
        per_row: list[TokenLogprobs | None] = []
        for seq, row_samples in zip(output.seqs, output.sample, strict=True):
            n = seq.sampling_params.logprobs
            if row_samples and n is not None:
                logprob, ids, values = next(asking)
                per_row.append((logprob, ids[:n], values[:n]))
            else:
                per_row.append(None)
        return token_ids, per_row

    def _greedy_step(self, output: SchedulerOutput) -> list[int] | None:
        """A decode step whose rows all sample their most likely token, through the model's fused
        layers and head: the tokens, without logits in Python; None where that path does not
        take the step (the caller then runs the forward and the sampler)."""
        if (self.model.fused_head is None or self.stage is not None or self.graphs is not None
                or self.send_step is not None or not all(output.sample)
                or any(n != 1 for n in output.num_tokens) or self.pool_positions(output)
                or self.prompt_positions(output)):
            return None
        inputs = self.inputs(self.plan(output))
        tokens = self.model.greedy_tokens(inputs.token_ids, inputs.positions, inputs.meta, self.kv_caches)
        return None if tokens is None else tokens.tolist()

    @staticmethod
    def prompt_positions(output: SchedulerOutput) -> list[tuple[int, Sequence, int]]:
        """(row, sequence, position) of each prompt token of this step whose logits give a
        prompt logprob its request asks for (position p's give token p + 1's), not yet recorded
        (a preempted sequence recomputes its prompt)."""
        wanted: list[tuple[int, Sequence, int]] = []
        for row, (seq, num_tokens) in enumerate(zip(output.seqs, output.num_tokens, strict=True)):
            if seq.prompt_logprobs is None:
                continue
            start = max(seq.num_computed_tokens, len(seq.prompt_logprobs) - 1)
            end = min(seq.num_computed_tokens + num_tokens, seq.num_prompt_tokens - 1)
            wanted.extend((row, seq, position) for position in range(start, end))
        return wanted

    def _record_prompt_logprobs(self, output: SchedulerOutput, logits: torch.Tensor) -> None:
        """Each asked prompt position's next token logprob and top alternatives, onto its sequence."""
        positions = self.prompt_positions(output)
        log_probs = logits.float().log_softmax(dim=-1)
        targets = torch.tensor([seq.token_ids[position + 1] for _, seq, position in positions], device=logits.device)
        own = log_probs.gather(1, targets[:, None])[:, 0].tolist()
        top = max(seq.sampling_params.prompt_logprobs or 0 for _, seq, _ in positions)
        top_logprobs, top_ids = (t.tolist() for t in log_probs.topk(top, dim=-1))
        for index, (_, seq, _) in enumerate(positions):
            n = seq.sampling_params.prompt_logprobs or 0
            assert seq.prompt_logprobs is not None
            seq.prompt_logprobs.append((own[index], top_ids[index][:n], top_logprobs[index][:n]))

    @staticmethod
    def pool_positions(output: SchedulerOutput) -> list[tuple[int, Sequence, int]]:
        """(row, sequence, position) of each prompt token of this step an embedding request pools:
        every one not pooled yet for "mean" (a preempted sequence recomputes its prompt), the
        last for "last"."""
        wanted: list[tuple[int, Sequence, int]] = []
        for row, (seq, num_tokens) in enumerate(zip(output.seqs, output.num_tokens, strict=True)):
            pooling = seq.sampling_params.pooling
            if pooling is None:
                continue
            end = seq.num_computed_tokens + num_tokens
            if pooling == "last":
                if end == seq.num_prompt_tokens:
                    wanted.append((row, seq, end - 1))
                continue
            start = max(seq.num_computed_tokens, seq.pooled[1] if seq.pooled is not None else 0)
            wanted.extend((row, seq, position) for position in range(start, end))
        return wanted

    def _forward_pooling(self, output: SchedulerOutput, pooled: list[tuple[int, Sequence, int]]) -> torch.Tensor:
        """The step's logits, and the final hidden states of the positions embedding requests
        pool, added to their sequences (the vector, L2-normalized, once a prompt is complete)."""
        if self.stage is not None:
            raise RuntimeError("embeddings are not served under pipeline parallelism")
        plan = self.plan(output)
        if self.send_step is not None and self.tables is not None:
            self.send_step(self.tables.wire(plan, [seq.seq_id for seq in output.seqs]))
        inputs = self.inputs(plan)
        hidden, residual = self.model.model(inputs.token_ids, inputs.positions, inputs.meta, self.kv_caches)
        logits = self.model.compute_logits(hidden, residual, inputs.logits_indices)
        assert logits is not None, "only rank 0 executes scheduler outputs"
        starts = [0]
        for count in output.num_tokens:
            starts.append(starts[-1] + count)
        flat = self._tensor([starts[row] + position - seq.num_computed_tokens for row, seq, position in pooled])
        assert self.model.model.norm is not None
        states, _ = self.model.model.norm.add_forward(hidden[flat], residual[flat])
        states = states.float()
        by_seq: dict[str, tuple[Sequence, int, list[int]]] = {}
        for index, (row, seq, _) in enumerate(pooled):
            by_seq.setdefault(seq.seq_id, (seq, row, []))[2].append(index)
        for seq, row, indices in by_seq.values():
            total = states[indices].sum(dim=0)
            count = len(indices)
            if seq.pooled is not None:
                previous, previous_count = seq.pooled
                assert isinstance(previous, torch.Tensor)
                total, count = total + previous, count + previous_count
            seq.pooled = (total, count)
            if seq.num_computed_tokens + output.num_tokens[row] == seq.num_prompt_tokens:
                vector = total / count
                seq.embedding = (vector / vector.norm().clamp_min(1e-12)).tolist()
        return logits

    def _forward(self, output: SchedulerOutput) -> torch.Tensor:
        """The logits of the rows that sample: from a CUDA graph for a plain decode step, else eagerly."""
        pooled = self.pool_positions(output)
        if pooled:
            return self._forward_pooling(output, pooled)
        if self.graphs is not None and all(n == 1 for n in output.num_tokens) and all(output.sample):
            computed = [seq.num_computed_tokens for seq in output.seqs]
            widths = [-(-(c + 1) // self.block_size) for c in computed]
            if self.graphs.fits(len(computed), max(widths)):
                return self.graphs.run(
                    [seq.token_ids[c] for seq, c in zip(output.seqs, computed, strict=True)],
                    computed,
                    [seq.block_table[:w] for seq, w in zip(output.seqs, widths, strict=True)],
                    [c + 1 for c in computed],
                )
        plan = self.plan(output)
        if self.send_step is not None and self.tables is not None:
            self.send_step(self.tables.wire(plan, [seq.seq_id for seq in output.seqs]))
        logits = self.forward_plan(plan)
        assert logits is not None, "only rank 0 executes scheduler outputs"
        return logits

    def forward_plan(self, plan: StepPlan) -> torch.Tensor | None:
        """The model's forward over one step (K/V written to the cache); logits on rank 0 only."""
        if self.stage is not None:
            return self.stage.forward(plan)
        inputs = self.inputs(plan)
        return self.model(inputs.token_ids, inputs.positions, inputs.meta, self.kv_caches, inputs.logits_indices)

    def prepare(self, output: SchedulerOutput) -> StepInputs:
        return self.inputs(self.plan(output))

    def inputs(self, plan: StepPlan) -> StepInputs:
        meta = AttentionMetadata.build(plan.num_tokens, plan.context_lens, plan.block_tables, self.block_size,
                                       self.device)
        return StepInputs(self._tensor(plan.token_ids), self._tensor(plan.positions), meta,
                          self._tensor(plan.logits_indices))

    def plan(self, output: SchedulerOutput) -> StepPlan:
        """Flatten the rows: row `i` brings tokens `[c, c + num_tokens[i])` of its sequence. The
        logits are those of each sampling row's last token, then of the prompt positions whose
        logprobs are asked for (`prompt_positions`)."""
        token_ids: list[int] = []
        positions: list[int] = []
        context_lens: list[int] = []
        logits_indices: list[int] = []
        row_starts: list[int] = []
        for seq, num_tokens, row_samples in zip(output.seqs, output.num_tokens, output.sample, strict=True):
            computed = seq.num_computed_tokens
            row_starts.append(len(token_ids))
            token_ids.extend(seq.token_ids[computed : computed + num_tokens])
            positions.extend(range(computed, computed + num_tokens))
            context_lens.append(computed + num_tokens)
            if row_samples:
                logits_indices.append(len(token_ids) - 1)
        # Then the prompt positions whose logprobs are asked for (execute splits them off).
        logits_indices.extend(row_starts[row] + position - seq.num_computed_tokens
                              for row, seq, position in self.prompt_positions(output))
        return StepPlan(token_ids, positions, list(output.num_tokens), context_lens,
                        [list(seq.block_table) for seq in output.seqs], logits_indices)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _sampling_batch(self, seqs: list[Sequence]) -> SamplingBatch:
        params = [seq.sampling_params for seq in seqs]
        generators = [self._generator(seq) for seq in seqs]
        # Penalties and min_tokens need the rows' tokens: gathered only when a row uses them.
        history = None
        if any(p.penalized for p in params):
            history = [(seq.prompt_token_ids, seq.output_token_ids) if seq.sampling_params.penalized else ([], [])
                       for seq in seqs]
        banned = None
        if any(p.min_tokens for p in params):
            banned = [seq.banned_token_ids for seq in seqs]
        return SamplingBatch.build(params, generators, self.args.vocab_size, self.device, history=history,
                                   banned=banned)

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        """A seeded request's own generator, made at its first draw and kept until it finishes."""
        seed = seq.sampling_params.seed
        if seed is None or seq.sampling_params.greedy:
            return None
        generator = self._generators.get(seq.seq_id)
        if generator is None:
            generator = self._generators[seq.seq_id] = torch.Generator(self.device).manual_seed(seed)
        return generator
