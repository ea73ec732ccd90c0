"""The OpenAI-compatible API on a real server, through the `openai` client unmodified: the bundled
SmolLM2-135M-Instruct chats (its chat template applied by the llm backend), streaming and not."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import ServerProcess
from gguf import GGUFReader

from e2e.llm_server import MODEL, QUESTION, llm_server
from e2e.raw_http import post_json
from e2e.scaling_util import scrape, total
from naiad.llm.loading.gguf import smollm2_path
from naiad.llm.loading.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with llm_server(tmp_path_factory.mktemp("openai-repo")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", timeout=60, max_retries=0)


def _ask(client: openai.OpenAI, stream: bool) -> Any:
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                          stream=stream)


def test_chat_answers_the_question(client: openai.OpenAI) -> None:
    completion = _ask(client, stream=False)
    assert completion.model == MODEL
    assert completion.choices[0].message.role == "assistant"
    assert "Paris" in completion.choices[0].message.content


def test_streamed_chat_joins_to_the_same_answer(client: openai.OpenAI) -> None:
    whole = _ask(client, stream=False).choices[0].message.content
    chunks = list(_ask(client, stream=True))
    pieces = [chunk.choices[0].delta.content or "" for chunk in chunks]
    assert len([p for p in pieces if p]) > 1  # really streamed, not one piece
    assert "".join(pieces) == whole
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_of_a_raw_prompt_streamed_and_not(client: openai.OpenAI) -> None:
    settings: dict[str, Any] = {"model": MODEL, "prompt": "The capital of France is", "temperature": 0,
                                "max_tokens": 5}
    whole = client.completions.create(**settings).choices[0].text
    assert whole
    assert "".join(chunk.choices[0].text for chunk in client.completions.create(**settings, stream=True)) == whole


def test_models_lists_the_llm_model(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    assert "no-such-model" in caught.value.message
    assert (caught.value.type, caught.value.code) == ("not_found_error", "model_not_found")  # OpenAI's error shape


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_temperature_is_a_bad_request(client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=-1, stream=stream)
    assert "temperature" in caught.value.message


@pytest.mark.parametrize(("extra", "message"), [
    ({"extra_body": {"functions": [{"name": "f", "parameters": {}}]}}, "deprecated function calling"),
    ({"logit_bias": {"x": 5}}, "logit_bias keys are token ids"),
    ({"logit_bias": {"1": 500}}, "logit_bias maps token ids"),
    ({"logit_bias": {"99999999": 5}}, "token id 99999999 is not in the vocabulary"),
    ({"logit_bias": [1]}, "'logit_bias' must be an object"),
    ({"extra_body": {"no_such_field": 1}}, "unknown field 'no_such_field'"),
    ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2]"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "up to 4"),
    ({"n": 0}, "'n' must be"),
    ({"top_logprobs": 2}, "needs 'logprobs' true"),
    ({"stream_options": {"include_usage": True}}, "only allowed with 'stream' true"),
    ({"extra_body": {"continue_final_message": True}}, "needs add_generation_prompt false"),
    ({"extra_body": {"continue_final_message": True, "add_generation_prompt": False}},
     "needs a last message from the assistant"),
    ({"extra_body": {"add_generation_prompt": "yes"}}, "'add_generation_prompt' must be true or false"),
    ({"extra_body": {"chat_template_kwargs": [1]}}, "'chat_template_kwargs' must be an object"),
    ({"extra_body": {"chat_template_kwargs": {"messages": []}}}, "may not set 'messages'"),
    ({"extra_body": {"include_stop_str_in_output": 1}}, "'include_stop_str_in_output' must be true or false"),
])
def test_unsupported_or_bad_settings_are_bad_requests(client: openai.OpenAI, extra: dict[str, Any],
                                                      message: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, **extra)
    assert message in caught.value.message


def test_metadata_fields_the_client_sends_are_accepted(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=3,
                                                user="someone", store=False, metadata={"k": "v"})
    assert completion.choices[0].message.content


# -- usage, finish_reason, stop, n, logprobs, penalties ----------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(GGUFReader(smollm2_path()))


def test_usage_counts_the_tokens_and_eos_ends_with_stop(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=50)
    choice, usage = completion.choices[0], completion.usage
    assert choice.finish_reason == "stop"
    assert usage is not None
    assert usage.prompt_tokens == len(tokenizer.encode(tokenizer.apply_chat_template(QUESTION)))
    # The answer's tokens and the end-of-sequence token that ended it.
    assert usage.completion_tokens == len(tokenizer.encode(choice.message.content)) + 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_max_tokens_ends_with_length(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    prompt = "The capital of France is"
    completion = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (len(tokenizer.encode(prompt)), 3)


@pytest.mark.parametrize("stop", ["Paris", "is Par", ["nothing like it", "France is"]])
def test_a_stop_string_cuts_the_text(client: openai.OpenAI, stop: str | list[str]) -> None:
    """'is Par' spans tokens ("is", " Paris"); streamed text never shows any of it."""
    whole = _ask(client, stream=False).choices[0].message.content
    first = stop if isinstance(stop, str) else stop[1]
    assert first in whole
    expected = whole[: whole.index(first)]
    stopped = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20, stop=stop)
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                                 stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_gives_that_many_choices(client: openai.OpenAI) -> None:
    settings: dict[str, Any] = {"model": MODEL, "messages": QUESTION, "temperature": 1.0, "seed": 5,
                                "max_tokens": 12, "n": 2}
    completion = client.chat.completions.create(**settings)
    assert [choice.index for choice in completion.choices] == [0, 1]
    texts = [choice.message.content for choice in completion.choices]
    assert all(texts) and texts[0] != texts[1]  # seeds 5 and 6
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 24
    streamed = {0: "", 1: ""}
    chunks = list(client.chat.completions.create(**settings, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert [streamed[0], streamed[1]] == texts
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == completion.usage.completion_tokens


def test_chat_logprobs_with_top_alternatives(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=5,
                                                logprobs=True, top_logprobs=3)
    content = completion.choices[0].logprobs.content
    assert completion.usage is not None and len(content) == completion.usage.completion_tokens == 5
    assert "".join(entry.token for entry in content) == completion.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the most likely one
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert bytes(entry.bytes) == entry.token.encode()
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=8)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                           max_tokens=5, logprobs=2)
    choice = completion.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and len(logprobs.tokens) == 5
    assert "".join(logprobs.tokens) == choice.text
    assert all(value <= 0 for value in logprobs.token_logprobs)
    assert all(2 <= len(top) <= 3 and token in top for token, top in zip(logprobs.tokens, logprobs.top_logprobs,
                                                                        strict=True))
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(5)]


def test_stream_with_include_usage_ends_with_a_usage_chunk(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=6)
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                            max_tokens=6, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert chunks[-2].choices[0].finish_reason == "length"
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_penalties_change_a_repetitive_answer(client: openai.OpenAI) -> None:
    settings: dict[str, Any] = {"model": MODEL, "prompt": "one one one one one one", "temperature": 0,
                                "max_tokens": 12}
    plain = client.completions.create(**settings).choices[0].text
    assert plain.count("-to-many") == 3  # greedy: "-to-many-to-many-to-many"
    frequency = client.completions.create(**settings, frequency_penalty=2.0).choices[0].text
    repetition = client.completions.create(**settings, extra_body={"repetition_penalty": 2.0}).choices[0].text
    presence = client.completions.create(**settings, presence_penalty=2.0).choices[0].text
    for penalized in (frequency, repetition, presence):
        assert penalized.count("-to-many") < 3, penalized


def test_a_client_leaving_a_stream_of_two_choices_aborts_both(client: openai.OpenAI, server: ServerProcess) -> None:
    """Both choices' requests end (failures in the statistics) once the client leaves, long
    before their 1,000 tokens: told by the tokens the engine generated, not by how long it took."""
    stats_url = str(client.base_url).replace("/v1/", f"/v2/models/{MODEL}/stats")

    def failures() -> int:
        with urllib.request.urlopen(stats_url, timeout=10) as answer:
            stats = json.loads(answer.read())["model_stats"][0]
        return int(stats["inference_stats"]["fail"]["count"])

    def generated() -> float:
        return total(scrape(server.metrics_port), "nv_llm_generation_tokens", model=MODEL)

    before, generated_before = failures(), generated()
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=1000, n=2, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))  # generation has begun
    stream.close()
    deadline = time.monotonic() + 60  # a bound on the wait, never reached when things work
    while failures() < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failures() == before + 2
    tokens = generated() - generated_before
    assert tokens < 2000 / 2, f"{tokens:.0f} of the 2 x 1,000 tokens were generated for a client that left"


def test_content_as_text_parts_answers_as_the_same_text(client: openai.OpenAI) -> None:
    """Clients built for multimodal models send content as parts: text parts are that text."""
    as_text = _ask(client, stream=False).choices[0].message.content
    parts = [{**message, "content": [{"type": "text", "text": message["content"]}]} for message in QUESTION]
    as_parts = client.chat.completions.create(model=MODEL, messages=parts, temperature=0, max_tokens=20)
    assert as_parts.choices[0].message.content == as_text


def test_a_batch_of_prompts_answers_each_in_order(client: openai.OpenAI) -> None:
    prompts = ["The capital of France is", "Two plus two equals"]
    alone = [client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=5) for p in prompts]
    batch = client.completions.create(model=MODEL, prompt=prompts, temperature=0, max_tokens=5, n=2)
    assert [choice.index for choice in batch.choices] == [0, 1, 2, 3]
    assert [choice.text for choice in batch.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert batch.usage.prompt_tokens == sum(single.usage.prompt_tokens for single in alone)


def test_include_stop_str_in_output_keeps_the_stop_string(client: openai.OpenAI) -> None:
    whole = _ask(client, stream=False).choices[0].message.content
    assert "Paris" in whole
    expected = whole[: whole.index("Paris") + len("Paris")]
    for stream in (False, True):
        answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                                stop="Paris", stream=stream,
                                                extra_body={"include_stop_str_in_output": True})
        text = ("".join(c.choices[0].delta.content or "" for c in answer if c.choices) if stream
                else answer.choices[0].message.content)
        assert text == expected


def test_chat_template_controls_shape_the_prompt(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    """usage.prompt_tokens counts the prompt the backend rendered: without the generation prompt
    it is the template's text with add_generation_prompt false; continuing a final assistant
    message ends the prompt right after that message's text, and the answer carries on from it."""
    def prompt_tokens(messages: list[dict[str, str]], **extra: Any) -> int:
        answer = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=1,
                                                extra_body=extra)
        return answer.usage.prompt_tokens

    bare = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=False)
    assert prompt_tokens(QUESTION, add_generation_prompt=False) == len(tokenizer.encode(bare))
    assert prompt_tokens(QUESTION) == len(tokenizer.encode(tokenizer.apply_chat_template(QUESTION)))
    started = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    rendered = tokenizer.apply_chat_template(started, add_generation_prompt=False)
    continued = rendered[: rendered.rindex("is") + 2]
    assert prompt_tokens(started, add_generation_prompt=False, continue_final_message=True) == len(
        tokenizer.encode(continued))
    answer = client.chat.completions.create(model=MODEL, messages=started, temperature=0, max_tokens=5,
                                            extra_body={"add_generation_prompt": False,
                                                        "continue_final_message": True})
    assert "Paris" in answer.choices[0].message.content
    # chat_template_kwargs reach the template: a variable SmolLM2's template does not read changes nothing
    assert prompt_tokens(QUESTION, chat_template_kwargs={"enable_thinking": False}) == prompt_tokens(QUESTION)


