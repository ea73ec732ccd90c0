"""LLM serving benchmark (issue 6): naiad's "llm" backend beside vLLM-CPU and llama.cpp's llama-server.

Model: the ~123M random-weight Llama of ``bench/llm_model.py`` (hidden 768, 12 layers, vocab
49152, SmolLM2 tokenizer) in ``.bench/llm-model/``; naiad runs it in bf16 from the HF directory,
vLLM-CPU in bfloat16 from the same directory, llama-server from its f32 GGUF conversion
(``bench/setup_llm_peers.sh`` builds all of it into the git-ignored ``.bench/``).

Load: each server in turn is started on free loopback ports, warmed up, then driven through its
OpenAI endpoint ``POST /v1/completions`` with ``stream: true`` (SSE) by an asyncio (aiohttp)
client: 128-token prompts (random lower-case words, checked to be exactly 128 tokens with the
model's tokenizer, distinct for every request so no prefix-cache hits; the same prompts for
every server), ``max_tokens: 128`` with ``ignore_eos: true`` (exactly 128 new tokens),
temperature 0, at 1, 16 and 64 concurrent streams; each point is a fixed set of
``max(4, 2 x streams)`` requests. Per request: TTFT (send to the first SSE chunk carrying text)
and inter-token latencies (gaps between consecutive chunks carrying text); per point: output
tokens/s (requests x 128 / wall time from the first send to the last answer) and the server's
CPU seconds per output token (user+system time of its whole process tree from /proc, as in
``bench/harness.py``). Every naiad figure is also shown as a ratio to each peer in the same run.

Also measured:
- **engine ceiling**: naiad's ``LLMEngine`` in this process (bf16, no server), one decode step
  with 1, 16 and 64 sequences (128-token prompts, prefilled first), as tokens/s: the server's
  overhead is the gap between this and the served figure. Runs while no server is up.
- **bandwidth ceiling** at 1 stream (bench/bandwidth.py): the bytes of weights one decode step
  reads over the rate this machine reads a buffer of that size, measured just before and after
  the engine's one-stream steps (the engine's ratio), and again just before and after each
  server's one-stream point, with that server up and idle (its served ratio): this VM's read
  rate moved x1.9 within ten minutes, so a rate read minutes away from a point says little of it.
- **prefix cache**: on each server, TTFT of a request whose prompt shares a 1,000-token prefix
  with an earlier finished request (hit) against one with a fresh 1,000-token prompt (miss),
  median of a few pairs; the ratio miss/hit (issue 6 targets >= 5x for naiad).

    .venv/bin/python bench/llm.py [--model llama123m|smollm2-gguf] [--servers naiad vllm llama]
                                  [--streams 1 16 64] [--no-ceiling] [--rounds 3]

``--rounds N``: N rounds of (engine ceiling, each server in turn); every figure is the median over
the rounds, and the tok/s ratio is the median of the rounds' own ratios, each shown beside it. The
prefix-cache pairs run in the first round only (a latency figure).

``--model smollm2-gguf``: the bundled SmolLM2-135M-Instruct's own Q4_1 GGUF file, served by naiad
with ``quantization: "gguf"`` (its blocks kept, dtype auto) and by llama-server from the same
file; vLLM-CPU does not run it. The prompts use the same SmolLM2 tokenizer.

Results: a printed table and ``.bench/results/llm-<date>.json``; server logs in ``.bench/logs/llm-*.log``.
A peer that is not installed (or fails to start) is reported as unavailable and the rest still runs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from harness import (
    BENCH_DIR,
    LOG_DIR,
    RESULTS_DIR,
    ROOT,
    BenchError,
    Server,
    fmt,
    free_ports,
    http_get,
    median,
    tail,
    tree_cpu_seconds,
    with_rounds,
)
from llm_model import MODEL_DIR, is_built

GGUF_PATH = BENCH_DIR / "llm-model.f32.gguf"
VLLM_PYTHON = BENCH_DIR / "vllm-venv/bin/python"
LLAMA_SRC = BENCH_DIR / "llama-cpp-src"
NAIAD_REPO = BENCH_DIR / "llm-naiad-repo"
PROMPT_TOKENS = 128
NEW_TOKENS = 128
PREFIX_TOKENS = 1000
MAX_SEQS = 64
SERVERS = ("naiad", "vllm", "llama")
PEERS = ("vllm", "llama")
# Servers whose load set-up cannot hold a 1,000-token prompt: restarted for the prefix-cache pairs.
PREFIX_RESTART = ("llama",)
LABELS = {"naiad": "naiad", "vllm": "vLLM-CPU", "llama": "llama-server"}
WORD = re.compile(r"^Ġ[a-z]{3,}$")  # byte-level BPE: Ġ is the leading space


@dataclass(frozen=True)
class BenchModel:
    """What every server of one run serves: the model's name, what naiad and vLLM load, the
    GGUF llama-server loads, the llm backend's parameters and the engine ceiling's settings."""

    name: str
    source: Path
    gguf: Path
    naiad: dict[str, str]
    engine: dict[str, Any]
    vllm: bool = True


def bench_models() -> dict[str, BenchModel]:
    from naiad.llm.loading.gguf import smollm2_path

    smollm2 = smollm2_path()
    return {
        "llama123m": BenchModel("llama123m", MODEL_DIR, GGUF_PATH, {"dtype": "bf16"}, {"dtype": "bf16"}),
        "smollm2-gguf": BenchModel("smollm2", smollm2, smollm2, {"dtype": "auto", "quantization": "gguf"},
                                   {"dtype": "auto", "quantization": "gguf"}, vllm=False),
    }


CHOSEN: BenchModel  # set by main from --model


# ------------------------------------------------------------------------------------ prompts


class Prompts:
    """Distinct prompts of an exact token length: random space-separated lower-case words."""

    def __init__(self, seed: int) -> None:
        if CHOSEN.source.suffix == ".gguf":  # the file's own tokenizer (SmolLM2's)
            from naiad.llm.loading.gguf import open_gguf
            from naiad.llm.loading.tokenizer import Tokenizer as GgufTokenizer

            self.tokenizer = GgufTokenizer.from_gguf(open_gguf(CHOSEN.source)).tokenizer
        else:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
        vocab = self.tokenizer.get_vocab()
        self.words = sorted(tok[1:] for tok in vocab if WORD.match(tok))
        self.rng = random.Random(seed)
        self.seen: set[str] = set()

    def make(self, n_tokens: int) -> str:
        while True:
            text = "".join(" " + self.rng.choice(self.words) for _ in range(n_tokens))
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) != n_tokens:  # a rare merge across words: cut to length and re-check
                text = self.tokenizer.decode(ids[:n_tokens])
                if len(self.tokenizer.encode(text, add_special_tokens=False).ids) != n_tokens:
                    continue
            if text not in self.seen:
                self.seen.add(text)
                return text

    def batch(self, count: int, n_tokens: int = PROMPT_TOKENS) -> list[str]:
        return [self.make(n_tokens) for _ in range(count)]

    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


# ------------------------------------------------------------------------------------- client


@dataclass
class RequestResult:
    ttft_s: float | None
    itl_s: list[float]
    text_chunks: int
    end_s: float  # since the point started
    completion_tokens: int | None  # from the server's usage chunk, when it sends one
    prompt_tokens: int | None
    error: str | None = None
    sent_s: float = 0.0  # since the point started


async def stream_completion(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int,
                            t0: float) -> RequestResult:
    """One streamed /v1/completions call; times measured on the client's monotonic clock."""
    body = {
        "model": CHOSEN.name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                return RequestResult(None, [], 0, time.perf_counter() - t0, None, None, f"HTTP {resp.status}: {text}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if "error" in event:
                    return RequestResult(None, [], 0, now - t0, None, None, f"stream error: {event['error']}")
                if event.get("usage"):
                    usage = event["usage"]
                choices = event.get("choices") or []
                if choices and choices[0].get("text"):
                    stamps.append(now)
    except (TimeoutError, aiohttp.ClientError) as err:
        return RequestResult(None, [], 0, time.perf_counter() - t0, None, None, f"{type(err).__name__}: {err}")
    end = time.perf_counter()
    return RequestResult(
        sent_s=start - t0,
        ttft_s=stamps[0] - start if stamps else None,
        itl_s=[b - a for a, b in itertools.pairwise(stamps)],
        text_chunks=len(stamps),
        end_s=end - t0,
        completion_tokens=usage.get("completion_tokens"),
        prompt_tokens=usage.get("prompt_tokens"),
    )


async def run_load(base: str, prompts: list[str], streams: int, max_tokens: int) -> tuple[list[RequestResult], float]:
    """Send ``prompts`` with at most ``streams`` in flight; (results, wall seconds)."""
    queue = list(reversed(prompts))
    results: list[RequestResult] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    # A fresh connection per request: llama-server closes streamed connections, and a pooled one
    # it has closed fails the next request ("Can not write request body").
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()

        async def worker() -> None:
            while queue:
                prompt = queue.pop()
                results.append(await stream_completion(session, f"{base}/v1/completions", prompt, max_tokens, t0))

        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - t0
    return results, wall


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


@dataclass
class Point:
    """One server at one number of concurrent streams."""

    server: str
    streams: int
    requests: int
    ok: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    cpu_s: float
    cpu_ms_per_token: float
    usage_tokens_checked: int  # requests whose usage said exactly NEW_TOKENS
    text_chunks_mean: float
    errors: list[str] = field(default_factory=list)


def summarize(server: str, streams: int, results: list[RequestResult], wall: float, cpu_s: float) -> Point:
    ok = [r for r in results if r.error is None]
    tokens = NEW_TOKENS * len(ok)
    ttft = [r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]
    itl = [x * 1e3 for r in ok for x in r.itl_s]

    def pct(values: list[float], q: float) -> float | None:
        return percentile(values, q)

    return Point(
        server=server, streams=streams, requests=len(results), ok=len(ok), output_tokens=tokens,
        wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else 0.0,
        ttft_p50_ms=pct(ttft, 50), ttft_p99_ms=pct(ttft, 99), itl_p50_ms=pct(itl, 50), itl_p99_ms=pct(itl, 99),
        cpu_s=cpu_s, cpu_ms_per_token=cpu_s * 1e3 / max(tokens, 1),
        usage_tokens_checked=sum(1 for r in ok if r.completion_tokens == NEW_TOKENS),
        text_chunks_mean=statistics.fmean(r.text_chunks for r in ok) if ok else 0.0,
        errors=sorted({r.error for r in results if r.error})[:5],
    )


# ------------------------------------------------------------------------------------ servers


def llama_server_bin() -> Path | None:
    for path in sorted(LLAMA_SRC.glob("llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-server")):
        if os.access(path, os.X_OK):
            return path
    return None


def unavailable_reason(name: str) -> str | None:
    """Why a server cannot run here (None when it can)."""
    if name == "vllm" and not CHOSEN.vllm:
        return f"vLLM-CPU does not serve {CHOSEN.gguf.name} here"
    if name == "vllm" and not VLLM_PYTHON.exists():
        return f"vLLM-CPU not installed ({VLLM_PYTHON} missing; run bash bench/setup_llm_peers.sh vllm)"
    if name == "llama":
        if llama_server_bin() is None:
            return "llama-server not built (run bash bench/setup_llm_peers.sh llama)"
        if not CHOSEN.gguf.exists():
            return f"{CHOSEN.gguf} missing (run bash bench/setup_llm_peers.sh gguf)"
    return None


def write_naiad_repo() -> Path:
    """A one-model repository: the chosen model served by the "llm" backend."""
    # Only this run's model: a directory left by a run of the other model would be served too,
    # its idle engine core (and its KV cache) beside the one measured.
    shutil.rmtree(NAIAD_REPO, ignore_errors=True)
    model = NAIAD_REPO / CHOSEN.name
    (model / "1").mkdir(parents=True, exist_ok=True)
    params = {
        "model": str(CHOSEN.source), **CHOSEN.naiad, "kv_cache_memory": str(1 << 30),
        "max_num_seqs": str(MAX_SEQS), "enable_prefix_caching": "true",
    }
    lines = [f'name: "{CHOSEN.name}"', 'backend: "llm"']
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    (model / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return NAIAD_REPO


def server_argv(name: str, ports: list[int], prefix_mode: bool = False) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, readiness URL) for one server on ``ports[0]`` (HTTP).

    ``prefix_mode``: the llama-server set-up for the prefix-cache pairs (see PREFIX_RESTART).
    """
    port = ports[0]
    env = dict(os.environ)
    if name == "naiad":
        argv = [str(ROOT / ".venv/bin/naiad"), "serve", "--model-repository", str(write_naiad_repo()),
                "--http-address", "127.0.0.1", f"--http-port={port}", "--grpc-address", "127.0.0.1",
                f"--grpc-port={ports[1]}", "--metrics-port", str(ports[2])]
        return argv, env, f"http://127.0.0.1:{port}/v2/models/{CHOSEN.name}/ready"
    if name == "vllm":
        env["VLLM_CPU_KVCACHE_SPACE"] = "2"
        argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(CHOSEN.source),
                "--served-model-name", CHOSEN.name, "--dtype", "bfloat16", "--host", "127.0.0.1",
                "--port", str(port), "--max-num-seqs", str(MAX_SEQS), "--max-model-len", "2048"]
        return argv, env, f"http://127.0.0.1:{port}/health"
    # llama-server: 64 continuous-batching slots of 256 tokens each (-c is split between them). A
    # unified KV buffer (-kvu) would let one slot take a 1,000-token prompt, but then every
    # sequence attends over the whole shared buffer: 5x slower at 64 streams, so the prefix-cache
    # pairs get a server of their own with one 2,048-token slot instead.
    slots, ctx = (1, 2048) if prefix_mode else (MAX_SEQS, MAX_SEQS * 256)
    argv = [str(llama_server_bin()), "-m", str(CHOSEN.gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(ctx), "-a", CHOSEN.name, "--no-webui"]
    return argv, env, f"http://127.0.0.1:{port}/health"


def start(name: str, timeout_s: float, prefix_mode: bool = False) -> tuple[Server, str]:
    """Start one server and wait until its readiness URL answers 200; (server, base URL)."""
    ports = free_ports(3)
    argv, env, ready_url = server_argv(name, ports, prefix_mode)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"llm-{name}{'-prefix' if prefix_mode else ''}.log"
    with log.open("wb") as out:
        out.write((" ".join(argv) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    server = Server(name, proc, ports[0], None, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited with {proc.returncode} before ready ({log}):\n{tail(log, 25)}")
        if http_get(ready_url)[0] == 200:
            return server, f"http://127.0.0.1:{ports[0]}"
        time.sleep(0.5)
    server.stop()
    raise BenchError(f"{name} not ready after {timeout_s:.0f} s ({log}):\n{tail(log, 25)}")


# --------------------------------------------------------------------------------- measurement


def measure_server(name: str, base: str, server: Server, load: dict[int, list[str]], warmup: list[str],
                   prefix_pairs: list[tuple[str, str, str]], read_bytes: int | None = None) -> dict[str, Any]:
    """Warm-up, then every load point, then the prefix-cache pairs, on one running server.
    With `read_bytes` (the bytes of weights one decode step reads), the one-stream point also
    gets the bandwidth ceiling read just before and just after it."""
    if read_bytes:
        from bandwidth import ceiling_tokens_per_s, read_rate  # torch: only where a ceiling is read
    out: dict[str, Any] = {"points": [], "prefix": None}
    results, _ = asyncio.run(run_load(base, warmup, len(warmup), 16))
    bad = [r.error for r in results if r.error]
    if bad:
        raise BenchError(f"{name}: warm-up failed: {bad[0]}")
    for streams, prompts in load.items():
        rates = [read_rate(read_bytes)] if read_bytes and streams == 1 else []
        cpu0 = tree_cpu_seconds(server.proc.pid)
        results, wall = asyncio.run(run_load(base, prompts, streams, NEW_TOKENS))
        cpu_s = tree_cpu_seconds(server.proc.pid) - cpu0
        point = summarize(name, streams, results, wall, cpu_s)
        beside: dict[str, Any] = {}
        if read_bytes and rates:
            rates.append(read_rate(read_bytes))
            bound = ceiling_tokens_per_s(read_bytes, statistics.mean(rates))
            beside = {"ceiling_read_gb_s": [rate / 1e9 for rate in rates], "ceiling_tokens_per_s": bound,
                      "served_over_ceiling": point.tokens_per_s / bound}
        prompt_tokens = {r.prompt_tokens for r in results if r.prompt_tokens is not None}
        print(f"  {LABELS[name]:<12} c={streams:<3} {point.tokens_per_s:7.1f} tok/s  TTFT p50 "
              f"{fmt(point.ttft_p50_ms, ',.0f')} ms  ITL p50 {fmt(point.itl_p50_ms, ',.1f')} ms  "
              f"{point.cpu_ms_per_token:.1f} CPU-ms/token  ({point.ok}/{point.requests} ok, {wall:.1f} s"
              f"{', prompt tokens ' + str(sorted(prompt_tokens)) if prompt_tokens else ''})", flush=True)
        if beside:
            before, after = beside["ceiling_read_gb_s"]  # far apart: the machine changed state meanwhile
            print(f"  {'':<12} ÷ the bandwidth ceiling read beside it ({beside['ceiling_tokens_per_s']:.1f} tok/s; "
                  f"{before:.1f} GB/s before, {after:.1f} after): {beside['served_over_ceiling']:.2f}", flush=True)
        for err in point.errors:
            print(f"    error: {err}", flush=True)
        if server.proc.poll() is not None:
            raise BenchError(f"{name} exited with {server.proc.returncode} ({server.log}):\n{tail(server.log, 25)}")
        by_send = sorted((r for r in results if r.ttft_s is not None), key=lambda r: r.sent_s)
        out["points"].append(asdict(point) | beside | {
            "prompt_tokens_reported": sorted(prompt_tokens),
            "ttft_ms_in_send_order": [round(r.ttft_s * 1e3, 1) for r in by_send if r.ttft_s is not None],
        })
    if prefix_pairs and name not in PREFIX_RESTART:
        out["prefix"] = measure_prefix(name, base, prefix_pairs)
    return out


def measure_prefix(name: str, base: str, pairs: list[tuple[str, str, str]]) -> dict[str, Any]:
    """For each (first, hit, miss): run ``first`` to the end, then ``hit`` (same 1,000-token prefix), then ``miss``."""
    hits, misses = [], []

    def ttft(prompt: str) -> float | None:
        results, _ = asyncio.run(run_load(base, [prompt], 1, 4))
        return results[0].ttft_s

    for first, hit, miss in pairs:
        ttft(first)
        h, m = ttft(hit), ttft(miss)
        if h is not None and m is not None:
            hits.append(h * 1e3)
            misses.append(m * 1e3)
    if not hits:
        return {"error": "no TTFT measured"}
    hit_ms, miss_ms = statistics.median(hits), statistics.median(misses)
    print(f"  {LABELS[name]:<12} prefix cache: TTFT hit {hit_ms:.0f} ms, miss {miss_ms:.0f} ms, "
          f"ratio {miss_ms / hit_ms:.1f}x", flush=True)
    return {"hit_ttft_ms": hits, "miss_ttft_ms": misses, "hit_median_ms": hit_ms, "miss_median_ms": miss_ms,
            "ratio_miss_over_hit": miss_ms / hit_ms}


def engine_ceiling(streams: list[int], prompts: Prompts, steps: int) -> list[dict[str, Any]]:
    """Tokens/s of naiad's bare engine decode step (no server), the chosen model, 128-token prompts."""
    import torch
    from bandwidth import ceiling_tokens_per_s, decode_read_bytes, read_rate

    from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
    from naiad.llm.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=CHOSEN.source, **CHOSEN.engine, kv_cache_memory=1 << 30,
                                    max_num_seqs=MAX_SEQS))
    greedy = SamplingParams(temperature=0.0)
    engine.generate([prompts.token_ids(p) for p in prompts.batch(2)], max_tokens=8, sampling_params=greedy)  # warm-up
    read_bytes = decode_read_bytes(engine.runner.model)
    rows = []
    for n in streams:
        rates = [read_rate(read_bytes)] if n == 1 else []  # the bandwidth ceiling at one stream
        ids = [engine.add_request(prompts.token_ids(p), NEW_TOKENS, sampling_params=greedy, ignore_eos=True)
               for p in prompts.batch(n)]
        seqs = [engine.scheduler.get(i) for i in ids]
        while any(s is not None and s.num_output_tokens < 1 for s in seqs):  # prefill everything first
            engine.step()
        for _ in range(2):
            engine.step()
        times = []
        with torch.inference_mode():
            for _ in range(steps):
                t = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - t)
        for request_id in ids:
            engine.abort_request(request_id)
        while engine.has_unfinished():
            engine.step()
        step_s = statistics.median(times)
        row = {"streams": n, "steps": steps, "median_step_ms": step_s * 1e3, "tokens_per_s": n / step_s,
               "mean_tokens_per_s": n * steps / sum(times)}
        print(f"  engine ceiling c={n:<3} {row['tokens_per_s']:7.1f} tok/s (median decode step "
              f"{row['median_step_ms']:.1f} ms over {steps} steps)", flush=True)
        if rates:
            rates.append(read_rate(read_bytes))  # before and after the steps: the rate drifts
            ceiling = ceiling_tokens_per_s(read_bytes, statistics.mean(rates))
            row |= {"read_bytes": read_bytes, "read_gb_s": [rate / 1e9 for rate in rates],
                    "bandwidth_ceiling_tokens_per_s": ceiling}
            print(f"  bandwidth ceiling c=1 {ceiling:7.1f} tok/s ({read_bytes / 1e6:.1f} MB of weights a step "
                  f"at {statistics.mean(rates) / 1e9:.1f} GB/s); engine ÷ it {row['tokens_per_s'] / ceiling:.2f}",
                  flush=True)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------- report


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def round_ratios(rounds: list[dict[str, Any]], peer: str, streams: int) -> list[float | None]:
    """Each round's naiad ÷ peer tok/s at `streams` (None where a round lacks either)."""
    def tokens_per_s(one: dict[str, Any], server: str) -> float | None:
        points = one["servers"].get(server, {}).get("points", [])
        return next((p["tokens_per_s"] for p in points if p["streams"] == streams), None)

    pairs = [(tokens_per_s(r, "naiad"), tokens_per_s(r, peer)) for r in rounds]
    return [a / b if a is not None and b else None for a, b in pairs]


