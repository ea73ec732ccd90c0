"""The models of the dynamic-batching benchmark and the repositories that serve them.

Everything here is generated under the git-ignored ``.bench/`` folder and never committed:

- ``.bench/batching-repo/``: naiad's repository. The MLP (FP32 ``INPUT`` [-1, 256] -> MatMul
  256x1024 -> ReLU -> MatMul 1024x256 -> ``OUTPUT``, fixed-seed random weights, built with
  onnx.helper) and the MiniLM encoder of ``examples/models/minilm`` (sequence length 128), each
  twice: ``*_dynamic`` with ``dynamic_batching`` and ``*_nobatch`` without it.
- ``.bench/batching-triton-repo/``: the peer's repository, the same MLP in the same two variants
  served by Triton's Python backend through a ``model.py`` that runs onnxruntime.
- ``.bench/batching-data/minilm.json``: perf_analyzer ``--input-data`` for MiniLM (valid token ids).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from harness import BENCH_DIR, ROOT, TRITON_SITE

NAIAD_REPO = BENCH_DIR / "batching-repo"
TRITON_REPO = BENCH_DIR / "batching-triton-repo"
DATA_DIR = BENCH_DIR / "batching-data"
MINILM_SOURCE = ROOT / "examples/models/minilm/1/model.onnx"
TRITON_PYTHON = BENCH_DIR / "triton-venv/bin/python"

MLP_IN, MLP_HIDDEN, MLP_SEED = 256, 1024, 0
SEQ_LEN = 128
VOCAB = 30522  # bert-base-uncased, MiniLM's tokenizer: token ids must stay below this
MINILM_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class Batching:
    """The dynamic_batching settings of one model (the ``*_dynamic`` variant)."""

    max_queue_delay_us: int
    preferred: tuple[int, ...] = ()

    def pbtxt(self) -> str:
        preferred = f" preferred_batch_size: [ {', '.join(map(str, self.preferred))} ]" if self.preferred else ""
        return f"dynamic_batching {{ max_queue_delay_microseconds: {self.max_queue_delay_us}{preferred} }}\n"


@dataclass(frozen=True)
class BenchModel:
    """A benchmarked model: its name stem, batching limits and how perf_analyzer feeds it."""

    stem: str  # "mlp" or "minilm"; served as STEM_dynamic and STEM_nobatch
    max_batch_size: int
    batching: Batching
    instances: int

    def name(self, dynamic: bool) -> str:
        return f"{self.stem}_{'dynamic' if dynamic else 'nobatch'}"

    def pa_args(self) -> list[str]:
        """perf_analyzer flags that shape (and for MiniLM fill) one batch-1 request."""
        if self.stem == "mlp":
            return ["--shape", f"INPUT:{MLP_IN}"]
        shapes = [arg for name in MINILM_INPUTS for arg in ("--shape", f"{name}:{SEQ_LEN}")]
        return [*shapes, "--input-data", str(DATA_DIR / "minilm.json")]


# ---------------------------------------------------------------------------------------------
# ONNX files


def build_mlp(path: Path) -> Path:
    """Write the MLP as ONNX (opset 17, IR version 8) to ``path`` unless it is already there."""
    if path.exists():
        return path
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(MLP_SEED)
    w1 = (rng.standard_normal((MLP_IN, MLP_HIDDEN)) / np.sqrt(MLP_IN)).astype(np.float32)
    w2 = (rng.standard_normal((MLP_HIDDEN, MLP_IN)) / np.sqrt(MLP_HIDDEN)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT", "W1"], ["hidden"]),
            helper.make_node("Relu", ["hidden"], ["act"]),
            helper.make_node("MatMul", ["act", "W2"], ["OUTPUT"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", MLP_IN])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", MLP_IN])],
        initializer=[numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def minilm_path() -> Path:
    """examples' MiniLM encoder; it is made by ``make examples``."""
    if not MINILM_SOURCE.exists():
        raise FileNotFoundError(f"{MINILM_SOURCE} is missing: run `make examples` first")
    return MINILM_SOURCE


def link_model(source: Path, target: Path) -> None:
    """Make ``target`` name ``source`` (a symlink: the MiniLM file is 90 MB)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        if target.resolve() == source.resolve():
            return
        target.unlink()
    target.symlink_to(source.resolve())


# ---------------------------------------------------------------------------------------------
# configs


def mlp_io() -> str:
    return (
        f'input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {MLP_IN} ] }} ]\n'
        f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {MLP_IN} ] }} ]\n'
    )


def minilm_io() -> str:
    inputs = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in MINILM_INPUTS)
    return (
        f"input [\n{inputs}\n]\n"
        "output [\n"
        '  { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 384 ] },\n'
        '  { name: "sentence_embedding" data_type: TYPE_FP32 dims: [ 384 ] }\n'
        "]\n"
    )


def naiad_config(model: BenchModel, dynamic: bool) -> str:
    """naiad's config: onnxruntime, 1 intra-op thread per instance, ``model.instances`` CPU instances."""
    io = mlp_io() if model.stem == "mlp" else minilm_io()
    text = (
        f'name: "{model.name(dynamic)}"\n'
        'backend: "onnxruntime"\n'
        f"max_batch_size: {model.max_batch_size}\n"
        f"{io}"
        f"instance_group [ {{ count: {model.instances} kind: KIND_CPU }} ]\n"
        'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
        'parameters { key: "inter_op_thread_count" value { string_value: "1" } }\n'
    )
    return text + (model.batching.pbtxt() if dynamic else "")


