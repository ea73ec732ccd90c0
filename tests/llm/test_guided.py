"""Structured outputs in the engine (naiad.llm.engine.guided): the bundled SmolLM2 sampling at
temperature 1 under a JSON schema, a regex, a list of choices and a Lark grammar, and the
sampler's mask on just the rows that carry one."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import torch

from llm.json_schemas import SCHEMAS
from naiad.errors import InvalidArgument
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import SamplingParams
from naiad.llm.layers.sampler import SamplingBatch, sample, unpack_bitmask
from naiad.llm.loading.gguf import smollm2_path
from naiad.llm.loading.loader import load_tokenizer
from naiad.llm.loading.tokenizer import Tokenizer

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Iterator[LLMEngine]:
    engine = LLMEngine(EngineConfig(smollm2_path(), kv_cache_memory=64 << 20))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer(Path(smollm2_path()))


def _prompt(tokenizer: Tokenizer, question: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                          add_generation_prompt=True))


def _run(engine: LLMEngine, tokenizer: Tokenizer, guide: tuple[str, str], n: int = 4,
         max_tokens: int = 96) -> list[str]:
    """n sequences of one request's guide at temperature 1, batched together; each must have
    ended by its grammar (a token past max_tokens would leave the output unfinished)."""
    ids = [engine.add_request(_prompt(tokenizer, "Describe a person."), max_tokens,
                              sampling_params=SamplingParams(temperature=1.0, seed=seed, guide=guide))
           for seed in range(n)]
    finished = {}
    while engine.has_unfinished():
        finished.update((seq.seq_id, seq) for seq in engine.step())
    assert all(finished[i].finish_reason == "stop" for i in ids), [finished[i].finish_reason for i in ids]
    return [tokenizer.decode(finished[i].output_token_ids) for i in ids]


def test_json_schema_outputs_validate_against_the_schema(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    for text in _run(engine, tokenizer, ("json_schema", json.dumps(SCHEMA))):
        jsonschema.validate(json.loads(text), SCHEMA)


def test_regex_choice_and_grammar_outputs_match_them(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    for text in _run(engine, tokenizer, ("regex", r"[0-9]{3}-[a-z]{2}")):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
    choices = ["yes", "no", "it depends \"quoted\""]
    for text in _run(engine, tokenizer, ("choice", json.dumps(choices))):
        assert text in choices
    # Bounded (at most three terms): at temperature 1 an open-ended repetition could outrun max_tokens.
    lark = 'start: "(" NUMBER ("+" NUMBER)? ("+" NUMBER)? ")"\nNUMBER: /[1-9][0-9]?/'
    gbnf = 'root ::= "(" num ("+" num)? ("+" num)? ")"\nnum ::= [1-9] [0-9]?'
    for grammar in (lark, gbnf):
        for text in _run(engine, tokenizer, ("grammar", grammar), max_tokens=64):
            assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?){0,2}\)", text), text


def test_a_guided_row_beside_a_free_one_leaves_the_free_one_alone(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    prompt = _prompt(tokenizer, "What is the capital of France?")
    alone = engine.generate([prompt], 8, SamplingParams(temperature=0.0))[0]
    free = engine.add_request(prompt, 8, sampling_params=SamplingParams(temperature=0.0))
    guided = engine.add_request(prompt, 8, sampling_params=SamplingParams(temperature=0.0,
                                                                           guide=("choice", '["Paris!"]')))
    outputs = {}
    while engine.has_unfinished():
        outputs.update((seq.seq_id, seq.output_token_ids) for seq in engine.step())
    assert outputs[free] == alone
    assert tokenizer.decode(outputs[guided]) == "Paris!"


@pytest.mark.parametrize(("guide", "message"), [
    (("regex", "(unclosed"), "regex cannot be used"),
    (("grammar", "start: undefined_rule"), "grammar cannot be used"),
    (("grammar", "root ::= (unclosed"), "grammar cannot be used"),
    (("json_schema", "[1, 2]"), "not a JSON object"),
    (("choice", "[]"), "non-empty array"),
])
def test_a_grammar_the_engine_cannot_use_is_refused_when_added(engine: LLMEngine, tokenizer: Tokenizer,
                                                               guide: tuple[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        engine.add_request([1, 2, 3], 4, sampling_params=SamplingParams(guide=guide))
    assert not engine.has_unfinished()


def test_a_guide_of_an_unknown_kind_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="kind one of"):
        SamplingParams(guide=("xml", "<a/>"))


def test_the_mask_forbids_its_tokens_on_its_rows_only() -> None:
    logits = torch.zeros(3, 40)
    logits[:, 7] = 5.0  # every row's favourite
    bits = torch.zeros(1, 2, dtype=torch.int32)
    bits[0, 1] = 1 << (33 - 32)  # row 1 may draw token 33 only
    batch = SamplingBatch.build([SamplingParams(temperature=0.0)] * 3, [None] * 3, 40, "cpu")
    batch.allowed = (torch.tensor([1]), bits)
    assert sample(logits, batch).tolist() == [7, 33, 7]
    assert logits[1, 7] == 5.0  # the caller's logits (logprobs read them) are left as they were
    assert unpack_bitmask(torch.tensor([[-1]], dtype=torch.int32), 20).all()


def test_grammars_survive_preemption(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    """Too little KV cache for four guided sequences at once: some are preempted and recomputed,
    and their grammars go on from where they were."""
    block_bytes = engine.runner.kv_cache_bytes() // engine.runner.num_blocks
    small = LLMEngine(EngineConfig(smollm2_path(), kv_cache_memory=10 * block_bytes))
    try:
        texts = _run(small, tokenizer, ("json_schema", json.dumps(SCHEMA)), n=4, max_tokens=48)
        assert small.scheduler.num_preemptions > 0
    finally:
        small.close()
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_fifty_schemas_give_valid_json_at_temperature_one(tokenizer: Tokenizer) -> None:
    """Issue 24's validity set: every answer parses and validates (formats checked too), and
    ended by its grammar, well inside max_tokens (the set's bounded schemas take < 140 tokens)."""
    engine = LLMEngine(EngineConfig(smollm2_path(), kv_cache_memory=384 << 20))
    try:
        prompt = _prompt(tokenizer, "Answer in JSON.")
        ids = {engine.add_request(prompt, 256, sampling_params=SamplingParams(
            temperature=1.0, seed=index, guide=("json_schema", json.dumps(schema)))): schema
            for index, schema in enumerate(SCHEMAS)}
        finished = {}
        while engine.has_unfinished():
            finished.update((seq.seq_id, seq) for seq in engine.step())
    finally:
        engine.close()
    checker = jsonschema.FormatChecker()
    for request_id, schema in ids.items():
        seq = finished[request_id]
        assert seq.finish_reason == "stop", tokenizer.decode(seq.output_token_ids)
        jsonschema.validate(json.loads(tokenizer.decode(seq.output_token_ids)), schema, format_checker=checker)


def test_objects_that_list_properties_are_closed_unless_they_say_otherwise() -> None:
    from naiad.llm.engine.guided import closed

    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}},
                                               "properties": {"type": "integer"}},
              "$defs": {"d": {"properties": {"x": {}}, "additionalProperties": True}},
              "anyOf": [{"properties": {}}], "items": {"properties": {}}}
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["properties"] == {"type": "integer"}  # a property's name is not a keyword
    assert out["$defs"]["d"]["additionalProperties"] is True
    assert out["anyOf"][0]["additionalProperties"] is False and out["items"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the caller's schema is left as it was
