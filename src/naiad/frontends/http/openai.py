"""An OpenAI-compatible front door to "llm" models: `GET /v1/models`, `POST /v1/completions` and
`POST /v1/chat/completions`, enough for the `openai` Python client unmodified.

Each choice becomes one request to the model's `text_input` with sampling settings as request
parameters, as Triton's generate endpoint would send them; `n` choices are `n` requests run
together (with a seed, choice i uses seed + i, as vLLM). Chat messages go to the backend as a
JSON array with `apply_chat_template` set: the chat template belongs to the model, and frontends
may not import naiad.llm. The backend is asked for its finish reason, token counts and, when the
client wants them, logprobs (with the token strings: the tokenizer is the backend's), which make
`usage`, `finish_reason` and `logprobs` here. `stream: true` answers with server-sent events
`data: {...}` ending in `data: [DONE]`, chunks of the choices interleaved as they come, and with
`stream_options.include_usage` a last chunk with the usage. Each choice also says where its
request's time went, `timings: {"queue_ms", "prefill_ms", "decode_ms"}` (waiting for the engine
to batch it, until its first token, the rest; streamed: in its finish chunk, with include_usage).

A message's `content` may be an array of text parts (joined by newlines, as vLLM); `prompt` may be
an array of token ids, or an array of strings or of such arrays (choice `p * n + i` is the i-th of
prompt p's, as OpenAI orders them). vLLM's
`add_generation_prompt`, `continue_final_message`, `chat_template_kwargs` (chat) and
`include_stop_str_in_output` go to the backend, which renders the template. A model whose config
names a `reasoning_parser` answers chats with `reasoning_content` beside `content` (reasoning.py);
`/tokenize` and `/detokenize` are in openai_tokens.py; reading the backend's responses into
choices in openai_answers.py, the server-sent events in openai_sse.py.
Structured outputs (`response_format`, vLLM's `guided_*`) are read in openai_guided.py.
A completion with `echo` starts with its prompt (the backend's decoding of it: token-id prompts
too) and, with `logprobs`, the prompt tokens' logprobs first (the first token's null), as
lm-eval-harness' loglikelihood tasks read them.
Fields that would change the answer but are not supported (suffix, best_of > 1)
are a 400, as is any field this module does not know; the metadata fields clients commonly send
(user, metadata, store, ...) are accepted and ignored. Errors use OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from naiad.core.server import InferenceServer
from naiad.errors import InvalidArgument, NaiadError, NotFound
from naiad.frontends.http.openai_answers import Body, Choice, collect, openai_error, usage
from naiad.frontends.http.openai_guided import GUIDED_FIELDS, guided_parameters
from naiad.frontends.http.openai_sse import stream_reply
from naiad.frontends.http.openai_tasks import check_fields, embedding_models
from naiad.frontends.http.openai_tools import Tools, parse_tools
from naiad.frontends.http.reasoning import CONFIG_KEY as REASONING_KEY
from naiad.frontends.http.reasoning import ReasoningSplitter, thinks_first
from naiad.frontends.http.reply import Headers, Reply
from naiad.frontends.http.routes import Route
from naiad.frontends.http.tracing import carry_trace
from naiad.types import DataType, InferRequest, Tensor

LLM_BACKEND = "llm"
MAX_N = 128  # as OpenAI
MAX_CHOICES = 2048  # prompts x n in one completions call: each is a request to the model
MAX_STOP = 4  # stop strings, as OpenAI
MAX_LOGPROBS = 20  # as vLLM (OpenAI's completions allow 5, chat's top_logprobs 20)
# Fields read below, for both endpoints or one of them.
_COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n", "stop", "seed",
           "presence_penalty", "frequency_penalty", "logprobs", "logit_bias",
           # vLLM's extensions
           "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
           "include_stop_str_in_output", *GUIDED_FIELDS}
_COMPLETION_ONLY = {"prompt", "echo", "suffix", "best_of"}
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions",
              "function_call", "parallel_tool_calls",
              # vLLM's chat-template controls, rendered by the backend
              "add_generation_prompt", "continue_final_message", "chat_template_kwargs"}
# Accepted and ignored: they do not change the answer.
_IGNORED = {"user", "metadata", "store", "service_tier"}
# Passed to the backend as they are (it checks them and words the errors as through /generate).
_PASSED = ("top_p", "seed", "ignore_eos", "top_k", "min_p", "repetition_penalty", "presence_penalty",
           "frequency_penalty", "min_tokens")
_encoder = msgspec.json.Encoder()


# ---------------------------------------------------------------------------------------- handlers


async def models(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    """The LLM models, then the embedding models (`task` says which: naiad's field)."""
    generating = _llm_models(server)
    embedding = embedding_models(server)
    # An "llm" model that also pools is listed once, with both tasks.
    listed = [(name, "generate,embedding" if name in embedding else "generate") for name in generating]
    listed += [(name, "embedding") for name in embedding if name not in generating]
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "naiad", "task": task} for name, task in listed]
    return Reply(200, _encoder.encode({"object": "list", "data": data}))


