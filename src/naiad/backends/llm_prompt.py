"""How the "llm" backend renders a chat into its prompt: the model's chat template with vLLM's
controls, and tools (function calling).

Tools (`tools`: OpenAI's array of {"type": "function", "function": {name, description,
parameters}}) reach a template that renders them itself (one that reads `tools`, as Qwen's and
Llama 3.1's do) as its `tools` variable. A template that does not, as SmolLM2's, gets them
described in the system message instead, in the Hermes format most open models were tuned on:
the functions' JSON inside <tools></tools>, and each call to be written as
<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Earlier assistant messages' `tool_calls`
are written back in that same format for such a template, so the model sees its own calls.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from naiad.backends.llm_request import RequestValues
from naiad.errors import InvalidArgument
from naiad.llm.loading.tokenizer import TEMPLATE_VARIABLES, Tokenizer

TOOLS_PROMPT = """# Tools

You may call one or more functions to answer the user's request. The functions, as JSON schemas:
<tools>
{tools}
</tools>

To call a function, write one JSON object per call, each inside <tool_call></tool_call> tags:
<tool_call>
{{"name": <the function's name>, "arguments": <the arguments, as a JSON object>}}
</tool_call>"""


def chat_prompt(tokenizer: Tokenizer, messages_json: str, values: RequestValues) -> str:
    """The prompt for a JSON array of chat messages, rendered with the model's chat template
    and the request's template controls and tools (as vLLM reads them)."""
    try:
        messages = json.loads(messages_json)
    except ValueError:
        raise InvalidArgument("with apply_chat_template, text_input must be a JSON array of messages") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidArgument("with apply_chat_template, text_input must be a JSON array of message objects")
    generation_prompt = values.boolean("add_generation_prompt", True)
    continuing = values.boolean("continue_final_message", False)
    if continuing and generation_prompt:
        raise InvalidArgument("continue_final_message needs add_generation_prompt false (as vLLM)")
    variables = values.mapping("chat_template_kwargs")
    reserved = sorted(set(variables) & (TEMPLATE_VARIABLES | {"tools"}))
    if reserved:
        raise InvalidArgument(f"chat_template_kwargs may not set '{reserved[0]}': the server sets it")
    final = messages[-1].get("content") if messages else None
    if continuing and (messages[-1].get("role") != "assistant" or not isinstance(final, str) or not final):
        raise InvalidArgument("continue_final_message needs a last message from the assistant with text")
    template = tokenizer.chat_template or ""
    tools = _tools(values)
    if tools and "tools" in template:
        variables["tools"] = tools
    elif tools:
        messages = _with_tools_described(messages, tools)
    if "tool_calls" not in template:
        messages = [_calls_as_text(message) for message in messages]
    try:
        prompt = tokenizer.apply_chat_template(messages, generation_prompt, **variables)
    except (ValueError, TypeError) as error:
        raise InvalidArgument(str(error)) from None
    if continuing:  # end right after the final message's text, before the template closes it
        assert isinstance(final, str)
        end = prompt.rfind(final)
        if end < 0:
            raise InvalidArgument("continue_final_message: the chat template changed the last message's text")
        prompt = prompt[: end + len(final)]
    return prompt


def _tools(values: RequestValues) -> list[dict[str, Any]]:
    raw = values.parameters.get("tools")
    if raw is None:
        return []
    try:
        tools = json.loads(raw) if isinstance(raw, str | bytes) else raw
    except ValueError:
        tools = None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise InvalidArgument("'tools' must be a JSON array of tool objects")
    return tools


def _with_tools_described(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    described = TOOLS_PROMPT.format(tools="\n".join(json.dumps(tool.get("function", tool)) for tool in tools))
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + described}, *messages[1:]]
    return [{"role": "system", "content": described}, *messages]


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's `tool_calls` appended to its text in the Hermes format; a message
    without calls as it is (content None made "", which templates concatenate)."""
    calls = message.get("tool_calls")
    content = message.get("content") or ""
    if not calls:
        return message if message.get("content") is not None else {**message, "content": content}
    blocks = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise InvalidArgument("each of a message's 'tool_calls' needs a 'function'")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # else written as the client gave it
                arguments = json.loads(arguments)
        blocks.append("<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": arguments})
                      + "\n</tool_call>")
    return {**{k: v for k, v in message.items() if k != "tool_calls"},
            "content": "\n".join(([content] if content else []) + blocks)}
