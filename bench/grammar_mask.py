"""Structured outputs' grammar engines, measured (issue 24): xgrammar against llguidance on the
bundled SmolLM2's 49,152-token vocabulary.

For a JSON schema (nested object, array, enum, required fields), each engine compiles the schema
once, then walks a valid JSON text token by token: fill the next-token bitmask, accept the token.
Printed per engine and round: compile ms and the mask fill's median and p99 µs per token, to set
beside an LLM decode step (bench/llm_engine_step.py: 12-28 ms on 2 cores).

The engines are benchmark-only here: install them beside naiad's own dependencies, in .bench/:

    python3 -m venv --system-site-packages .bench/grammar
    .bench/grammar/bin/pip install xgrammar llguidance
    .venv/bin/python bench/grammar_mask.py --write-tokenizer .bench/smollm2-tokenizer.json
    .bench/grammar/bin/python bench/grammar_mask.py --tokenizer .bench/smollm2-tokenizer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

VOCAB = 49152
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"]},
        "kind": {"enum": ["a", "b", "c"]},
    },
    "required": ["name", "age", "tags", "address", "kind"],
    "additionalProperties": False,
}
TEXT = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines", "poetry"],
                   "address": {"city": "London", "zip": "W1"}, "kind": "b"})


def write_tokenizer(path: str) -> None:
    """SmolLM2's tokenizer as tokenizer.json (run with naiad's own venv)."""
    from gguf import GGUFReader

    from naiad.llm.loading.gguf import smollm2_path
    from naiad.llm.loading.tokenizer import Tokenizer
    with open(path, "w") as file:
        file.write(Tokenizer.from_gguf(GGUFReader(smollm2_path())).tokenizer.to_str())


def _xgrammar(hf: Any, ids: list[int]) -> tuple[float, list[float]]:
    import xgrammar as xgr
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB))
    start = time.perf_counter()
    matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA)))
    compile_ms = (time.perf_counter() - start) * 1e3
    mask = xgr.allocate_token_bitmask(1, VOCAB)
    times = []
    for token in ids:
        began = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - began)
        if not matcher.accept_token(token):
            raise RuntimeError(f"xgrammar refused token {token}")
    return compile_ms, times


def _llguidance(hf: Any, ids: list[int]) -> tuple[float, list[float]]:
    import llguidance
    import llguidance.hf
    import llguidance.torch
    tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=VOCAB)
    start = time.perf_counter()
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
    compile_ms = (time.perf_counter() - start) * 1e3
    mask = llguidance.torch.allocate_token_bitmask(1, VOCAB)
    times = []
    for token in ids:
        began = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
        times.append(time.perf_counter() - began)
        if not matcher.consume_token(token):
            raise RuntimeError(f"llguidance refused token {token}: {matcher.get_error()}")
    return compile_ms, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", help="tokenizer.json of the bundled SmolLM2")
    parser.add_argument("--write-tokenizer", help="write that file (with naiad's venv) and exit")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.write_tokenizer:
        write_tokenizer(args.write_tokenizer)
        return
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(args.tokenizer))
    hf.eos_token = "<|im_end|>"
    ids = hf.encode(TEXT, add_special_tokens=False)
    engines: dict[str, Callable[[Any, list[int]], tuple[float, list[float]]]] = {
        "xgrammar": _xgrammar, "llguidance": _llguidance}
    for name, run in engines.items():
        for round_index in range(args.rounds):
            compile_ms, times = run(hf, ids)
            ordered = sorted(times)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            print(f"{name:10s} round {round_index + 1}: {len(ids)} tokens, compile {compile_ms:.1f} ms, mask "
                  f"median {statistics.median(times) * 1e6:.1f} µs, p99 {p99 * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
