"""The sampler on hand-made logits: greedy, the filters, temperature and seeds."""

from __future__ import annotations

import pytest
import torch

from naiad.errors import InvalidArgument
from naiad.llm.sampler import SamplingBatch, apply_filters, sample
from naiad.llm.sampling_params import GREEDY, SamplingParams

PROBS = torch.tensor([0.05, 0.5, 0.15, 0.3])  # sorted: 1 (0.5), 3 (0.3), 2 (0.15), 0 (0.05)
ROWS = 4000


def _draw(params: SamplingParams, rows: int = ROWS, logits: torch.Tensor | None = None) -> torch.Tensor:
    """`rows` draws with `params` from PROBS (or `logits`), one per row of a batch."""
    logits = PROBS.log().expand(rows, -1) if logits is None else logits
    generators = [None] * rows
    return sample(logits, SamplingBatch.build([params] * rows, generators, logits.shape[-1], "cpu"))


def _support(tokens: torch.Tensor) -> set[int]:
    return set(tokens.unique().tolist())


def test_greedy_takes_the_argmax_of_every_row() -> None:
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_draw(GREEDY, 8, logits), logits.argmax(-1))
    assert torch.equal(_draw(SamplingParams(temperature=2.0, top_k=1), 8, logits), logits.argmax(-1))


def test_greedy_rows_are_unaffected_by_random_neighbours() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    params = [
        GREEDY,
        SamplingParams(temperature=5.0),
        GREEDY,
        SamplingParams(temperature=5.0, top_p=0.5),
        GREEDY,
        GREEDY,
    ]
    tokens = sample(logits, SamplingBatch.build(params, [None] * 6, 50, "cpu"))
    greedy_rows = [0, 2, 4, 5]
    assert torch.equal(tokens[greedy_rows], logits.argmax(-1)[greedy_rows])


def test_temperature_one_draws_from_the_softmax() -> None:
    counts = torch.bincount(_draw(SamplingParams()), minlength=4) / ROWS
    torch.testing.assert_close(counts, PROBS, atol=0.03, rtol=0)


def test_low_temperature_sharpens() -> None:
    counts = torch.bincount(_draw(SamplingParams(temperature=0.5)), minlength=4) / ROWS
    sharpened = PROBS**2 / (PROBS**2).sum()  # softmax(log p / 0.5)
    torch.testing.assert_close(counts, sharpened, atol=0.03, rtol=0)


@pytest.mark.parametrize(
    ("params", "support"),
    [
        (SamplingParams(top_k=2), {1, 3}),
        (SamplingParams(top_p=0.7), {1, 3}),  # 0.5 alone is short of 0.7; 0.5 + 0.3 holds it
        (SamplingParams(top_p=0.3), {1}),
        (SamplingParams(min_p=0.35), {1, 3}),  # 0.35 * 0.5 = 0.175: token 2 (0.15) falls out
        # top-p weighs what top-k left: token 1 holds 0.5 / 0.95 > 0.52 of it, so 3 falls out
        (SamplingParams(top_k=3, top_p=0.52), {1}),
    ],
)
def test_filters_restrict_the_draws(params: SamplingParams, support: set[int]) -> None:
    assert _support(_draw(params)) == support


def test_filters_leave_the_kept_tokens_in_proportion() -> None:
    counts = torch.bincount(_draw(SamplingParams(top_k=2)), minlength=4) / ROWS
    torch.testing.assert_close(counts, torch.tensor([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]), atol=0.03, rtol=0)


def test_filters_keep_the_top_token_and_mark_the_rest() -> None:
    logits = PROBS.log().expand(2, -1)
    filtered = apply_filters(logits, torch.tensor([4, 4]), torch.tensor([0.01, 1.0]), torch.tensor([0.0, 0.0]))
    assert torch.isinf(filtered[0]).tolist() == [True, False, True, True]
    assert torch.equal(filtered[1], logits[1])


def test_a_seed_gives_the_same_draws_in_any_batch() -> None:
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(2))
    seeded = SamplingParams(temperature=1.5, seed=42)

    def draws(row: int, batch: int) -> list[int]:
        generator = torch.Generator().manual_seed(42)
        params = [SamplingParams(temperature=1.5)] * batch
        params[row] = seeded
        generators: list[torch.Generator | None] = [None] * batch
        generators[row] = generator
        batch_of = SamplingBatch.build(params, generators, 64, "cpu")
        return [int(sample(logits.expand(batch, -1), batch_of)[row]) for _ in range(20)]

    assert draws(0, 1) == draws(3, 5) == draws(1, 2)
    assert len(set(draws(0, 1))) > 1


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_k": -1},
        {"top_k": 1.5},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"min_p": 2.0},
        {"seed": "7"},
    ],
)
def test_invalid_sampling_params_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_greedy_and_filters_flags() -> None:
    assert GREEDY.greedy and SamplingParams(top_k=1).greedy and not SamplingParams().greedy
    assert not SamplingParams().filters and SamplingParams(min_p=0.1).filters
