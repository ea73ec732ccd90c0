"""Tiny random-weight Hugging Face models built at test time, and transformers as the oracle.

torch and transformers are imported inside the functions: the scheduler and block-manager
tests in this folder import nothing of them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from naiad.llm.engine.llm_engine import LLMEngine

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

# The variants the engine reads differently: tied embeddings (SmolLM2), q/k/v biases (Qwen2),
# q/k norms (Qwen3), Llama 3 rope scaling, a sliding window shorter than the prompts (Mistral).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": True, "rope_theta": 10000.0}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False, "rope_theta": 1000000.0}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32}),
    "mistral-window": ("MistralConfig", {"sliding_window": 6, "tie_word_embeddings": False}),
    "llama3-rope": (
        "LlamaConfig",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            "rope_theta": 500000.0,
        },
    ),
}


def build_tiny_model(variant: str, path: Path, **overrides: Any) -> Path:
    """Save a random-weight model of `variant` (fp32 safetensors) into `path`; `overrides`
    change its TINY shape (an odd vocabulary, other head counts)."""
    import torch
    import transformers

    config_cls, extra = VARIANTS[variant]
    config = getattr(transformers, config_cls)(**{**TINY, **extra, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)  # float32
    # Larger weights than the 0.02 default spread the logits, so a greedy choice is never a
    # near-tie that rounding could flip; norms and biases off their 1 and 0, so that loading
    # them into the wrong place shows.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0, 0.15)
            else:
                param.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(path)
    return path


def hf_model(path: Path) -> Any:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path)  # as saved: float32
    return model.eval()


def hf_greedy(model: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' own greedy generation of one prompt: the tokens it adds."""
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


# A continuous batch for the engine tests, on CPU and GPU alike: requests of different lengths
# arrive at different steps with different max_tokens; several share a long prefix (one is
# exactly that prefix, one ends on a block boundary inside it).


def tokens(n: int, seed: int) -> list[int]:
    return random.Random(seed).choices(range(3, TINY["vocab_size"]), k=n)


PREFIX = tokens(26, 0)
#: (prompt, max_tokens, the step before which it arrives)
REQUESTS = [
    (tokens(5, 1), 12, 0),
    (tokens(23, 2), 7, 0),
    (PREFIX + tokens(5, 3), 10, 0),
    (PREFIX + tokens(7, 4), 9, 2),
    (tokens(1, 5), 8, 2),
    (tokens(37, 6), 16, 5),
    (PREFIX + tokens(3, 7), 5, 5),
    (PREFIX, 6, 5),
    (PREFIX[:12], 6, 6),
]


def run_staggered(engine: LLMEngine, requests: list[tuple[list[int], int, int]] = REQUESTS) -> list[list[int]]:
    """Feed `requests` greedily as they arrive, step the engine to the end; outputs in request order."""
    from naiad.llm.engine.sampling_params import GREEDY

    index: dict[str, int] = {}
    outputs: dict[int, list[int]] = {}
    for step in range(500):
        for i, (prompt, max_tokens, arrival) in enumerate(requests):
            if arrival == step:
                index[engine.add_request(prompt, max_tokens, sampling_params=GREEDY)] = i
        outputs.update((index[seq.seq_id], seq.output_token_ids) for seq in engine.step())
        if len(outputs) == len(requests):
            return [outputs[i] for i in range(len(requests))]
    raise AssertionError("the engine made no progress")
