"""The engine end to end on tiny models: greedy tokens identical to transformers' generate.

Requests of different lengths arrive at different steps with different max_tokens; several
share a long prefix (one is exactly that prefix, one ends on a block boundary inside it); the
step budget is small enough to chunk the longer prompts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.tiny_models import PREFIX, REQUESTS, TINY, hf_greedy, hf_model, run_staggered, tokens
from naiad.errors import InvalidArgument
from naiad.llm import kernels
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY, SamplingParams
from naiad.llm.engine.sequence import FinishReason, Sequence

BLOCK = 4



def _kv_bytes(num_blocks: int) -> int:
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    per_block = 2 * TINY["num_hidden_layers"] * BLOCK * TINY["num_key_value_heads"] * head_dim * 4  # fp32
    return num_blocks * per_block


def _engine(path: Path, **overrides: object) -> LLMEngine:
    config = {
        "model": path,
        "dtype": "float32",
        "block_size": BLOCK,
        "kv_cache_memory": _kv_bytes(256),
        "max_num_batched_tokens": 32,
        "max_model_len": 96,
    }
    return LLMEngine(EngineConfig(**{**config, **overrides}))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def references(tiny_models: dict[str, Path]) -> dict[str, list[list[int]]]:
    """transformers' greedy output for every request, one prompt at a time."""
    refs = {}
    for variant in ("llama", "qwen2"):
        model = hf_model(tiny_models[variant])
        refs[variant] = [hf_greedy(model, prompt, max_tokens) for prompt, max_tokens, _ in REQUESTS]
    return refs




@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-cache"])
@pytest.mark.parametrize("variant", ["llama", "qwen2"])
def test_greedy_matches_transformers_in_a_continuous_batch(
    tiny_models: dict[str, Path], references: dict[str, list[list[int]]], variant: str, caching: bool
) -> None:
    engine = _engine(tiny_models[variant], enable_prefix_caching=caching)
    assert run_staggered(engine) == references[variant]
    hits = engine.block_manager.prefix_cache_hits
    assert hits > 0 if caching else hits == 0
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-cache"])
@pytest.mark.parametrize("variant", ["llama", "qwen2"])
def test_preemption_recomputes_the_sametokens(
    tiny_models: dict[str, Path], references: dict[str, list[list[int]]], variant: str, caching: bool
) -> None:
    # 16 blocks of 4 tokens: max_model_len's worth, a fraction of what the batch wants.
    engine = _engine(
        tiny_models[variant], kv_cache_memory=_kv_bytes(16), max_model_len=64, enable_prefix_caching=caching
    )
    assert engine.runner.num_blocks == 16
    assert run_staggered(engine) == references[variant]
    assert engine.scheduler.num_preemptions > 0


def test_generate_returns_outputs_in_prompt_order(
    tiny_models: dict[str, Path], references: dict[str, list[list[int]]]
) -> None:
    engine = _engine(tiny_models["qwen2"])
    prompts = [prompt for prompt, max_tokens, _ in REQUESTS if max_tokens >= 8]
    expected = [
        ref[:8] for ref, (_, max_tokens, _) in zip(references["qwen2"], REQUESTS, strict=True) if max_tokens >= 8
    ]
    assert engine.generate(prompts, max_tokens=8, sampling_params=GREEDY) == expected


def test_a_seeded_request_draws_the_same_tokens_in_any_batch(tiny_models: dict[str, Path]) -> None:
    engine = _engine(tiny_models["llama"])
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    alone = engine.generate([PREFIX], max_tokens=12, sampling_params=seeded)[0]
    others = [
        engine.add_request(prompt, 10, sampling_params=SamplingParams(temperature=0.8)) for prompt, _, _ in REQUESTS
    ]
    again = engine.generate([PREFIX], max_tokens=12, sampling_params=seeded)[0]
    assert again == alone and len(alone) >= 1
    assert not any(engine.scheduler.get(request_id) for request_id in others)
    other_seed = engine.generate([PREFIX], max_tokens=12, sampling_params=SamplingParams(temperature=1.0, seed=99))[0]
    assert other_seed != alone


