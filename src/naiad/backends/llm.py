"""The "llm" backend: a language model served by naiad's own engine as a decoupled model.

Like Triton's vLLM backend: the input `text_input` is the raw prompt (no chat template is
applied here), the output `text_output` the generated text. Sampling settings come from
optional inputs or request parameters of the same names (`REQUEST_PARAMETERS`); any other
request parameter, besides those the server itself reads, is a 400. With `stream` true every
step's new text is its own response; otherwise (the default, so /generate gets one answer) one
response carries all of it. Either way a flags-only final response closes the request.

Stop strings (`stop`) are looked for in the detokenized text: the text from the first match on
is cut, the engine request aborted and the finish reason is "stop". While streaming, text that
could be the start of a stop string is held back until it is known not to be one.

Extra outputs, sent only when asked (`return_finish_reason`, `return_num_tokens`,
`return_logprobs` or `logprobs`, or by naming them as requested outputs) so that /generate
answers with text_output alone by default: `finish_reason` ("stop", "length" or "abort"; ""
before the end), `prompt_tokens` and `completion_tokens` (so far), and `logprobs` (a JSON array,
one entry per output token the response covers: {"id", "token", "logprob", "bytes", "top":
[{"id", "token", "logprob", "bytes"}, ...]}). Every response of a request carries the same
outputs (the builder needs each requested output in each response).

With the request parameter `apply_chat_template` true, `text_input` is instead a JSON array of
chat messages ({"role", "content"}) that the backend renders with its tokenizer's chat template
(generation prompt added). This is how the OpenAI frontend asks for a chat completion: frontends
may not import naiad.llm, and the template belongs to the model the backend loaded.

Config parameters: `model` (a Hugging Face directory, a `.gguf` file, a path relative to the
version directory, or "bundled:smollm2"), `dtype` (auto, fp32, bf16, fp16) and
`kv_cache_memory` (bytes). Each instance owns one engine stepping on its own thread.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, Model, ModelInstance, Outputs, RequestResult, ResponseSender
from naiad.errors import Cancelled, InternalError, InvalidArgument, NaiadError
from naiad.llm import gguf
from naiad.llm.engine import EngineConfig, LLMEngine
from naiad.llm.sampling_params import SamplingParams
from naiad.llm.sequence import FinishReason, Sequence, TokenLogprobs
from naiad.llm.tokenizer import IncrementalDetokenizer, Tokenizer
from naiad.types import InferRequest, RequestedOutput

log = logging.getLogger(__name__)

BUNDLED = {"bundled:smollm2": gguf.smollm2_path}
TEXT_INPUT, TEXT_OUTPUT = "text_input", "text_output"
FINISH_REASON, PROMPT_TOKENS, COMPLETION_TOKENS, LOGPROBS = "finish_reason", "prompt_tokens", "completion_tokens", \
    "logprobs"
#: the optional outputs auto-complete declares, and their types
EXTRA_OUTPUTS = {FINISH_REASON: mc.TYPE_STRING, PROMPT_TOKENS: mc.TYPE_INT32, COMPLETION_TOKENS: mc.TYPE_INT32,
                 LOGPROBS: mc.TYPE_STRING}
#: the request parameters (or optional inputs) this backend reads
REQUEST_PARAMETERS = frozenset({
    "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "ignore_eos", "stream", "apply_chat_template",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs", "stop", "stop_token_ids",
    "min_tokens", "return_finish_reason", "return_num_tokens", "return_logprobs",
})
#: request parameters the server itself reads and passes along; `id` is how /generate maps its
#: key, the `triton_` ones are Triton's reserved keys
CORE_PARAMETERS = frozenset({"id", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                             "binary_data_output", "headers"})
#: vLLM clamps -inf logprobs the same way, so that they stay JSON numbers
MIN_LOGPROB = -9999.0
DEFAULT_MAX_TOKENS = 16  # as vLLM and OpenAI's completions
#: send(outputs / error / None for a flags-only response, final) for one request
Send = Callable[[Outputs | Exception | None, bool], None]


class LLMModel(Model):
    backend_name = "llm"

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        """Fill the generate I/O and the decoupled policy when the config leaves them out."""
        if not config.HasField("model_transaction_policy"):
            config.model_transaction_policy.decoupled = True
        if not config.input:
            # Sampling settings stay request parameters (generate's extra JSON keys); a config
            # may still declare them as optional inputs of the same names.
            config.input.add(name=TEXT_INPUT, data_type=mc.TYPE_STRING, dims=[1])
        if not config.output:
            config.output.add(name=TEXT_OUTPUT, data_type=mc.TYPE_STRING, dims=[-1])
            for name, data_type in EXTRA_OUTPUTS.items():
                config.output.add(name=name, data_type=data_type, dims=[1])
        return False

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        if not self.config.model_transaction_policy.decoupled:
            raise InvalidArgument(f"model '{self.config.name}': the llm backend needs "
                                  "model_transaction_policy { decoupled: true }")
        return LLMInstance(self.engine_config(), self.config.name, {output.name for output in self.config.output})

    def engine_config(self) -> EngineConfig:
        """The engine settings from the config's `parameters` (every EngineConfig field but `model`
        by its own name: dtype, device, block_size, kv_cache_memory, max_num_seqs, ...)."""
        params = {key: value.string_value for key, value in self.config.parameters.items()}
        if "model" not in params:
            raise InvalidArgument(f"model '{self.config.name}': the llm backend needs a 'model' parameter")
        settings: dict[str, Any] = {"model": self._model_path(params["model"])}
        for name, kind in ENGINE_PARAMETERS.items():
            if name in params:
                settings[name] = _parameter(name, params[name], kind)
        return EngineConfig(**settings)

    def _model_path(self, model: str) -> Path:
        if model in BUNDLED:
            return BUNDLED[model]()
        path = Path(model)
        return path if path.is_absolute() else self.version_dir / path


#: the config parameters that set EngineConfig fields, and how each is read
ENGINE_PARAMETERS: dict[str, type] = {
    "dtype": str, "device": str, "block_size": int, "kv_cache_memory": int, "max_num_seqs": int,
    "max_num_batched_tokens": int, "max_model_len": int, "enable_prefix_caching": bool,
}


def _parameter(name: str, text: str, kind: type) -> Any:
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise InvalidArgument(f"parameter '{name}' must be true or false, got {text!r}")
        return text.lower() in ("true", "1")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise InvalidArgument(f"parameter '{name}' must be an integer, got {text!r}") from None
    return text


def load_tokenizer(model: Path) -> Tokenizer:
    """The tokenizer that comes with the engine's model (GGUF metadata or tokenizer.json)."""
    return Tokenizer.from_gguf(GGUFReader(model)) if gguf.is_gguf(model) else Tokenizer.from_dir(model)


