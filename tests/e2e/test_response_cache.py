"""The response cache end to end: `naiad serve --cache-config local,size=N` with models that set
`response_cache { enable: true }`, driven by tritonclient over HTTP and gRPC; statistics and
/metrics read back as clients and Prometheus see them."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

IDENTITY = """
name: "{name}"
backend: "identity"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""
CACHE = "response_cache { enable: true }"
MODELS = {
    "cached": CACHE,
    "uncached": "",
}
DECOUPLED = """
name: "decoupled_cached"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
response_cache { enable: true }
"""
SEQUENCE = IDENTITY.format(name="sequence_cached", extra="sequence_batching { } " + CACHE)
REFUSED = {
    "decoupled_cached": "Response Cache does not currently support model decoupled_cached with 'decoupled' "
                        "transaction policy. Please disable the response cache.",
    "sequence_cached": "Response Cache does not currently support model sequence_cached with sequence batching "
                       "scheduler. Please disable the response cache.",
}
TEXT = """
name: "cached_text"
backend: "identity"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "ECHO" data_type: TYPE_STRING dims: [ -1 ] } ]
response_cache { enable: true }
"""
ONE_MB = "local,size=1048576"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cache")
    for name, extra in MODELS.items():
        write_model(repo, name, IDENTITY.format(name=name, extra=extra), {1: lambda path: None})
    write_model(repo, "cached_text", TEXT, {1: lambda path: None})
    write_model(repo, "decoupled_cached", DECOUPLED, {1: lambda path: None})
    write_model(repo, "sequence_cached", SEQUENCE, {1: lambda path: None})
    return repo


def _serve(start_server: Any, repo: Path, *flags: str, models: tuple[str, ...] = ("cached", "uncached")) -> Any:
    """A server that loads `models` (the others only when a test asks for them)."""
    return start_server(["--model-repository", str(repo), "--model-control-mode=explicit",
                         *(f"--load-model={model}" for model in models), *flags])


def _rows(seed: float, rows: int = 1) -> np.ndarray:
    return (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + seed).astype(np.float32)


def _http_infer(client: httpclient.InferenceServerClient, model: str, data: np.ndarray,
                request_id: str = "") -> httpclient.InferResult:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor], request_id=request_id)


def _grpc_infer(client: grpcclient.InferenceServerClient, model: str, data: np.ndarray,
                request_id: str = "") -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor], request_id=request_id)


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    return stats


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    """The figures the cache changes; gRPC's JSON leaves zeros out and writes numbers as text."""
    infer = stats["inference_stats"]
    return {"hit": int(infer["cache_hit"].get("count", 0)), "miss": int(infer["cache_miss"].get("count", 0)),
            "success": int(infer["success"].get("count", 0)), "queue": int(infer["queue"].get("count", 0)),
            "compute_infer": int(infer["compute_infer"].get("count", 0)),
            "inference_count": int(stats.get("inference_count", 0)),
            "execution_count": int(stats.get("execution_count", 0))}