def test_tokenize_gives_the_tokens_generation_sees(server: ServerProcess, tokenizer: Tokenizer) -> None:
    answer = post_json(server.url, "/tokenize", {"model": MODEL, "prompt": "The capital of France"})
    assert answer.status == 200, answer.body
    body = answer.json()
    assert body["tokens"] == tokenizer.encode("The capital of France") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] > body["count"] and body["token_strs"] is None
    strs = post_json(server.url, "/tokenize", {"model": MODEL, "prompt": "The capital of France",
                                               "return_token_strs": True}).json()["token_strs"]
    assert strs == ["The", "Ġcapital", "Ġof", "ĠFrance"]  # the vocabulary's entries (byte-level BPE), as vLLM
    chat = post_json(server.url, "/tokenize", {"model": MODEL, "messages": QUESTION}).json()
    assert chat["tokens"] == tokenizer.encode(tokenizer.apply_chat_template(QUESTION))
    bare = post_json(server.url, "/tokenize", {"model": MODEL, "messages": QUESTION, "add_generation_prompt": False})
    unprompted = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=False)
    assert bare.json()["tokens"] == tokenizer.encode(unprompted)


def test_detokenize_turns_the_tokens_back_into_the_text(server: ServerProcess, tokenizer: Tokenizer) -> None:
    prompt = tokenizer.apply_chat_template(QUESTION)
    tokens = post_json(server.url, "/tokenize", {"model": MODEL, "prompt": prompt}).json()["tokens"]
    answer = post_json(server.url, "/detokenize", {"model": MODEL, "tokens": tokens})
    assert answer.status == 200, answer.body
    assert answer.json() == {"prompt": prompt}  # special tokens (<|im_start|>) included, as vLLM


