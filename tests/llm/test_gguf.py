"""The bundled chat model, SmolLM2-135M-Instruct, loaded from its Q4_1 GGUF file.

The model is loaded once for the module (dequantizing takes a few seconds) by an engine;
the logit comparison reuses that engine's model.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader

from llm.test_models import Runner
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY
from naiad.llm.loading import tokenizer as tokenizer_module
from naiad.llm.loading.gguf import hf_name, read_config, smollm2_path, unpermute_qk
from naiad.llm.loading.tokenizer import Tokenizer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def path() -> Path:
    return smollm2_path()  # installed by `make install`: a missing file is a failure


@pytest.fixture(scope="module")
def reader(path: Path) -> GGUFReader:
    return GGUFReader(path)


@pytest.fixture(scope="module")
def tokenizer(reader: GGUFReader) -> Tokenizer:
    return Tokenizer.from_gguf(reader)


@pytest.fixture(scope="module")
def engine(path: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, dtype="float32", kv_cache_memory=64 << 20))


def test_config_is_smollm2_135m(reader: GGUFReader) -> None:
    config = read_config(reader)
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152
    assert config["tie_word_embeddings"] is True  # the file has no output.weight


def test_tensor_names_map_to_hugging_face() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(KeyError):
        hf_name("blk.0.attn_qkv.weight")


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    """llama.cpp's converter interleaves each head's two rotary halves; unpermute restores them."""
    heads, head_dim = 3, 8
    weight = torch.arange(heads * head_dim * 2, dtype=torch.float32).reshape(heads * head_dim, 2)
    permuted = weight.reshape(heads, 2, head_dim // 2, 2).transpose(1, 2).reshape(weight.shape)
    torch.testing.assert_close(unpermute_qk(permuted, heads), weight)


def test_chat_answers_capital_of_france(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    (output,) = engine.generate([tokenizer.encode(prompt)], max_tokens=20, sampling_params=GREEDY)
    assert output[-1] in engine.eos_token_ids  # the answer ends its turn
    assert "Paris" in tokenizer.decode(output)


def test_tokenizer_round_trips_text(tokenizer: Tokenizer) -> None:
    text = "Grüße aus Zürich — 東京 2024, naïve café 🙂!\n  indented"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    # Special tokens are single ids, and decode drops them unless asked to keep them.
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == "user\nhi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_tokenizer_splits_digits_one_by_one(tokenizer: Tokenizer) -> None:
    # SmolLM2's pre-tokenizer ("smollm" in GGUF) splits every digit: 2024 is four tokens.
    assert len(tokenizer.encode("2024")) == 4


def test_incremental_detokenizer_matches_decode(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    messages = [{"role": "user", "content": "Say 'naïve café 東京' and nothing else."}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages))
    (output,) = engine.generate([prompt], max_tokens=20, sampling_params=GREEDY)
    detokenizer = tokenizer.detokenizer()
    pieces = [detokenizer.push(token) for token in output]
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == tokenizer.decode(output)
    assert all("\ufffd" not in piece for piece in pieces)


def test_incremental_detokenizer_holds_back_half_characters(tokenizer: Tokenizer) -> None:
    # Byte-level tokens for the bytes of "東" one at a time: nothing until the third.
    ids = [tokenizer.tokenizer.token_to_id(_byte_token(byte)) for byte in "東".encode()]
    detokenizer = tokenizer.detokenizer()
    assert [detokenizer.push(i) for i in ids] == ["", "", "東"]


def _byte_token(byte: int) -> str:
    """GPT-2's printable stand-in for a raw byte, as byte-level BPE vocabularies spell it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if byte in printable:
        return chr(byte)
    return chr(256 + [b for b in range(256) if b not in printable].index(byte))


def test_logits_match_transformers(engine: LLMEngine, path: Path, tokenizer: Tokenizer) -> None:
    """Our dequantize-and-unpermute against transformers' own GGUF loader on the same file."""
    import transformers
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    tokens = tokenizer.encode(tokenizer.apply_chat_template(QUESTION))
    (logits,) = Runner(engine.runner.model).feed({0: tokens})
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-3, rtol=0)


def test_tokenizer_from_hf_directory(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """tokenizer.json and tokenizer_config.json (template, AddedToken-style eos) give the same tokenizer."""
    tokenizer.tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {"chat_template": tokenizer.chat_template, "eos_token": {"content": "<|im_end|>"}, "bos_token": None}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = Tokenizer.from_dir(tmp_path)
    prompt = loaded.apply_chat_template(QUESTION)
    assert prompt == tokenizer.apply_chat_template(QUESTION)
    assert loaded.encode(prompt) == tokenizer.encode(prompt)
    assert loaded.eos_token == "<|im_end|>"


def test_the_q4_1_blocks_serve_without_dequantizing(path: Path, tokenizer: Tokenizer, engine: LLMEngine) -> None:
    """`quantization: "gguf"` keeps the file's Q4_1 linears as 8-bit blocks (exact values) for the
    C kernel, in half the memory (the fp32 embedding stays). Each of fp32's answer tokens is asked
    after fp32's own prefix, the first included: a near tie in fp32 ("The" -1.88 against "L" -1.97
    log-probability) that int8 activations flipped and the kernel's 15-bit ones keep (2026-12-04)."""
    from naiad.llm.layers.quantization import Q8BlockLinear, weight_bytes

    kept = LLMEngine(EngineConfig(model=path, dtype="float32", kv_cache_memory=64 << 20, quantization="gguf"))
    model = kept.runner.model
    assert sum(isinstance(module, Q8BlockLinear) for module in model.modules()) == 30 * 4 + 1  # and the LM head
    assert weight_bytes(model) < 0.5 * weight_bytes(engine.runner.model)  # 263 MB against 538 MB
    prompt = tokenizer.encode(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True))
    (answer,) = engine.generate([prompt], max_tokens=20, sampling_params=GREEDY)
    assert "Paris" in tokenizer.decode(answer)
    prefixes = [prompt + answer[:i] for i in range(len(answer))]
    choices = kept.generate(prefixes, 1, GREEDY)
    assert [c[0] for c in choices] == answer  # "The capital of France is Paris." and the end


def test_the_chat_template_is_compiled_once(tokenizer: Tokenizer) -> None:
    """Compiling SmolLM2's template took 2.7 ms of every chat request and left its Jinja
    environment to the cyclic garbage collector: it is compiled once per template text, and a
    render leaves nothing for the collector."""
    first = tokenizer.apply_chat_template(QUESTION)
    assert tokenizer.chat_template is not None
    assert tokenizer_module._compile(tokenizer.chat_template) is tokenizer_module._compile(tokenizer.chat_template)
    gc.collect()
    gc.disable()
    try:
        assert all(tokenizer.apply_chat_template(QUESTION) == first for _ in range(5))
        assert gc.collect() == 0
    finally:
        gc.enable()
