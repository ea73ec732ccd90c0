"""The embedding ensemble against the same three steps called in-process.

    .venv/bin/python bench/ensemble.py [--concurrency 32] [--seconds 10] [--protocols grpc http openai] [--rounds 3]

naiad serves ``minilm_embed`` from the example repository (``make examples`` writes its files):
minilm_tokenizer (python) -> minilm_encoder (onnx) -> minilm_pooling (python), all inside the
server. tritonclient's asyncio clients keep ``--concurrency`` requests in flight, one sentence per
request, cycling through :data:`SENTENCES` (so token counts vary, as in real traffic). The
``openai`` row sends the same sentences to ``POST /v1/embeddings`` (aiohttp, bodies encoded once):
its ratio to the KServe ``http`` row is what the OpenAI route costs on top.

The baseline is one Python process doing the same three steps for one sentence at a time with
the same code: `tokenizers` with the repository's tokenizer.json, onnxruntime on
minilm_encoder's model.onnx (default threads) and the numpy ``mean_pool_normalize`` of
minilm_pooling. The headline is naiad's sentences per second over the baseline's; a second
in-process row encodes ``--concurrency`` sentences per call (padded), what batching alone buys
without a server. Each row reports the CPU time spent per sentence: the server's whole process
tree (model processes included) from /proc, the in-process rows' own process time.

naiad starts once; each of ``--rounds`` rounds (default 1) measures the in-process rows, then
naiad over each protocol, and each ratio is taken within its round. The table shows medians over
the rounds, with each round's ratio in brackets. Results, every round's figures included, go to
``.bench/results/ensemble-<date>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    RESULTS_DIR,
    ROOT,
    BenchError,
    Server,
    fmt,
    free_ports,
    http_get,
    median,
    start_server,
    tree_cpu_seconds,
    with_rounds,
)

REPO = ROOT / "examples" / "models"
NAIAD_BIN = ROOT / ".venv" / "bin" / "naiad"
MODEL = "minilm_embed"
STEPS = ["minilm_tokenizer", "minilm_encoder", "minilm_pooling"]
WARMUP_S = 2.0
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "How do I reset my password if I no longer have access to my email account?",
    "The quarterly report shows revenue growth in every region except the north-east.",
    "Inference servers batch requests to make better use of the hardware.",
    "It rained all day.",
    "Please turn off the lights when you leave the room.",
    "The train to the airport leaves every fifteen minutes during the morning rush hour.",
    "Cats sleep for most of the day.",
]


@dataclass
class Row:
    """One measured configuration."""

    name: str
    per_s: float
    p50_ms: float | None
    cpu_us: float
    count: int
    seconds: float


# --------------------------------------------------------------------------- in-process baseline


def in_process(seconds: float, per_call: int = 1) -> Row:
    """Tokenize, encode and pool ``per_call`` sentences at a time in this process; sentences per second.

    ``per_call=1`` is the headline baseline; a larger batch (padded to its longest sentence) shows
    what batching alone buys without a server.
    """
    import onnxruntime as ort
    from tokenizers import Tokenizer

    sys.path.insert(0, str(REPO / "minilm_pooling" / "1"))
    from pooling import mean_pool_normalize

    tokenizer = Tokenizer.from_file(str(REPO / "minilm_tokenizer" / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.no_padding()  # the file pads to 128 tokens; the model pads each request to its longest only
    session = ort.InferenceSession(str(REPO / "minilm_encoder" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])

    if per_call > 1:
        tokenizer.enable_padding()  # to the longest sentence of the call

    def embed(sentences: list[str]) -> np.ndarray:
        encodings = tokenizer.encode_batch(sentences)
        feeds = {"input_ids": np.array([e.ids for e in encodings], np.int64),
                 "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
                 "token_type_ids": np.array([e.type_ids for e in encodings], np.int64)}
        (hidden,) = session.run(["last_hidden_state"], feeds)
        return mean_pool_normalize(hidden, feeds["attention_mask"])

    def sentences(call: int) -> list[str]:
        return [SENTENCES[(call * per_call + i) % len(SENTENCES)] for i in range(per_call)]

    deadline = time.monotonic() + WARMUP_S
    while time.monotonic() < deadline:
        embed(sentences(0))
    latencies: list[float] = []
    cpu0, start = time.process_time(), time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.perf_counter()
        embed(sentences(len(latencies)))
        latencies.append(time.perf_counter() - t)
    wall, cpu = time.monotonic() - start, time.process_time() - cpu0
    done = len(latencies) * per_call
    return Row(f"in-process {per_call}/call", done / wall, statistics.median(latencies) * 1e3,
               cpu * 1e6 / done, done, wall)


# --------------------------------------------------------------------------- naiad


def start_naiad() -> Server:
    http, grpc, metrics = free_ports(3)
    argv = [str(NAIAD_BIN), "serve", f"--model-repository={REPO}", f"--http-port={http}", f"--grpc-port={grpc}",
            f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
            "--model-control-mode=explicit", *(f"--load-model={m}" for m in [*STEPS, MODEL])]
    server = start_server("ensemble-naiad", argv)
    server.wait_ready(120)
    return server


class _OpenAIClient:
    """POST /v1/embeddings with bodies encoded once (aiohttp, one keep-alive pool)."""

    def __init__(self, server: Server) -> None:
        import aiohttp

        self.url = f"http://{server.url}/v1/embeddings"
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def infer(self, model: str, inputs: list[bytes]) -> None:
        async with self.session.post(self.url, data=inputs[0], headers={"content-type": "application/json"}) as r:
            if r.status != 200:
                raise BenchError(f"/v1/embeddings answered {r.status}: {await r.text()}")
            await r.read()

    async def close(self) -> None:
        await self.session.close()


def _client(protocol: str, server: Server) -> tuple[Any, Any]:
    if protocol == "openai":
        return None, _OpenAIClient(server)
    if protocol == "grpc":
        import tritonclient.grpc as sync_module
        import tritonclient.grpc.aio as module
    else:
        import tritonclient.http as sync_module
        import tritonclient.http.aio as module
    return sync_module, module.InferenceServerClient(server.url_for(protocol))


async def _drive(protocol: str, server: Server, concurrency: int, seconds: float) -> Row:
    sync_module, client = _client(protocol, server)
    inputs: list[Any] = []
    for sentence in SENTENCES:  # built once: the client's own cost should not be what is measured
        if protocol == "openai":
            inputs.append(json.dumps({"model": MODEL, "input": sentence}).encode())
            continue
        tensor = sync_module.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[sentence.encode()]], dtype=np.object_))
        inputs.append(tensor)
    window: dict[str, float] = {}
    latencies: list[float] = []

    async def worker(first: int) -> None:
        k = first
        while "end" not in window:
            t = time.monotonic()
            await client.infer(MODEL, [inputs[k % len(inputs)]])
            done = time.monotonic()
            if "start" in window and t >= window["start"] and "end" not in window:
                latencies.append(done - t)
            k += concurrency

    async def clock() -> None:
        await asyncio.sleep(WARMUP_S)
        window["cpu0"], window["start"] = tree_cpu_seconds(server.proc.pid), time.monotonic()
        await asyncio.sleep(seconds)
        window["cpu1"], window["end"] = tree_cpu_seconds(server.proc.pid), time.monotonic()

    try:
        await asyncio.gather(clock(), *(worker(i) for i in range(concurrency)))
    finally:
        await client.close()
    wall = window["end"] - window["start"]
    count = len(latencies)
    if count == 0:
        raise BenchError(f"no {protocol} request finished inside the {seconds:.0f} s window")
    return Row(f"naiad {protocol} c={concurrency}", count / wall, statistics.median(latencies) * 1e3,
               (window["cpu1"] - window["cpu0"]) * 1e6 / count, count, wall)


def encoder_batch(server: Server) -> float | None:
    """The average batch minilm_encoder ran (inferences / executions since the server started)."""
    status, body = http_get(f"http://{server.url}/v2/models/minilm_encoder/stats")
    if status != 200:
        return None
    stats = json.loads(body)["model_stats"][0]
    return int(stats["inference_count"]) / max(1, int(stats["execution_count"]))


def check_answer(server: Server) -> None:
    """One request through the ensemble must give a unit vector, or there is nothing to measure."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[SENTENCES[0].encode()]], dtype=np.object_))
    embedding = client.infer(MODEL, [tensor]).as_numpy("EMBEDDING")
    if embedding.shape != (1, 384) or abs(float(np.linalg.norm(embedding)) - 1) > 1e-4:
        raise BenchError(f"{MODEL} answered {embedding.shape} with norm {np.linalg.norm(embedding):.4f}")