def test_eos_stops_a_request_unless_ignored(
    tiny_models: dict[str, Path], references: dict[str, list[list[int]]]
) -> None:
    engine = _engine(tiny_models["llama"])
    prompt, expected = REQUESTS[0][0], references["llama"][0]
    # The first token that the greedy output has not produced before becomes the EOS token.
    stop_at = next(i for i in range(1, len(expected)) if expected[i] not in expected[:i])
    engine.eos_token_ids = (expected[stop_at],)
    stopped = engine.add_request(prompt, 12, sampling_params=GREEDY)
    ignoring = engine.add_request(prompt, 12, sampling_params=GREEDY, ignore_eos=True)
    finished = {}
    while engine.has_unfinished():
        finished.update((seq.seq_id, seq) for seq in engine.step())
    assert finished[stopped].output_token_ids == expected[: stop_at + 1]
    assert finished[stopped].finish_reason is FinishReason.STOP
    assert finished[ignoring].output_token_ids[: len(expected)] == expected
    assert finished[ignoring].num_output_tokens == 12
    assert finished[ignoring].finish_reason is FinishReason.LENGTH


def test_abort_frees_the_request_blocks(tiny_models: dict[str, Path]) -> None:
    engine = _engine(tiny_models["llama"])
    request_id = engine.add_request(PREFIX, 20)
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    assert engine.abort_request(request_id)
    assert not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0
    assert not engine.abort_request(request_id)
    engine.step()  # tells the runner the request is gone


def test_bad_requests_are_refused_before_scheduling(tiny_models: dict[str, Path]) -> None:
    engine = _engine(tiny_models["llama"])
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        engine.add_request([5, TINY["vocab_size"]], 4)
    with pytest.raises(InvalidArgument, match="context length"):
        engine.add_request(tokens(96, 0), 4)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        _engine(tiny_models["llama"], max_model_len=1000)
    assert not engine.has_unfinished()


def _finish(engine: LLMEngine) -> dict[str, Sequence]:
    finished = {}
    while engine.has_unfinished():
        finished.update((seq.seq_id, seq) for seq in engine.step())
    return finished


def test_stop_token_ids_and_mintokens(tiny_models: dict[str, Path], references: dict[str, list[list[int]]]) -> None:
    engine = _engine(tiny_models["llama"])
    prompt, expected = REQUESTS[0][0], references["llama"][0]
    stop_at = next(i for i in range(1, len(expected)) if expected[i] not in expected[:i])
    stopped = engine.add_request(prompt, 12, sampling_params=SamplingParams(temperature=0.0,
                                                                            stop_token_ids=(expected[stop_at],)))
    # min_tokens past the stop token: it may not be drawn, so the greedy output changes there.
    held = engine.add_request(prompt, 12, sampling_params=SamplingParams(
        temperature=0.0, stop_token_ids=(expected[stop_at],), min_tokens=stop_at + 2))
    finished = _finish(engine)
    assert finished[stopped].output_token_ids == expected[: stop_at + 1]
    assert finished[stopped].finish_reason is FinishReason.STOP
    held_tokens = finished[held].output_token_ids
    assert held_tokens[:stop_at] == expected[:stop_at]
    assert expected[stop_at] not in held_tokens[: stop_at + 2]
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        engine.add_request(prompt, 4, sampling_params=SamplingParams(stop_token_ids=(TINY["vocab_size"],)))


def test_logprobs_are_kept_per_output_token_only_when_asked(tiny_models: dict[str, Path]) -> None:
    engine = _engine(tiny_models["llama"])
    asking = engine.add_request(PREFIX, 6, sampling_params=SamplingParams(temperature=0.0, logprobs=3))
    sampled = engine.add_request(PREFIX[:12], 5, sampling_params=SamplingParams(temperature=1.0, logprobs=0, seed=3))
    plain = engine.add_request(PREFIX[:7], 6, sampling_params=GREEDY)
    finished = _finish(engine)
    assert finished[plain].logprobs is None
    seq = finished[asking]
    assert seq.logprobs is not None and len(seq.logprobs) == 6
    for token, (logprob, top_ids, top_values) in zip(seq.output_token_ids, seq.logprobs, strict=True):
        assert len(top_ids) == len(top_values) == 3
        assert top_ids[0] == token and logprob == pytest.approx(top_values[0])  # greedy: the top token
        assert top_values == sorted(top_values, reverse=True) and all(v <= 0 for v in top_values)
    draws = finished[sampled]
    assert draws.logprobs is not None and len(draws.logprobs) == 5
    assert all(ids == values == [] and logprob <= 0 for logprob, ids, values in draws.logprobs)


