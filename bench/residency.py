"""Many models on one server (issue 28, docs/residency.md): what a cold start costs, and what a
mostly-hot request mix costs against every model resident, measured in the same run.

1. Cold start per model: naiad --model-load-on-demand with a repository of that one model. The
   first request loads it; its latency is shown as a ratio to a warm request's, with the
   footprint the server measured. Models: MiniLM (ONNX Runtime, the bundled example), a Python
   model (model.py, numpy), SmolLM2 (the LLM engine, one generated token).
2. Mix: 20 Python models, 9 of them hot. "all resident": no budget, every model loaded by a first
   request; "under the budget": a budget of ten footprints (the hot nine and one more). The 90/10
   mix (every client sends 90 % of its requests to the hot nine, 10 % over the other eleven) as a
   ratio to all resident: cold requests are loads, so this measures how many loads per second the
   server makes. And what churn costs the hot traffic: seven clients on the hot nine while an
   eighth asks only for cold models, as a ratio to the seven alone. Closed loops; server CPU-µs
   per request.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS_DIR, ROOT, free_ports, start_server, tree_cpu_seconds

PY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.ballast = np.ones(4 << 20, dtype=np.float32)  # 16 MiB, written through

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
'''
PY_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''
CLIENTS = 8


def _python_model(repo: Path, name: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(PY_MODEL)
    (repo / name / "config.pbtxt").write_text(PY_CONFIG)


def _serve(name: str, repo: Path, *flags: str):
    http, grpc, metrics = free_ports(3)
    server = start_server(name, [str(ROOT / ".venv/bin/naiad"), "serve", "--model-repository", str(repo),
                                 f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
                                 "--http-address=127.0.0.1", "--log-warning=true", *flags])
    server.wait_ready(300)
    server.metrics_port = metrics  # type: ignore[attr-defined]
    return server


def _resident_bytes(server, model: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'nv_model_resident_bytes{{model="{model}"}}'):
                return int(float(line.split()[-1]))
    return 0


def _request(kind: str) -> tuple[str, bytes]:
    """(path, body) of one request for a model of `kind`."""
    if kind == "onnx":
        ids = [101, 7592, 2088, 102]
        tensor = [{"name": n, "datatype": "INT64", "shape": [1, 4], "data": d}
                  for n, d in (("input_ids", ids), ("attention_mask", [1] * 4), ("token_type_ids", [0] * 4))]
        return "/v2/models/{m}/infer", json.dumps({"inputs": tensor}).encode()
    if kind == "llm":
        return "/v2/models/{m}/generate", json.dumps({"text_input": "Hello", "max_tokens": 1,
                                                      "temperature": 0}).encode()
    return "/v2/models/{m}/infer", json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1],
                                                           "data": [1]}]}).encode()


def _timed(url: str, model: str, kind: str) -> float:
    path, body = _request(kind)
    request = urllib.request.Request(f"http://{url}{path.format(m=model)}", body, method="POST")
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()
    return time.perf_counter() - start


def cold_starts(rounds: int) -> list[dict[str, object]]:
    examples = ROOT / "examples"
    cases = [("minilm (ONNX)", "minilm", examples / "models" / "minilm", "onnx"),
             ("Python model", "py", None, "python"),
             ("SmolLM2 (LLM engine)", "smollm2", examples / "llm" / "smollm2", "llm")]
    rows = []
    for label, model, source, kind in cases:
        colds, warms, footprints = [], [], []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as folder:
                repo = Path(folder)
                if source is None:
                    _python_model(repo, model)
                else:
                    shutil.copytree(source, repo / model, symlinks=True)
                server = _serve(f"residency-{model}", repo, "--model-load-on-demand")
                try:
                    colds.append(_timed(server.url, model, kind))
                    warms.append(statistics.median(_timed(server.url, model, kind) for _ in range(5)))
                    footprints.append(_resident_bytes(server, model))
                finally:
                    server.stop()
        cold, warm = statistics.median(colds), statistics.median(warms)
        rows.append({"model": label, "cold_s": cold, "warm_ms": warm * 1e3, "cold_over_warm": cold / warm,
                     "footprint_mib": statistics.median(footprints) / (1 << 20)})
    return rows


def _closed_loop(url: str, clients: list[list[str]], seconds: float, seed: int) -> list[int]:
    """Requests each client answered in `seconds`; client i draws its models from clients[i]."""
    stop = time.monotonic() + seconds
    counts = [0] * len(clients)

    def client(index: int) -> None:
        rng = random.Random(seed + index)
        data = np.array([1], dtype=np.int32)
        with httpclient.InferenceServerClient(url, network_timeout=600) as connection:
            while time.monotonic() < stop:
                tensor = httpclient.InferInput("IN", [1], "INT32")
                tensor.set_data_from_numpy(data)
                connection.infer(rng.choice(clients[index]), [tensor])
                counts[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


#: (setting, clients): "mix" is the 90/10 request mix on every client (the hot nine drawn ten
#: times as often as each cold one); "churn" keeps seven clients on the hot nine while an eighth
#: asks for cold models only, so each of its requests is a cold start: what churn costs hot traffic.
def _settings(hot: list[str], cold: list[str]) -> dict[str, list[list[str]]]:
    weighted = hot * 110 + cold * 10
    return {"mix": [weighted] * CLIENTS, "churn": [hot] * (CLIENTS - 1) + [cold],
            "hot only": [hot] * (CLIENTS - 1)}


def mix(rounds: int, seconds: float) -> dict[str, object]:
    names = [f"py{i}" for i in range(20)]
    hot, cold = names[:9], names[9:]
    settings = _settings(hot, cold)
    runs: dict[tuple[str, str], list[tuple[list[int], float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder)
        for name in names:
            _python_model(repo, name)
        footprint = 0
        for round_index in range(rounds):
            for residency in ("all resident", "budget"):
                flags = ["--model-load-on-demand"]
                if residency == "budget":
                    flags = [f"--model-memory-budget={10 * footprint}"]
                server = _serve(f"residency-mix-{round_index}", repo, *flags)
                try:
                    for name in (names if residency == "all resident" else hot):
                        _timed(server.url, name, "python")  # loaded (the hot nine warm) before timing
                    if residency == "all resident":
                        footprint = statistics.median(_resident_bytes(server, name) for name in names)
                    for setting, clients in settings.items():
                        cpu = tree_cpu_seconds(server.proc.pid)
                        counts = _closed_loop(server.url, clients, seconds, round_index)
                        cpu = tree_cpu_seconds(server.proc.pid) - cpu
                        runs.setdefault((residency, setting), []).append((counts, cpu / sum(counts) * 1e6))
                finally:
                    server.stop()

    def rate(residency: str, setting: str, clients: slice = slice(None)) -> float:
        return statistics.median(sum(counts[clients]) / seconds for counts, _ in runs[(residency, setting)])

    def cpu_us(residency: str, setting: str) -> float:
        return statistics.median(cpu for _, cpu in runs[(residency, setting)])

    hot_clients = slice(0, CLIENTS - 1)
    return {
        "footprint_mib": footprint / (1 << 20),
        "mix_resident_rps": rate("all resident", "mix"), "mix_budget_rps": rate("budget", "mix"),
        "mix_ratio": rate("budget", "mix") / rate("all resident", "mix"),
        "mix_resident_cpu_us": cpu_us("all resident", "mix"), "mix_budget_cpu_us": cpu_us("budget", "mix"),
        "hot_alone_rps": rate("budget", "hot only"),
        "hot_during_churn_rps": rate("budget", "churn", hot_clients),
        "churn_ratio": rate("budget", "churn", hot_clients) / rate("budget", "hot only"),
        "cold_starts_per_s": rate("budget", "churn", slice(CLIENTS - 1, CLIENTS)),
        "churn_cpu_us": cpu_us("budget", "churn"),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure; medians are shown")
    parser.add_argument("--seconds", type=float, default=20.0, help="closed-loop window of the mix")
    parser.add_argument("--quick", action="store_true", help="one round, 3 s windows: checks the script")
    args = parser.parse_args(argv)
    rounds, seconds = (1, 3.0) if args.quick else (args.rounds, args.seconds)
    rows = cold_starts(rounds)
    print(f"\ncold start on first request, median of {rounds} round(s)")
    print("| model | footprint | cold request | warm request | cold ÷ warm |\n|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['footprint_mib']:.0f} MiB | {row['cold_s']:.2f} s | "
              f"{row['warm_ms']:.1f} ms | {row['cold_over_warm']:.0f}x |")
    mixed = mix(rounds, seconds)
    print(f"\n20 Python models ({mixed['footprint_mib']:.0f} MiB each), {seconds:.0f} s windows, median of "
          f"{rounds} round(s); budget: ten footprints (the hot nine and one more)")
    print("| workload | all resident req/s | under the budget req/s | ratio | CPU-µs/req resident | under budget |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| 90/10 mix, {CLIENTS} clients | {mixed['mix_resident_rps']:,.0f} | {mixed['mix_budget_rps']:,.0f} | "
          f"{mixed['mix_ratio']:.2f} | {mixed['mix_resident_cpu_us']:,.0f} | {mixed['mix_budget_cpu_us']:,.0f} |")
    print(f"\nhot traffic ({CLIENTS - 1} clients on the hot nine) while an eighth client asks only for cold models")
    print("| hot req/s, alone | hot req/s, during churn | ratio | cold starts/s | CPU-µs/req |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {mixed['hot_alone_rps']:,.0f} | {mixed['hot_during_churn_rps']:,.0f} | {mixed['churn_ratio']:.2f} | "
          f"{mixed['cold_starts_per_s']:.1f} | {mixed['churn_cpu_us']:,.0f} |")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "residency.json"
    path.write_text(json.dumps({"cold_starts": rows, "mix": mixed}, indent=2))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
