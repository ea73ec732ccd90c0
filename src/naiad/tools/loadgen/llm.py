"""LLM load over the OpenAI API (streamed completions), for genai-perf's figures.

Each slot is a keep-alive HTTP connection that streams one completion at a time and stamps every
server-sent event that carries text: time to first token (TTFT), inter-token latency (ITL: the
time after the first token divided by the tokens that followed, as genai-perf defines it),
request latency and output length (from the `usage` the server sends last, else the chunks).

Prompts are synthetic: random common words, sized to a token count by asking the server how many
tokens a probe prompt is (`usage.prompt_tokens`), so no tokenizer is needed on the client and
every prompt differs (no prefix-cache hits between requests).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from naiad.tools.loadgen import http1
from naiad.tools.loadgen.measure import percentile

WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "that", "on", "as", "with", "by", "he", "at", "from",
    "his", "an", "were", "are", "which", "this", "be", "or", "has", "had", "not", "first", "one", "their",
    "its", "new", "after", "but", "who", "they", "have", "her", "she", "two", "been", "other", "when", "there",
    "all", "during", "into", "school", "time", "may", "years", "more", "most", "only", "over", "city", "some",
    "world", "would", "where", "later", "up", "such", "used", "many", "can", "state", "about", "national",
    "out", "known", "university", "united", "then", "made", "also", "team", "year", "game", "season", "river",
    "people", "part", "each", "house", "music", "film", "history", "family", "group", "between", "before",
    "through", "three", "since", "both", "under", "work", "series", "number", "well", "album", "won", "against",
    "following", "north", "south", "west", "east", "life", "band", "name", "early", "long", "town", "public",
    "same", "high", "war", "water", "light", "sound", "garden", "market", "paper", "window", "morning",
    "question", "story", "night", "mountain", "letter", "station",
)
_decoder = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class LlmSettings:
    endpoint: str = "completions"  # or "chat"
    prompt_tokens: int = 128
    prompt_tokens_stddev: int = 0
    output_tokens: int = 128
    ignore_eos: bool = True  # every request generates exactly output_tokens (vLLM's extension)
    seed: int = 0


@dataclass(slots=True)
class RequestRecord:
    start_ns: int
    first_ns: int = 0  # first event with text
    end_ns: int = 0
    chunks: int = 0
    output_tokens: int = 0  # from usage; chunks when the server sends none
    prompt_tokens: int = 0
    error: str = ""

    @property
    def ttft_ms(self) -> float:
        return (self.first_ns - self.start_ns) / 1e6

    @property
    def latency_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def itl_ms(self) -> float | None:
        if self.output_tokens < 2 or not self.first_ns:
            return None
        return (self.end_ns - self.first_ns) / 1e6 / (self.output_tokens - 1)


class StreamSlot(http1.HttpConnection):
    """One streamed completion at a time."""

    def __init__(self, run: LlmRun) -> None:
        super().__init__(_unused, keep_body=True)
        self.run = run
        self.record: RequestRecord | None = None
        self._pending = b""

    def send(self, body: bytes) -> None:
        self.record = RequestRecord(time.monotonic_ns())
        self._pending = b""
        self.write(body)

    def on_body(self, body: bytes) -> None:
        if self._status != 200:
            self._body.append(body)
            return
        data = self._pending + body
        *events, self._pending = data.split(b"\n\n")
        now = time.monotonic_ns()
        for event in events:
            self._event(event, now)

    def _event(self, event: bytes, now: int) -> None:
        record = self.record
        assert record is not None
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]" or not payload:
                continue
            try:
                chunk = _decoder.decode(payload)
            except msgspec.DecodeError:
                record.error = f"undecodable event: {payload[:80]!r}"
                continue
            if chunk.get("error"):
                record.error = str(chunk["error"].get("message", chunk["error"]))
            for choice in chunk.get("choices") or ():
                text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                if text:
                    record.chunks += 1
                    record.first_ns = record.first_ns or now
            usage = chunk.get("usage")
            if usage:
                record.output_tokens = int(usage.get("completion_tokens") or 0)
                record.prompt_tokens = int(usage.get("prompt_tokens") or 0)

    def on_message_complete(self) -> None:
        record = self.record
        assert record is not None
        record.end_ns = time.monotonic_ns()
        self.pending = False
        if self._status != 200:
            record.error = f"HTTP {self._status}: {b''.join(self._body).decode(errors='replace')[:300]}"
            self._body = []
        record.output_tokens = record.output_tokens or record.chunks
        self.run.finished(self, record)


def _unused(*_: Any) -> None:
    raise AssertionError("unreachable")


class PromptMaker:
    """Random-word prompts of about a given number of tokens, calibrated against the server."""

    def __init__(self, settings: LlmSettings) -> None:
        self.settings = settings
        self.random = random.Random(settings.seed)
        self.words_per_token = 1.0

    def words(self, count: int) -> str:
        return " ".join(self.random.choice(WORDS) for _ in range(max(1, count)))

    def prompt(self) -> str:
        tokens = self.settings.prompt_tokens
        if self.settings.prompt_tokens_stddev:
            tokens = max(1, round(self.random.gauss(tokens, self.settings.prompt_tokens_stddev)))
        return self.words(round(tokens * self.words_per_token))

    def body(self, host: str, model: str, prompt: str, max_tokens: int, stream: bool = True) -> bytes:
        request: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream}
        if self.settings.ignore_eos:
            request["ignore_eos"] = True
        if stream:
            request["stream_options"] = {"include_usage": True}
        if self.settings.endpoint == "chat":
            request["messages"] = [{"role": "user", "content": prompt}]
            path = "/v1/chat/completions"
        else:
            request["prompt"] = prompt
            path = "/v1/completions"
        raw = json.dumps(request).encode()
        return http1.request_bytes("POST", host, path, raw, {"Content-Type": "application/json"})

    async def calibrate(self, control: http1.HttpControl, model: str) -> None:
        """Two probes: tokens per word of this vocabulary under this server's tokenizer (and template)."""
        words = max(8, self.settings.prompt_tokens)
        for _ in range(2):
            body = self.body("", model, self.words(words), 1, stream=False)
            _, _, raw = body.partition(b"\r\n\r\n")
            path = "/v1/chat/completions" if self.settings.endpoint == "chat" else "/v1/completions"
            status, answer = await control.request("POST", path, raw)
            if status != 200:
                raise http1.HttpError(f"POST {path}: HTTP {status}: {answer.decode(errors='replace')[:300]}")
            tokens = int(json.loads(answer).get("usage", {}).get("prompt_tokens") or 0)
            if tokens <= 0:
                return  # the server reports no usage: one word per token it is
            self.words_per_token = words / tokens
            words = max(1, round(self.settings.prompt_tokens * self.words_per_token))


