"""Triton-mode tracing in a real server: the trace settings API over HTTP and gRPC (global and
per model, with Triton's clearing rules and errors), and the JSON trace file it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
         "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
         "HTTP_SEND_END"]


def _infer(url: str, request_id: str) -> None:
    a = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    a.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    b = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    b.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    with httpclient.InferenceServerClient(url) as client:
        client.infer("simple", [a, b], request_id=request_id)


def _traces(path: Path) -> list[dict[str, Any]]:
    """Triton's file: per trace, an object with the model, then one with the timestamps."""
    items = json.loads(path.read_text())
    info = {item["id"]: item for item in items if "model_name" in item}
    stamps = {item["id"]: item["timestamps"] for item in items if "timestamps" in item}
    assert info.keys() == stamps.keys()
    return [{**info[i], "timestamps": stamps[i]} for i in sorted(info)]


def test_the_settings_api_over_http(example_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(example_repo)])
    with httpclient.InferenceServerClient(server.url) as client:
        assert client.get_trace_settings()["trace_level"] == ["OFF"]
        updated = client.update_trace_settings(settings={"trace_rate": "5", "trace_level": ["TIMESTAMPS"]})
        assert updated["trace_rate"] == "5" and updated["trace_level"] == ["TIMESTAMPS"]
        # A model starts from the global settings; its own values override them until cleared.
        assert client.get_trace_settings("simple")["trace_rate"] == "5"
        assert client.update_trace_settings("simple", {"trace_rate": "2"})["trace_rate"] == "2"
        assert client.get_trace_settings()["trace_rate"] == "5"
        assert client.update_trace_settings("simple", {"trace_rate": None})["trace_rate"] == "5"
        for bad, message in [({"trace_rate": "-1"}, "must be at least 0"), ({"trace_level": ["LOUD"]}, "trace_level"),
                             ({"trace_mode": "opentelemetry"}, "cannot be changed"),
                             ({"trace_count": "many"}, "must be an integer"), ({"colour": "1"}, "unknown")]:
            with pytest.raises(InferenceServerException, match=message):
                client.update_trace_settings(settings=bad)
        with pytest.raises(InferenceServerException, match="Request for unknown model : does-not-exist"):
            client.get_trace_settings("does-not-exist")


def test_the_settings_api_over_grpc(example_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(example_repo)])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answer = client.update_trace_settings("simple", {"trace_count": "3", "trace_level": ["TIMESTAMPS"]},
                                          as_json=True)["settings"]
    assert answer["trace_count"]["value"] == ["3"] and answer["trace_level"]["value"] == ["TIMESTAMPS"]
    cleared = client.update_trace_settings("simple", {"trace_count": None}, as_json=True)["settings"]
    assert cleared["trace_count"]["value"] == ["-1"]
    assert client.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]


