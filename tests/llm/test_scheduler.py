"""The scheduler driven by a fake runner: hand-made sampled tokens, no torch.

`_next_token` stands in for a greedy model: the next token depends on the whole context,
so a sequence recomputed after preemption, or prefilled in chunks, must produce the same
tokens as a sequence that ran alone.
"""

import pytest

from naiad.errors import AlreadyExists, InvalidArgument
from naiad.llm.engine.block_manager import BlockManager
from naiad.llm.engine.sampling_params import SamplingParams
from naiad.llm.engine.scheduler import SchedulerConfig, SchedulerOutput, StepScheduler
from naiad.llm.engine.sequence import FinishReason, Sequence, SequenceStatus


def _next_token(context: list[int]) -> int:
    return 100 + (sum(context) * 31 + len(context)) % 50


def _reference(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(_next_token(tokens))
    return tokens[len(prompt) :]


def _scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    *,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    caching: bool = True,
) -> StepScheduler:
    config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len)
    return StepScheduler(config, BlockManager(num_blocks, block_size, enable_prefix_caching=caching))


def _prompt(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def _add(sched: StepScheduler, seq_id: str, prompt: list[int], max_tokens: int = 4, **kwargs) -> Sequence:
    seq = Sequence(seq_id, prompt, max_tokens, **kwargs)
    sched.add(seq)
    return seq


def _sampled(output: SchedulerOutput) -> list[int]:
    """What a runner would return: a token for every row that reaches its sequence's end."""
    return [
        _next_token(seq.token_ids[: seq.num_computed_tokens + n]) if sample else -1
        for seq, n, sample in zip(output.seqs, output.num_tokens, output.sample, strict=True)
    ]


def _step(sched: StepScheduler) -> tuple[SchedulerOutput, list[Sequence]]:
    output = sched.schedule()
    return output, sched.update(output, _sampled(output))


def _ids(output: SchedulerOutput) -> list[str]:
    return [seq.seq_id for seq in output.seqs]


def _run(sched: StepScheduler, max_steps: int = 500) -> list[SchedulerOutput]:
    outputs = []
    while sched.has_unfinished():
        assert len(outputs) < max_steps, "the scheduler made no progress"
        outputs.append(_step(sched)[0])
    return outputs


def _check_idle(sched: StepScheduler) -> None:
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_used_blocks == 0
    assert sched.num_running == sched.num_waiting == 0


def test_a_prompt_is_prefilled_in_one_step_then_decodes_one_token_a_step():
    sched = _scheduler()
    seq = _add(sched, "a", _prompt(6), max_tokens=3)
    outputs = _run(sched)
    assert [o.num_tokens for o in outputs] == [[6], [1], [1]]
    assert all(o.sample == [True] for o in outputs)
    assert seq.output_token_ids == _reference(_prompt(6), 3)
    assert seq.finish_reason is FinishReason.LENGTH and seq.is_finished
    _check_idle(sched)


def test_a_request_added_while_others_decode_joins_at_the_next_step():
    sched = _scheduler()
    _add(sched, "a", _prompt(5), max_tokens=10)
    _step(sched)
    _step(sched)
    b = _add(sched, "b", _prompt(7, 50), max_tokens=2)
    output, _ = _step(sched)
    assert _ids(output) == ["a", "b"] and output.num_tokens == [1, 7]
    output, _ = _step(sched)
    assert output.num_tokens == [1, 1]
    assert b.output_token_ids == _reference(_prompt(7, 50), 2)


def test_finished_sequences_leave_the_batch_and_are_reported_once():
    sched = _scheduler()
    a = _add(sched, "a", _prompt(3), max_tokens=1)
    _add(sched, "b", _prompt(3, 10), max_tokens=3)
    output, finished = _step(sched)
    assert _ids(output) == ["a", "b"] and finished == [a]
    assert a.block_table == []
    output, _ = _step(sched)
    assert _ids(output) == ["b"] and output.finished_seq_ids == ["a"]
    output, _ = _step(sched)
    assert output.finished_seq_ids == []


def test_every_step_respects_the_token_budget_and_max_num_seqs():
    sched = _scheduler(max_num_seqs=2, max_num_batched_tokens=8)
    prompts = {f"r{i}": _prompt(5 + i, 10 * i) for i in range(5)}
    seqs = [_add(sched, rid, prompt, max_tokens=3) for rid, prompt in prompts.items()]
    first = sched.schedule()
    assert _ids(first) == ["r0", "r1"] and first.num_tokens == [5, 3]  # r1 gets a chunk
    sched.update(first, _sampled(first))
    outputs = _run(sched)
    assert all(o.total_num_tokens <= 8 and len(o.seqs) <= 2 for o in outputs)
    for seq in seqs:
        assert seq.output_token_ids == _reference(prompts[seq.seq_id], 3)
    _check_idle(sched)


def test_a_long_prompt_is_prefilled_in_chunks_over_several_steps():
    sched = _scheduler(max_num_batched_tokens=4)
    seq = _add(sched, "a", _prompt(10), max_tokens=3)
    computed = []
    for expected in ([4], [4], [2], [1]):
        output, _ = _step(sched)
        assert output.num_tokens == expected
        computed.append(seq.num_computed_tokens)
    assert computed == [4, 8, 10, 11]
    assert output.sample == [True]
    _run(sched)
    assert seq.output_token_ids == _reference(_prompt(10), 3)


def test_chunked_and_unchunked_prefill_reach_the_same_state():
    def run(budget: int) -> dict[str, list[int]]:
        sched = _scheduler(max_num_batched_tokens=budget)
        seqs = [_add(sched, f"r{i}", _prompt(3 + 4 * i, i), max_tokens=5) for i in range(4)]
        _run(sched)
        return {seq.seq_id: seq.token_ids for seq in seqs}

    assert run(3) == run(64)


def test_preemption_frees_the_latest_arrival_which_later_resumes_by_recompute():
    # 6 blocks of 2 tokens: two 4-token prompts fit, but not their growth.
    sched = _scheduler(6, 2, max_num_seqs=2, max_model_len=12)
    a = _add(sched, "a", _prompt(4), max_tokens=6)
    b = _add(sched, "b", _prompt(4, 20), max_tokens=6)
    c = _add(sched, "c", _prompt(2, 40), max_tokens=1)  # waits: max_num_seqs
    outputs = [_step(sched)[0] for _ in range(3)]
    assert all(_ids(o) == ["a", "b"] for o in outputs)
    output, _ = _step(sched)  # a needs a 4th block and none is free
    assert output.preempted == [b] and _ids(output) == ["a"]
    assert b.status is SequenceStatus.PREEMPTED and b.block_table == [] and b.num_computed_tokens == 0
    assert [entry[2] for entry in sorted(sched.waiting)] == [b, c] and sched.num_preemptions == 1
    assert b.output_token_ids == _reference(_prompt(4, 20), 3)  # kept: it recomputes them
    outputs = _run(sched)
    resumed = next(o for o in outputs if "b" in _ids(o))
    # c fits in one block but does not overtake b, which waits for a to finish.
    assert outputs.index(resumed) <= next(i for i, o in enumerate(outputs) if "c" in _ids(o))
    # a took back two of b's freed blocks, the end of b's chain first; the first one was
    # still cached, so b recomputes its 7 tokens but the first 2.
    assert b.num_cached_tokens == 2 and resumed.num_tokens[_ids(resumed).index("b")] == 5
    assert a.output_token_ids == _reference(_prompt(4), 6)
    assert b.output_token_ids == _reference(_prompt(4, 20), 6)
    assert c.output_token_ids == _reference(_prompt(2, 40), 1)
    _check_idle(sched)


def test_preemption_picks_the_lowest_priority_before_the_latest_arrival():
    sched = _scheduler(6, 2, max_model_len=12)
    low = _add(sched, "low", _prompt(4), max_tokens=6, priority=1)
    high = _add(sched, "high", _prompt(4, 20), max_tokens=6, priority=0)
    preempted = []
    while sched.has_unfinished():
        preempted += _step(sched)[0].preempted
    assert preempted and set(preempted) == {low}
    assert high.output_token_ids == _reference(_prompt(4, 20), 6)
    assert low.output_token_ids == _reference(_prompt(4), 6)


def test_admission_goes_by_priority_then_arrival():
    sched = _scheduler(max_num_seqs=1)
    for seq_id, priority in (("a", 0), ("b", 1), ("c", 0), ("d", -1)):
        _add(sched, seq_id, _prompt(3), max_tokens=1, priority=priority)
    order = [_ids(output)[0] for output in _run(sched)]
    assert order == ["d", "a", "c", "b"]


def test_a_waiting_request_does_not_overtake_one_whose_blocks_do_not_fit():
    sched = _scheduler(4, 4, max_model_len=16)
    _add(sched, "a", _prompt(8), max_tokens=4)
    _add(sched, "big", _prompt(12, 30), max_tokens=1)
    _add(sched, "small", _prompt(2, 60), max_tokens=1)
    output, _ = _step(sched)
    assert _ids(output) == ["a"]  # big needs 3 blocks, 2 are free; small waits behind it
    _run(sched)
    _check_idle(sched)


def test_a_prefix_cache_hit_shortens_the_prefill():
    sched = _scheduler()
    shared = _prompt(8, 40)
    _add(sched, "a", [*shared, 1], max_tokens=2)
    _step(sched)
    b = _add(sched, "b", [*shared, 2, 3], max_tokens=2)
    output, _ = _step(sched)
    assert output.num_tokens[_ids(output).index("b")] == 2
    assert b.num_cached_tokens == 8
    same = _add(sched, "same", list(shared), max_tokens=1)
    output, _ = _step(sched)
    # The whole prompt is cached, but its last block is recomputed for the next token's logits.
    assert output.num_tokens[_ids(output).index("same")] == 4 and same.num_cached_tokens == 4
    _run(sched)
    assert b.output_token_ids == _reference([*shared, 2, 3], 2)
    assert same.output_token_ids == _reference(shared, 1)


def test_caching_on_and_off_generate_the_same_tokens_with_less_work_on():
    def run(caching: bool) -> tuple[dict[str, list[int]], int]:
        sched = _scheduler(caching=caching)
        shared = _prompt(12, 7)
        seqs = [_add(sched, "r0", [*shared, 0], max_tokens=3)]
        work = _step(sched)[0].total_num_tokens
        seqs += [_add(sched, f"r{i}", [*shared, i], max_tokens=3) for i in (1, 2)]
        work += sum(o.total_num_tokens for o in _run(sched))
        return {s.seq_id: s.output_token_ids for s in seqs}, work

    (on, work_on), (off, work_off) = run(True), run(False)
    assert on == off
    assert work_off - work_on == 2 * 12  # r1 and r2 find the 12 shared tokens cached


def test_abort_frees_a_waiting_and_a_running_request():
    sched = _scheduler(max_num_seqs=1)
    a = _add(sched, "a", _prompt(6), max_tokens=10)
    b = _add(sched, "b", _prompt(6, 20), max_tokens=10)
    _step(sched)
    assert sched.abort("b") is b and b.finish_reason is FinishReason.ABORT
    assert sched.num_waiting == 0
    assert sched.abort("a") is a and a.finish_reason is FinishReason.ABORT and a.block_table == []
    assert sched.abort("a") is None and sched.abort("nobody") is None
    _check_idle(sched)
    output = sched.schedule()
    assert output.seqs == [] and output.finished_seq_ids == ["b", "a"]


def test_a_request_aborted_after_it_was_scheduled_is_skipped_by_update():
    sched = _scheduler()
    _add(sched, "a", _prompt(6), max_tokens=10)
    keep = _add(sched, "keep", _prompt(6, 20), max_tokens=10)
    output = sched.schedule()
    sched.abort("a")
    assert sched.update(output, _sampled(output)) == []
    assert keep.num_output_tokens == 1 and sched.num_running == 1


def test_an_eos_token_stops_unless_ignored():
    sched = _scheduler()
    a = _add(sched, "a", _prompt(3), max_tokens=10, eos_token_ids=(2, 7))
    b = _add(sched, "b", _prompt(3), max_tokens=10, eos_token_ids=(7,), ignore_eos=True)
    output = sched.schedule()
    assert sched.update(output, [7, 7]) == [a]
    assert a.finish_reason is FinishReason.STOP and a.output_token_ids == [7]
    assert b.status is SequenceStatus.RUNNING


def test_max_tokens_and_the_context_length_stop_with_length():
    sched = _scheduler(max_model_len=8)
    short = _add(sched, "short", _prompt(3), max_tokens=2)
    long = _add(sched, "long", _prompt(6, 10), max_tokens=100)
    _run(sched)
    assert short.num_output_tokens == 2 and short.finish_reason is FinishReason.LENGTH
    assert len(long) == 8 and long.finish_reason is FinishReason.LENGTH


def test_add_rejects_requests_that_can_never_run():
    sched = _scheduler(max_model_len=8)
    with pytest.raises(InvalidArgument, match="empty"):
        sched.add(Sequence("e", [], 1))
    with pytest.raises(InvalidArgument, match="context length is 8"):
        sched.add(Sequence("l", _prompt(8), 1))
    with pytest.raises(InvalidArgument, match="max_tokens"):
        sched.add(Sequence("m", _prompt(2), 0))
    sched.add(Sequence("d", _prompt(2), 1))
    with pytest.raises(AlreadyExists):
        sched.add(Sequence("d", _prompt(2), 1))


def test_the_kv_cache_must_hold_a_whole_context():
    with pytest.raises(ValueError, match="max_model_len"):
        _scheduler(4, 4, max_model_len=17)
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)


