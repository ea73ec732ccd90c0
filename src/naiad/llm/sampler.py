"""Pick the next token of each sampling row, on the logits' device.

Greedy rows take the argmax. The others divide their logits by the temperature, drop the
tokens outside top-k, top-p and min-p, and draw from the rest with the exponential race
(`argmax(p / E)` with `E ~ Exp(1)` picks token `i` with probability `p[i]`), which needs no
host sync and lets a seeded row draw its noise from its own generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from naiad.llm.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingBatch:
    """The sampling settings of a step's rows, as tensors on the logits' device."""

    temperatures: torch.Tensor  # [rows] float32; 1 for greedy rows, which skip the division
    top_k: torch.Tensor  # [rows] int64; the vocabulary size when off
    top_p: torch.Tensor  # [rows] float32
    min_p: torch.Tensor  # [rows] float32
    greedy: torch.Tensor  # [rows] bool
    generators: list[torch.Generator | None]  # a row's own generator when it has a seed
    all_greedy: bool
    any_filter: bool

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        vocab_size: int,
        device: torch.device | str,
    ) -> SamplingBatch:
        def tensor(values: list[float] | list[int] | list[bool], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            temperatures=tensor([1.0 if p.greedy else p.temperature for p in params], torch.float32),
            top_k=tensor([p.top_k or vocab_size for p in params], torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float32),
            min_p=tensor([p.min_p for p in params], torch.float32),
            greedy=tensor([p.greedy for p in params], torch.bool),
            generators=generators,
            all_greedy=all(p.greedy for p in params),
            any_filter=any(p.filters and not p.greedy for p in params),
        )


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """One token id per row of `logits` (`[rows, vocab]`), as an int64 tensor on its device."""
    greedy_tokens = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy_tokens
    scaled = logits.float() / batch.temperatures[:, None]
    if batch.any_filter:
        scaled = apply_filters(scaled, batch.top_k, batch.top_p, batch.min_p)
    random_tokens = _race(scaled.softmax(dim=-1), batch.generators)
    return torch.where(batch.greedy, greedy_tokens, random_tokens)


def apply_filters(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf the logits of the tokens that top-k, then top-p, then min-p drop.

    Top-p keeps the smallest set of most likely tokens that holds `top_p` of the probability
    left by top-k; min-p drops tokens less likely than `min_p` times the most likely one.
    The most likely token always stays.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    drop = ranks[None, :] >= top_k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # Only where top_p < 1: rounding can push the running sum to 1 before the tail.
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    drop |= probs < min_p[:, None] * probs[:, :1]
    filtered = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, filtered)


def _race(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)
