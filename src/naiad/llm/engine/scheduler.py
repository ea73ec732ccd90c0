"""Iteration-level continuous batching: which sequences run in the next model step, and how far.

The engine's step is `schedule() → runner executes the output → update(output, tokens)`.
Nothing here imports torch: the runner's part is a list of sampled token ids.
"""

from __future__ import annotations

import heapq
import itertools
import time
from bisect import insort
from dataclasses import dataclass, field

from naiad.errors import AlreadyExists, InvalidArgument
from naiad.llm.engine.block_manager import BlockManager
from naiad.llm.engine.sequence import FinishReason, Sequence, SequenceStatus, TokenLogprobs


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits of one step, and of one sequence.

    `max_num_batched_tokens` is the token budget of a step (decode tokens plus prefill
    chunks); `max_num_seqs` caps the running batch; `max_model_len` is the context length,
    prompt and output together.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work: row `i` computes `num_tokens[i]` tokens of `seqs[i]`.

    Those are `seqs[i].token_ids[c : c + num_tokens[i]]` at positions `c, c+1, ...`, where
    `c` is the sequence's `num_computed_tokens` as scheduled; their KV goes to its
    `block_table`. `sample[i]` says whether the row reaches the sequence's last token, so
    the runner samples its next token; the other rows are prefill chunks with more to come.
    `preempted` lost their blocks this step; `finished_seq_ids` ended (or were aborted) since
    the previous step, so the runner can drop whatever it keeps for them.
    """

    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    sample: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    finished_seq_ids: list[str] = field(default_factory=list)

    @property
    def total_num_tokens(self) -> int:
        return sum(self.num_tokens)

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_tokens.append(num_tokens)
        # (an embedding request draws no token: it ends with its prompt)
        self.sample.append(num_tokens == seq.num_uncomputed_tokens and seq.sampling_params.pooling is None)


def _order(seq: Sequence) -> tuple[int, int]:
    # Lower priority values first (as vLLM), then first come, first served.
    return seq.priority, seq.arrival


class StepScheduler:
    """Continuous batching with a token budget, chunked prefill and preemption by recompute.

    Per-step contract:
    - `add(seq)` queues a request; it can join the batch at the next `schedule()`.
    - `schedule()` decides one model step. Running sequences go first, in (priority, arrival)
      order: one token each when decoding, the next chunk of the prompt otherwise. Then, if no
      sequence was preempted in this step, waiting ones are admitted in the same order while
      the budget, `max_num_seqs` and the KV blocks allow; admission stops at the first one
      whose blocks do not fit (no overtaking). A prompt longer than the budget left is
      admitted with a chunk and continues in the next steps. Prefix-cache hits count as
      computed, so a prefill only computes the rest (never less than its last token).
    - When a running sequence needs a block and none is free, the running sequence that
      comes last in (priority, arrival) order is preempted: its blocks are freed, it returns
      to the waiting queue under its original order (ahead of everything that arrived after
      it) and later recomputes its prompt and output so far, mostly from the prefix cache.
    - `update(output, sampled_token_ids, logprobs)` is called once per `schedule()`, after the
      runner executed it, with one token per row of the output (ignored for rows with
      `sample[i] == False`) and, when some row asked, one logprobs entry per row. It records
      the computed tokens, appends the sampled ones, and finishes sequences on an
      end-of-sequence or stop token, `max_tokens` or the context length, freeing their
      blocks at once; finished sequences leave the batch for the next step.
    - `abort(seq_id)` finishes a request wherever it is and frees its blocks at once; it is
      called between steps (the engine loop runs schedule, execute and update back to back).
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        kv_tokens = block_manager.num_blocks * block_manager.block_size
        if kv_tokens < config.max_model_len:
            # Otherwise a lone sequence could outgrow the cache and never be readmitted.
            raise ValueError(
                f"the KV cache holds {kv_tokens} tokens, fewer than max_model_len ({config.max_model_len}): "
                "give it more memory or lower max_model_len"
            )
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[tuple[int, int, Sequence]] = []  # a heap on (priority, arrival)
        self.running: list[Sequence] = []  # sorted by (priority, arrival)
        self.num_preemptions = 0
        self._seqs: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._finished_ids: list[str] = []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    def get(self, seq_id: str) -> Sequence | None:
        return self._seqs.get(seq_id)

    def add(self, seq: Sequence) -> None:
        """Queue a new request; raises InvalidArgument for a request that can never run."""
        if seq.seq_id in self._seqs:
            raise AlreadyExists(f"request '{seq.seq_id}' is already being generated")
        self._validate(seq)
        seq.arrival = next(self._arrivals)
        seq.status = SequenceStatus.WAITING
        self._seqs[seq.seq_id] = seq
        heapq.heappush(self.waiting, (seq.priority, seq.arrival, seq))

    def abort(self, seq_id: str) -> Sequence | None:
        """Finish a request with reason ABORT and free its blocks; None if it is not here."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            return None
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting = [entry for entry in self.waiting if entry[2] is not seq]
            heapq.heapify(self.waiting)
        self._finish(seq, FinishReason.ABORT)
        return seq

    def schedule(self) -> SchedulerOutput:
        """Choose the sequences of the next step and the number of tokens each computes."""
        output = SchedulerOutput(finished_seq_ids=self._finished_ids)
        self._finished_ids = []
        budget = self._schedule_running(output, self.config.max_num_batched_tokens)
        # Admitting right after a preemption would hand the freed blocks to a newcomer and
        # preempt again at the next step.
        if not output.preempted:
            self._schedule_waiting(output, budget)
        return output

    def update(
        self, output: SchedulerOutput, sampled_token_ids: list[int], logprobs: list[TokenLogprobs | None] | None = None
    ) -> list[Sequence]:
        """Apply the runner's results for `output`; return the sequences that finished.

        `logprobs` (None when no row asked) has one entry per row, for rows whose sequence
        keeps logprobs."""
        if len(sampled_token_ids) != len(output.seqs):
            raise ValueError(f"{len(sampled_token_ids)} sampled tokens for {len(output.seqs)} scheduled sequences")
        finished = []
        for row, (seq, num_tokens, token_id) in enumerate(
            zip(output.seqs, output.num_tokens, sampled_token_ids, strict=True)
        ):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted after it was scheduled
            self.block_manager.mark_computed(seq, num_tokens)
            if seq.num_uncomputed_tokens:
                continue  # a prefill chunk with more to come: nothing was sampled
            if seq.sampling_params.pooling is not None:  # an embedding: the runner pooled it
                self._finish(seq, FinishReason.STOP)
                finished.append(seq)
                continue
            seq.append_token(token_id, None if logprobs is None else logprobs[row])
            reason = seq.stop_reason(self.config.max_model_len)
            if reason is not None:
                self._finish(seq, reason)
                finished.append(seq)
        if finished:
            self.running = [seq for seq in self.running if seq.status is SequenceStatus.RUNNING]
        return finished

    # -- internals ---------------------------------------------------------------------------

    def _validate(self, seq: Sequence) -> None:
        limit = self.config.max_model_len
        if not seq.token_ids:
            raise InvalidArgument("the prompt is empty")
        if seq.sampling_params.pooling is not None:  # an embedding generates nothing: all the context is its
            if len(seq) > limit:
                raise InvalidArgument(f"the text has {len(seq)} tokens; the context length is {limit}")
            return
        if len(seq) >= limit:
            raise InvalidArgument(
                f"the prompt has {len(seq)} tokens; the context length is {limit}, leaving no room to generate"
            )
        if seq.max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be at least 1, got {seq.max_tokens}")

    def _schedule_running(self, output: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if not self._reserve(seq, output):
                break  # it preempted itself, so it was the last one
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            output.add(seq, num_tokens)
            budget -= num_tokens
            i += 1
        return budget

    def _reserve(self, seq: Sequence, output: SchedulerOutput) -> bool:
        """Make room for `seq`'s next tokens, preempting from the end of the running list."""
        while not self.block_manager.can_append(seq):
            # The tail has not been scheduled in this step yet: the loop runs front to back.
            victim = self.running.pop()
            self._preempt(victim)
            output.preempted.append(victim)
            if victim is seq:
                return False
        self.block_manager.may_append(seq)
        return True

    def _schedule_waiting(self, output: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0][2]
            if not self.block_manager.can_allocate(seq):
                break
            heapq.heappop(self.waiting)
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            if not seq.first_scheduled:
                seq.first_scheduled = time.monotonic()
            insort(self.running, seq, key=_order)
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            output.add(seq, num_tokens)
            budget -= num_tokens

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.PREEMPTED
        heapq.heappush(self.waiting, (seq.priority, seq.arrival, seq))
        self.num_preemptions += 1

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free(seq)
        del self._seqs[seq.seq_id]
        self._finished_ids.append(seq.seq_id)