def _metrics(server: Any) -> dict[str, dict[str, float]]:
    """{family: {model: value}} of the per-model samples on /metrics (Prometheus' own parser)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    families: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "model" in sample.labels and "quantile" not in sample.labels:
                families.setdefault(sample.name if family.type == "summary" else family.name, {})[
                    sample.labels["model"]] = sample.value
    return families


def test_http_second_identical_request_is_a_hit(repo: Path, start_server: Any) -> None:
    server = _serve(start_server, repo, "--cache-config", ONE_MB)
    with httpclient.InferenceServerClient(server.url) as client:
        first = _http_infer(client, "cached", _rows(1), "first")
        second = _http_infer(client, "cached", _rows(1), "second")
        np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), first.as_numpy("OUTPUT0"))
        np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), _rows(1))
        assert second.get_response()["id"] == "second"  # a hit answers with its own request's id
        stats = _stats(client, "cached")
        assert _counts(stats) == {"hit": 1, "miss": 1, "success": 2, "queue": 2, "compute_infer": 1,
                                  "inference_count": 1, "execution_count": 1}
        assert stats["inference_stats"]["cache_hit"]["ns"] > 0
        assert stats["inference_stats"]["cache_miss"]["ns"] > 0

        _http_infer(client, "cached", _rows(2))  # one different value: a miss, computed
        assert _counts(_stats(client, "cached"))["miss"] == 2
        assert _counts(_stats(client, "cached"))["execution_count"] == 2
        _http_infer(client, "cached", _rows(1, rows=2))  # the same first row, another shape: a miss
        changed = _rows(1)
        changed.view(np.uint8)[0, 0] ^= 1  # one bit of one element: a miss
        _http_infer(client, "cached", changed)
        assert _counts(_stats(client, "cached"))["hit"] == 1

        for _ in range(2):
            _http_infer(client, "uncached", _rows(1))
        uncached = _counts(_stats(client, "uncached"))
        assert uncached["hit"] == uncached["miss"] == 0 and uncached["execution_count"] == 2

    families = _metrics(server)
    assert families["nv_cache_num_hits_per_model"] == {"cached": 1}  # only versions the cache serves
    assert families["nv_cache_num_misses_per_model"] == {"cached": 4}
    assert set(families["nv_cache_hit_duration_per_model"]) == {"cached"}
    assert families["nv_cache_miss_duration_per_model"]["cached"] >= 0
    assert families["nv_inference_request_success"] == {"cached": 5, "uncached": 2}
    assert families["nv_inference_exec_count"] == {"cached": 4, "uncached": 2}  # hits never execute
    assert families["nv_inference_count"] == {"cached": 5, "uncached": 2}  # 1 + 1 + 2 rows + 1


def test_grpc_hits_misses_and_statistics(repo: Path, start_server: Any) -> None:
    # The deprecated flag means the same as --cache-config local,size=N.
    server = _serve(start_server, repo, "--response-cache-byte-size", "1048576")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        first = _grpc_infer(client, "cached", _rows(5), "a")
        second = _grpc_infer(client, "cached", _rows(5), "b")
        np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), first.as_numpy("OUTPUT0"))
        assert second.get_response().id == "b"
        (stats,) = client.get_inference_statistics("cached", as_json=True)["model_stats"]
        assert _counts(stats) == {"hit": 1, "miss": 1, "success": 2, "queue": 2, "compute_infer": 1,
                                  "inference_count": 1, "execution_count": 1}
        assert int(stats["inference_stats"]["cache_hit"]["ns"]) > 0
        _grpc_infer(client, "cached", _rows(6))
        (stats,) = client.get_inference_statistics("cached", as_json=True)["model_stats"]
        assert _counts(stats)["miss"] == 2 and _counts(stats)["execution_count"] == 2
        for _ in range(2):
            _grpc_infer(client, "uncached", _rows(5))
        (plain,) = client.get_inference_statistics("uncached", as_json=True)["model_stats"]
        assert "count" not in plain["inference_stats"]["cache_hit"]  # zero: left out of protobuf JSON
        assert int(plain["execution_count"]) == 2
    # A hit over HTTP for what gRPC computed: one cache for every frontend.
    with httpclient.InferenceServerClient(server.url) as http:
        _http_infer(http, "cached", _rows(6))
        assert _counts(_stats(http, "cached"))["hit"] == 2
    families = _metrics(server)
    assert families["nv_cache_num_hits_per_model"] == {"cached": 2}
    assert families["nv_cache_num_misses_per_model"] == {"cached": 2}


def test_bytes_tensors_and_binary_outputs(repo: Path, start_server: Any) -> None:
    server = _serve(start_server, repo, "--cache-config", ONE_MB, models=("cached_text",))
    text = np.array([b"ab", b"c", b""], dtype=object)
    with httpclient.InferenceServerClient(server.url) as client:
        answers = []
        for binary in (True, False, True):  # the wire format of the reply is not part of the key
            tensor = httpclient.InferInput("TEXT", [3], "BYTES")
            tensor.set_data_from_numpy(text, binary_data=binary)
            wanted = [httpclient.InferRequestedOutput("ECHO", binary_data=binary)]
            answers.append(client.infer("cached_text", [tensor], outputs=wanted).as_numpy("ECHO"))
        other = httpclient.InferInput("TEXT", [2], "BYTES")
        other.set_data_from_numpy(np.array([b"a", b"bc"], dtype=object))  # the same bytes, split elsewhere
        split = client.infer("cached_text", [other]).as_numpy("ECHO")
        counts = _counts(_stats(client, "cached_text"))
    for answer in answers:  # JSON outputs come back as str
        assert [item if isinstance(item, bytes) else item.encode() for item in answer] == [b"ab", b"c", b""]
    assert split.tolist() == [b"a", b"bc"]
    assert (counts["hit"], counts["miss"], counts["execution_count"]) == (2, 2, 2)


def test_without_a_server_cache_the_model_loads_and_is_not_cached(repo: Path, start_server: Any) -> None:
    server = _serve(start_server, repo)  # as Triton: the config asks, but the server has no cache
    with httpclient.InferenceServerClient(server.url) as client:
        assert client.is_model_ready("cached")
        for _ in range(2):
            _http_infer(client, "cached", _rows(1))
        counts = _counts(_stats(client, "cached"))
        assert counts["hit"] == counts["miss"] == 0 and counts["execution_count"] == 2
    assert not any(name.startswith("nv_cache_") for name in _metrics(server))


def test_eviction_under_a_small_size(repo: Path, start_server: Any) -> None:
    # One row of 4 FP32 is 16 bytes plus 64 of bookkeeping: 200 bytes hold two such entries.
    server = _serve(start_server, repo, "--cache-config=local,size=200")
    with httpclient.InferenceServerClient(server.url) as client:
        for seed in (1, 2, 3):  # the third evicts the first
            _http_infer(client, "cached", _rows(seed))
        _http_infer(client, "cached", _rows(2))  # still there: a hit (and now the most recent)
        assert _counts(_stats(client, "cached"))["hit"] == 1
        _http_infer(client, "cached", _rows(1))  # evicted: a miss, computed again
        counts = _counts(_stats(client, "cached"))
        assert (counts["hit"], counts["miss"], counts["execution_count"]) == (1, 4, 4)
        _http_infer(client, "cached", _rows(2))  # 3 was the least recently used, not 2
        assert _counts(_stats(client, "cached"))["hit"] == 2
        for _ in range(2):  # 16 rows (256 bytes) never fit: computed both times
            _http_infer(client, "cached", _rows(7, rows=16))
        counts = _counts(_stats(client, "cached"))
        assert (counts["hit"], counts["execution_count"]) == (2, 6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refused_configs_fail_to_load_with_the_reason(repo: Path, start_server: Any, protocol: str) -> None:
    server = _serve(start_server, repo, "--cache-config", ONE_MB)
    module = httpclient if protocol == "http" else grpcclient
    with module.InferenceServerClient(server.url if protocol == "http" else server.grpc_url) as client:
        for name, reason in REFUSED.items():
            with pytest.raises(InferenceServerException) as caught:
                client.load_model(name)
            assert reason in caught.value.message()
            assert not client.is_model_ready(name)


def test_cache_summaries_with_metrics_config(repo: Path, start_server: Any) -> None:
    server = _serve(start_server, repo, "--cache-config", ONE_MB, "--metrics-config", "summary_latencies=true")
    with httpclient.InferenceServerClient(server.url) as client:
        for model in ("cached", "uncached"):
            for _ in range(3):
                _http_infer(client, model, _rows(1))
    families = _metrics(server)
    assert families["nv_cache_hit_summary_per_model_count"] == {"cached": 2}
    assert families["nv_cache_miss_summary_per_model_count"] == {"cached": 1}
    # As Triton, a cached model has no request summary (it would mix hits and computed requests).
    assert families["nv_inference_request_summary_us_count"] == {"uncached": 3}
    assert families["nv_inference_queue_summary_us_count"] == {"cached": 3, "uncached": 3}


@pytest.mark.parametrize(("flags", "message"), [
    (["--cache-config", "redis,host=localhost"], "only the 'local' cache is available, got 'redis'"),
    (["--cache-config", "local,capacity=10"], "unknown setting 'capacity' for the local cache"),
    (["--cache-config", "local,size=0"], "local,size must be a positive number of bytes, got '0'"),
    (["--cache-config", "local"], "--cache-config expects <cache>,<key>=<value>, got 'local'"),
    (["--cache-config", ONE_MB, "--response-cache-byte-size", "10"],
     "Incompatible flags --response-cache-byte-size and --cache-config both provided"),
])
def test_bad_cache_flags_are_usage_errors(repo: Path, flags: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "naiad.cli", "serve", "--model-repository", str(repo), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