@pytest.mark.parametrize(("path", "document", "status", "message"), [
    ("/tokenize", {"model": "no-such-model", "prompt": "x"}, 404, "does not exist"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "messages": QUESTION}, 400, "either 'prompt' or 'messages'"),
    ("/tokenize", {"model": MODEL, "prompt": ["x"]}, 400, "'prompt' must be a string"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "add_special_tokens": True}, 400,
     "unknown field 'add_special_tokens'"),
    ("/tokenize", {"model": MODEL, "messages": QUESTION, "continue_final_message": True}, 400,
     "needs add_generation_prompt false"),
    ("/detokenize", {"model": MODEL, "tokens": [1, 10**9]}, 400, "token id 1000000000 is not in the vocabulary"),
    ("/detokenize", {"model": MODEL, "tokens": "1 2"}, 400, "'tokens' must be an array of token ids"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "return_token_strs": 1}, 400, "must be true or false"),
])
def test_tokenize_and_detokenize_refuse_bad_requests(server: ServerProcess, path: str, document: dict[str, Any],
                                                     status: int, message: str) -> None:
    answer = post_json(server.url, path, document)
    assert answer.status == status and message in answer.json()["error"]["message"]


def test_usage_reports_the_prompt_tokens_found_in_the_prefix_cache(client: openai.OpenAI) -> None:
    """The same long prompt twice: the second finds all its whole blocks in the prefix cache (the
    first may find the chat template's opening, which every chat shares)."""
    long = [{"role": "user", "content": "Name three rivers of Europe and say where each one rises. " * 6}]
    usages = [client.chat.completions.create(model=MODEL, messages=long, temperature=0, max_tokens=2).usage
              for _ in range(2)]
    first, second = (usage.prompt_tokens_details.cached_tokens for usage in usages)
    assert usages[0].prompt_tokens == usages[1].prompt_tokens > 64
    assert first < 32 < second < usages[1].prompt_tokens and usages[1].prompt_tokens - second <= 32
    chunks = list(client.chat.completions.create(model=MODEL, messages=long, temperature=0, max_tokens=2, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == usages[1].prompt_tokens_details.cached_tokens


def test_logit_bias_bans_and_forces_tokens(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=5,
                                           logprobs=True)
    first = tokenizer.encode(plain.choices[0].logprobs.content[0].token)[0]
    banned = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=5,
                                            logprobs=True, logit_bias={str(first): -100})
    assert tokenizer.encode(banned.choices[0].logprobs.content[0].token)[0] != first
    forced = tokenizer.encode(" river")[0]
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=1.0, max_tokens=3,
                                            logit_bias={str(forced): 100})
    assert answer.choices[0].message.content == tokenizer.decode([forced] * 3)


