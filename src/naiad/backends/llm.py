"""The "llm" backend: a language model served by naiad's own engine as a decoupled model.

Like Triton's vLLM backend: the input `text_input` is the raw prompt (no chat template is
applied here), the output `text_output` the generated text. Sampling settings come from
optional inputs or request parameters of the same names (`llm_request.REQUEST_PARAMETERS`); any other
request parameter, besides those the server itself reads, is a 400. With `stream` true every
step's new text is its own response; otherwise (the default, so /generate gets one answer) one
response carries all of it. Either way a flags-only final response closes the request.

Stop strings (`stop`) are looked for in the detokenized text: the text from the first match on
is cut, the engine request aborted and the finish reason is "stop". While streaming, text that
could be the start of a stop string is held back until it is known not to be one.

Extra outputs, sent only when asked (`return_finish_reason`, `return_num_tokens`,
`return_logprobs` or `logprobs`, or by naming them as requested outputs) so that /generate
answers with text_output alone by default: `finish_reason` ("stop", "length" or "abort"; ""
before the end), `prompt_tokens` (with the response parameter `cached_tokens`: how many of them
the prefix cache held, and on the last response `queue_ms`, `prefill_ms` and `decode_ms`: where
the request's time went) and `completion_tokens` (so far), and `logprobs` (a JSON array,
one entry per output token the response covers: {"id", "token", "logprob", "bytes", "top":
[{"id", "token", "logprob", "bytes"}, ...]}). Every response of a request carries the same
outputs (the builder needs each requested output in each response).

With the request parameter `apply_chat_template` true, `text_input` is instead a JSON array of
chat messages ({"role", "content"}) that the backend renders with its tokenizer's chat template
(generation prompt added). This is how the OpenAI frontend asks for a chat completion: frontends
may not import naiad.llm, and the template belongs to the model the backend loaded. vLLM's
controls apply then: `add_generation_prompt` (default true), `continue_final_message` (the prompt
ends inside the last message, an assistant's, so the model continues it; needs
`add_generation_prompt` false), and `chat_template_kwargs` (a JSON object of extra template
variables, e.g. Qwen3's `enable_thinking`). `include_stop_str_in_output` keeps the stop string
that ended the text. A request with `tokenize` (the prompt, template included, to the token ids
generation would see) or `detokenize` (`token_ids` to text) is answered at once by the tokenizer,
the ids and `max_model_len` in the response's parameters (vLLM's /tokenize and /detokenize).

Config parameters: `model` (a Hugging Face directory, a `.gguf` file, a path relative to the
version directory, or "bundled:smollm2"), the engine's settings by their EngineConfig names
(`ENGINE_PARAMETERS`: dtype, device, kv_cache_memory or kv_cache_fraction, max_num_seqs, ...),
and `engine_process` (default true). Each instance owns one engine core, in a process of its
own (`naiad.llm.engine.engine_core`) unless `engine_process` is false (then on a thread); a core that
dies fails its open requests, and the instance is not ready (requests get a 503 saying why)
until `llm_supervisor` has started a new one: `engine_restart_limit` attempts in a row at most
(default 5; 0: never), the first after `engine_restart_backoff` seconds (default 1), doubling.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch, BatchSender, ExecutionTimes, Model, ModelInstance, Outputs, ParameterizedOutputs
from naiad.backends.llm_metrics import LLMMetrics
from naiad.backends.llm_prompt import chat_prompt
from naiad.backends.llm_request import RequestValues, StopStrings, check_parameters, guide
from naiad.backends.llm_settings import ENGINE_PARAMETERS, PLACEMENT_SETTINGS, config_parameter, model_path
from naiad.backends.llm_supervisor import EngineSupervisor, RestartPolicy
from naiad.channel import Watch
from naiad.errors import Cancelled, InternalError, InvalidArgument, NaiadError, Unavailable
from naiad.llm.engine.engine_core import (
    AddRequest,
    CoreMessage,
    EngineFailed,
    RequestOutput,
    RequestRejected,
    StepOutputs,
)
from naiad.llm.engine.llm_engine import EngineConfig
from naiad.llm.engine.sampling_params import SamplingParams
from naiad.llm.engine.sequence import FinishReason, TokenLogprobs
from naiad.llm.loading.loader import load_tokenizer, read_args
from naiad.llm.loading.tokenizer import IncrementalDetokenizer
from naiad.observability.metrics import MetricRow
from naiad.types import InferRequest, RequestedOutput

log = logging.getLogger(__name__)

TEXT_INPUT, TEXT_OUTPUT = "text_input", "text_output"
FINISH_REASON, PROMPT_TOKENS, COMPLETION_TOKENS, LOGPROBS = "finish_reason", "prompt_tokens", "completion_tokens", \
    "logprobs"
#: the optional outputs auto-complete declares, and their types
EXTRA_OUTPUTS = {FINISH_REASON: mc.TYPE_STRING, PROMPT_TOKENS: mc.TYPE_INT32, COMPLETION_TOKENS: mc.TYPE_INT32,
                 LOGPROBS: mc.TYPE_STRING}
#: vLLM clamps -inf logprobs the same way, so that they stay JSON numbers
MIN_LOGPROB = -9999.0
#: the config parameter ("last" or "mean") that makes the model serve embeddings too, in the
#: output EMBEDDING (the request parameter of the same name asks for one)
POOLING, EMBEDDING = "pooling", "embedding"
DEFAULT_MAX_TOKENS = 16  # as vLLM and OpenAI's completions
#: send(outputs / error / None for a flags-only response, final) for one request
Send = Callable[[Outputs | Exception | None, bool], None]


class LLMModel(Model):
    backend_name = "llm"

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, version_dir: Path, options: Mapping[str, Any]) -> bool:
        """Fill the generate I/O, the decoupled policy and the placement settings (from
        --backend-config=llm,...) when the config leaves them out."""
        backend_config: Mapping[str, str] = options.get("backend_config", {})
        for name in PLACEMENT_SETTINGS:
            if name in backend_config and name not in config.parameters:
                config.parameters[name].string_value = backend_config[name]
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
        if POOLING in config.parameters and not any(output.name == EMBEDDING for output in config.output):
            # An embedding model too (its vectors: the final hidden state, `hidden_size` long).
            pooling = config.parameters[POOLING].string_value
            if pooling not in ("last", "mean"):
                raise InvalidArgument(f"model '{config.name}': parameter 'pooling' must be last or mean, "
                                      f"got {pooling!r}")
            model = config.parameters["model"].string_value if "model" in config.parameters else ""
            if model:
                size = read_args(model_path(model, version_dir)).hidden_size
                config.output.add(name=EMBEDDING, data_type=mc.TYPE_FP32, dims=[size])
        return False

    def create_instance(self, group: mc.ModelInstanceGroup, index: int) -> ModelInstance:
        if not self.config.model_transaction_policy.decoupled:
            raise InvalidArgument(f"model '{self.config.name}': the llm backend needs "
                                  "model_transaction_policy { decoupled: true }")
        params = {key: value.string_value for key, value in self.config.parameters.items()}
        engine_process = config_parameter("engine_process", params.get("engine_process", "true"), bool)
        return LLMInstance(self.engine_config(group, index), self.config.name,
                           {output.name for output in self.config.output}, engine_process=engine_process,
                           instance_label=f"{group.name or self.config.name}_{index}",
                           restart_policy=self.restart_policy(),
                           watch=self.host.watch if self.host is not None else None,
                           watch_writable=self.host.watch_writable if self.host is not None else None)

    def restart_policy(self) -> RestartPolicy:
        """How a dead engine core is restarted (`engine_restart_limit`, `engine_restart_backoff`)."""
        params = {key: value.string_value for key, value in self.config.parameters.items()}
        default = RestartPolicy()
        limit = config_parameter("engine_restart_limit", params.get("engine_restart_limit", str(default.limit)), int)
        backoff = config_parameter("engine_restart_backoff", params.get("engine_restart_backoff", str(default.backoff)),
                             float)
        try:
            return RestartPolicy(limit=limit, backoff=backoff)
        except ValueError as error:
            raise InvalidArgument(f"model '{self.config.name}': {error}") from None

    def engine_config(self, group: mc.ModelInstanceGroup | None = None, index: int = 0) -> EngineConfig:
        """The engine settings from the config's `parameters` (every EngineConfig field but `model`
        by its own name: dtype, device, block_size, kv_cache_memory, max_num_seqs, ...).

        Without a `device` parameter, a KIND_GPU instance runs on its group's GPU (as Triton
        spreads a group's instances over its `gpus`), any other on the CPU."""
        params = {key: value.string_value for key, value in self.config.parameters.items()}
        if "model" not in params:
            raise InvalidArgument(f"model '{self.config.name}': the llm backend needs a 'model' parameter")
        settings: dict[str, Any] = {"model": self._model_path(params["model"])}
        for name, kind in ENGINE_PARAMETERS.items():
            if name in params:
                settings[name] = config_parameter(name, params[name], kind)
        if "device" not in settings and group is not None and group.kind == mc.ModelInstanceGroup.KIND_GPU:
            settings["device"] = f"cuda:{group.gpus[index % len(group.gpus)] if group.gpus else 0}"
        return EngineConfig(**settings)

    def _model_path(self, model: str) -> Path:
        return model_path(model, self.version_dir)


