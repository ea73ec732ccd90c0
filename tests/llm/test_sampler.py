"""The sampler on hand-made logits: greedy, the filters, temperature and seeds."""

from __future__ import annotations

import pytest
import torch

from naiad.errors import InvalidArgument
from naiad.llm.engine.sampling_params import GREEDY, SamplingParams
from naiad.llm.layers.sampler import SamplingBatch, apply_filters, logprobs, sample

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


# -- penalties, banned tokens and logprobs -------------------------------------------------------


def _penalized(params: SamplingParams, logits: torch.Tensor, prompt: list[int], output: list[int]) -> torch.Tensor:
    batch = SamplingBatch.build([params], [None], logits.shape[-1], "cpu", history=[(prompt, output)])
    assert batch.penalties is not None
    return batch.penalties.apply(logits[None])[0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = torch.tensor([2.0, -1.0, 3.0, -4.0, 0.5])
    # token 0 (positive) in the prompt, 1 (negative) in the output, 2 and 3 never seen
    penalized = _penalized(SamplingParams(repetition_penalty=2.0), logits, prompt=[0, 0], output=[1])
    assert penalized.tolist() == [1.0, -2.0, 3.0, -4.0, 0.5]


def test_frequency_and_presence_penalties_count_output_tokens_only() -> None:
    logits = torch.zeros(5)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    penalized = _penalized(params, logits, prompt=[4, 4, 4], output=[1, 1, 1, 2])
    # token 1 three times: 3 * 0.5 + 0.25; token 2 once: 0.5 + 0.25; the prompt's token 4 untouched
    assert penalized.tolist() == [0.0, -1.75, -0.75, 0.0, 0.0]


def test_negative_penalties_favour_repeats() -> None:
    penalized = _penalized(SamplingParams(presence_penalty=-1.0), torch.zeros(3), prompt=[0], output=[2])
    assert penalized.tolist() == [0.0, 0.0, 1.0]


def test_penalties_change_the_greedy_choice_of_their_row_only() -> None:
    logits = torch.tensor([[1.0, 0.9, 0.0], [1.0, 0.9, 0.0]])
    params = [SamplingParams(temperature=0.0, frequency_penalty=0.5), GREEDY]
    batch = SamplingBatch.build(params, [None, None], 3, "cpu", history=[([2], [0]), ([2], [0])])
    assert sample(logits, batch).tolist() == [1, 0]


def test_penalties_need_the_rows_tokens() -> None:
    with pytest.raises(ValueError, match="prompt and output tokens"):
        SamplingBatch.build([SamplingParams(repetition_penalty=1.2)], [None], 4, "cpu")


def test_banned_tokens_are_never_drawn() -> None:
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 9.0, 0.0]])
    batch = SamplingBatch.build([GREEDY, GREEDY], [None, None], 3, "cpu", banned=[(1,), ()])
    assert sample(logits, batch).tolist() == [0, 1]


def test_without_options_the_batch_carries_nothing_extra() -> None:
    batch = SamplingBatch.build([GREEDY, SamplingParams()], [None, None], 4, "cpu", banned=[(), ()])
    assert batch.penalties is None and batch.banned is None and batch.logprob_rows is None and batch.bias is None


def test_logit_bias_moves_its_rows_choice_and_leaves_the_logprobs_raw() -> None:
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 9.0, 0.0], [0.0, 9.0, 0.0]])
    params = [SamplingParams(temperature=0.0, logit_bias=((2, 100.0),)),
              SamplingParams(temperature=0.0, logit_bias=((1, -100.0), (0, 0.5))), GREEDY]
    batch = SamplingBatch.build(params, [None] * 3, 3, "cpu")
    assert sample(logits, batch).tolist() == [2, 0, 1]
    assert logits[0].tolist() == [0.0, 9.0, 0.0]  # the raw logits (logprobs read them) are untouched
    forced = SamplingBatch.build([SamplingParams(temperature=1.0, logit_bias=((3, 100.0),))] * 200, [None] * 200, 4,
                                 "cpu")
    assert _support(sample(PROBS.log().expand(200, -1), forced)) == {3}


def test_logprobs_are_the_log_softmax_of_the_raw_logits() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.5), GREEDY,
              SamplingParams(temperature=0.7, logprobs=2)]
    batch = SamplingBatch.build(params, [None] * 3, 40, "cpu", history=[([1, 2], [3])] * 3)
    tokens = sample(logits, batch)
    own, top_ids, top_values = logprobs(logits, tokens, batch)
    expected = torch.log_softmax(logits, dim=-1)
    assert batch.logprob_rows is not None and batch.logprob_rows.tolist() == [0, 2]
    assert batch.num_logprobs == 5
    torch.testing.assert_close(own, expected[[0, 2], tokens[[0, 2]]])
    reference = expected[[0, 2]].topk(5, dim=-1)
    assert torch.equal(top_ids, reference.indices)
    torch.testing.assert_close(top_values, reference.values)
    assert (own <= 0).all()


@pytest.mark.parametrize(
    "bad",
    [
        {"repetition_penalty": 0.0},
        {"repetition_penalty": float("nan")},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"frequency_penalty": float("nan")},
        {"logprobs": -1},
        {"logprobs": 21},
        {"logprobs": True},
        {"min_tokens": -1},
        {"stop_token_ids": [2]},
        {"stop_token_ids": (-1,)},
        {"logit_bias": ((1, 101.0),)},
        {"logit_bias": ((-1, 1.0),)},
        {"logit_bias": ((1, True),)},
        {"logit_bias": ((1,),)},
    ],
)
def test_invalid_penalties_and_logprobs_are_refused(bad: dict[str, object]) -> None:
    name = next(iter(bad))
    with pytest.raises(InvalidArgument, match=name):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_penalized_flag() -> None:
    assert not SamplingParams().penalized
    assert SamplingParams(repetition_penalty=1.1).penalized and SamplingParams(presence_penalty=-0.5).penalized
