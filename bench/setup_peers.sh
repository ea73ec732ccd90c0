#!/usr/bin/env bash
# Install the benchmark peers into the git-ignored .bench/ folder (never as project deps):
#   .bench/triton-venv  nvidia-pytriton 0.7.0  -> tritonserver 2.51.0 + Python backend (3.11 stub)
#   .bench/pa-venv      tritonclient[all] 2.51.0 -> perf_analyzer (+ CUDA runtime lib it links)
# Idempotent: each step is skipped when its result is already there. See shared/PEERS.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="$ROOT/.bench"
PY="${PEER_PYTHON:-python3.11}"
TRITON_VENV="$BENCH/triton-venv"
PA_VENV="$BENCH/pa-venv"
TRITON_SITE="$TRITON_VENV/lib/python3.11/site-packages"
PA_SITE="$PA_VENV/lib/python3.11/site-packages"
TRITON_DIR="$TRITON_SITE/pytriton/tritonserver"
PA_BIN="$PA_VENV/bin/perf_analyzer"

log() { echo "[setup_peers] $*" >&2; }

make_venv() {  # make_venv DIR PIP-ARGS...
    local dir="$1"; shift
    if [ ! -x "$dir/bin/python" ]; then
        log "creating $dir"
        "$PY" -m venv "$dir"
    fi
    log "pip install $* into $dir"
    # pip warns about every missing local index entry; keep its real messages only.
    "$dir/bin/pip" install --quiet "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }
}

ensure_libb64() {
    if ldconfig -p | grep -q 'libb64\.so\.0d'; then return; fi
    log "apt-get install libb64-0d"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq libb64-0d >/dev/null 2>&1; then
        apt-get update -qq >/dev/null
        apt-get install -y -qq libb64-0d >/dev/null
    fi
}

ensure_triton() {
    if [ ! -x "$TRITON_DIR/bin/tritonserver" ] || ! "$TRITON_VENV/bin/python" -c 'import numpy' 2>/dev/null; then
        make_venv "$TRITON_VENV" "nvidia-pytriton==0.7.0" numpy
    fi
    local stub="$TRITON_DIR/backends/python/triton_python_backend_stub"
    if [ ! -x "$stub" ]; then
        log "copying the Python 3.11 stub into backends/python"
        cp "$TRITON_DIR/python_backend_stubs/3.11/triton_python_backend_stub" "$stub"
        chmod +x "$stub"
    fi
}

ensure_perf_analyzer() {
    if [ ! -x "$PA_BIN" ] || [ ! -d "$PA_SITE/nvidia/cuda_runtime/lib" ]; then
        make_venv "$PA_VENV" "tritonclient[all]==2.51.0" nvidia-cuda-runtime-cu12
    fi
}

main() {
    mkdir -p "$BENCH"
    ensure_libb64
    ensure_triton
    ensure_perf_analyzer
    echo "tritonserver:         $TRITON_DIR/bin/tritonserver"
    echo "  backend directory:  $TRITON_DIR/backends"
    echo "  LD_LIBRARY_PATH:    $TRITON_SITE/nvidia_pytriton.libs"
    echo "  model.py site dir:  $TRITON_SITE"
    echo "perf_analyzer:        $PA_BIN"
    echo "  LD_LIBRARY_PATH:    $PA_SITE/nvidia/cuda_runtime/lib"
}

main "$@"