class StopStrings:
    """Finds stop strings in text that arrives piece by piece.

    `push` returns the text that can go out and whether a stop string was found. Text from the
    first match on is dropped; without a match, the longest end of the text that could still
    become a stop string is held back (a match can then never start in text already out).
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.longest = max(map(len, stops))
        self.pending = ""

    def push(self, text: str, final: bool = False) -> tuple[str, bool]:
        buffer = self.pending + text
        self.pending = ""
        found = [index for index in (buffer.find(stop) for stop in self.stops) if index >= 0]
        if found:
            return buffer[: min(found)], True
        if not final:
            held = self._held(buffer)
            if held:
                self.pending = buffer[-held:]
                return buffer[:-held], False
        return buffer, False

    def _held(self, buffer: str) -> int:
        for size in range(min(len(buffer), self.longest - 1), 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0


@dataclass(slots=True)
class _Request:
    """One request between the backend's execute path and the engine thread."""

    send: Send
    cancelled: Callable[[], bool]
    prompt: list[int]
    max_tokens: int
    sampling_params: SamplingParams
    ignore_eos: bool
    stream: bool
    detokenizer: IncrementalDetokenizer
    stop: StopStrings | None = None
    returns: frozenset[str] = frozenset()  # the extra outputs its responses carry
    seq_id: str = ""
    sent_tokens: int = 0  # output tokens already pushed through the detokenizer
    text: list[str] = field(default_factory=list)  # held back until the end when not streaming
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # for the next response that goes out


