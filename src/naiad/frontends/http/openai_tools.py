"""Function calling on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`, and
the answer's `tool_calls` (OpenAI's shapes).

`tool_choice` "none" leaves the tools out. "auto" (the default with tools) gives them to the
backend, which has the chat template render them (or describes them in the system message,
naiad.backends.llm_prompt), and the answer's text is searched for calls in the Hermes / Qwen
format, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, or, as Llama 3.x writes it,
an answer that is one JSON object `{"name": ..., "parameters": {...}}`. A call to a function the
request did not offer, or whose arguments do not fit its schema (`check_arguments`), stays text.
"required" and a named function generate the calls under a grammar instead (structured outputs:
a JSON array of {"name", "arguments"} objects, each function's arguments under its own schema;
one call unless `parallel_tool_calls`), so they cannot be malformed or name an unknown function.
An answer with calls finishes with "tool_calls"; streamed, a choice's calls come as one delta
each once its text is complete. Streamed in "auto", text goes out as it comes until a call may
have begun (`CallWatch`): from a `<tool_call>` tag on (and the end of the text that could start
one), or the whole answer when it opens with `{`, is held until the end and parsed then.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from naiad.errors import InvalidArgument

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),)}


@dataclass(frozen=True, slots=True)
class Tools:
    """A request's tools and how the answer may use them."""

    functions: dict[str, dict[str, Any]]  # name -> the function's parameters schema
    offered: list[dict[str, Any]]  # the request's tools, as the backend renders them
    forced: str | None  # None: the model decides ("auto"); "*": any of them ("required"); else that one
    parallel: bool

    def backend_parameters(self) -> dict[str, Any]:
        parameters: dict[str, Any] = {"tools": json.dumps(self.offered)}
        if self.forced is not None:
            names = list(self.functions) if self.forced == "*" else [self.forced]
            call = [{"type": "object", "properties": {"name": {"const": name}, "arguments": self.functions[name]},
                     "required": ["name", "arguments"], "additionalProperties": False} for name in names]
            schema = {"type": "array", "items": call[0] if len(call) == 1 else {"anyOf": call}, "minItems": 1}
            if not self.parallel:
                schema["maxItems"] = 1
            parameters["guided_json"] = json.dumps(schema)
        return parameters

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The answer's content (None when it is all calls) and its calls, in OpenAI's shape."""
        if self.forced is not None:
            try:
                calls = json.loads(text)
            except ValueError:  # cut short by max_tokens: the text is all there is
                return text, []
            return None, [_call(item["name"], item["arguments"]) for item in calls]
        found = []
        for match in _CALL.finditer(text):
            call = self._parsed(match.group(1))
            if call is not None:
                found.append((match.span(), call))
        if not found and text.strip().startswith("{"):
            call = self._parsed(text.strip())
            if call is not None:
                return None, [call]
        if not found:
            return text, []
        content, end = [], 0
        for (start, stop), _ in found:
            content.append(text[end:start])
            end = stop
        content.append(text[end:])
        rest = "".join(content).strip()
        return rest or None, [call for _, call in found]

    def _parsed(self, raw: str) -> dict[str, Any] | None:
        try:
            item = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(item, dict) or item.get("name") not in self.functions:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not check_arguments(arguments, self.functions[item["name"]]):
            return None
        return _call(item["name"], arguments)


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def check_arguments(value: Any, schema: dict[str, Any]) -> bool:
    """Whether `value` fits the parts of a JSON schema that decide a call's shape: type (one or
    several), enum, const, an object's required and properties (and additionalProperties false),
    an array's items. Other keywords (formats, ranges, patterns, $ref) are not checked here."""
    if not isinstance(schema, dict):
        return True
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        allowed = tuple(t for kind in kinds for t in _JSON_TYPES.get(kind, (object,)))
        if not isinstance(value, allowed) or (isinstance(value, bool) and "boolean" not in kinds):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if any(key not in value for key in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(key not in properties for key in value):
            return False
        return all(check_arguments(item, properties[key]) for key, item in value.items() if key in properties)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(check_arguments(item, schema["items"]) for item in value)
    return True


def parse_tools(body: dict[str, Any]) -> Tools | None:
    """The request's tools, checked; None without any, or with tool_choice "none"."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidArgument("'parallel_tool_calls' must be true or false")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise InvalidArgument("'tool_choice' needs 'tools'")
        return None
    if not isinstance(tools, list):
        raise InvalidArgument("'tools' must be an array of tools")
    functions: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise InvalidArgument(f"'tools[{index}]' must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise InvalidArgument(f"'tools[{index}].function.name' must be 1-64 letters, digits, _ or -")
        if name in functions:
            raise InvalidArgument(f"'tools': two functions are named '{name}'")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InvalidArgument(f"'tools[{index}].function.parameters' must be a JSON schema (an object)")
        functions[name] = parameters
    if choice is None or choice == "auto":
        forced = None
    elif choice == "none":
        return None
    elif choice == "required":
        forced = "*"
    else:
        named = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
        if not isinstance(named, dict) or not isinstance(named.get("name"), str):
            raise InvalidArgument("'tool_choice' must be none, auto, required or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        if named["name"] not in functions:
            raise InvalidArgument(f"'tool_choice' names '{named['name']}', which is not one of the tools")
        forced = named["name"]
    return Tools(functions, tools, forced, parallel)


_TAG = "<tool_call>"


class CallWatch:
    """One streamed choice's text under "auto": what can go out now, and the rest held until the
    end, where the calls in it are found (`Tools.split`)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.held = ""
        self.holding = False  # a call may have begun: everything from here waits for the end
        self.sent = False  # some text other than blanks went out

    def push(self, text: str) -> str:
        if self.holding:
            self.held += text
            return ""
        buffer = self.held + text
        self.held = ""
        if not self.sent and not buffer.strip():
            self.held = buffer  # leading blanks: the answer may yet open with a JSON call
            return ""
        if not self.sent and buffer.lstrip().startswith("{"):
            self.holding, self.held = True, buffer
            return ""
        index = buffer.find(_TAG)
        if index >= 0:
            self.holding, self.held = True, buffer[index:]
            out = buffer[:index]
        else:
            keep = next((size for size in range(min(len(buffer), len(_TAG) - 1), 0, -1)
                         if _TAG.startswith(buffer[-size:])), 0)
            out, self.held = buffer[: len(buffer) - keep], buffer[len(buffer) - keep:]
        self.sent = self.sent or bool(out.strip())
        return out

    def finish(self) -> tuple[str | None, list[dict[str, Any]]]:
        """The held text's content (None when it is all calls) and calls."""
        if not self.holding:
            return self.held, []
        return self.tools.split(self.held)



class HeldText(CallWatch):
    """A forced call's text (a JSON array of calls): all of it waits for the end."""

    def __init__(self, tools: Tools) -> None:
        super().__init__(tools)
        self.holding = True