def test_prompt_logprobs_match_transformers_through_chunks_and_past_the_prefix_cache(
        tiny_models: dict[str, Path]) -> None:
    import torch

    engine = _engine(tiny_models["llama"], max_num_batched_tokens=8)  # the prompt goes in chunks
    prompt = PREFIX + tokens(9, 5)
    engine.generate([prompt], 2)  # its blocks are in the prefix cache now
    request_id = engine.add_request(prompt, 1, sampling_params=SamplingParams(temperature=0.0, prompt_logprobs=3))
    finished: dict[str, Sequence] = {}
    while engine.has_unfinished():
        finished.update((seq.seq_id, seq) for seq in engine.step())
    seq = finished[request_id]
    assert seq.num_cached_tokens == 0  # computed again: cached tokens have no logits
    with torch.no_grad():
        reference = hf_model(tiny_models["llama"])(torch.tensor([prompt])).logits[0].log_softmax(-1)
    entries = seq.prompt_logprobs
    assert entries is not None and len(entries) == len(prompt) and entries[0] is None
    for position in range(1, len(prompt)):
        entry = entries[position]
        assert entry is not None
        own, top_ids, _ = entry
        assert abs(own - reference[position - 1, prompt[position]].item()) < 1e-4
        assert top_ids == reference[position - 1].topk(3).indices.tolist()


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_pool_the_final_hidden_states_as_transformers_does(tiny_models: dict[str, Path],
                                                                       pooling: str) -> None:
    """An embedding request beside generating ones, its prompt in chunks: the L2-normalized last
    (or mean) final hidden state, as transformers computes it; no token drawn."""
    import torch

    engine = _engine(tiny_models["llama"], max_num_batched_tokens=8)
    prompt = PREFIX + tokens(9, 6)
    engine.generate([prompt], 2)  # its blocks in the prefix cache ("last" may use them)
    generating = engine.add_request(tokens(12, 7), 6, sampling_params=GREEDY)
    embedding = engine.add_request(prompt, 1, sampling_params=SamplingParams(pooling=pooling))
    finished: dict[str, Sequence] = {}
    while engine.has_unfinished():
        finished.update((seq.seq_id, seq) for seq in engine.step())
    seq = finished[embedding]
    assert seq.finish_reason == "stop" and seq.output_token_ids == [] and seq.embedding is not None
    assert len(finished[generating].output_token_ids) == 6
    with torch.no_grad():
        states = hf_model(tiny_models["llama"])(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0]
    expected = states[-1] if pooling == "last" else states.mean(dim=0)
    expected = expected / expected.norm()
    assert torch.allclose(torch.tensor(seq.embedding), expected, atol=1e-4)


def test_an_embedding_may_fill_the_whole_context(tiny_models: dict[str, Path]) -> None:
    engine = _engine(tiny_models["llama"])
    full = tokens(96, 8)  # max_model_len: no room to generate, all of it to embed
    assert engine.generate([full], 1, SamplingParams(pooling="last")) == [[]]
    with pytest.raises(InvalidArgument, match="the text has 97 tokens"):
        engine.add_request(tokens(97, 8), 1, sampling_params=SamplingParams(pooling="mean"))
    with pytest.raises(InvalidArgument, match="pooling must be one of"):
        SamplingParams(pooling="cls")


@pytest.mark.skipif(kernels.library() is None, reason="gcc could not build the CPU kernels")
def test_greedy_decode_steps_take_the_fused_head_and_its_tokens_are_the_samplers(
        tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(tiny_models["llama"], quantization="int8")  # 8-bit linears: fused layers and head
    head = engine.runner.model.fused_head
    assert head is not None
    rows: list[int] = []
    real = head.greedy
    monkeypatch.setattr(head, "greedy", lambda x, residual: rows.append(x.shape[0]) or real(x, residual))
    prompts = [PREFIX[:7], PREFIX[:12], PREFIX]
    fused = engine.generate(prompts, 6, GREEDY)
    assert rows and max(rows) == 3, "the decode steps of plain greedy requests took the fused head"
    engine.runner.model.fused_head = None  # the forward's logits, then the sampler's argmax
    assert engine.generate(prompts, 6, GREEDY) == fused
    engine.runner.model.fused_head = head
    rows.clear()
    engine.add_request(PREFIX[:9], 4, sampling_params=SamplingParams(temperature=0.0, logprobs=2))
    engine.add_request(PREFIX[:5], 4, sampling_params=SamplingParams(temperature=0.0, logit_bias=((3, 5.0),)))
    _finish(engine)
    assert rows == [], "steps that need the logits (logprobs, a bias) take the forward and the sampler"
