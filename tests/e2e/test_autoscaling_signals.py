"""Autoscaling signals (docs/scaling.md): the /metrics queries an HPA or KEDA scales on, computed
here from real scrapes the way the Prometheus adapter and the HPA would, under a bounded load and
at idle. Under load the rules must ask for more than one replica; at idle, for one.

The load: one model instance that takes 100 ms per request (the identity backend's
execute_delay_ms) and four clients calling it in a loop, so three requests queue behind the one
that runs: the average queue time per request is about 300 ms and about three requests pend.
The LLM engine's signals (KV-cache use, time to first token) come from the bundled SmolLM2
under three concurrent generations.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from e2e.lifecycle_util import wait_for
from e2e.llm_server import CONFIG as LLM_CONFIG
from e2e.llm_server import MODEL, wait_model_ready
from e2e.raw_http import post
from e2e.repo_builder import write_model
from e2e.scaling_util import Samples, scrape, total

pytestmark = pytest.mark.e2e

BUSY = """
name: "busy"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "execute_delay_ms" value { string_value: "100" } }
"""
CLIENTS = 4  # above the instance count: requests queue
WINDOW_SECS = 3.0
# Targets an operator would set (docs/scaling.md): 50 ms of queueing per request, one pending
# request per replica.
QUEUE_TARGET_US = 50_000
PENDING_TARGET = 1.0
TOLERANCE = 0.1  # the HPA's default: no change while the ratio is within 10 % of 1


def desired_replicas(current: int, metric: float, target: float, minimum: int = 1) -> int:
    """The HPA's rule: ceil(current * metric / target), unchanged within the tolerance."""
    ratio = metric / target
    if abs(ratio - 1) <= TOLERANCE:
        return current
    return max(minimum, math.ceil(current * ratio))


def queue_us_per_request(before: Samples, after: Samples) -> float:
    """rate(nv_inference_queue_duration_us[w]) / rate(nv_inference_request_success[w]): the
    average time a request waited for an instance over the window (0 when none was served,
    where PromQL's 0/0 is NaN and the HPA ignores the metric)."""
    queued = total(after, "nv_inference_queue_duration_us", model="busy") - total(
        before, "nv_inference_queue_duration_us", model="busy")
    served = total(after, "nv_inference_request_success", model="busy") - total(
        before, "nv_inference_request_success", model="busy")
    return queued / served if served else 0.0


def compute_share(before: Samples, after: Samples) -> float:
    """Compute time over request time in the window: near 1, the replica is busy computing
    (add replicas or shard); near 0 with a long queue, it waits (add instances or replicas)."""
    def delta(name: str) -> float:
        return total(after, name, model="busy") - total(before, name, model="busy")

    request = delta("nv_inference_request_duration_us")
    return delta("nv_inference_compute_infer_duration_us") / request if request else 0.0


def _load(url: str, stop: threading.Event, failures: list[BaseException]) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    try:
        while not stop.is_set():
            client.infer("busy", [tensor])
    except BaseException as error:  # surfaced by the test, not lost in the thread
        failures.append(error)
    finally:
        client.close()


def _window(server: Any) -> tuple[Samples, Samples, list[float]]:
    """Scrapes at the start and end of a window, and the pending gauge sampled within it."""
    before = scrape(server.metrics_port)
    pending = []
    deadline = time.monotonic() + WINDOW_SECS
    while time.monotonic() < deadline:
        pending.append(total(scrape(server.metrics_port), "nv_inference_pending_request_count", model="busy"))
        time.sleep(0.2)
    return before, scrape(server.metrics_port), pending


