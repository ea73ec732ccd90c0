"""One generation request as the engine sees it: tokens, stop limits, scheduling and KV state.

Fields are plain ints, strings, lists and enums so that the part crossing a process boundary
(ids, tokens, limits) maps one to one onto a `msgspec.Struct` later.
"""

from __future__ import annotations

import enum
from typing import Protocol

from naiad.llm.engine.sampling_params import SamplingParams

#: One output token's logprobs: its own, and the top alternatives' ids and logprobs (most likely first).
TokenLogprobs = tuple[float, list[int], list[float]]


class SequenceStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # back in the waiting queue after its KV blocks were taken; it recomputes
    FINISHED = 3


class FinishReason(enum.StrEnum):
    """Why a sequence ended; the values are OpenAI's `finish_reason` strings."""

    STOP = "stop"  # an end-of-sequence token, a stop token id (or, in the backend, a stop string)
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"  # the client went away


class Grammar(Protocol):
    """A structured output's grammar as a sequence follows it (naiad.llm.engine.guided.GrammarState)."""

    def accept(self, token_id: int) -> None: ...

    @property
    def finished(self) -> bool: ...


class Sequence:
    """A request's token state.

    `token_ids` holds the prompt followed by the generated tokens. The KV of the first
    `num_computed_tokens` of them is in the blocks of `block_table`; the rest are computed by
    the next steps (a prompt in chunks, then one token per decode step). `num_cached_tokens`
    is how many of its tokens the last allocation found in the prefix cache. `block_hashes`
    holds the chained hashes of the full blocks of `token_ids`: they depend on content only,
    so they survive preemption. The scheduler stamps `arrival` when the sequence is added;
    the runner reads `sampling_params` to pick each next token. `logprobs` holds one
    `TokenLogprobs` per output token when the sampling params ask for them, else None.
    `prompt_logprobs` (when asked) holds the prompt tokens' logprobs, filled during prefill.
    `grammar` (set by the engine for a request with a guide) follows the output through its
    grammar: the runner masks each draw with it, and the sequence stops when it is complete.
    """

    __slots__ = (
        "arrival",
        "block_hashes",
        "block_table",
        "embedding",
        "eos_token_ids",
        "finish_reason",
        "first_scheduled",
        "grammar",
        "ignore_eos",
        "logprobs",
        "max_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_prompt_tokens",
        "pooled",
        "priority",
        "prompt_logprobs",
        "sampling_params",
        "seq_id",
        "status",
        "token_ids",
    )

    def __init__(
        self,
        seq_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        *,
        eos_token_ids: tuple[int, ...] = (),
        ignore_eos: bool = False,
        priority: int = 0,
        sampling_params: SamplingParams | None = None,
    ) -> None:
        self.seq_id = seq_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.max_tokens = max_tokens
        self.eos_token_ids = eos_token_ids
        self.ignore_eos = ignore_eos
        self.priority = priority
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.arrival = -1
        self.first_scheduled = 0.0  # time.monotonic() when it first joined the batch (0: not yet)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.logprobs: list[TokenLogprobs] | None = None if self.sampling_params.logprobs is None else []
        self.grammar: Grammar | None = None
        # With sampling_params.pooling: the runner's running pool (its sum and how many prompt
        # positions it holds), then the finished vector.
        self.pooled: tuple[object, int] | None = None
        self.embedding: list[float] | None = None
        # With sampling_params.prompt_logprobs: one entry per prompt token computed so far (the
        # first token's None: nothing comes before it); the runner fills it during prefill.
        self.prompt_logprobs: list[TokenLogprobs | None] | None = (
            None if self.sampling_params.prompt_logprobs is None else [None])

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.seq_id!r}, {self.status.name}, tokens={len(self)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV is still to be computed: the rest of the prompt, or 1 when decoding."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, logprobs: TokenLogprobs | None = None) -> None:
        self.token_ids.append(token_id)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs.append(logprobs)
        if self.grammar is not None:
            self.grammar.accept(token_id)

    @property
    def banned_token_ids(self) -> tuple[int, ...]:
        """Tokens the next draw may not pick: end-of-sequence and stop tokens before min_tokens."""
        params = self.sampling_params
        if self.num_output_tokens >= params.min_tokens:
            return ()
        return (() if self.ignore_eos else self.eos_token_ids) + params.stop_token_ids

    @property
    def ends_with_stop_token(self) -> bool:
        """Whether the last token is an end-of-sequence token (unless ignored) or a stop token."""
        last = self.token_ids[-1]
        return (not self.ignore_eos and last in self.eos_token_ids) or last in self.sampling_params.stop_token_ids

    def stop_reason(self, max_model_len: int) -> FinishReason | None:
        """Why the sequence must stop after its last appended token, or None to go on."""
        params = self.sampling_params
        if self.ends_with_stop_token and self.num_output_tokens >= params.min_tokens:
            return FinishReason.STOP
        if self.grammar is not None and self.grammar.finished:
            return FinishReason.STOP
        if self.num_output_tokens >= self.max_tokens or len(self.token_ids) >= max_model_len:
            return FinishReason.LENGTH
        return None
