"""The "llm" backend's metrics per instance: tokens in and out, time to first token and between
tokens, and the engine's KV-cache use, prefix-cache hit rate, preemptions and restarts."""

from __future__ import annotations

import threading
from typing import Protocol

from naiad.llm.engine.engine_core import EngineStats
from naiad.observability.metrics import MetricRow
from naiad.observability.statistics import Histogram


class TokenTimes(Protocol):
    """When a request arrived and when its tokens did (the backend's request keeps them)."""

    arrival: float
    last_token_at: float | None
    first_token_at: float | None


#: vLLM's buckets for the same two histograms, in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class LLMMetrics:
    """One instance's LLM metrics: tokens in and out, time to first token and between tokens
    (measured here, where the tokens reach the server), and the engine's KV use, prefix-cache
    hit rate and preemptions (from its last step). Named like vLLM's (`vllm:prompt_tokens_total`
    → `nv_llm_prompt_tokens`, ...) with Triton's prefix and the model, version and instance
    labels; read at scrape time."""

    def __init__(self, instance: str) -> None:
        self.labels = (("instance", instance),)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.engine: EngineStats | None = None
        self.engine_restarts = 0  # set by the instance from its supervisor's count
        self._lock = threading.Lock()

    def add_prompt(self, tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += tokens

    def tokens_out(self, request: TokenTimes, count: int, now: float) -> None:
        """`count` new tokens of `request` arrived at `now`: its first ones, or the next ones."""
        with self._lock:
            self.generation_tokens += count
            if request.last_token_at is None:
                self.ttft.observe(now - request.arrival)
                request.first_token_at = now
            else:
                self.itl.observe(now - request.last_token_at)
        request.last_token_at = now

    def rows(self) -> list[MetricRow]:
        with self._lock:
            rows = [
                MetricRow("nv_llm_prompt_tokens", "counter", "Prompt tokens received", self.prompt_tokens,
                          self.labels),
                MetricRow("nv_llm_generation_tokens", "counter", "Tokens generated", self.generation_tokens,
                          self.labels),
                _histogram_row("nv_llm_time_to_first_token_seconds", "Time from arrival to the first token",
                               self.ttft, self.labels),
                _histogram_row("nv_llm_inter_token_latency_seconds", "Time between a request's successive tokens",
                               self.itl, self.labels),
                MetricRow("nv_llm_engine_restarts", "counter", "Engine cores started again after one died",
                          self.engine_restarts, self.labels),
            ]
        engine = self.engine
        if engine is not None:
            queries = engine.prefix_cache_queries
            rows += [
                MetricRow("nv_llm_kv_cache_usage", "gauge", "Fraction of KV-cache blocks in use [0.0 - 1.0]",
                          engine.num_used_blocks / max(engine.num_blocks, 1), self.labels),
                MetricRow("nv_llm_prefix_cache_hit_rate", "gauge",
                          "Fraction of prompt tokens found in the prefix cache, since the start [0.0 - 1.0]",
                          engine.prefix_cache_hits / queries if queries else 0.0, self.labels),
                MetricRow("nv_llm_preemptions", "counter", "Sequences preempted for KV-cache room",
                          engine.num_preemptions, self.labels),
            ]
        return rows


def _histogram_row(name: str, doc: str, histogram: Histogram, labels: tuple[tuple[str, str], ...]) -> MetricRow:
    return MetricRow(name, "histogram", doc, histogram.sum, labels, tuple(histogram.cumulative()))