def test_stop_token_ids_stop_even_with_ignore_eos_but_not_before_min_tokens():
    sched = _scheduler()
    stop = SamplingParams(stop_token_ids=(9,))
    a = _add(sched, "a", _prompt(3), max_tokens=10, ignore_eos=True, sampling_params=stop)
    b = _add(sched, "b", _prompt(3, 10), max_tokens=10, sampling_params=SamplingParams(stop_token_ids=(9,),
                                                                                       min_tokens=2))
    assert b.banned_token_ids == (9,) and a.banned_token_ids == ()
    output = sched.schedule()
    assert sched.update(output, [9, 9]) == [a]
    assert a.finish_reason is FinishReason.STOP and b.status is SequenceStatus.RUNNING
    assert b.banned_token_ids == (9,)  # one output token so far, min_tokens 2
    output = sched.schedule()
    assert sched.update(output, [9]) == [b]
    assert b.output_token_ids == [9, 9] and b.banned_token_ids == ()


def test_update_keeps_logprobs_only_for_sequences_that_ask():
    sched = _scheduler()
    asking = _add(sched, "asking", _prompt(3), max_tokens=2, sampling_params=SamplingParams(logprobs=1))
    plain = _add(sched, "plain", _prompt(3, 10), max_tokens=2)
    for step in range(2):
        output = sched.schedule()
        sched.update(output, [5, 6], [(-0.5 - step, [5], [-0.5 - step]), None])
    assert asking.logprobs == [(-0.5, [5], [-0.5]), (-1.5, [5], [-1.5])]
    assert plain.logprobs is None
