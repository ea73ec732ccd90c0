"""OpenTelemetry mode against a real OTLP/HTTP receiver (an in-test HTTP server decoding
ExportTraceServiceRequest): the span tree of a traced request under the client's traceparent,
over HTTP and gRPC."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

pytestmark = pytest.mark.e2e

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


class Receiver:
    """Collects the spans every OTLP/HTTP export carries."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, str]] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                export = ExportTraceServiceRequest.FromString(body)
                with receiver.arrived:
                    for resource_spans in export.resource_spans:
                        receiver.resources.append({a.key: a.value.string_value
                                                   for a in resource_spans.resource.attributes})
                        for scope in resource_spans.scope_spans:
                            receiver.spans.extend(scope.spans)
                    receiver.arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 30) -> list[Any]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.spans) >= count, timeout)
            return list(self.spans)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.server.shutdown()


def _inputs(module: Any) -> list[Any]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        tensors.append(tensor)
    return tensors


def _tree(spans: list[Any]) -> dict[str, Any]:
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"InferRequest", "queue", "compute"}
    return by_name


def test_a_propagated_request_becomes_a_span_tree(example_repo: Path, start_server: Any, receiver: Receiver) -> None:
    server = start_server(["--model-repository", str(example_repo), "--trace-config", "mode=opentelemetry",
                           "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=0",
                           "--trace-config", f"opentelemetry,url={receiver.url}",
                           "--trace-config", "opentelemetry,bsp_schedule_delay=50",
                           "--trace-config", "opentelemetry,resource=service.name=naiad-test"])
    with httpclient.InferenceServerClient(server.url) as client:
        client.infer("simple", _inputs(httpclient), request_id="untraced")  # rate 0, no traceparent
        client.infer("simple", _inputs(httpclient), request_id="traced",
                     headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    spans = _tree(receiver.wait_for(3))
    root, queue, compute = spans["InferRequest"], spans["queue"], spans["compute"]
    assert root.trace_id.hex() == TRACE_ID and root.parent_span_id.hex() == CLIENT_SPAN
    assert queue.parent_span_id == root.span_id and compute.parent_span_id == root.span_id
    assert {queue.trace_id, compute.trace_id} == {root.trace_id}
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["triton.model_name"].string_value == "simple"
    assert attributes["triton.request_id"].string_value == "traced"
    assert root.start_time_unix_nano <= queue.start_time_unix_nano <= queue.end_time_unix_nano \
        <= compute.end_time_unix_nano <= root.end_time_unix_nano
    assert queue.end_time_unix_nano == compute.start_time_unix_nano
    assert [event.name for event in compute.events] == ["COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"]
    assert receiver.resources[0]["service.name"] == "naiad-test"
    assert server.stop() == 0
    assert len(receiver.spans) == 3  # the untraced request never became spans


def test_sampled_grpc_requests_are_exported_too(example_repo: Path, start_server: Any, receiver: Receiver) -> None:
    server = start_server(["--model-repository", str(example_repo), "--trace-config", "mode=opentelemetry",
                           "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                           "--trace-config", f"opentelemetry,url={receiver.url}"])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("simple", _inputs(grpcclient), request_id="by-grpc",
                 headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    assert server.stop() == 0  # shutting down exports what the batch processor still holds
    spans = _tree(receiver.wait_for(3))
    assert spans["InferRequest"].trace_id.hex() == TRACE_ID
    assert spans["InferRequest"].parent_span_id.hex() == CLIENT_SPAN


def test_ensemble_steps_are_spans_under_the_ensemble_span(tmp_path: Path, start_server: Any,
                                                         receiver: Receiver) -> None:
    from e2e.test_ensemble import DIAMOND, _write_repo

    _write_repo(tmp_path, {"diamond": DIAMOND})
    server = start_server(["--model-repository", str(tmp_path), "--trace-config", "mode=opentelemetry",
                           "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=0",
                           "--trace-config", f"opentelemetry,url={receiver.url}"])
    tensors = []
    for name in ("A", "B"):
        tensor = httpclient.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        tensors.append(tensor)
    with httpclient.InferenceServerClient(server.url) as client:
        client.infer("diamond", tensors, headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    assert server.stop() == 0
    spans = receiver.wait_for(9)  # three requests (the ensemble, its two steps), three spans each
    requests = [s for s in spans if s.name == "InferRequest"]
    models = {s.span_id: {a.key: a.value for a in s.attributes}["triton.model_name"].string_value for s in requests}
    (root,) = [s for s in requests if models[s.span_id] == "diamond"]
    steps = [s for s in requests if s is not root]
    assert root.parent_span_id.hex() == CLIENT_SPAN
    assert [models[s.span_id] for s in steps] == ["add_sub", "add_sub"]
    assert all(s.parent_span_id == root.span_id and s.trace_id.hex() == TRACE_ID for s in steps)
    for request in requests:
        assert sorted(s.name for s in spans if s.parent_span_id == request.span_id
                      and s.name != "InferRequest") == ["compute", "queue"]
