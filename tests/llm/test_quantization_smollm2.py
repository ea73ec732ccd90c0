"""The done criterion of INT8 on a real model: SmolLM2-135M-Instruct (the bundled GGUF file,
Q4_1, dequantized to fp32 as the reference) against its int8 form (per-channel int8 weights,
activations in int8 per block of 32): at least 95 % of 32 prompts' greedy tokens agree, and
the perplexity of a fixed English text rises by less than 2 %.

The models are run directly (no engine): one prefill of every prompt, eight batched decode
steps for fp32's greedy tokens, then one teacher-forced prefill of prompt + those tokens for
int8, so that one early difference does not count as every later token differing.

The prompts are windows of the text, cut mid-sentence, where a 135M model's top two tokens are
often near ties: measured (2026-11-30, VNNI) on three such sets of 32 prompts, int8 agrees on
243, 245 and 245 of 256 tokens (this test's set is the second), bf16 weights on 249, 247 and
247; weight-only int8 (float activations) on 248 of the first set. Perplexity: -0.7 %.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.nn import functional as F

from naiad.llm import kernels
from naiad.llm.attention import AttentionMetadata, allocate_kv_caches
from naiad.llm.gguf import smollm2_path
from naiad.llm.loader import load_gguf
from naiad.llm.models.llama import LlamaForCausalLM
from naiad.llm.quantization import Int8Linear, quantize_linears, weight_bytes

BLOCK = 16
PROMPT, NEW_TOKENS = 12, 8
TEXT = (
    "The history of the lighthouse is a story about people who lived at the edge of the land and watched "
    "the sea for a living. Long before electric lamps, sailors relied on fires lit on hilltops to find "
    "their way home at night. The ancient lighthouse of Alexandria, built on the island of Pharos more "
    "than two thousand years ago, was one of the wonders of the world, and its name still means "
    "lighthouse in several languages.\n"
    "For centuries, keepers climbed the narrow stairs every evening to trim the wicks and polish the "
    "glass. The work was lonely and often dangerous. Storms could cut a rock station off from the "
    "mainland for weeks, and supply boats could not land until the waves calmed down. Many keepers kept "
    "diaries, and their notes tell us about the weather, the ships that passed, and the small routines "
    "that filled the long days.\n"
    "In the nineteenth century, the Fresnel lens changed everything. Instead of one large mirror, the "
    "lens used rings of glass prisms to bend the light into a narrow beam that could be seen from far "
    "away. A single lamp could now shine across twenty miles of open water. Governments built new towers "
    "along dangerous coasts, and each one was given its own pattern of flashes so that sailors could tell "
    "them apart.\n"
    "Today most lighthouses are automatic. Satellites and electronic charts guide ships across the "
    "oceans, and the old towers have become museums, hotels, or simply landmarks that visitors like to "
    "photograph. Yet on a dark and stormy night, a steady beam on the horizon still means the same thing "
    "it always has: you are close to the shore, and someone has thought about your safety.\n"
    "Children who visit these towers often ask how the keepers spent their free time. The answer is that "
    "they read books, painted, grew vegetables in small gardens, and wrote letters to their families. "
    "Some of them became well known as artists or writers, and their stories remind us that a quiet life "
    "can still be a full one.\n"
)


class Batch:
    """Sequences run through the model by hand, each with its own blocks of a fresh KV cache."""

    def __init__(self, model: LlamaForCausalLM, num_seqs: int, max_len: int) -> None:
        args, per_seq = model.args, -(-max_len // BLOCK)
        self.model = model
        self.caches = allocate_kv_caches(args.num_layers, num_seqs * per_seq, BLOCK, args.num_kv_heads,
                                         args.head_dim, torch.float32, "cpu")
        self.tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(num_seqs)]
        self.computed = [0] * num_seqs

    def feed(self, rows: list[list[int]]) -> list[torch.Tensor]:
        """New tokens for every sequence; the logits of each new token, per sequence."""
        lens = [len(r) for r in rows]
        contexts = [done + n for done, n in zip(self.computed, lens, strict=True)]
        meta = AttentionMetadata.build(lens, contexts, self.tables, BLOCK, "cpu")
        tokens = torch.tensor([t for r in rows for t in r])
        starts = zip(self.computed, lens, strict=True)
        positions = torch.tensor([p for done, n in starts for p in range(done, done + n)])
        with torch.inference_mode():
            logits = self.model(tokens, positions, meta, self.caches, torch.arange(len(tokens)))
        self.computed = contexts
        return list(logits.split(lens))


@pytest.fixture(scope="module")
def models() -> tuple[LlamaForCausalLM, LlamaForCausalLM, list[int]]:
    model, tokenizer, _ = load_gguf(smollm2_path(), "float32")
    int8 = copy.deepcopy(model)
    assert quantize_linears(int8, "int8") == 30 * 4 + 1  # qkv, o, gate_up, down per layer; the LM head
    return model, int8, tokenizer.encode(TEXT)


def test_int8_takes_less_memory(models: tuple[LlamaForCausalLM, LlamaForCausalLM, list[int]]) -> None:
    fp32, int8, _ = models
    assert isinstance(int8.model.layers[0].mlp.down_proj, Int8Linear)
    # 538 MB → 249 MB: the embedding stays fp32 (113 MB; the LM head, tied to it, gains an int8 copy)
    assert weight_bytes(int8) < 0.5 * weight_bytes(fp32)


def test_int8_greedy_tokens_agree_with_fp32(models: tuple[LlamaForCausalLM, LlamaForCausalLM, list[int]]) -> None:
    fp32, int8, text = models
    prompts = [text[8 * i + 4 : 8 * i + 4 + PROMPT] for i in range(32)]  # 32 windows of the text
    batch = Batch(fp32, len(prompts), PROMPT + NEW_TOKENS)
    logits = batch.feed(prompts)
    greedy: list[list[int]] = [[] for _ in prompts]
    for _ in range(NEW_TOKENS):
        for out, row in zip(greedy, logits, strict=True):
            out.append(int(row[-1].argmax()))
        logits = batch.feed([[out[-1]] for out in greedy])
    forced = Batch(int8, len(prompts), PROMPT + NEW_TOKENS).feed(
        [prompt + out for prompt, out in zip(prompts, greedy, strict=True)])
    # int8's choice after the prompt and each of fp32's tokens but the last
    answers = [row[PROMPT - 1 : PROMPT - 1 + NEW_TOKENS].argmax(dim=1).tolist() for row in forced]
    same = sum(a == b for got, want in zip(answers, greedy, strict=True) for a, b in zip(got, want, strict=True))
    print(f"int8 agrees with fp32 on {same} of {32 * NEW_TOKENS} greedy tokens (VNNI: {kernels.has_vnni()})")
    assert same >= 0.95 * 32 * NEW_TOKENS


def test_int8_perplexity_stays_within_two_percent(
    models: tuple[LlamaForCausalLM, LlamaForCausalLM, list[int]],
) -> None:
    fp32, int8, text = models
    assert len(text) > 300

    def perplexity(model: LlamaForCausalLM) -> float:
        (logits,) = Batch(model, 1, len(text)).feed([text])
        return math.exp(F.cross_entropy(logits[:-1], torch.tensor(text[1:])).item())

    before, after = perplexity(fp32), perplexity(int8)
    print(f"perplexity fp32 {before:.3f}, int8 {after:.3f} ({after / before - 1:+.2%})")
    assert before < 40  # the model reads English: the text is not noise to it
    assert after < before * 1.02