class LLMInstance(ModelInstance):
    """One engine and the thread that steps it.

    It answers later (`start`): the core hands requests over and returns at once, and the
    engine thread sends every response. A plain `execute_decoupled` would not do, as the core
    closes requests still open when it returns.
    """

    answers_later = True
    gathers_inputs = False

    def __init__(self, config: EngineConfig, model_name: str, output_names: set[str] | None = None) -> None:
        self.model_name = model_name
        self.output_names = {TEXT_OUTPUT, *EXTRA_OUTPUTS} if output_names is None else output_names
        self._token_texts: dict[int, str] = {}
        self.engine = LLMEngine(config)
        self.tokenizer = load_tokenizer(Path(config.model))
        self._ids = itertools.count()
        self._incoming: list[_Request] = []
        self._active: dict[str, _Request] = {}  # by engine request id; only the engine thread uses it
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"llm-{model_name}", daemon=True)
        self._thread.start()

    def execute(self, batch: Batch) -> list[RequestResult]:
        raise InvalidArgument("the llm backend only serves decoupled models")

    def start(self, batch: Batch, send: ResponseSender, executed: Callable[[], None], blocking: bool = True) -> bool:
        """Validate each request and queue it for the engine thread; there is always room (the
        engine's scheduler queues what does not fit in a step)."""
        accepted = []
        for index, request in enumerate(batch.requests):
            try:
                accepted.append(self._parse(request, _sender(send, index), _canceller(batch, index)))
            except NaiadError as error:
                send(index, error, True)
        with self._wake:
            self._incoming.extend(accepted)
            self._wake.notify()
        executed()
        return True

    def set_on_room(self, callback: Callable[[], None]) -> None:
        """Never called back: `start` always takes its batch."""

    def is_ready(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------------- request parsing

    def _parse(self, request: InferRequest, send: Send,
               cancelled: Callable[[], bool]) -> _Request:
        """A request's prompt and settings; InvalidArgument before anything is scheduled."""
        check_parameters(request)
        values = RequestValues(request)
        text = values.text(TEXT_INPUT)
        if values.boolean("apply_chat_template", False):
            text = self._chat_prompt(text)
        prompt = self.tokenizer.encode(text)
        if not prompt:
            raise InvalidArgument("text_input is empty")
        max_tokens = values.integer("max_tokens", DEFAULT_MAX_TOKENS)
        if max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt) + max_tokens > self.engine.max_model_len:
            raise InvalidArgument(f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceeds "
                                  f"the model's context length ({self.engine.max_model_len})")
        min_tokens = values.integer("min_tokens", 0)
        if min_tokens > max_tokens:
            raise InvalidArgument(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})")
        returns = self._returns(request, values)
        logprobs = values.optional_integer("logprobs")
        if logprobs is None and LOGPROBS in returns:
            logprobs = 0
        sampling = SamplingParams(
            temperature=values.number("temperature", 1.0),
            top_k=values.integer("top_k", 0),
            top_p=values.number("top_p", 1.0),
            min_p=values.number("min_p", 0.0),
            seed=values.optional_integer("seed"),
            repetition_penalty=values.number("repetition_penalty", 1.0),
            presence_penalty=values.number("presence_penalty", 0.0),
            frequency_penalty=values.number("frequency_penalty", 0.0),
            logprobs=logprobs,
            min_tokens=min_tokens,
            stop_token_ids=tuple(values.integers("stop_token_ids")),
        )
        if logprobs is not None:
            returns |= {LOGPROBS} & self.output_names
        self._request_outputs(request, returns)
        stops = values.strings("stop")
        return _Request(send, cancelled, prompt, max_tokens, sampling, values.boolean("ignore_eos", False),
                        values.boolean("stream", False), self.tokenizer.detokenizer(),
                        StopStrings(stops) if stops else None, frozenset(returns))

    def _returns(self, request: InferRequest, values: RequestValues) -> set[str]:
        """The extra outputs the request asks for; one the config does not declare is a 400."""
        asked = set()
        if values.boolean("return_finish_reason", False):
            asked.add(FINISH_REASON)
        if values.boolean("return_num_tokens", False):
            asked |= {PROMPT_TOKENS, COMPLETION_TOKENS}
        if values.boolean("return_logprobs", False):
            asked.add(LOGPROBS)
        missing = sorted(asked - self.output_names)
        if missing:
            raise InvalidArgument(f"model '{self.model_name}' does not declare the output '{missing[0]}' "
                                  "(leave the config's outputs out to have them all)")
        if request.outputs is not None:
            asked |= {output.name for output in request.outputs} & set(EXTRA_OUTPUTS)
        return asked

    def _request_outputs(self, request: InferRequest, returns: set[str]) -> None:
        """Without requested outputs, the server expects every declared output in every
        response: name the ones this request's responses carry instead."""
        if request.outputs is not None:
            return
        binary = {"binary_data": True} if request.parameters.get("binary_data_output") is True else {}
        request.outputs = [RequestedOutput(name, dict(binary)) for name in [TEXT_OUTPUT, *sorted(returns)]]

    def _chat_prompt(self, messages_json: str) -> str:
        """The prompt for a JSON array of chat messages, rendered with the model's chat template."""
        try:
            messages = json.loads(messages_json)
        except ValueError:
            raise InvalidArgument("with apply_chat_template, text_input must be a JSON array of messages") from None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InvalidArgument("with apply_chat_template, text_input must be a JSON array of message objects")
        try:
            return self.tokenizer.apply_chat_template(messages)
        except ValueError as error:
            raise InvalidArgument(str(error)) from None

    # ------------------------------------------------------------------------- the engine thread

    def _loop(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._closed or self._incoming or self.engine.has_unfinished())
                if self._closed:
                    break
                incoming, self._incoming = self._incoming, []
            self._admit(incoming)
            self._abort_cancelled()
            if self.engine.has_unfinished():
                self._step()
        self._fail_all(Cancelled(f"model '{self.model_name}' was unloaded"))

    def _admit(self, requests: list[_Request]) -> None:
        for request in requests:
            try:
                request.seq_id = self.engine.add_request(
                    request.prompt, request.max_tokens, sampling_params=request.sampling_params,
                    request_id=f"llm-{next(self._ids)}", ignore_eos=request.ignore_eos,
                )
            except NaiadError as error:
                request.send(error, True)
                continue
            self._active[request.seq_id] = request

    def _abort_cancelled(self) -> None:
        """The client went away: free its sequence's KV blocks now rather than at max_tokens."""
        for seq_id, request in list(self._active.items()):
            if request.cancelled():
                self.engine.abort_request(seq_id)
                del self._active[seq_id]
                request.send(Cancelled("the request was cancelled"), True)

    def _step(self) -> None:
        try:
            finished = {seq.seq_id: seq for seq in self.engine.step()}
        except Exception as error:  # the engine failed: its requests cannot go on
            log.exception("model '%s': the engine step failed", self.model_name)
            self._fail_all(InternalError(f"the engine failed: {error}"))
            return
        for seq_id, request in list(self._active.items()):
            seq = finished.get(seq_id) or self.engine.scheduler.get(seq_id)
            if seq is not None and self._emit(request, seq, seq_id in finished):
                del self._active[seq_id]

    def _emit(self, request: _Request, seq: Sequence, done: bool) -> bool:
        """Send the text of the request's new tokens (or hold it back); close the request when
        its sequence finished or a stop string ended it. Returns whether it is closed."""
        tokens = seq.output_token_ids
        new = tokens[request.sent_tokens :]
        if seq.logprobs is not None and LOGPROBS in request.returns:
            request.logprobs.extend(self._logprobs_json(new, seq.logprobs[request.sent_tokens : len(tokens)]))
        request.sent_tokens = len(tokens)
        if done and seq.finish_reason is FinishReason.STOP and new:
            new = new[:-1]  # the end-of-sequence or stop token has no text (as vLLM)
        pieces = [request.detokenizer.push(token) for token in new]
        if done:
            pieces.append(request.detokenizer.flush())
        text = "".join(pieces)
        reason = seq.finish_reason if done else None
        if request.stop is not None:
            text, stopped = request.stop.push(text, final=done)
            if stopped:
                if not done:
                    self.engine.abort_request(seq.seq_id)
                done, reason = True, FinishReason.STOP
        if request.stream:
            if text or (done and request.returns):
                request.send(self._outputs(request, text, reason, seq), False)
        else:
            request.text.append(text)
            if done:
                request.send(self._outputs(request, "".join(request.text), reason, seq), False)
        if done:
            request.send(None, True)
        return done

    def _outputs(self, request: _Request, text: str, reason: FinishReason | None, seq: Sequence) -> Outputs:
        outputs = _text(text)
        returns = request.returns
        if not returns:
            return outputs
        if FINISH_REASON in returns:
            outputs[FINISH_REASON] = np.array([(reason.value if reason is not None else "").encode()], dtype=object)
        if PROMPT_TOKENS in returns:
            outputs[PROMPT_TOKENS] = np.array([seq.num_prompt_tokens], dtype=np.int32)
        if COMPLETION_TOKENS in returns:
            outputs[COMPLETION_TOKENS] = np.array([seq.num_output_tokens], dtype=np.int32)
        if LOGPROBS in returns:
            outputs[LOGPROBS] = np.array([json.dumps(request.logprobs).encode()], dtype=object)
            request.logprobs = []
        return outputs

    def _logprobs_json(self, tokens: list[int], logprobs: list[TokenLogprobs]) -> list[dict[str, Any]]:
        return [{**self._token_json(token, logprob), "top": [self._token_json(i, v) for i, v in zip(ids, values,
                                                                                                    strict=True)]}
                for token, (logprob, ids, values) in zip(tokens, logprobs, strict=True)]

    def _token_json(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"id": token_id, "token": text, "logprob": max(logprob, MIN_LOGPROB),
                "bytes": list(text.encode("utf-8"))}

    def _fail_all(self, error: NaiadError) -> None:
        for seq_id, request in self._active.items():
            self.engine.abort_request(seq_id)
            with contextlib.suppress(NaiadError):
                request.send(error, True)
        self._active.clear()
        with self._wake:
            incoming, self._incoming = self._incoming, []
        for request in incoming:
            request.send(error, True)


