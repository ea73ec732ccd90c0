"""fp32 vs fp16 vs int8 ONNX variants of MiniLM: size on disk, memory, and onnxruntime throughput
as a ratio to fp32 in the same run (issue 11).

    .venv/bin/python bench/onnx_precision.py [--seconds 20] [--batch 8] [--seq 64] [--threads 1] [--rounds 3]

The variants are the files naiad's onnxruntime backend serves for `parameters { key: "precision" }`
(made by `naiad.backends.onnxruntime_precision.precision_variant`, into $NAIAD_CACHE_DIR or a
temporary cache). Throughput is one in-process InferenceSession per variant with the backend's
session options (one intra-op thread unless --threads), batch 8 of random token ids, measured in
interleaved slices so that machine noise hits every variant alike. ``--rounds N`` (default 1)
repeats that measurement N times on the same sessions, each ratio to fp32 taken within its round;
the table shows medians over the rounds, with each round's ratio in brackets, and the JSON keeps
every round's figures. Memory is the resident set a fresh process gains by creating the session
and running one batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnxruntime as ort
from harness import median, with_rounds

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "examples" / "models" / "minilm" / "1" / "model.onnx"
SENTENCES = ROOT / "tests" / "examples" / "minilm_reference.json"  # real tokenized sentences
RESULTS_DIR = ROOT / ".bench" / "results"
VARIANTS = ("fp32", "fp16", "int8")

# Run in a fresh interpreter per variant: RSS after the imports, after the session, after one run.
_MEMORY_PROBE = """
import sys, numpy as np, onnxruntime as ort
def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096
base = rss()
options = ort.SessionOptions(); options.intra_op_num_threads = int(sys.argv[2])
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
loaded = rss()
ids = np.ones((int(sys.argv[3]), int(sys.argv[4])), np.int64)
session.run(None, {"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)})
print(loaded - base, rss() - base)
"""


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def _sentences() -> dict[str, np.ndarray]:
    rows = json.loads(SENTENCES.read_text())["input_ids"]
    longest = max(map(len, rows))
    ids = np.array([row + [0] * (longest - len(row)) for row in rows], np.int64)
    mask = (np.arange(longest)[None, :] < np.array([len(r) for r in rows])[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _memory(path: Path, threads: int, batch: int, seq: int) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(path), str(threads), str(batch), str(seq)],
                         check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


def _throughput(sessions: dict[str, ort.InferenceSession], feeds: dict[str, np.ndarray], seconds: float,
                batch: int) -> dict[str, float]:
    """Sequences/s of each session over ``seconds`` in all, run in interleaved 0.5 s slices."""
    runs = dict.fromkeys(sessions, 0)
    spent = dict.fromkeys(sessions, 0.0)
    slice_s = 0.5
    for _ in range(max(1, int(seconds / slice_s / len(sessions)))):
        for variant, session in sessions.items():
            start = time.perf_counter()
            while time.perf_counter() - start < slice_s:
                session.run(["sentence_embedding"], feeds)
                runs[variant] += 1
            spent[variant] += time.perf_counter() - start
    return {v: runs[v] * batch / spent[v] for v in sessions}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds, all variants together")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (the backend's default is 1)")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds of --seconds each; medians are shown")
    args = parser.parse_args(argv)
    if not SOURCE.is_file():
        print(f"{SOURCE} is missing: run `make examples` (examples/prepare.py) first", file=sys.stderr)
        return 1
    if os.environ.get("NAIAD_CACHE_DIR"):
        return _run(args)
    with tempfile.TemporaryDirectory(prefix="naiad-precision-") as cache:  # ~70 MB of variants
        os.environ["NAIAD_CACHE_DIR"] = cache
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from naiad.backends.onnxruntime_precision import precision_variant

    paths, build_s = {}, {}
    for variant in VARIANTS:
        start = time.perf_counter()
        paths[variant] = precision_variant(SOURCE, variant, "minilm")
        build_s[variant] = time.perf_counter() - start
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    sessions = {v: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for v, p in paths.items()}
    feeds = _feeds(args.batch, args.seq)
    # Agreement on real sentences (random token ids are far from what the model was trained on).
    sentences = _sentences()
    reference = sessions["fp32"].run(["sentence_embedding"], sentences)[0]
    cosine = {}
    for variant, session in sessions.items():
        session.run(["sentence_embedding"], feeds)  # warm-up at the timed shape
        out = session.run(["sentence_embedding"], sentences)[0]
        cosine[variant] = float(((out * reference).sum(1) / np.linalg.norm(out, axis=1)
                                 / np.linalg.norm(reference, axis=1)).min())

    rates: list[dict[str, float]] = []  # per round: sequences/s of each variant
    for round_no in range(1, args.rounds + 1):
        print(f"round {round_no}/{args.rounds} ({args.seconds:.0f} s) ...", flush=True)
        rates.append(_throughput(sessions, feeds, args.seconds, args.batch))

    rows = []
    print(f"MiniLM-L6 batch {args.batch} x {args.seq} tokens, {args.threads} intra-op thread(s), "
          f"onnxruntime {ort.__version__}, {datetime.now(UTC):%Y-%m-%d}; median of {args.rounds} round(s), "
          "x fp32 within each round (each round's in brackets)")
    print(f"{'variant':8} {'file MB':>8} {'size':>6} {'RSS MB':>7} {'seq/s':>8} {'min cos':>8} {'convert s':>9}  "
          "x fp32")
    for variant in VARIANTS:
        size = paths[variant].stat().st_size
        loaded, after_run = _memory(paths[variant], args.threads, args.batch, args.seq)
        ratios = [r[variant] / r["fp32"] for r in rates]
        rate = median(r[variant] for r in rates)
        rows.append({"variant": variant, "file_bytes": size, "rss_loaded_bytes": loaded,
                     "rss_after_run_bytes": after_run, "sequences_per_s": rate, "ratio_to_fp32": median(ratios),
                     "sequences_per_s_per_round": [r[variant] for r in rates], "ratio_to_fp32_per_round": ratios,
                     "min_cosine_to_fp32": cosine[variant], "convert_s": build_s[variant]})
        print(f"{variant:8} {size / 1e6:8.1f} {size / paths['fp32'].stat().st_size:6.2f} {after_run / 1e6:7.1f} "
              f"{rate:8.1f} {cosine[variant]:8.4f} {build_s[variant]:9.1f}  {with_rounds(ratios)}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"onnx_precision-{datetime.now(UTC).strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"batch": args.batch, "seq": args.seq, "threads": args.threads,
                               "seconds_per_round": args.seconds, "rounds": args.rounds, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