# --------------------------------------------------------------------------- report


def summarise(rounds: list[list[Row]]) -> list[dict[str, Any]]:
    """One entry per row: medians over rounds, and each round's ratio to that round's baseline
    (rounds[k][0])."""
    summary = []
    for i, row in enumerate(rounds[0]):
        same = [r[i] for r in rounds]
        summary.append({"name": row.name, **{f: median(getattr(r, f) for r in same)
                                             for f in ("per_s", "p50_ms", "cpu_us", "count")},
                        "ratios": [r[i].per_s / r[0].per_s for r in rounds]})
    return summary


def print_table(summary: list[dict[str, Any]]) -> None:
    ratios = summary[0]["ratios"]
    print(f"\n{MODEL}: one sentence per request, median of {len(ratios)} round(s); ratio = sentences/s over "
          f"{summary[0]['name']} in the same round, each round's in brackets "
          "(p50 ms: per call in process, per request through naiad)")
    print(f"{'':22}{'sentences/s':>12}{'p50 ms':>9}{'CPU-us/sent':>13}{'count':>8}  ratio")
    for row in summary:
        print(f"{row['name']:22}{fmt(row['per_s'], ',.1f'):>12}{fmt(row['p50_ms'], '.2f'):>9}"
              f"{fmt(row['cpu_us']):>13}{fmt(row['count']):>8}  {with_rounds(row['ratios'])}")