def test_traced_requests_are_written_at_shutdown(example_repo: Path, start_server: Any, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(["--model-repository", str(example_repo), "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "rate=2", "--trace-config", f"triton,file={trace_file}"])
    for i in range(5):
        _infer(server.url, f"req-{i}")
    assert server.stop() == 0
    traces = _traces(trace_file)
    assert [t["request_id"] for t in traces] == ["req-0", "req-2", "req-4"]  # one in every 2
    for trace in traces:
        assert trace["model_name"] == "simple" and trace["model_version"] == 2 and trace["parent_id"] == 0  # the latest
        names = [stamp["name"] for stamp in trace["timestamps"]]
        assert names == ORDER
        times = [stamp["ns"] for stamp in trace["timestamps"]]
        assert times == sorted(times)


def test_trace_count_and_log_frequency(example_repo: Path, start_server: Any, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(["--model-repository", str(example_repo), "--trace-level", "TIMESTAMPS",
                           "--trace-rate", "1", "--trace-count", "3", "--trace-file", str(trace_file),
                           "--trace-log-frequency", "2"])
    for i in range(6):
        _infer(server.url, f"req-{i}")
    # Two traces fill the first file at once; the third waits for the shutdown.
    assert [t["request_id"] for t in _traces(tmp_path / "trace.json.0")] == ["req-0", "req-1"]
    assert not (tmp_path / "trace.json.1").exists()
    assert server.stop() == 0
    assert [t["request_id"] for t in _traces(tmp_path / "trace.json.1")] == ["req-2"]  # count 3: no more


def test_bad_trace_flags_are_usage_errors(example_repo: Path) -> None:
    for flag in (["--trace-config", "mode=zipkin"], ["--trace-config", "rate=-1"],
                 ["--trace-config", "colour=blue"]):
        done = subprocess.run([sys.executable, "-m", "naiad.cli", "serve", "--model-repository", str(example_repo),
                               *flag], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, flag


def test_a_traced_request_that_fails_is_written_too(example_repo: Path, start_server: Any, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(["--model-repository", str(example_repo), "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "rate=1", "--trace-config", f"triton,file={trace_file}"])
    bad = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 15], "INT32")  # simple wants 16 values
        tensor.set_data_from_numpy(np.ones((1, 15), dtype=np.int32))
        bad.append(tensor)
    with httpclient.InferenceServerClient(server.url) as client, pytest.raises(InferenceServerException):
        client.infer("simple", bad, request_id="bad")
    assert server.stop() == 0
    (trace,) = _traces(trace_file)
    assert trace["request_id"] == "bad"
    assert [stamp["name"] for stamp in trace["timestamps"]] == [
        "HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "HTTP_SEND_START", "HTTP_SEND_END"]


def test_grpc_requests_carry_grpc_stamps(example_repo: Path, start_server: Any, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(["--model-repository", str(example_repo), "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "rate=1", "--trace-config", f"triton,file={trace_file}"])
    tensors = []
    for name, width in (("INPUT0", 16), ("INPUT1", 16)):
        tensor = grpcclient.InferInput(name, [1, width], "INT32")
        tensor.set_data_from_numpy(np.ones((1, width), dtype=np.int32))
        tensors.append(tensor)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("simple", tensors, request_id="by-grpc")
    tensors[1] = grpcclient.InferInput("INPUT1", [1, 15], "INT32")
    tensors[1].set_data_from_numpy(np.ones((1, 15), dtype=np.int32))
    with pytest.raises(InferenceServerException):
        client.infer("simple", tensors, request_id="bad-grpc")
    client.close()
    assert server.stop() == 0
    good, bad = _traces(trace_file)
    assert good["request_id"] == "by-grpc"
    assert [stamp["name"] for stamp in good["timestamps"]] == [name.replace("HTTP", "GRPC") for name in ORDER]
    times = [stamp["ns"] for stamp in good["timestamps"]]
    assert times == sorted(times)
    assert [stamp["name"] for stamp in bad["timestamps"]] == ["GRPC_RECV_START", "GRPC_RECV_END", "REQUEST_START"]


def test_the_tensors_level_lists_inputs_and_outputs(example_repo: Path, start_server: Any, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(["--model-repository", str(example_repo), "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "level=TENSORS", "--trace-config", "rate=1",
                           "--trace-config", f"triton,file={trace_file}"])
    with httpclient.InferenceServerClient(server.url) as client:
        assert client.get_trace_settings()["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    _infer(server.url, "with-tensors")
    assert server.stop() == 0
    items = json.loads(trace_file.read_text())
    tensors = {(item["activity"], item["tensor"]["name"]): item["tensor"] for item in items if "activity" in item}
    assert set(tensors) == {("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1"),
                            ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT1")}
    assert tensors["TENSOR_QUEUE_INPUT", "INPUT0"] == {"name": "INPUT0", "data": ",".join(["1"] * 16),
                                                       "shape": "1,16", "dtype": "INT32"}
    # simple version 2 swaps its outputs: OUTPUT0 = INPUT0 - INPUT1 = 0, OUTPUT1 = the sum = 2.
    assert tensors["TENSOR_BACKEND_OUTPUT", "OUTPUT1"]["data"] == ",".join(["2"] * 16)
    assert tensors["TENSOR_BACKEND_OUTPUT", "OUTPUT0"]["data"] == ",".join(["0"] * 16)


def test_requests_are_logged_one_by_one_only_when_verbose(example_repo: Path, start_server: Any) -> None:
    quiet = start_server(["--model-repository", str(example_repo)])
    verbose = start_server(["--model-repository", str(example_repo), "--log-verbose", "1"])
    _infer(quiet.url, "quiet-request")
    _infer(verbose.url, "loud-request")
    assert quiet.stop() == 0 and verbose.stop() == 0
    assert "quiet-request" not in quiet.log_path.read_text()
    assert "infer request 'loud-request' for model 'simple' version 2: inputs [('INPUT0', 'INT32', [1, 16])," \
        in verbose.log_path.read_text()


def test_generate_requests_carry_their_receive_stamps(example_repo: Path, start_server: Any, tmp_path: Path) -> None:
    import urllib.request

    trace_file = tmp_path / "trace.json"
    server = start_server(["--model-repository", str(example_repo), "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "rate=1", "--trace-config", f"triton,file={trace_file}"])
    for endpoint in ("generate", "generate_stream"):
        request = urllib.request.Request(f"http://{server.url}/v2/models/identity/{endpoint}",
                                         data=json.dumps({"INPUT0": [1.0, 2.0, 3.0]}).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200 and b"OUTPUT0" in answer.read()
    assert server.stop() == 0
    traces = _traces(trace_file)
    assert len(traces) == 2
    for trace in traces:
        names = [stamp["name"] for stamp in trace["timestamps"]]
        assert names[:3] == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START"] and names[-1] == \
            "INFER_RESPONSE_COMPLETE"