def test_hpa_rules_ask_for_more_replicas_under_load_and_one_at_idle(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "busy", BUSY, {1: lambda path: None})
    server = start_server(["--model-repository", str(repo)])

    before, after, pending = _window(server)  # idle
    assert total(after, "nv_inference_request_success", model="busy") == 0
    assert desired_replicas(1, queue_us_per_request(before, after), QUEUE_TARGET_US) == 1
    assert desired_replicas(1, max(pending), PENDING_TARGET) == 1

    stop, failures = threading.Event(), []
    clients = [threading.Thread(target=_load, args=(server.url, stop, failures)) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    try:
        time.sleep(0.5)  # let the queue form
        before, after, pending = _window(server)
    finally:
        stop.set()
        for client in clients:
            client.join(30)
    assert not failures, failures
    queue_us = queue_us_per_request(before, after)
    print(f"load: {queue_us:.0f} us queued per request, pending {pending}, "  # shown with -rP
          f"compute share {compute_share(before, after):.2f}, desired {desired_replicas(1, queue_us, QUEUE_TARGET_US)}")
    # Three waiting behind one 100 ms execution: about 300 ms each (loose: timing on a busy machine).
    assert 100_000 < queue_us < 1_000_000, queue_us
    assert desired_replicas(1, queue_us, QUEUE_TARGET_US) > 1
    average_pending = sum(pending) / len(pending)
    assert average_pending >= 1.5, pending  # about three
    assert desired_replicas(1, average_pending, PENDING_TARGET) > 1
    # Most of a request's time was queueing, not computing: more replicas (or instances) help.
    assert compute_share(before, after) < 0.5

    # Idle again: the rates over a fresh window fall to nothing and the rules ask for one.
    before, after, pending = _window(server)
    assert desired_replicas(1, queue_us_per_request(before, after), QUEUE_TARGET_US) == 1
    assert desired_replicas(1, max(pending), PENDING_TARGET) == 1
    assert desired_replicas(3, queue_us_per_request(before, after), QUEUE_TARGET_US) == 1  # scale back down


def test_the_hpa_rule_itself() -> None:
    assert desired_replicas(2, 300_000, 50_000) == 12
    assert desired_replicas(4, 52_000, 50_000) == 4  # within the tolerance: no change
    assert desired_replicas(4, 0, 50_000) == 1  # never below the minimum


# ------------------------------------------------------------------------------ the LLM engine

LLM_CLIENTS = 3
# Scale out when 5 % of this test's small KV cache is in use at the peak (three short
# generations hold 0.1-0.2 of it); a real deployment sets 0.7-0.8 of a real cache.
LLM_KV_TARGET = 0.05


def _llm_signals(samples: Samples) -> dict[str, float]:
    return {"kv_cache_usage": total(samples, "nv_llm_kv_cache_usage", model=MODEL),
            "ttft_sum": total(samples, "nv_llm_time_to_first_token_seconds_sum", model=MODEL),
            "ttft_count": total(samples, "nv_llm_time_to_first_token_seconds_count", model=MODEL)}


def _generate(url: str, prompt: str, failures: list[BaseException]) -> None:
    body = {"text_input": prompt, "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    try:
        answer = post(url, f"/v2/models/{MODEL}/generate", json.dumps(body).encode(),
                      {"Content-Type": "application/json"}, timeout=120)
        assert answer.status == 200, answer.body
    except BaseException as error:
        failures.append(error)


def test_llm_kv_cache_and_ttft_signals_under_load_and_at_idle(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "llm"
    (repo / MODEL / "1").mkdir(parents=True)
    # A small KV cache: about 720 tokens of SmolLM2-135M in fp32.
    (repo / MODEL / "config.pbtxt").write_text(LLM_CONFIG.replace("67108864", str(32 << 20)))
    started = time.monotonic()
    server = start_server(["--model-repository", str(repo)])
    wait_model_ready(server)
    print(f"llm: ready in {time.monotonic() - started:.1f} s")
    prompt = "Count slowly from one to one hundred, one number per line: " * 3
    idle = _llm_signals(scrape(server.metrics_port))
    assert idle["kv_cache_usage"] == 0
    assert desired_replicas(1, idle["kv_cache_usage"], LLM_KV_TARGET) == 1

    failures: list[BaseException] = []
    clients = [threading.Thread(target=_generate, args=(server.url, prompt, failures)) for _ in range(LLM_CLIENTS)]
    for client in clients:
        client.start()
    started = time.monotonic()
    usage = []
    while any(client.is_alive() for client in clients):
        usage.append(_llm_signals(scrape(server.metrics_port))["kv_cache_usage"])
        time.sleep(0.02)  # often: the gauge follows engine steps, which are short on a fast machine
    for client in clients:
        client.join()
    assert not failures, failures
    # max_over_time(nv_llm_kv_cache_usage[w]): the window's peak (the gauge follows engine steps).
    print(f"llm: load {time.monotonic() - started:.1f} s, peak KV-cache use {max(usage):.3f}, "
          f"desired {desired_replicas(1, max(usage), LLM_KV_TARGET)}")
    assert 0 < max(usage) <= 1, usage
    assert desired_replicas(1, max(usage), LLM_KV_TARGET) > 1, usage
    after = _llm_signals(scrape(server.metrics_port))
    # rate(..._sum[w]) / rate(..._count[w]): the average time to first token of the window.
    served = after["ttft_count"] - idle["ttft_count"]
    assert served == LLM_CLIENTS
    assert (after["ttft_sum"] - idle["ttft_sum"]) / served > 0

    # Idle again: nothing holds KV blocks, and the rule asks for one replica.
    settled = wait_for(lambda: _llm_signals(scrape(server.metrics_port))["kv_cache_usage"] == 0 or None,
                       15, "the KV cache to empty")
    assert settled
    assert desired_replicas(2, 0.0, LLM_KV_TARGET) == 1