async def completions(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return await _answer(server, body, headers, chat=False)


async def chat_completions(server: InferenceServer, route: Route, body: bytes, headers: Headers) -> Reply:
    return await _answer(server, body, headers, chat=True)


async def _answer(server: InferenceServer, body: bytes, headers: Headers, chat: bool) -> Reply:
    """Every OpenAI error leaves here in OpenAI's shape, not Triton's."""
    try:
        document = parse_body(body)
        await server.loaded(document.get("model"))  # a model that loads on demand, before it is looked up
        call = _Call.parse(server, document, chat)
        for request in call.requests:
            carry_trace(server, request, headers)
        if call.stream:
            return await stream_reply(server, call)
        choices = await asyncio.gather(*(collect(server, request) for request in call.requests))
        return Reply(200, _encoder.encode(call.completion(choices)))
    except NaiadError as error:
        return openai_error(error)


# ------------------------------------------------------------------------------------- requests


def _llm_models(server: InferenceServer) -> list[str]:
    names = sorted({entry["name"] for entry in server.repository_index(ready_only=True)})
    return [name for name in names if server.model_config_message(name, None).backend == LLM_BACKEND]


def parse_body(body: bytes) -> Body:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
        raise InvalidArgument(f"the request body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return document


@dataclass(slots=True)
class _Call:
    """One API call: its settings and the backend requests of its choices."""

    model: str
    chat: bool
    stream: bool
    include_usage: bool
    logprobs: int | None  # top alternatives per token; None when the client wants no logprobs
    requests: list[InferRequest]
    ident: str = ""
    created: int = 0
    n: int = 1  # choices per prompt
    thinks_first: bool | None = None  # with a reasoning parser: whether answers start as reasoning
    tools: Tools | None = None  # function calling (openai_tools.py)

    @classmethod
    def parse(cls, server: InferenceServer, body: Body, chat: bool) -> _Call:
        model = llm_model(server, body.get("model"))
        _check_fields(body, chat)
        stream = _boolean(body, "stream")
        options = body.get("stream_options")
        if options is not None and not stream:
            raise InvalidArgument("'stream_options' is only allowed with 'stream' true")
        if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
            raise InvalidArgument("'stream_options' supports only 'include_usage'")
        include_usage = bool(options and options.get("include_usage"))
        n = body.get("n")
        n = 1 if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise InvalidArgument(f"'n' must be an integer from 1 to {MAX_N}, got {n!r}")
        logprobs = _chat_logprobs(body) if chat else _completion_logprobs(body)
        texts = [messages_json(body.get("messages"))] if chat else _prompts(body.get("prompt"))
        if len(texts) * n > MAX_CHOICES:
            raise InvalidArgument(f"{len(texts)} prompts x n={n} is more than {MAX_CHOICES} choices in one call")
        parameters = _sampling(body)
        # A stream reports its token counts only in the usage chunk: not asked, not sent.
        parameters.update(stream=stream, return_finish_reason=True, return_num_tokens=not stream or include_usage)
        tools = parse_tools(body) if chat else None
        if chat:
            parameters["apply_chat_template"] = True
            parameters.update(template_controls(body))
        if tools is not None:
            tool_parameters = tools.backend_parameters()
            if tools.forced is not None and any(key.startswith("guided_") for key in parameters):
                raise InvalidArgument("tool_choice required or a named function goes with no response_format "
                                      "or guided_* field")
            parameters.update(tool_parameters)
        if logprobs is not None:
            parameters["logprobs"] = logprobs
        if not chat and _boolean(body, "echo"):
            parameters["echo"] = True
            if logprobs is not None:
                parameters["prompt_logprobs"] = logprobs
        requests = []  # choice p * n + i is the i-th of prompt p's, as OpenAI orders them
        for prompt in texts:
            for index in range(n):
                choice_parameters = dict(parameters)
                if "seed" in parameters and index:
                    choice_parameters["seed"] = parameters["seed"] + index
                if isinstance(prompt, list):  # token ids: the backend takes them as they are
                    choice_parameters["prompt_token_ids"] = json.dumps(prompt)
                    prompt_input = text_input("")
                else:
                    prompt_input = text_input(prompt)
                requests.append(InferRequest(model, None, [prompt_input], parameters=choice_parameters))
        return cls(model, chat, stream, include_usage, logprobs, requests, _new_id(chat), int(time.time()), n,
                   _reasoning(server, model) if chat else None, tools)

    # -- answers

    def completion(self, choices: list[Choice]) -> Body:
        body = self._envelope("chat.completion" if self.chat else "text_completion")
        body["choices"] = [self._choice(index, choice) for index, choice in enumerate(choices)]
        body["usage"] = usage(choices, self.n)
        return body

    def _choice(self, index: int, choice: Choice) -> Body:
        body: Body = {"index": index, "finish_reason": choice.finish_reason or "stop",
                      "logprobs": self._logprobs(choice.logprobs, 0) if self.logprobs is not None else None}
        if choice.timings is not None:
            body["timings"] = choice.timings
        if self.chat:
            message: Body = {"role": "assistant", "content": choice.text}
            if self.thinks_first is not None:
                reasoning, content = ReasoningSplitter(self.thinks_first).push(choice.text, final=True)
                message.update(content=content, reasoning_content=reasoning or None)
            if self.tools is not None:
                message["content"], calls = self.tools.split(message["content"])
                if calls:
                    message["tool_calls"] = calls
                    body["finish_reason"] = "tool_calls"
            body["message"] = message
        else:
            body["text"] = choice.text
        return body

    def chunk(self, index: int, text: str, logprobs: list[Body], offset: int,
              finish_reason: str | None = None, reasoning: str = "", timings: Body | None = None) -> Body:
        choice: Body = {"index": index, "finish_reason": finish_reason,
                        "logprobs": self._logprobs(logprobs, offset) if logprobs and self.logprobs is not None
                        else None}
        if timings is not None:
            choice["timings"] = timings
        if self.chat:
            delta: Body = {"role": "assistant"}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if text or not reasoning:
                delta["content"] = text
            choice["delta"] = {} if finish_reason is not None else delta
        else:
            choice["text"] = text
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = [choice]
        return body

    def tool_calls_chunk(self, index: int, content: str | None, calls: list[Body]) -> Body:
        """A choice's calls (and the text around them), once its answer is complete."""
        delta: Body = {"role": "assistant", "content": content,
                       "tool_calls": [{"index": position, **tool_call} for position, tool_call in enumerate(calls)]}
        body = self._envelope("chat.completion.chunk")
        body["choices"] = [{"index": index, "finish_reason": None, "logprobs": None, "delta": delta}]
        return body

    def usage_chunk(self, choices: list[Choice]) -> Body:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(choices, self.n)
        return body

    def _envelope(self, kind: str) -> Body:
        return {"id": self.ident, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, entries: list[Body], offset: int) -> Body:
        """The backend's per-token entries in OpenAI's shape: chat's `content` list, or the
        completions' parallel lists (`top_logprobs` holds the sampled token too, as vLLM)."""
        if self.chat:
            return {"content": [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
                                 "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                                                  for t in e["top"]]} for e in entries]}
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry["token"])
        # (a prompt's first token, echoed, has no logprob: null, and no alternatives)
        top = [None if e["logprob"] is None else {**{t["token"]: t["logprob"] for t in e["top"]},
                                                  e["token"]: e["logprob"]} for e in entries]
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": top, "text_offset": offsets}


def _reasoning(server: InferenceServer, model: str) -> bool | None:
    """With the model's `reasoning_parser` (config parameter): whether its answers start as
    reasoning; None without one."""
    parameters = server.model_config_message(model, None).parameters
    return thinks_first(parameters[REASONING_KEY].string_value) if REASONING_KEY in parameters else None


def llm_model(server: InferenceServer, model: Any) -> str:
    """The request's `model`, when it names a ready "llm" model; OpenAI's 404 otherwise."""
    if not isinstance(model, str) or not model:
        raise InvalidArgument("'model' must be a model name")
    # Only "llm" models take text_input with sampling parameters; any other is unknown here.
    if model not in _llm_models(server):
        raise NotFound(f"The model '{model}' does not exist")
    return model


def _check_fields(body: Body, chat: bool) -> None:
    check_fields(body, _COMMON | _IGNORED | (_CHAT_ONLY if chat else _COMPLETION_ONLY))
    refused = [
        ("functions", bool(body.get("functions")), "functions (the deprecated function calling: use tools)"),
        ("function_call", body.get("function_call") not in (None, "none", "auto"),
         "function_call (the deprecated function calling: use tool_choice)"),
        ("suffix", bool(body.get("suffix")), "suffix"),
        ("best_of", body.get("best_of") not in (None, 1), "best_of other than 1"),
    ]
    for key, unsupported, what in refused:
        if unsupported:
            raise InvalidArgument(f"'{key}': {what} is not supported by this server")


def _boolean(body: Body, key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidArgument(f"'{key}' must be true or false, got {value!r}")
    return value


def _completion_logprobs(body: Body) -> int | None:
    logprobs = body.get("logprobs")
    if logprobs is None:
        return None
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_LOGPROBS:
        raise InvalidArgument(f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS}, got {logprobs!r}")
    return logprobs


def _chat_logprobs(body: Body) -> int | None:
    wanted = _boolean(body, "logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS:
            raise InvalidArgument(f"'top_logprobs' must be an integer from 0 to {MAX_LOGPROBS}, got {top!r}")
        if not wanted:
            raise InvalidArgument("'top_logprobs' needs 'logprobs' true")
    return (top or 0) if wanted else None


def _prompts(prompt: Any) -> list[str] | list[list[int]]:
    """A string or an array of token ids, or an array of either (a batch: each prompt gets its
    `n` choices), as vLLM reads `prompt`."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return prompt
    if _token_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(_token_ids(p) for p in prompt):
        return prompt
    raise InvalidArgument("'prompt' must be a string, an array of token ids, or a non-empty array of either")


def _token_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value))


def messages_json(messages: Any) -> str:
    """Chat `messages` as the JSON array the backend renders with its chat template."""
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("'messages' must be a non-empty array")
    texts = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidArgument("each message needs a string 'role' and a 'content'")
        entry: Body = {"role": message["role"]}
        calls = message.get("tool_calls")
        if calls is not None:  # an assistant's earlier calls: its content may be null
            entry["tool_calls"] = _tool_calls(calls, index, message["role"])
            entry["content"] = None if message.get("content") is None else _content(message["content"], index)
        else:
            entry["content"] = _content(message.get("content"), index)
        if message["role"] == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise InvalidArgument(f"'messages[{index}]': a tool message needs a string 'tool_call_id'")
            entry["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        texts.append(entry)
    return json.dumps(texts)


def _tool_calls(calls: Any, index: int, role: str) -> list[Body]:
    if role != "assistant" or not isinstance(calls, list):
        raise InvalidArgument(f"'messages[{index}].tool_calls' must be an array, on an assistant's message")
    checked = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)):
            raise InvalidArgument(f"'messages[{index}].tool_calls': each call needs a 'function' with a string "
                                  "'name' and 'arguments'")
        checked.append({"id": call.get("id"), "type": "function",
                        "function": {"name": function["name"], "arguments": function["arguments"]}})
    return checked


def _content(content: Any, index: int) -> str:
    """A message's content: a string, or an array of text parts (joined by newlines, as vLLM)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise InvalidArgument(f"'messages[{index}].content' must be a string or a non-empty array of parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            shown = kind if isinstance(kind, str) else type(part).__name__
            raise InvalidArgument(f"'messages[{index}].content': parts of type '{shown}' are not supported by "
                                  "this server (text parts only)")
        if not isinstance(part.get("text"), str):
            raise InvalidArgument(f"'messages[{index}].content': a text part needs a string 'text'")
        texts.append(part["text"])
    return "\n".join(texts)


def _sampling(body: Body) -> dict[str, Any]:
    """The backend's sampling parameters; OpenAI's ranges are checked here, the backend checks
    the rest (so the messages stay the same as through /generate)."""
    parameters: dict[str, Any] = {}
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise InvalidArgument(f"'temperature' must be a number between 0 and 2, got {temperature!r}")
        parameters["temperature"] = float(temperature)
    for key in ("max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            parameters["max_tokens"] = body[key]
    for key in _PASSED:
        if body.get(key) is not None:
            parameters[key] = body[key]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
            raise InvalidArgument(f"'stop' must be a non-empty string or an array of up to {MAX_STOP} of them")
        if stops:
            parameters["stop"] = json.dumps(stops)  # request parameters hold no lists
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise InvalidArgument("'logit_bias' must be an object of token ids to numbers from -100 to 100")
        if bias:
            parameters["logit_bias"] = json.dumps(bias)  # the backend checks the ids and the values
    if body.get("include_stop_str_in_output") is not None:
        parameters["include_stop_str_in_output"] = _boolean(body, "include_stop_str_in_output")
    stop_token_ids = body.get("stop_token_ids")
    if stop_token_ids:
        if not isinstance(stop_token_ids, list):
            raise InvalidArgument("'stop_token_ids' must be an array of token ids")
        parameters["stop_token_ids"] = json.dumps(stop_token_ids)
    parameters.update(guided_parameters(body))
    return parameters


def template_controls(body: Body) -> dict[str, Any]:
    """vLLM's chat-template fields as the backend's parameters (it checks how they combine)."""
    parameters: dict[str, Any] = {}
    for key in ("add_generation_prompt", "continue_final_message"):
        if body.get(key) is not None:
            parameters[key] = _boolean(body, key)
    variables = body.get("chat_template_kwargs")
    if variables is not None:
        if not isinstance(variables, dict):
            raise InvalidArgument("'chat_template_kwargs' must be an object")
        parameters["chat_template_kwargs"] = json.dumps(variables)  # request parameters hold no objects
    return parameters


def text_input(text: str) -> Tensor:
    """The backend's `text_input` tensor holding `text`."""
    data = np.array([text.encode("utf-8")], dtype=object)
    return Tensor("text_input", DataType.BYTES, (1,), data)


# ------------------------------------------------------------------------------------ responses


def _new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
