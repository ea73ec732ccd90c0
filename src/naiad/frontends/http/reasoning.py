"""`reasoning_content` for models that think (vLLM's reasoning parsers): a chat answer's text
split into the reasoning between `<think>` and `</think>` and the content around it.

An "llm" model asks for it in its config, `parameters { key: "reasoning_parser" value: {
string_value: "qwen3" } }` as vLLM's `--reasoning-parser`: "qwen3" (the model opens `<think>`
itself; an answer without the tags is all content) or "deepseek_r1" (the chat template opened
it: the answer is reasoning until `</think>`). The tags themselves are dropped. Text arrives
piece by piece when streamed: the end of a piece that could begin a tag is held back until the
next piece says whether it does.
"""

from __future__ import annotations

from naiad.errors import InternalError

OPEN, CLOSE = "<think>", "</think>"
#: parser name → whether the answer starts inside the reasoning
PARSERS = {"qwen3": False, "deepseek_r1": True}
CONFIG_KEY = "reasoning_parser"


def thinks_first(parser: str) -> bool:
    """Whether an answer under `parser` starts as reasoning; an unknown name is a mistake in the
    model's config, named in an InternalError."""
    if parser not in PARSERS:
        raise InternalError(f"unknown {CONFIG_KEY} '{parser}' (known: {', '.join(sorted(PARSERS))})")
    return PARSERS[parser]


class ReasoningSplitter:
    """One answer's text in, (reasoning, content) out, piece by piece."""

    __slots__ = ("pending", "thinking")

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self.pending = ""

    def push(self, text: str, final: bool = False) -> tuple[str, str]:
        buffer, self.pending = self.pending + text, ""
        reasoning: list[str] = []
        content: list[str] = []
        while buffer:
            tag = CLOSE if self.thinking else OPEN
            out = reasoning if self.thinking else content
            found = buffer.find(tag)
            if found >= 0:
                out.append(buffer[:found])
                buffer = buffer[found + len(tag):]
                self.thinking = not self.thinking
                continue
            held = 0 if final else _partial(buffer, tag)
            out.append(buffer[: len(buffer) - held])
            self.pending = buffer[len(buffer) - held:]
            break
        return "".join(reasoning), "".join(content)


def _partial(text: str, tag: str) -> int:
    """How much of the end of `text` could be the start of `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