def print_table(doc: dict[str, Any]) -> None:
    points = {(p["server"], p["streams"]): p for s in doc["servers"].values() for p in s.get("points", [])}
    ceiling = {row["streams"]: row["tokens_per_s"] for row in doc.get("engine_ceiling") or []}
    rounds = len(doc.get("rounds", [])) or 1
    print(f"\n## LLM serving, 128 prompt + 128 new tokens, /v1/completions stream, temperature 0; "
          f"median of {rounds} round(s)")
    print("| server | c | tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | CPU-ms/token | ok |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (server, streams), p in sorted(points.items(), key=lambda kv: (kv[0][1], SERVERS.index(kv[0][0]))):
        print(f"| {LABELS[server]} | {streams} | {p['tokens_per_s']:,.1f} | {fmt(p['ttft_p50_ms'])} / "
              f"{fmt(p['ttft_p99_ms'])} | {fmt(p['itl_p50_ms'], ',.1f')} / {fmt(p['itl_p99_ms'], ',.1f')} | "
              f"{p['cpu_ms_per_token']:.1f} | {p['ok']}/{p['requests']} |")
    print("\n### naiad / peer (tok/s: higher is better; TTFT, ITL, CPU per token: lower is better)")
    print("| c | peer | tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | CPU-ms/token "
          "| engine ceiling tok/s | naiad served / ceiling |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for streams in doc["streams"]:
        n = points.get(("naiad", streams))
        if n is None:
            continue
        for peer in PEERS:
            p = points.get((peer, streams))
            if p is None:
                continue
            rounds = doc.get("rounds", [])  # several: the median of the rounds' own ratios, then each
            tokens = (with_rounds(round_ratios(rounds, peer, streams)) if len(rounds) > 1
                      else ratio(n["tokens_per_s"], p["tokens_per_s"]))
            print(f"| {streams} | {LABELS[peer]} | {tokens} | "
                  f"{ratio(n['ttft_p50_ms'], p['ttft_p50_ms'])} | {ratio(n['ttft_p99_ms'], p['ttft_p99_ms'])} | "
                  f"{ratio(n['itl_p50_ms'], p['itl_p50_ms'])} | {ratio(n['itl_p99_ms'], p['itl_p99_ms'])} | "
                  f"{ratio(n['cpu_ms_per_token'], p['cpu_ms_per_token'])} | {fmt(ceiling.get(streams), ',.1f')} | "
                  f"{ratio(n['tokens_per_s'], ceiling.get(streams))} |")
        if not any((peer, streams) in points for peer in PEERS):
            print(f"| {streams} | (no peer) | | | | | | | {fmt(ceiling.get(streams), ',.1f')} | "
                  f"{ratio(n['tokens_per_s'], ceiling.get(streams))} |")
    one = next((row for row in doc.get("engine_ceiling") or [] if "bandwidth_ceiling_tokens_per_s" in row), None)
    served = points.get(("naiad", 1))
    if one is not None:
        bound = one["bandwidth_ceiling_tokens_per_s"]
        print(f"\n### Bandwidth ceiling at 1 stream: {bound:,.1f} tok/s ({one['read_bytes'] / 1e6:.1f} MB of weights "
              f"a step at {statistics.mean(one['read_gb_s']):.1f} GB/s, read in this run)")
        print(f"naiad engine ÷ ceiling {ratio(one['tokens_per_s'], bound)}; naiad served ÷ ceiling "
              f"{ratio(served['tokens_per_s'] if served else None, bound)}")
        by_round = [next((row for row in r.get("engine_ceiling") or [] if "bandwidth_ceiling_tokens_per_s" in row),
                         None) for r in doc.get("rounds", [])]
        if len(by_round) > 1:  # the read rate is the process's memory state: say it round by round
            print("each round: " + "; ".join(
                f"engine ÷ ceiling {ratio(row['tokens_per_s'], row['bandwidth_ceiling_tokens_per_s'])} at "
                f"{statistics.mean(row['read_gb_s']):.1f} GB/s" for row in by_round if row is not None))
    if served is not None and "served_over_ceiling" in served:
        print(f"naiad served ÷ the ceiling read just before and after its own one-stream point: "
              f"{with_rounds(served['served_over_ceiling_rounds'])}")
    prefix = {s: v["prefix"] for s, v in doc["servers"].items() if v.get("prefix")}
    if prefix:
        print(f"\n### Prefix cache: TTFT with a shared {PREFIX_TOKENS}-token prefix (hit) vs a fresh prompt (miss)")
        print("| server | hit TTFT (ms) | miss TTFT (ms) | miss / hit |")
        print("|---|---:|---:|---:|")
        for server, v in prefix.items():
            if "error" in v:
                print(f"| {LABELS[server]} | - | - | {v['error']} |")
            else:
                print(f"| {LABELS[server]} | {v['hit_median_ms']:,.0f} | {v['miss_median_ms']:,.0f} | "
                      f"{v['ratio_miss_over_hit']:.1f}x |")
    for server, why in doc["unavailable"].items():
        print(f"unavailable: {LABELS[server]}: {why}")


# --------------------------------------------------------------------------------------- rounds


def run_round(args: argparse.Namespace, prompts: Prompts, load: dict[int, list[str]], warmup: list[str],
              prefix_pairs: list[tuple[str, str, str]], unavailable: dict[str, str]) -> dict[str, Any]:
    """The engine ceiling, then each server in turn (a server found unavailable is skipped from then on)."""
    one: dict[str, Any] = {"servers": {}, "engine_ceiling": None, "loadavg_start": os.getloadavg()}
    read_bytes = None  # the bytes one decode step reads, from the engine ceiling: a served ceiling needs it
    if not args.no_ceiling:
        print(f"naiad engine ceiling (in-process LLMEngine, {CHOSEN.name}, no server)", flush=True)
        try:
            one["engine_ceiling"] = engine_ceiling(args.streams, prompts, args.ceiling_steps)
            read_bytes = next((row["read_bytes"] for row in one["engine_ceiling"] if "read_bytes" in row), None)
        except Exception as err:  # the served benchmark still runs; say why the ceiling is missing
            print(f"  engine ceiling failed: {type(err).__name__}: {err}", flush=True)
            one["engine_ceiling_error"] = f"{type(err).__name__}: {err}"
    for name in args.servers:
        why = unavailable.get(name) or unavailable_reason(name)
        if why:
            print(f"{LABELS[name]}: unavailable: {why}", flush=True)
            unavailable[name] = why
            continue
        print(f"{LABELS[name]}: starting", flush=True)
        server = None
        try:
            t = time.monotonic()
            server, base = start(name, args.start_timeout)
            print(f"  ready after {time.monotonic() - t:.0f} s", flush=True)
            one["servers"][name] = measure_server(name, base, server, load, warmup, prefix_pairs, read_bytes)
            if prefix_pairs and name in PREFIX_RESTART:
                server.stop(30)
                server, base = start(name, args.start_timeout, prefix_mode=True)
                one["servers"][name]["prefix"] = measure_prefix(name, base, prefix_pairs)
                one["servers"][name]["prefix_server"] = "restarted with -np 1 -c 2048"
        except BenchError as err:
            print(f"{LABELS[name]}: unavailable: {err}", flush=True)
            unavailable[name] = str(err).splitlines()[0]
        finally:
            if server is not None:
                server.stop(30)
    return one


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    return median(row.get(key) for row in rows)


def merge_rounds(rounds: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """Each server's points and the engine ceiling as medians over the rounds, field by field (each
    round's own figures stay in ``doc["rounds"]``)."""
    servers: dict[str, Any] = {}
    for name in SERVERS:
        measured = [r["servers"][name] for r in rounds if name in r["servers"]]
        if not measured:
            continue
        points = []
        for streams in sorted({p["streams"] for m in measured for p in m["points"]}):
            rows = [p for m in measured for p in m["points"] if p["streams"] == streams]
            merged = {"server": name, "streams": streams, "rounds": len(rows),
                      "requests": sum(p["requests"] for p in rows), "ok": sum(p["ok"] for p in rows)}
            for key in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "cpu_ms_per_token"):
                merged[key] = median_of(rows, key)
            beside = [p["served_over_ceiling"] for p in rows if "served_over_ceiling" in p]
            if beside:  # the median of the rounds' own ratios (each against the rate read beside it)
                merged |= {"served_over_ceiling": statistics.median(beside), "served_over_ceiling_rounds": beside}
            points.append(merged)
        servers[name] = {"points": points, "prefix": next((m["prefix"] for m in measured if m.get("prefix")), None)}
    ceilings = [r["engine_ceiling"] for r in rounds if r.get("engine_ceiling")]
    if not ceilings:
        return servers, None
    engine = []
    for streams in sorted({row["streams"] for c in ceilings for row in c}):
        rows = [row for c in ceilings for row in c if row["streams"] == streams]
        merged = {"streams": streams, "rounds": len(rows), "tokens_per_s": median_of(rows, "tokens_per_s"),
                  "median_step_ms": median_of(rows, "median_step_ms")}
        bounded = [row for row in rows if "bandwidth_ceiling_tokens_per_s" in row]
        if bounded:
            merged |= {"read_bytes": bounded[0]["read_bytes"],
                       "read_gb_s": [rate for row in bounded for rate in row["read_gb_s"]],
                       "bandwidth_ceiling_tokens_per_s": median_of(bounded, "bandwidth_ceiling_tokens_per_s")}
        engine.append(merged)
    return servers, engine


# --------------------------------------------------------------------------------------- main


def naiad_source() -> dict[str, Any]:
    """The commit naiad ran from, and the files under src/ that differed from it at the start."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "src_changes": git("status", "--short", "--", "src").splitlines()}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("llama123m", "smollm2-gguf"), default="llama123m",
                        help="the 123M random-weight Llama (bf16 / f32 GGUF) or the bundled SmolLM2's Q4_1 GGUF")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64], help="concurrent streams")
    parser.add_argument("--requests-per-stream", type=int, default=2,
                        help="requests per point = max(4, this x streams)")
    parser.add_argument("--prefix-pairs", type=int, default=3, help="hit/miss pairs for the prefix cache (0: skip)")
    parser.add_argument("--no-ceiling", action="store_true", help="skip naiad's in-process engine ceiling")
    parser.add_argument("--ceiling-steps", type=int, default=20, help="timed decode steps per ceiling point")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds to wait for a server to be ready")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of (engine ceiling, every server): medians, and each round's tok/s ratio")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    global CHOSEN
    CHOSEN = bench_models()[args.model]
    if any(n > MAX_SEQS for n in args.streams):
        raise SystemExit(f"--streams above {MAX_SEQS} (the servers' max_num_seqs / slots) would queue")
    if CHOSEN.source == MODEL_DIR and not is_built():
        print("model missing: running bench/setup_llm_peers.sh model", flush=True)
        subprocess.run(["bash", str(ROOT / "bench/setup_llm_peers.sh"), "model"], check=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    prompts = Prompts(args.seed)
    load = {n: prompts.batch(max(4, args.requests_per_stream * n)) for n in args.streams}
    warmup = prompts.batch(4)
    prefix_pairs = []
    for _ in range(args.prefix_pairs):
        prefix = prompts.make(PREFIX_TOKENS)
        prefix_pairs.append((prefix + prompts.make(24), prefix + prompts.make(24), prompts.make(PREFIX_TOKENS + 24)))
    doc: dict[str, Any] = {
        "benchmark": "llm", "started": started, "model": CHOSEN.name, "source": str(CHOSEN.source),
        "gguf": str(CHOSEN.gguf),
        "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS, "streams": args.streams,
        "requests": {str(n): len(p) for n, p in load.items()}, "args": vars(args),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "servers": {}, "unavailable": {}, "engine_ceiling": None, "naiad_source": naiad_source(),
    }
    rounds: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        print(f"round {round_no}/{args.rounds} (load {os.getloadavg()[0]:.2f})", flush=True)
        # The prefix-cache pairs are a latency figure, not a throughput: the first round only.
        rounds.append(run_round(args, prompts, load, warmup, prefix_pairs if round_no == 1 else [],
                                doc["unavailable"]))
    doc["rounds"] = rounds
    doc["servers"], doc["engine_ceiling"] = merge_rounds(rounds)
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    doc["host"]["loadavg_end"] = os.getloadavg()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"llm-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(doc)
    print(f"\nresults: {path}")
    return 1 if doc["unavailable"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
