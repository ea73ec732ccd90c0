"""Structured outputs' cost (issue 24): the bundled SmolLM2 served by naiad, the same chat requests
unconstrained and under a JSON schema, in the same run.

- **tokens/s, json_schema ÷ unconstrained** at 1 and 16 streams: streamed /v1/chat/completions,
  `max_tokens` 128 with `ignore_eos` (exactly 128 tokens unconstrained); the schema is an array of
  16 small objects, longer than 128 tokens, so the guided answers are cut at 128 tokens too and
  both sides generate the same number of tokens. Plus the server's CPU-ms per output token.
- **TTFT, a new schema ÷ none**, one stream: requests in turn, unconstrained, under a schema never
  seen before (a property renamed each time: a compile per request) and under one seen before
  (compiled once, then copied); medians.

Rounds alternate the two sides (A, B, A, B ...) so that the machine's drift touches both.

    .venv/bin/python bench/llm_structured.py [--rounds 3] [--streams 1 16]

Results: a printed table and `.bench/results/llm-structured-<date>.json`; the server's log in
`.bench/logs/llm-structured.log`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
from harness import LOG_DIR, RESULTS_DIR, ROOT, BenchError, Server, free_ports, http_get, tail, tree_cpu_seconds

MODEL = "smollm2"
REPO = ROOT / ".bench" / "llm-structured-repo"
NEW_TOKENS = 128
CONFIG = f"""name: "{MODEL}"
backend: "llm"
parameters {{ key: "model" value: {{ string_value: "bundled:smollm2" }} }}
parameters {{ key: "dtype" value: {{ string_value: "auto" }} }}
parameters {{ key: "kv_cache_memory" value: {{ string_value: "268435456" }} }}
parameters {{ key: "max_num_seqs" value: {{ string_value: "64" }} }}
"""
MESSAGES = [{"role": "user", "content": "List sixteen items of a shop's inventory as JSON, with their quantities."}]


def schema(field: str = "qty") -> dict[str, Any]:
    item = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                             field: {"type": "integer", "minimum": 0, "maximum": 999}},
            "required": ["name", field], "additionalProperties": False}
    return {"type": "object", "properties": {"items": {"type": "array", "items": item, "minItems": 16,
                                                       "maxItems": 16}},
            "required": ["items"], "additionalProperties": False}


def start() -> tuple[Server, str]:
    (REPO / MODEL / "1").mkdir(parents=True, exist_ok=True)
    (REPO / MODEL / "config.pbtxt").write_text(CONFIG)
    ports = free_ports(3)
    argv = [str(ROOT / ".venv/bin/naiad"), "serve", "--model-repository", str(REPO), "--http-address", "127.0.0.1",
            f"--http-port={ports[0]}", "--grpc-address", "127.0.0.1", f"--grpc-port={ports[1]}",
            "--metrics-port", str(ports[2])]
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / "llm-structured.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    server = Server("naiad", proc, ports[0], None, log)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"naiad exited with {proc.returncode} before ready:\n{tail(log, 25)}")
        if http_get(f"http://127.0.0.1:{ports[0]}/v2/models/{MODEL}/ready")[0] == 200:
            return server, f"http://127.0.0.1:{ports[0]}"
        time.sleep(0.5)
    server.stop()
    raise BenchError(f"naiad not ready after 600 s:\n{tail(log, 25)}")


async def chat(session: aiohttp.ClientSession, base: str, extra: dict[str, Any]) -> tuple[float, int]:
    """One streamed chat: (seconds to the first content, completion tokens)."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    start = time.perf_counter()
    first = None
    tokens = 0
    async with session.post(f"{base}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise BenchError(f"HTTP {response.status}: {(await response.text())[:300]}")
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if first is None and any(c.get("delta", {}).get("content") for c in event.get("choices") or []):
                first = time.perf_counter() - start
    if first is None:
        raise BenchError("no content streamed")
    return first, tokens


async def load(base: str, streams: int, requests: int, extra: dict[str, Any]) -> tuple[float, int]:
    """`requests` chats with `streams` in flight: (wall seconds, completion tokens in all)."""
    left = [requests]
    total = [0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=600)) as session:
        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                tokens = (await chat(session, base, extra))[1]  # awaited first: `+=` would read the total before
                total[0] += tokens

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        return time.perf_counter() - began, total[0]


async def ttfts(base: str, count: int, extra: Any) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as session:
        for index in range(count):
            out.append((await chat(session, base, extra(index) if callable(extra) else extra))[0])
    return out


def guided(field: str = "qty") -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "inventory", "schema": schema(field)}}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--ttft-requests", type=int, default=8)
    args = parser.parse_args()
    server, base = start()
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "throughput": [], "ttft": [],
                           "load_at_start": Path("/proc/loadavg").read_text().split()[:3]}
    try:
        asyncio.run(load(base, 4, 4, {}))  # warm-up: the engine and the grammar engine's tokenizer
        asyncio.run(load(base, 4, 4, guided()))
        for round_index in range(args.rounds):
            for streams in args.streams:
                requests = max(4, 2 * streams)
                row: dict[str, Any] = {"round": round_index + 1, "streams": streams}
                for side, extra in (("unconstrained", {}), ("json_schema", guided())):
                    cpu0 = tree_cpu_seconds(server.proc.pid)
                    wall, tokens = asyncio.run(load(base, streams, requests, extra))
                    cpu = tree_cpu_seconds(server.proc.pid) - cpu0
                    row[side] = {"tokens_per_s": tokens / wall, "cpu_ms_per_token": cpu * 1e3 / tokens,
                                 "tokens": tokens}
                ratio = row["json_schema"]["tokens_per_s"] / row["unconstrained"]["tokens_per_s"]
                row["ratio"] = ratio
                doc["throughput"].append(row)
                print(f"round {round_index + 1} c={streams:<3} unconstrained "
                      f"{row['unconstrained']['tokens_per_s']:7.1f} tok/s "
                      f"({row['unconstrained']['cpu_ms_per_token']:.1f} CPU-ms/token)  json_schema "
                      f"{row['json_schema']['tokens_per_s']:7.1f} tok/s "
                      f"({row['json_schema']['cpu_ms_per_token']:.1f} CPU-ms/token)  ratio {ratio:.3f}", flush=True)
            stamp = f"{round_index}-{time.time_ns()}"
            none = asyncio.run(ttfts(base, args.ttft_requests, {}))
            new = asyncio.run(ttfts(base, args.ttft_requests, lambda i, stamp=stamp: guided(f"q{stamp}x{i}")))
            seen = asyncio.run(ttfts(base, args.ttft_requests, guided()))
            row = {"round": round_index + 1, **{name: statistics.median(values) * 1e3 for name, values in
                                                 (("none_ms", none), ("new_schema_ms", new), ("seen_schema_ms", seen))}}
            row["new_ratio"] = row["new_schema_ms"] / row["none_ms"]
            row["seen_ratio"] = row["seen_schema_ms"] / row["none_ms"]
            doc["ttft"].append(row)
            print(f"round {round_index + 1} TTFT c=1: none {row['none_ms']:.1f} ms, new schema "
                  f"{row['new_schema_ms']:.1f} ms ({row['new_ratio']:.2f}x), seen schema "
                  f"{row['seen_schema_ms']:.1f} ms ({row['seen_ratio']:.2f}x)", flush=True)
    finally:
        server.stop()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"llm-structured-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(doc, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