@dataclass(slots=True)
class _Request:
    """One request between the backend's execute path and the engine core's outputs."""

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
    arrival: float = 0.0  # time.monotonic() when handed to the engine
    last_token_at: float | None = None  # when its latest tokens arrived (None: none yet)
    first_token_at: float | None = None
    embedding: list[float] | None = None  # an embedding request's vector, once pooled
    prompt_extras: dict[str, Any] | None = None  # response parameters for the next response out
    scheduled_at: float = 0.0  # when the engine first batched it (the engine's clock is this one)


class LLMInstance(ModelInstance):
    """One engine core (its own process unless `engine_process` is False) and its client.

    `submit` hands requests over and returns at once; every response is sent as the engine
    core's step outputs arrive, read by the server's event loop (or, without one, by the
    client's reader thread).
    """

    depth = 1 << 30  # the engine core queues what does not fit in a step

    def __init__(self, config: EngineConfig, model_name: str, output_names: set[str] | None = None,
                 engine_process: bool = True, instance_label: str = "0",
                 restart_policy: RestartPolicy | None = None, watch: Watch | None = None,
                 watch_writable: Watch | None = None) -> None:
        self.model_name = model_name
        self.output_names = {TEXT_OUTPUT, *EXTRA_OUTPUTS} if output_names is None else output_names
        self._token_texts: dict[int, str] = {}
        self.tokenizer = load_tokenizer(Path(config.model))
        self._ids = itertools.count()
        self._active: dict[str, _Request] = {}  # by engine request id
        self._lock = threading.Lock()  # guards _active: submit adds, the outputs' reader removes
        self.metrics_state = LLMMetrics(instance_label)
        try:
            self.engine = EngineSupervisor(config, self._on_message, model_name=model_name,
                                           in_process=not engine_process, policy=restart_policy, watch=watch,
                                           watch_writable=watch_writable)
        except RuntimeError as error:
            raise InvalidArgument(f"model '{model_name}': {error}") from None
        self.max_model_len = self.engine.info.max_model_len  # a restarted core has the same config
        self.vocab_size = self.engine.info.vocab_size  # the logits' width
        self._kv_on_host = not str(config.device).startswith("cuda")

    def submit(self, batch: Batch, sender: BatchSender) -> bool:
        """Validate each request and hand it to the engine core; there is always room (the
        engine's scheduler queues what does not fit in a step). The batch's execution is that
        hand-over (parsing and tokenizing the prompts is its compute_input): the tokens stream
        back as the engine core's outputs are read."""
        start = time.monotonic_ns()
        parsing_ns = 0
        for index, request in enumerate(batch.requests):
            began = time.monotonic_ns()
            try:
                answer = self._tokens_answer(request)
                if answer is not None:  # /tokenize, /detokenize: the tokenizer's, no generation
                    sender.send(index, answer, False)
                    sender.send(index, None, True)
                    continue
                parsed = self._parse(request, _sender(sender, index), _canceller(batch, index))
            except NaiadError as error:
                sender.send(index, error, True)
                continue
            finally:
                parsing_ns += time.monotonic_ns() - began
            parsed.seq_id = f"llm-{next(self._ids)}"
            parsed.arrival = time.monotonic()
            self.metrics_state.add_prompt(len(parsed.prompt))
            with self._lock:
                self._active[parsed.seq_id] = parsed
            try:
                self.engine.add(AddRequest(parsed.seq_id, parsed.prompt, parsed.max_tokens, parsed.sampling_params,
                                           parsed.ignore_eos))
            except RuntimeError as error:  # no core now (restarting, or given up): a client may retry
                with self._lock:
                    self._active.pop(parsed.seq_id, None)
                sender.send(index, Unavailable(f"model '{self.model_name}' is not ready: {error}"), True)
        end = time.monotonic_ns()
        sender.executed(ExecutionTimes(start, start + parsing_ns, end, end))
        return True

    def is_ready(self) -> bool:
        return self.engine.is_ready()

    def not_ready_reason(self) -> str:
        """Why the instance does not serve now ("" when it does): for the repository index."""
        return self.engine.not_ready_reason()

    def host_bytes_reserved(self) -> int:
        """The KV cache, when it lives in host memory (zeroed pages count once written)."""
        return self.engine.info.kv_cache_bytes if self._kv_on_host else 0

    def metrics(self) -> list[MetricRow]:
        self.metrics_state.engine_restarts = self.engine.restarts
        return self.metrics_state.rows()

    def close(self) -> None:
        with self._lock:
            active, self._active = self._active, {}
        for request in active.values():
            with contextlib.suppress(NaiadError):
                request.send(Cancelled(f"model '{self.model_name}' was unloaded"), True)
        self.engine.close()

    # ------------------------------------------------------------------------- request parsing

    def _parse(self, request: InferRequest, send: Send,
               cancelled: Callable[[], bool]) -> _Request:
        """A request's prompt and settings; InvalidArgument before anything is scheduled."""
        check_parameters(request)
        values = RequestValues(request)
        text = values.text(TEXT_INPUT)
        prompt = values.integers("prompt_token_ids")
        if prompt:  # a prompt given as token ids (OpenAI's completions allow it), taken as it is
            if text or values.boolean("apply_chat_template", False):
                raise InvalidArgument("prompt_token_ids goes with an empty text_input and no chat template")
            self._check_vocabulary(prompt, "prompt_token_ids")
        else:
            if values.boolean("apply_chat_template", False):
                text = chat_prompt(self.tokenizer, text, values)
            prompt = self.tokenizer.encode(text)
        if not prompt:
            raise InvalidArgument("text_input is empty")
        max_tokens = values.integer("max_tokens", DEFAULT_MAX_TOKENS)
        pooling = values.parameters.get(POOLING)
        if pooling is not None and EMBEDDING not in self.output_names:
            raise InvalidArgument(f"model '{self.model_name}' serves no embeddings (its config sets no "
                                  "'pooling' parameter)")
        if max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be at least 1, got {max_tokens}")
        if pooling is None and len(prompt) + max_tokens > self.max_model_len:
            raise InvalidArgument(f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceeds "
                                  f"the model's context length ({self.max_model_len})")
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
            logit_bias=self._logit_bias(values),
            guide=guide(values),
            prompt_logprobs=values.optional_integer("prompt_logprobs"),
            pooling=pooling,
        )
        if pooling is not None:
            returns.add(EMBEDDING)
        if logprobs is not None:
            returns |= {LOGPROBS} & self.output_names
        self._request_outputs(request, returns)
        stops = values.strings("stop")
        parsed = _Request(send, cancelled, prompt, max_tokens, sampling, values.boolean("ignore_eos", False),
                          values.boolean("stream", False), self.tokenizer.detokenizer(),
                          StopStrings(stops, values.boolean("include_stop_str_in_output", False)) if stops else None,
                          frozenset(returns))
        if values.boolean("echo", False):  # the first response carries the prompt's text
            parsed.prompt_extras = {"prompt_text": self.tokenizer.decode(prompt, skip_special_tokens=False)}
        return parsed

    def _tokens_answer(self, request: InferRequest) -> Outputs | None:
        """For `tokenize` (the prompt's token ids, as generation would encode it: chat template
        and its controls included) or `detokenize` (`token_ids` to text), the answer at once:
        `text_output` holds the prompt text or the decoded text, the response parameters
        `token_ids` (a JSON array) and `max_model_len`. None for a generation request."""
        parameters = request.parameters
        if parameters.get("tokenize") is None and parameters.get("detokenize") is None:
            return None
        check_parameters(request)
        values = RequestValues(request)
        tokenize, detokenize = values.boolean("tokenize", False), values.boolean("detokenize", False)
        if tokenize and detokenize:
            raise InvalidArgument("tokenize and detokenize are two requests")
        if tokenize:
            text = values.text(TEXT_INPUT)
            if values.boolean("apply_chat_template", False):
                text = chat_prompt(self.tokenizer, text, values)
            ids = self.tokenizer.encode(text)
        elif detokenize:
            ids = values.integers("token_ids")
            self._check_vocabulary(ids, "token_ids")
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        else:
            return None
        self._request_outputs(request, set())
        answer = ParameterizedOutputs(_text(text))
        answer.parameters = {"token_ids": json.dumps(ids), "max_model_len": self.max_model_len}
        if tokenize and values.boolean("return_token_strs", False):  # the vocabulary's entries, as vLLM's
            answer.parameters["token_strs"] = json.dumps([self.tokenizer.tokenizer.id_to_token(i) for i in ids])
        return answer

    def _logit_bias(self, values: RequestValues) -> tuple[tuple[int, float], ...]:
        """`logit_bias` ({"token id": bias}, OpenAI's shape) as (id, bias) pairs; SamplingParams
        checks the biases, the vocabulary is checked here (the engine would fail on it)."""
        pairs = []
        for key, bias in values.mapping("logit_bias").items():
            try:
                token = int(key)
            except ValueError:
                raise InvalidArgument(f"logit_bias keys are token ids, got {key!r}") from None
            self._check_vocabulary([token], "logit_bias")
            pairs.append((token, bias))
        return tuple(pairs)

    def _check_vocabulary(self, ids: list[int], name: str) -> None:
        """Token ids a request gives must index the model's logits (the engine would fail)."""
        bad = [token for token in ids if not 0 <= token < self.vocab_size]
        if bad:
            raise InvalidArgument(f"{name}: token id {bad[0]} is not in the vocabulary (0 to {self.vocab_size - 1})")

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
            asked |= {output.name for output in request.outputs} & {*EXTRA_OUTPUTS, EMBEDDING}
        return asked

    def _request_outputs(self, request: InferRequest, returns: set[str]) -> None:
        """Without requested outputs, the server expects every declared output in every
        response: name the ones this request's responses carry instead."""
        if request.outputs is not None:
            return
        binary = {"binary_data": True} if request.parameters.get("binary_data_output") is True else {}
        request.outputs = [RequestedOutput(name, dict(binary)) for name in [TEXT_OUTPUT, *sorted(returns)]]

    # ------------------------------------------------------------------------ the core's outputs

    def _on_message(self, message: CoreMessage) -> None:
        """For every message of the engine core: on the server's event loop, or on the client's
        reader thread when the server runs none (and on an exit thread for a core that died)."""
        if isinstance(message, StepOutputs):
            if message.stats is not None:
                self.metrics_state.engine = message.stats
            for output in message.outputs:
                with self._lock:
                    request = self._active.get(output.request_id)
                if request is not None and self._emit(request, output):
                    self._forget(output.request_id)
            self._abort_cancelled()
        elif isinstance(message, RequestRejected):
            self._close(message.request_id, InvalidArgument(message.message))
        elif isinstance(message, EngineFailed):
            if message.request_ids:
                log.error("model '%s': %s", self.model_name, message.message)
            for request_id in message.request_ids:
                self._close(request_id, InternalError(message.message))

    def _forget(self, request_id: str) -> _Request | None:
        with self._lock:
            return self._active.pop(request_id, None)

    def _close(self, request_id: str, error: NaiadError) -> None:
        request = self._forget(request_id)
        if request is not None:
            with contextlib.suppress(NaiadError):
                request.send(error, True)

    def _abort_cancelled(self) -> None:
        """The client went away: free its sequence's KV blocks now rather than at max_tokens."""
        with self._lock:
            cancelled = [seq_id for seq_id, request in self._active.items() if request.cancelled()]
        if cancelled:
            self.engine.abort(cancelled)
            for seq_id in cancelled:
                self._close(seq_id, Cancelled("the request was cancelled"))

    def _emit(self, request: _Request, output: RequestOutput) -> bool:
        """Send the text of the request's new tokens (or hold it back); close the request when
        its sequence finished or a stop string ended it. Returns whether it is closed."""
        new = output.new_token_ids
        done = output.finish_reason is not None
        request.scheduled_at = output.scheduled_at or request.scheduled_at
        if output.embedding is not None:
            request.embedding = output.embedding
        if output.prompt_logprobs is not None:
            entries = [None if entry is None else self._logprobs_json([token], [entry])[0]
                       for token, entry in zip(request.prompt, output.prompt_logprobs, strict=True)]
            entries[0] = {**self._token_json(request.prompt[0], 0.0), "logprob": None, "top": []}
            request.prompt_extras = {**(request.prompt_extras or {}), "prompt_logprobs": json.dumps(entries)}
        if new:
            now = time.monotonic()
            self.metrics_state.tokens_out(request, len(new), now)
        if output.new_logprobs is not None and LOGPROBS in request.returns:
            request.logprobs.extend(self._logprobs_json(new, output.new_logprobs))
        request.sent_tokens += len(new)
        reason = FinishReason(output.finish_reason) if done and output.finish_reason is not None else None
        if reason is FinishReason.STOP and new and output.on_stop_token:
            new = new[:-1]  # the end-of-sequence or stop token has no text (as vLLM)
        pieces = [request.detokenizer.push(token) for token in new]
        if done:
            pieces.append(request.detokenizer.flush())
        text = "".join(pieces)
        if request.stop is not None:
            text, stopped = request.stop.push(text, final=done)
            if stopped:
                if not done:
                    self.engine.abort([request.seq_id])
                done, reason = True, FinishReason.STOP
        counts = (output.num_prompt_tokens, request.sent_tokens, output.num_cached_tokens)
        if request.stream:
            if text or (done and request.returns):
                request.send(self._outputs(request, text, reason, counts), False)
        else:
            request.text.append(text)
            if done:
                request.send(self._outputs(request, "".join(request.text), reason, counts), False)
        if done:
            request.send(None, True)
        return done

    def _outputs(self, request: _Request, text: str, reason: FinishReason | None,
                 counts: tuple[int, int, int]) -> Outputs:
        """The response's outputs; `counts` is (prompt tokens, output tokens so far, prompt
        tokens found in the prefix cache). The cached count travels as the response parameter
        `cached_tokens` beside `prompt_tokens` (a parameter: configs that list their outputs
        need not declare it)."""
        returns = request.returns
        if not returns and request.prompt_extras is None:
            return _text(text)
        outputs = ParameterizedOutputs(_text(text))
        if request.prompt_extras is not None:  # on the first response out only
            outputs.parameters.update(request.prompt_extras)
            request.prompt_extras = None
        if FINISH_REASON in returns:
            outputs[FINISH_REASON] = np.array([(reason.value if reason is not None else "").encode()], dtype=object)
        if PROMPT_TOKENS in returns:
            outputs[PROMPT_TOKENS] = np.array([counts[0]], dtype=np.int32)
            outputs.parameters["cached_tokens"] = counts[2]
            if reason is not None:
                outputs.parameters.update(_timings(request))
        if COMPLETION_TOKENS in returns:
            outputs[COMPLETION_TOKENS] = np.array([counts[1]], dtype=np.int32)
        if EMBEDDING in returns and request.embedding is not None:
            outputs[EMBEDDING] = np.array(request.embedding, dtype=np.float32)
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


def _timings(request: _Request) -> dict[str, float]:
    """A finished request's time in the queue (until the engine first batched it), in prefill
    (until its first token reached the backend) and in decode (the rest), in milliseconds."""
    end = time.monotonic()
    scheduled = request.scheduled_at or request.arrival
    first = request.first_token_at or end
    return {"queue_ms": round(max(0.0, scheduled - request.arrival) * 1e3, 3),
            "prefill_ms": round(max(0.0, first - scheduled) * 1e3, 3),
            "decode_ms": round(max(0.0, end - first) * 1e3, 3)}


def _text(text: str) -> Outputs:
    return {TEXT_OUTPUT: np.array([text.encode("utf-8")], dtype=object)}


def _sender(sender: BatchSender, index: int) -> Send:
    return lambda result, final: sender.send(index, result, final)


def _canceller(batch: Batch, index: int) -> Callable[[], bool]:
    return lambda: batch.is_cancelled(index)