@dataclass
class LlmRun:
    """`concurrency` streams, `requests` completions in all (after `warmup` not counted)."""

    host: str
    port: int
    model: str
    prompts: PromptMaker
    concurrency: int
    requests: int
    warmup: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    _sent: int = 0
    _done: asyncio.Future[None] | None = None
    _slots: list[StreamSlot] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0

    async def go(self) -> None:
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        for _ in range(self.concurrency):
            slot = StreamSlot(self)
            try:
                await loop.create_connection(lambda s=slot: s, self.host, self.port)  # type: ignore[misc]
            except OSError as error:
                raise http1.HttpError(f"cannot connect to {self.host}:{self.port}: {error}") from None
            self._slots.append(slot)
        self.start_ns = time.monotonic_ns()
        for slot in self._slots:
            self._next(slot)
        try:
            await self._done
        finally:
            for slot in self._slots:
                slot.close()

    def _next(self, slot: StreamSlot) -> bool:
        if self._sent >= self.warmup + self.requests:
            return False
        self._sent += 1
        slot.send(self.prompts.body(f"{self.host}:{self.port}", self.model, self.prompts.prompt(),
                                    self.prompts.settings.output_tokens))
        return True

    def finished(self, slot: StreamSlot, record: RequestRecord) -> None:
        self.records.append(record)
        if len(self.records) == self.warmup:
            self.start_ns = time.monotonic_ns()  # the measured part starts after the warm-up
        if record.error and self._done is not None and not self._done.done():
            self._done.set_exception(http1.HttpError(record.error))
            return
        more = slot.open and self._next(slot)
        if not more and len(self.records) >= self._sent and self._done is not None and not self._done.done():
            self.end_ns = time.monotonic_ns()
            self._done.set_result(None)


@dataclass(frozen=True)
class LlmMeasurement:
    """genai-perf's figures for one concurrency."""

    concurrency: int
    records: list[RequestRecord]
    duration_s: float

    def _values(self, name: str) -> list[float]:
        values = [getattr(r, name) for r in self.records]
        return sorted(v for v in values if v is not None)

    def stat(self, name: str) -> dict[str, float]:
        """avg, min, max, p99, p90, p75, p50 of a per-request figure (genai-perf's columns)."""
        values = self._values(name)
        if not values:
            return {k: 0.0 for k in ("avg", "min", "max", "p99", "p90", "p75", "p50")}
        as_ns = [int(v * 1e6) for v in values]  # percentile() takes sorted integers

        def pct(p: float) -> float:
            return percentile(as_ns, p) / 1e6

        return {"avg": sum(values) / len(values), "min": values[0], "max": values[-1], "p99": pct(99),
                "p90": pct(90), "p75": pct(75), "p50": pct(50)}

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.records)

    @property
    def output_token_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def request_throughput(self) -> float:
        return len(self.records) / self.duration_s if self.duration_s > 0 else 0.0


async def measure_llm(host: str, port: int, model: str, prompts: PromptMaker, concurrency: int,
                      requests: int, warmup: int = 0) -> LlmMeasurement:
    """Run `requests` streamed completions at `concurrency` and gather their figures."""
    run = LlmRun(host, port, model, prompts, concurrency, requests, warmup)
    await run.go()
    measured = run.records[warmup:]
    return LlmMeasurement(concurrency, measured, (run.end_ns - run.start_ns) / 1e9)