def _text(text: str) -> Outputs:
    return {TEXT_OUTPUT: np.array([text.encode("utf-8")], dtype=object)}


def _sender(send: ResponseSender, index: int) -> Send:
    return lambda result, final: send(index, result, final)


def _canceller(batch: Batch, index: int) -> Callable[[], bool]:
    return lambda: batch.is_cancelled(index)


def check_parameters(request: InferRequest) -> None:
    """An unknown request parameter is a 400, rather than a setting silently ignored."""
    for name in request.parameters:
        if name not in REQUEST_PARAMETERS and name not in CORE_PARAMETERS and not name.startswith("triton_"):
            raise InvalidArgument(f"unknown parameter '{name}'")


class RequestValues:
    """A request's settings by name: an input of that name, else a request parameter."""

    def __init__(self, request: InferRequest) -> None:
        self.inputs = {tensor.name: tensor.data for tensor in request.inputs}
        self.parameters = request.parameters

    def _get(self, name: str) -> Any:
        if name in self.inputs:
            data = np.asarray(self.inputs[name]).reshape(-1)
            if data.size != 1:
                raise InvalidArgument(f"input '{name}' must hold one element, got {data.size}")
            return data[0].item() if isinstance(data[0], np.generic) else data[0]
        return self.parameters.get(name)

    def text(self, name: str) -> str:
        value = self._get(name)
        if value is None:
            raise InvalidArgument(f"input '{name}' is required")
        if isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"input '{name}' is not valid UTF-8") from None
        if not isinstance(value, str):
            raise InvalidArgument(f"'{name}' must be a string")
        return value

    def integer(self, name: str, default: int) -> int:
        value = self.optional_integer(name)
        return default if value is None else value

    def optional_integer(self, name: str) -> int | None:
        value = self._get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidArgument(f"'{name}' must be an integer, got {value!r}")
        return value

    def number(self, name: str, default: float) -> float:
        value = self._get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArgument(f"'{name}' must be a number, got {value!r}")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidArgument(f"'{name}' must be true or false, got {value!r}")
        return value

    def strings(self, name: str) -> list[str]:
        """A string or a list of strings (a JSON array of strings, as request parameters hold
        no lists); [] when absent."""
        value = self._list(name)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise InvalidArgument(f"'{name}' must be a non-empty string or an array of non-empty strings")
        return value

    def integers(self, name: str) -> list[int]:
        """An integer or a list of integers (a JSON array); [] when absent."""
        value = self._list(name)
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise InvalidArgument(f"'{name}' must be an integer or an array of integers, got {value!r}")
        return value

    def _list(self, name: str) -> Any:
        value = self._get(name)
        if value is None:
            return []
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"'{name}' is not valid UTF-8") from None
        if isinstance(value, str) and value.startswith("["):
            try:
                decoded = json.loads(value)
            except ValueError:
                return value
            if isinstance(decoded, list):
                return decoded
        return value
