"""The conformance suite every backend passes, through a real server and tritonclient (HTTP and
gRPC): load, metadata, auto-complete, the MLP against numpy, every datatype it supports, dynamic
batching, bad input (refused clearly, the server serving on), unload and reload."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from backends.conformance import mlp
from backends.conformance.cases import BackendCase, all_cases, write_repository
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

CLIENTS = {"http": httpclient, "grpc": grpcclient}
CASES = all_cases()


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def case(request: pytest.FixtureRequest) -> BackendCase:
    chosen: BackendCase = request.param
    if not chosen.available():
        pytest.skip(f"the {chosen.name} backend's framework is not installed ({', '.join(chosen.requires)})")
    return chosen


@pytest.fixture(scope="module")
def server(case: BackendCase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from conftest import running_server

    repo = tmp_path_factory.mktemp(f"conformance-{case.name}")
    write_repository(case, repo)
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "*"]
    with running_server(args, repo.parent / f"{case.name}.log") as running:
        yield running


def _client(server: Any, protocol: str) -> Any:
    return CLIENTS[protocol].InferenceServerClient(server.url if protocol == "http" else server.grpc_url)


def _infer_mlp(server: Any, protocol: str, case: BackendCase, x: np.ndarray, model: str = "mlp") -> np.ndarray:
    module = CLIENTS[protocol]
    tensor = module.InferInput(case.input_name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    client = _client(server, protocol)
    try:
        return client.infer(model, [tensor]).as_numpy(case.output_name)
    finally:
        client.close()


def test_metadata(server: Any, case: BackendCase) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        metadata = client.get_model_metadata("mlp")
    assert metadata["platform"] == case.platform
    assert metadata["inputs"] == [{"name": case.input_name, "datatype": "FP32", "shape": [-1, mlp.IN]}]
    assert metadata["outputs"] == [{"name": case.output_name, "datatype": "FP32", "shape": [-1, mlp.OUT]}]


def test_auto_complete_fills_inputs_outputs_and_batching(server: Any, case: BackendCase) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        if not case.autocomplete:
            assert not client.is_model_ready("mlp_auto")  # the case writes no such model
            return
        config = client.get_model_config("mlp_auto")
        x = np.ones((2, mlp.IN), dtype=np.float32)
    assert [i["name"] for i in config["input"]] == [case.input_name]
    assert [o["name"] for o in config["output"]] == [case.output_name]
    assert config["max_batch_size"] > 0
    np.testing.assert_allclose(_infer_mlp(server, "http", case, x, "mlp_auto"), mlp.reference(x), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mlp_matches_numpy(server: Any, case: BackendCase, protocol: str) -> None:
    x = np.random.default_rng(1).standard_normal((3, mlp.IN)).astype(np.float32)
    np.testing.assert_allclose(_infer_mlp(server, protocol, case, x), mlp.reference(x), rtol=1e-4, atol=1e-5)


def _values(datatype: str) -> np.ndarray:
    rng = np.random.default_rng(3)
    if datatype == "BYTES":
        return np.array([[b"a", b"\x00bc", "\u00e9".encode()], [b"", b"xyz", b"1"]], dtype=np.object_)
    if datatype == "BOOL":
        return rng.integers(0, 2, (2, 3)).astype(bool)
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype)
    if dtype is not None:
        return rng.standard_normal((2, 3)).astype(dtype)
    info = np.iinfo(getattr(np, datatype.lower()))
    return rng.integers(info.min, info.max, (2, 3), dtype=getattr(np, datatype.lower()), endpoint=True)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_datatype_round_trips(server: Any, case: BackendCase, protocol: str) -> None:
    module = CLIENTS[protocol]
    client = _client(server, protocol)
    try:
        for datatype in case.datatypes:
            data = _values(datatype)
            tensor = module.InferInput("INPUT0", list(data.shape), datatype)
            tensor.set_data_from_numpy(data)
            out = client.infer(f"identity_{datatype.lower()}", [tensor]).as_numpy("OUTPUT0")
            assert out.dtype == data.dtype and out.tolist() == data.tolist(), datatype
    finally:
        client.close()


def test_concurrent_requests_are_batched(server: Any, case: BackendCase) -> None:
    rows = [np.random.default_rng(i).standard_normal((1, mlp.IN)).astype(np.float32) for i in range(4)]
    results: list[np.ndarray | None] = [None] * 4

    def one(i: int) -> None:
        results[i] = _infer_mlp(server, "http", case, rows[i], "mlp_batched")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for row, result in zip(rows, results, strict=True):
        np.testing.assert_allclose(result, mlp.reference(row), rtol=1e-4, atol=1e-5)
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("mlp_batched")["model_stats"][0]
    assert stats["inference_count"] == 4
    assert stats["execution_count"] < 4  # at least two of them ran as one batch


PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def test_statistics_measure_every_phase(server: Any, case: BackendCase) -> None:
    """Queue, compute_input, compute_infer and compute_output are measured for every backend, per
    request and per batch (the statistics extension, as Triton reports them)."""
    with httpclient.InferenceServerClient(server.url) as client:
        before = client.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]
    x = np.ones((2, mlp.IN), dtype=np.float32)
    for _ in range(5):
        _infer_mlp(server, "http", case, x)
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("mlp")["model_stats"][0]
    after = stats["inference_stats"]
    served = after["success"]["count"] - before["success"]["count"]
    assert served == 5
    for phase in PHASES:
        assert after[phase]["count"] - before[phase]["count"] == served, phase
        assert after[phase]["ns"] > before[phase]["ns"], f"{phase} was not measured"
    by_size = {entry["batch_size"]: entry for entry in stats["batch_stats"]}
    assert all(by_size[2][phase]["ns"] > 0 for phase in PHASES[1:])
    # /metrics prints the same sums in microseconds (nv_inference_compute_input_duration_us ...)
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as page:
        families = {f.name: f for f in text_string_to_metric_families(page.read().decode())}
    for phase in PHASES:
        family = families[f"nv_inference_{phase}_duration_us"]
        (value,) = [s.value for s in family.samples if s.labels.get("model") == "mlp"]
        assert value == after[phase]["ns"] // 1000, phase


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_input_is_refused_and_the_model_serves_on(server: Any, case: BackendCase, protocol: str) -> None:
    module = CLIENTS[protocol]
    client = _client(server, protocol)
    try:
        wrong_shape = module.InferInput(case.input_name, [1, mlp.IN + 1], "FP32")
        wrong_shape.set_data_from_numpy(np.ones((1, mlp.IN + 1), dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unexpected shape for input"):
            client.infer("mlp", [wrong_shape])
        wrong_type = module.InferInput(case.input_name, [1, mlp.IN], "INT32")
        wrong_type.set_data_from_numpy(np.ones((1, mlp.IN), dtype=np.int32))
        with pytest.raises(InferenceServerException, match="data-type is 'INT32', but model 'mlp' expects 'FP32'"):
            client.infer("mlp", [wrong_type])
        with pytest.raises(InferenceServerException, match="unexpected inference input 'NOPE'"):
            nope = module.InferInput("NOPE", [1, mlp.IN], "FP32")
            nope.set_data_from_numpy(np.ones((1, mlp.IN), dtype=np.float32))
            client.infer("mlp", [nope])
    finally:
        client.close()
    x = np.ones((1, mlp.IN), dtype=np.float32)
    np.testing.assert_allclose(_infer_mlp(server, protocol, case, x), mlp.reference(x), rtol=1e-4, atol=1e-5)


def test_unload_and_reload(server: Any, case: BackendCase) -> None:
    x = np.ones((1, mlp.IN), dtype=np.float32)
    with httpclient.InferenceServerClient(server.url) as client:
        client.unload_model("mlp")
        assert not client.is_model_ready("mlp")
        with pytest.raises(InferenceServerException, match="unknown model"):
            _infer_mlp(server, "http", case, x)
        client.load_model("mlp")
        assert client.is_model_ready("mlp")
    np.testing.assert_allclose(_infer_mlp(server, "http", case, x), mlp.reference(x), rtol=1e-4, atol=1e-5)


RELOADS = 20


def test_unloading_ends_the_instances_threads(server: Any, case: BackendCase) -> None:
    """Reloads do not pile up threads: each unload ends what its instances started (the PyTorch
    and OpenVINO instances once released their model without ending their thread)."""
    x = np.ones((1, mlp.IN), dtype=np.float32)

    def reload_and_count() -> int:
        with httpclient.InferenceServerClient(server.url) as client:
            client.unload_model("mlp")
            client.load_model("mlp")
        _infer_mlp(server, "http", case, x)  # the instance's thread starts with its first batch
        return len(list(Path(f"/proc/{server.process.pid}/task").iterdir()))

    counts = [reload_and_count() for _ in range(RELOADS)]
    # A leak adds a thread per instance per reload (15 between the windows below); a framework's
    # own pools come and go, so the lowest count of each window is compared (OpenVINO's: 41-49).
    first, last = min(counts[:5]), min(counts[-5:])
    assert last - first < RELOADS // 2, counts


def test_a_model_file_that_cannot_load_fails_alone(server: Any, case: BackendCase, tmp_path: Path) -> None:
    """A broken file fails its own load with a reason; the repository's other models serve on."""
    with httpclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("mlp")
        with pytest.raises(InferenceServerException, match=r"load failed|failed to load"):
            client.load_model("broken", config=_as_json(config, "broken"),
                              files={f"file:1/{case.model_file}": b"this is not a model"})
        assert client.is_model_ready("mlp")


def _as_json(config: dict[str, Any], name: str) -> str:
    import json

    return json.dumps({**config, "name": name})