def write_json(rounds: list[list[Row]], summary: list[dict[str, Any]], args: argparse.Namespace) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"ensemble-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    path.write_text(json.dumps({
        "model": MODEL, "steps": STEPS, "sentences": len(SENTENCES), "args": vars(args), "summary": summary,
        "rounds": [[asdict(r) | {"ratio": r.per_s / rows[0].per_s} for r in rows] for rows in rounds],
    }, indent=2))
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per row")
    parser.add_argument("--protocols", nargs="+", choices=["grpc", "http", "openai"],
                        default=["grpc", "http", "openai"], help="openai: POST /v1/embeddings, one sentence each")
    parser.add_argument("--rounds", type=int, default=1, help="in-process-then-naiad rounds; medians are shown")
    args = parser.parse_args(argv)
    if not (REPO / "minilm_encoder" / "1" / "model.onnx").exists():
        raise SystemExit("examples/models is not prepared: run `make examples` first")

    rounds: list[list[Row]] = []  # each round: the baseline first, then the other rows
    server = start_naiad()
    try:
        check_answer(server)
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}/{args.rounds}:\n  in-process baseline ({args.seconds:.0f} s) ...", flush=True)
            rows = [in_process(args.seconds)]
            print(f"  in-process, {args.concurrency} sentences per call ({args.seconds:.0f} s) ...", flush=True)
            rows.append(in_process(args.seconds, per_call=args.concurrency))
            for protocol in args.protocols:
                print(f"  naiad {protocol} c={args.concurrency} ({args.seconds:.0f} s) ...", flush=True)
                rows.append(asyncio.run(_drive(protocol, server, args.concurrency, args.seconds)))
            rounds.append(rows)
        batch = encoder_batch(server)
    finally:
        server.stop()
    summary = summarise(rounds)
    print_table(summary)
    print(f"minilm_encoder's average batch inside naiad (dynamic batching of equal padded widths): "
          f"{batch or 0:.1f}")
    print(f"\nresults: {write_json(rounds, summary, args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
