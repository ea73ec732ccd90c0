"""Do pipeline stages overlap? A prefill step's time under pipeline parallelism, with and without micro-batches.

    python bench/llm_pipeline.py [--layers 4] [--hidden 768] [--rows 8] [--prompt 64] [--repeats 3]

Builds a random-weight Llama (transformers, into a temporary folder; no tokenizer needed) and
times one prefill step of `rows` prompts of `prompt` tokens on the CPU: one process on one
thread, then two pipeline stages (one thread each) cutting the step into 1, 2 and 4
micro-batches (`pipeline_micro_batches`). With one micro-batch the stages take turns, so the step
costs both stages' time plus the transfers; with M micro-batches of a step split in two equal
stages, GPipe's forward takes (M + 1) / (2M) of that: 0.75 for M = 2, 0.625 for M = 4, before
the per-micro-batch overheads. Each row is the median of `repeats` steps (fresh prompts, prefix
caching off) and its ratio to the one-micro-batch row measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY


def build(path: Path, layers: int, hidden: int) -> Path:
    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, vocab_size=2048,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def time_prefill(engine: LLMEngine, rows: int, prompt: int, repeats: int, seed: int) -> float:
    """The median time of a step that prefills `rows` fresh prompts together."""
    rng = random.Random(seed)
    times = []
    for _ in range(repeats):
        for _ in range(rows):
            engine.add_request([rng.randrange(3, 2048) for _ in range(prompt)], 1, sampling_params=GREEDY)
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        while engine.has_unfinished():
            engine.step()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = build(Path(folder) / "model", options.layers, options.hidden)
        base = {"model": model, "dtype": "float32", "kv_cache_memory": 256 << 20, "enable_prefix_caching": False,
                "max_num_batched_tokens": options.rows * options.prompt, "max_num_seqs": options.rows}
        torch.set_num_threads(1)  # as one stage has on this machine's share
        runs = [("1 process", {}), *((f"2 stages, {m} micro-batch(es)", {"pipeline_parallel_size": 2,
                                                                        "pipeline_micro_batches": m})
                                     for m in (1, 2, 4))]
        rows = []
        for name, settings in runs:
            engine = LLMEngine(EngineConfig(**{**base, **settings}))  # type: ignore[arg-type]
            try:
                time_prefill(engine, options.rows, options.prompt, 1, seed=99)  # warm up
                seconds = time_prefill(engine, options.rows, options.prompt, options.repeats, seed=1)
            finally:
                engine.close()
            rows.append({"run": name, "step_s": round(seconds, 4)})
        one_batch = rows[1]["step_s"]
        for row in rows:
            row["vs_1_micro_batch"] = round(row["step_s"] / one_batch, 3)
            print(json.dumps(row))


if __name__ == "__main__":
    main()