def test_a_prompt_given_as_token_ids_answers_as_its_text(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    prompt = tokenizer.apply_chat_template(QUESTION)
    ids = tokenizer.encode(prompt)
    as_text = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8)
    as_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=8)
    assert as_ids.choices[0].text == as_text.choices[0].text and "Paris" in as_ids.choices[0].text
    assert as_ids.usage.prompt_tokens == len(ids)
    batch = client.completions.create(model=MODEL, prompt=[ids, ids[:-3]], temperature=0, max_tokens=8)
    assert batch.choices[0].text == as_text.choices[0].text and len(batch.choices) == 2
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=[ids[0], 10**9], max_tokens=2)
    assert "prompt_token_ids: token id 1000000000 is not in the vocabulary" in caught.value.message


def test_each_choice_says_where_its_time_went(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=8)
    timings = answer.choices[0].model_extra["timings"]  # type: ignore[index]
    assert set(timings) == {"queue_ms", "prefill_ms", "decode_ms"} and min(timings.values()) >= 0
    assert timings["prefill_ms"] > 0 and timings["decode_ms"] > 0  # 8 tokens: a prefill, then 7 steps
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    finish = next(chunk.choices[0] for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason)
    assert set(finish.model_extra["timings"]) == {"queue_ms", "prefill_ms", "decode_ms"}  # type: ignore[index]


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(client: openai.OpenAI,
                                                                   tokenizer: Tokenizer) -> None:
    """lm-eval-harness' loglikelihood request: echo, logprobs 1, max_tokens 1, temperature 0; the
    prompt tokens' logprobs come first (the first null), then the generated token's."""
    prompt = "The capital of France is"
    ids = tokenizer.encode(prompt)
    answer = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=1,
                                       temperature=0)
    choice = answer.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert choice.text.startswith(prompt) and len(logprobs.tokens) == len(ids) + 1
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.token_logprobs[0] is None and all(v <= 0 for v in logprobs.token_logprobs[1:])
    assert logprobs.top_logprobs is not None and logprobs.top_logprobs[0] is None
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    # The same score two ways: the generated token's logprob, and its logprob as a prompt token.
    generated = logprobs.token_logprobs[-1]
    scored = client.completions.create(model=MODEL, prompt=[*ids, tokenizer.encode(choice.text[len(prompt):])[0]],
                                       echo=True, logprobs=0, max_tokens=1, temperature=0)
    scored_logprobs = scored.choices[0].logprobs
    assert scored_logprobs is not None and scored_logprobs.token_logprobs is not None
    assert scored.choices[0].text.startswith(choice.text)  # a token-id prompt is echoed as text
    assert abs(scored_logprobs.token_logprobs[len(ids)] - generated) < 1e-3
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=MODEL, prompt=prompt, echo=True, max_tokens=1, temperature=0, stream=True) if chunk.choices)
    assert streamed == choice.text
