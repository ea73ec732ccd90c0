"""Structured outputs: a request's grammar, and the token masks that hold its output to it.

A request's `SamplingParams.guide` is `(kind, spec)`, one of `sampling_params.GUIDE_KINDS`: "json_schema" (a
JSON schema's text), "json_object" (any JSON object; spec ""), "regex", "choice" (a JSON array
of strings: the output is one of them) and "grammar" (Lark, llguidance's dialect, or GBNF /
EBNF with `root ::= ...` rules, as llama.cpp and vLLM's xgrammar take them).
The engine compiles it when the request is added (a bad one is that request's 400; the engine
core compiles a guide it has not seen on a thread, so that a large schema does not stall every
other stream) into a `GrammarState` that its sequence keeps: every token the sequence appends
advances it, and the sequence stops when the grammar is complete (docs/llm.md, "Structured
outputs").

The grammar engine is llguidance (chosen by measuring, docs/llm.md): no dependencies, a new JSON
schema compiles in 1-2 ms, and a mask over a 49k vocabulary takes ~12 µs. Each step, the runner
calls `MaskFiller.start` with the sampling rows' grammars before it runs the model: llguidance
fills the masks on a thread of its own, without the GIL, while torch runs the forward, and the
sampler then sets the logits of the tokens a mask forbids to -inf on those rows only.

JSON is generated compact (no whitespace between tokens; a schema's own `x-guidance` may ask
otherwise): a small model at temperature 1 would otherwise spend its tokens on blank lines. An
object schema that lists properties admits no others unless it says so (`closed`).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from naiad.errors import InvalidArgument
from naiad.llm.engine.sampling_params import check_guide
from naiad.llm.engine.sequence import Grammar

#: compiled grammars kept for reuse, by (kind, spec): a client sends the same schema many times
CACHE_SIZE = 64
_JSON_OPTIONS: Any = {"whitespace_flexible": False}  # llguidance's JsonCompileOptions


def grammar_text(kind: str, spec: str) -> str:
    """The llguidance grammar of a guide (not compiled yet)."""
    from llguidance import LLMatcher

    if kind == "json_schema":
        try:
            schema = json.loads(spec)
        except ValueError as error:
            raise InvalidArgument(f"the JSON schema is not valid JSON: {error}") from None
        if not isinstance(schema, dict):
            raise InvalidArgument("the JSON schema is not a JSON object")
        return LLMatcher.grammar_from_json_schema(closed(schema), defaults=_JSON_OPTIONS)
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        try:
            choices = json.loads(spec)
        except ValueError:
            choices = None
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise InvalidArgument("guided_choice must be a non-empty array of non-empty strings")
        # Lark string literals take JSON's escapes: each choice exactly, whatever it holds.
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    if kind == "grammar":
        from llguidance.gbnf_to_lark import any_to_lark

        try:  # GBNF (llama.cpp's, `root ::= ...`, as vLLM's EBNF) turned into Lark; Lark as it is
            return LLMatcher.grammar_from_lark(any_to_lark(spec))
        except Exception as error:  # the converter's own parse errors
            raise InvalidArgument(f"the grammar cannot be used: {error}") from None
    raise InvalidArgument(f"unknown guide kind {kind!r}")


_SUBSCHEMA = ("items", "additionalItems", "contains", "not", "if", "then", "else")
_SUBSCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema: Any) -> Any:
    """The schema with every object that lists its properties but says nothing of others closed
    to them (`additionalProperties: false`), as vLLM's default grammar engine (xgrammar, strict
    mode) reads schemas: a tool's or a client's schema rarely means "and anything else", and a
    model at temperature 1 will otherwise invent properties until max_tokens."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA:
        if key in out:
            out[key] = closed(out[key])
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), list):
            out[key] = [closed(item) for item in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(item) for name, item in out[key].items()}
    return out


class GrammarState:
    """One sequence's place in its grammar."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher  # llguidance.LLMatcher

    def accept(self, token_id: int) -> None:
        # A refused token (only possible where the mask was not applied: ignore_eos past the
        # end) puts the matcher in its error state, which `finished` reports.
        self.matcher.consume_token(token_id)

    @property
    def finished(self) -> bool:
        """The grammar is complete (nothing may follow) or was broken: the sequence stops."""
        return bool(self.matcher.is_stopped() or self.matcher.is_error())


class Grammars:
    """Compiles guides against one model's tokenizer, keeping the last `CACHE_SIZE` compiled.

    The tokenizer is converted on first use (~1 s, once per engine process)."""

    def __init__(self, model: str | Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._model = Path(model)
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._lock = threading.Lock()
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()

    @functools.cached_property
    def tokenizer(self) -> Any:
        try:
            import llguidance
        except ImportError:
            raise InvalidArgument("structured outputs need the llguidance package (pip install 'naiad[llm]')") from None
        from naiad.llm.loading.loader import load_tokenizer

        text = load_tokenizer(self._model).tokenizer.to_str()
        return llguidance.LLTokenizer(text, n_vocab=self.vocab_size, eos_token=self._eos or None)

    def state(self, guide: tuple[str, str]) -> GrammarState:
        """A fresh `GrammarState` for a guide; a grammar llguidance refuses is an InvalidArgument."""
        return GrammarState(self.compile(guide).deep_copy())

    def is_compiled(self, guide: tuple[str, str]) -> bool:
        with self._lock:
            return guide in self._compiled

    def compile(self, guide: tuple[str, str]) -> Any:
        """The guide's compiled matcher, kept for reuse. It compiles outside the lock: a large
        schema takes seconds (5,000 properties: 1.5 s), and `state` of guides already compiled
        must not wait for it. The engine core calls this on a thread of its own."""
        from llguidance import LLMatcher

        check_guide(guide)
        with self._lock:
            compiled = self._compiled.get(guide)
            if compiled is not None:
                self._compiled.move_to_end(guide)
                return compiled
        matcher = LLMatcher(self.tokenizer, grammar_text(*guide), log_level=0)  # releases the GIL
        if matcher.is_error():
            raise InvalidArgument(f"the {guide[0].replace('_', ' ')} cannot be used: {matcher.get_error()}")
        with self._lock:
            self._compiled[guide] = matcher
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return matcher


class MaskFiller:
    """Fills the sampling rows' token masks on a thread of its own, while the model runs."""

    def __init__(self, vocab_size: int) -> None:
        self.words = (vocab_size + 31) // 32
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        self._executor: Any = None

    def start(self, rows: list[tuple[int, Grammar]]) -> Future[tuple[list[int], np.ndarray]]:
        """Begin filling the masks of `rows` (sampling row index, its grammar); the future gives
        the row indices and their masks, one int32 bitmask row each (bit set: allowed)."""
        return self._thread.submit(self._fill, rows)

    def _fill(self, rows: list[tuple[int, Grammar]]) -> tuple[list[int], np.ndarray]:
        from llguidance import LLExecutor

        if self._executor is None:
            self._executor = LLExecutor()
        masks = np.empty((len(rows), self.words), dtype=np.int32)
        matchers = []
        for index, (_, state) in enumerate(rows):
            assert isinstance(state, GrammarState)  # the engine gives sequences no other
            matchers.append((state.matcher, index))
        self._executor.unsafe_compute_mask_ptr(matchers, masks.ctypes.data, self.words * 4, len(rows))
        return [row for row, _ in rows], masks

    def close(self) -> None:
        self._thread.shutdown(wait=False)