def triton_config(model: BenchModel, dynamic: bool) -> str:
    """The peer's config: the same I/O, instances and batching, on the Python backend."""
    text = (
        f'name: "{model.name(dynamic)}"\n'
        'backend: "python"\n'
        f"max_batch_size: {model.max_batch_size}\n"
        f"{mlp_io()}"
        f"instance_group [ {{ count: {model.instances} kind: KIND_CPU }} ]\n"
    )
    return text + (model.batching.pbtxt() if dynamic else "")


TRITON_MODEL_PY = '''\
"""The MLP for the benchmark peer: onnxruntime, 1 intra-op thread, one session per instance.

Generated by bench/batching_models.py. Each execute() gets the requests Triton's dynamic batcher
put together and runs them as one onnxruntime call.
"""
import os
import site

# The stub embeds Debian's libpython and ignores PYTHONPATH: find numpy and onnxruntime in the venv.
site.addsitedir({site_dir!r})

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        (out,) = self.session.run(["OUTPUT"], {{"INPUT": batch}})
        responses, start = [], 0
        for array in arrays:
            end = start + array.shape[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out[start:end])]))
            start = end
        return responses
'''


# ---------------------------------------------------------------------------------------------
# repositories


def write_naiad_repo(models: list[BenchModel]) -> Path:
    """Generate naiad's repository (both variants of each model) and return its root."""
    if NAIAD_REPO.exists():
        shutil.rmtree(NAIAD_REPO)  # a clean repo: only the models of this run
    mlp = build_mlp(BENCH_DIR / "batching-models/mlp.onnx")
    for model in models:
        source = mlp if model.stem == "mlp" else minilm_path()
        for dynamic in (True, False):
            model_dir = NAIAD_REPO / model.name(dynamic)
            link_model(source, model_dir / "1/model.onnx")
            (model_dir / "config.pbtxt").write_text(naiad_config(model, dynamic))
    return NAIAD_REPO


def write_triton_repo(model: BenchModel) -> Path:
    """Generate the peer's repository for the MLP (both variants) and return its root."""
    if TRITON_REPO.exists():
        shutil.rmtree(TRITON_REPO)
    mlp = build_mlp(BENCH_DIR / "batching-models/mlp.onnx")
    for dynamic in (True, False):
        model_dir = TRITON_REPO / model.name(dynamic)
        (model_dir / "1").mkdir(parents=True)
        shutil.copyfile(mlp, model_dir / "1/model.onnx")
        (model_dir / "1/model.py").write_text(TRITON_MODEL_PY.format(site_dir=str(TRITON_SITE)))
        (model_dir / "config.pbtxt").write_text(triton_config(model, dynamic))
    return TRITON_REPO


def write_minilm_data(entries: int = 8, seed: int = 0) -> Path:
    """perf_analyzer ``--input-data`` JSON: ``entries`` sequences of SEQ_LEN valid token ids.

    perf_analyzer's own "random" data would put arbitrary int64 values in input_ids, which the
    embedding lookup rejects; "zero" would be all padding. These look like real sentences to the
    model: [CLS] random ids [SEP], full attention mask, segment 0.
    """
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(entries):
        ids = [101, *rng.integers(1000, VOCAB, SEQ_LEN - 2).tolist(), 102]
        data.append({
            "input_ids": {"content": ids, "shape": [SEQ_LEN]},
            "attention_mask": {"content": [1] * SEQ_LEN, "shape": [SEQ_LEN]},
            "token_type_ids": {"content": [0] * SEQ_LEN, "shape": [SEQ_LEN]},
        })
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = DATA_DIR / "minilm.json"
    path.write_text(json.dumps({"data": data}))
    return path


def minilm_feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """In-process MiniLM inputs of ``batch`` rows shaped like perf_analyzer's requests."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, VOCAB, (batch, SEQ_LEN), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {
        "input_ids": ids,
        "attention_mask": np.ones((batch, SEQ_LEN), dtype=np.int64),
        "token_type_ids": np.zeros((batch, SEQ_LEN), dtype=np.int64),
    }


def mlp_feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """In-process MLP inputs of ``batch`` rows."""
    return {"INPUT": np.random.default_rng(seed).standard_normal((batch, MLP_IN)).astype(np.float32)}


def ensure_triton_onnxruntime() -> None:
    """Add onnxruntime to ``.bench/triton-venv`` (the peer's model.py imports it) when missing."""
    probe = subprocess.run([str(TRITON_PYTHON), "-c", "import onnxruntime"], capture_output=True)
    if probe.returncode == 0:
        return
    print("adding onnxruntime to .bench/triton-venv", flush=True)
    done = subprocess.run([str(TRITON_PYTHON), "-m", "pip", "install", "--quiet", "onnxruntime"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install onnxruntime into .bench/triton-venv failed:\n{done.stdout}{done.stderr}")
