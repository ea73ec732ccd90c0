"""How the "llm" backend reads a request: its settings by name (an input of that name, else a
request parameter), the refusal of parameters it does not know, and stop strings in text that
arrives piece by piece."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from naiad.errors import InvalidArgument
from naiad.types import InferRequest

#: structured outputs, vLLM's names -> the engine's guide kinds (naiad.llm.engine.guided)
GUIDE_PARAMETERS = {"guided_json": "json_schema", "guided_json_object": "json_object", "guided_regex": "regex",
                    "guided_choice": "choice", "guided_grammar": "grammar"}
#: the request parameters (or optional inputs) this backend reads
REQUEST_PARAMETERS = frozenset({
    "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "ignore_eos", "stream", "apply_chat_template",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs", "stop", "stop_token_ids",
    "min_tokens", "return_finish_reason", "return_num_tokens", "return_logprobs", "logit_bias",
    # vLLM's chat-template controls (with apply_chat_template) and stop-string option
    "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "include_stop_str_in_output",
    # function calling: the tools the chat template (or the system message) describes
    "tools",
    # the tokenizer alone (vLLM's /tokenize and /detokenize)
    "tokenize", "detokenize", "token_ids", "return_token_strs",
    # the prompt's own logprobs, and its text (OpenAI's echo)
    "prompt_logprobs", "echo",
    # an embedding instead of a generation ("last" or "mean" pooling of the final hidden states)
    "pooling",
    # a prompt given as token ids, with an empty text_input
    "prompt_token_ids",
    # structured outputs (vLLM's guided decoding fields; at most one): see `guide`
    *GUIDE_PARAMETERS,
})
#: request parameters the server itself reads and passes along; `id` is how /generate maps its
#: key, the `triton_` ones are Triton's reserved keys
CORE_PARAMETERS = frozenset({"id", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                             "binary_data_output", "headers"})

class StopStrings:
    """Finds stop strings in text that arrives piece by piece.

    `push` returns the text that can go out and whether a stop string was found. Text from the
    first match on is dropped; without a match, the longest end of the text that could still
    become a stop string is held back (a match can then never start in text already out).
    """

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self.stops = stops
        self.include = include  # the stop string itself goes out (vLLM's include_stop_str_in_output)
        self.longest = max(map(len, stops))
        self.pending = ""

    def push(self, text: str, final: bool = False) -> tuple[str, bool]:
        buffer = self.pending + text
        self.pending = ""
        # the earliest match; of several starting there, the shortest (it completes first)
        found = [(index, len(stop)) for index, stop in ((buffer.find(stop), stop) for stop in self.stops) if index >= 0]
        if found:
            index, size = min(found)
            return buffer[: index + size if self.include else index], True
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

    def mapping(self, name: str) -> dict[str, Any]:
        """A JSON object (request parameters hold no objects: a string of one); {} when absent."""
        value = self._get(name)
        if value is None:
            return {}
        if isinstance(value, bytes | str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                raise InvalidArgument(f"'{name}' must be a JSON object") from None
        if not isinstance(value, dict):
            raise InvalidArgument(f"'{name}' must be a JSON object, got {value!r}")
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


def guide(values: RequestValues) -> tuple[str, str] | None:
    """The request's structured-output guide (kind, spec), or None: `guided_json` (a JSON schema,
    as JSON text), `guided_json_object` (true: any JSON object), `guided_regex`, `guided_choice`
    (a JSON array of strings) or `guided_grammar` (Lark). The engine compiles it (a grammar it
    cannot use is the request's 400 then)."""
    given = [name for name in GUIDE_PARAMETERS if values.parameters.get(name) is not None or name in values.inputs]
    if not given:
        return None
    if len(given) > 1:
        raise InvalidArgument(f"at most one of {', '.join(GUIDE_PARAMETERS)} may be given, got {', '.join(given)}")
    name = given[0]
    kind = GUIDE_PARAMETERS[name]
    if kind == "json_object":
        return (kind, "") if values.boolean(name, False) else None
    if kind == "json_schema":
        schema = values.mapping(name)
        if not schema:
            raise InvalidArgument("guided_json must be a JSON schema (a non-empty JSON object)")
        return kind, json.dumps(schema)
    if kind == "choice":
        return kind, json.dumps(values.strings(name))
    spec = values.text(name)
    if not spec:
        raise InvalidArgument(f"'{name}' must not be empty")
    return kind, spec
