"""gRPC server options on real servers: TLS and mutual TLS (certificates made at test time with
openssl), the message size limit in both directions, response compression, keepalive flags,
--allow-grpc=false and a port that is already taken."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import build_models
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import ServerProcess, running_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

LIMIT = 4096  # --grpc-max-message-size of the TLS server
IDENTITY = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpc_options")
    write_model(root, "identity", IDENTITY, {1: lambda path: build_models.identity(path, TensorProto.FLOAT)})
    return root


# ------------------------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(name: str, cwd: Path) -> None:
    """`name`.key and `name`.crt signed by the test CA, valid for 127.0.0.1 and localhost."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=cwd)
    (cwd / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=cwd)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=naiad-test-ca", cwd=root)
    _signed("server", root)
    _signed("client", root)
    return root


def _tls_client(server: ServerProcess, certs: Path, with_client_cert: bool = False) -> grpcclient.InferenceServerClient:
    keys = {"private_key": str(certs / "client.key"), "certificate_chain": str(certs / "client.crt")}
    return grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(certs / "ca.crt"),
                                            **(keys if with_client_cert else {}))


def _infer(client: grpcclient.InferenceServerClient, count: int) -> np.ndarray:
    data = np.arange(count, dtype=np.float32).reshape(1, count)
    tensor = grpcclient.InferInput("INPUT0", [1, count], "FP32").set_data_from_numpy(data)
    result = client.infer("identity", [tensor], client_timeout=20)
    return result.as_numpy("OUTPUT0")


# ------------------------------------------------------------------------------------ servers


@pytest.fixture(scope="module")
def tls_server(repo: Path, certs: Path) -> Iterator[ServerProcess]:
    """TLS, a 4 KiB message limit, compressed inference responses and every keepalive flag."""
    args = ["--model-repository", str(repo), "--grpc-use-ssl=true", f"--grpc-server-cert={certs / 'server.crt'}",
            f"--grpc-server-key={certs / 'server.key'}", f"--grpc-max-message-size={LIMIT}",
            "--grpc-infer-response-compression-level=high", "--grpc-keepalive-time=10000",
            "--grpc-keepalive-timeout=5000", "--grpc-keepalive-permit-without-calls=true",
            "--grpc-http2-max-pings-without-data=0", "--grpc-http2-min-recv-ping-interval-without-data=1000",
            "--grpc-http2-max-ping-strikes=5", "--grpc-header-forward-pattern=^x-"]
    with running_server(args, repo.parent / "tls.log") as server:
        yield server


def test_tls(tls_server: ServerProcess, certs: Path) -> None:
    with _tls_client(tls_server, certs) as client:
        assert client.is_server_ready()
        assert _infer(client, 8).tolist() == [list(range(8))]
    plain = grpcclient.InferenceServerClient(tls_server.grpc_url)
    with plain, pytest.raises(InferenceServerException) as caught:
        plain.is_server_live(client_timeout=5)
    assert caught.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


def test_message_size_limit_both_ways(tls_server: ServerProcess, certs: Path) -> None:
    with _tls_client(tls_server, certs) as client:
        assert _infer(client, 512).shape == (1, 512)  # 2 KiB each way: inside the limit
        with pytest.raises(InferenceServerException) as caught:
            _infer(client, 2048)  # an 8 KiB request
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert client.is_server_ready()


def _identity_messages(count: int) -> tuple[service_pb2.ModelInferRequest, service_pb2.ModelInferResponse]:
    """A request for `count` floats and the answer it gets (a few bytes longer: version, names)."""
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, count])
    request.raw_input_contents.append(np.zeros(count, np.float32).tobytes())
    response = service_pb2.ModelInferResponse(model_name="identity", model_version="1")
    response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, count])
    response.raw_output_contents.append(np.zeros(count, np.float32).tobytes())
    return request, response


def test_message_size_limit_applies_to_responses(tls_server: ServerProcess, certs: Path) -> None:
    count = next(c for c in range(900, 1100) if _identity_messages(c)[0].ByteSize() <= LIMIT
                 < _identity_messages(c)[1].ByteSize())
    credentials = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.crt").read_bytes())
    unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.secure_channel(tls_server.grpc_url, credentials, unlimited) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(_identity_messages(count - 4)[0], timeout=20).outputs[0].name == "OUTPUT0"
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(_identity_messages(count)[0], timeout=20)  # the request fits, its answer does not
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


_TRACED_CLIENT = """
import sys, numpy as np, tritonclient.grpc as g
client = g.InferenceServerClient(sys.argv[1], ssl=True, root_certificates=sys.argv[2])
tensor = g.InferInput("INPUT0", [1, 64], "FP32").set_data_from_numpy(np.zeros((1, 64), np.float32))
assert client.infer("identity", [tensor]).as_numpy("OUTPUT0").shape == (1, 64)
client.get_model_metadata("identity")
"""


def test_inference_responses_are_compressed(tls_server: ServerProcess, certs: Path) -> None:
    """gRPC's compression trace (in a client process) shows what came over the wire: deflate
    (algorithm 1) for the inference answer, identity (0) for the metadata answer, as Triton."""
    traced = subprocess.run([sys.executable, "-c", _TRACED_CLIENT, tls_server.grpc_url, str(certs / "ca.crt")],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "GRPC_TRACE": "compression", "GRPC_VERBOSITY": "debug"})
    assert traced.returncode == 0, traced.stderr
    received = re.findall(r"DecompressMessage: len=\d+ max=\d+ alg=(\d)", traced.stderr)
    assert received[-2:] == ["1", "0"], traced.stderr[-2000:]


@pytest.fixture(scope="module")
def mutual_server(repo: Path, certs: Path) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(repo), "--grpc-use-ssl-mutual=true",
            f"--grpc-server-cert={certs / 'server.crt'}", f"--grpc-server-key={certs / 'server.key'}",
            f"--grpc-root-cert={certs / 'ca.crt'}"]
    with running_server(args, repo.parent / "mutual.log") as server:
        yield server


def test_mutual_tls_needs_a_client_certificate(mutual_server: ServerProcess, certs: Path) -> None:
    with _tls_client(mutual_server, certs, with_client_cert=True) as client:
        assert client.is_server_ready() and _infer(client, 4).tolist() == [[0.0, 1.0, 2.0, 3.0]]
    with _tls_client(mutual_server, certs) as client, pytest.raises(InferenceServerException) as caught:
        client.is_server_live(client_timeout=5)
    assert caught.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


# --------------------------------------------------------------------------- no gRPC, bad start


def test_allow_grpc_false_serves_http_only(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo), "--allow-grpc=false"])
    assert server.get("/v2/health/ready") == 200
    with grpcclient.InferenceServerClient(server.grpc_url) as client, pytest.raises(InferenceServerException):
        client.is_server_live(client_timeout=2)


def test_a_taken_port_is_a_clean_startup_error(repo: Path, start_server: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server(["--model-repository", str(repo), f"--grpc-port={port}"], wait=False)
        assert server.process.wait(timeout=60) == 1
    assert f"failed to start GRPC service at 127.0.0.1:{port}" in server.logs()


def test_missing_certificate_is_a_clean_startup_error(repo: Path, start_server: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"
    server = start_server(["--model-repository", str(repo), "--grpc-use-ssl=true", f"--grpc-server-cert={missing}",
                           f"--grpc-server-key={missing}"], wait=False)
    assert server.process.wait(timeout=60) == 1
    assert f"failed to read --grpc-server-key '{missing}'" in server.logs()


# ------------------------------------------------------------------------------- transports


def test_grpcio_transport_serves_the_same_api(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo), "--grpc-transport=grpcio"])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready() and _infer(client, 5).tolist() == [list(range(5))]
        answers: list[Any] = []
        client.start_stream(callback=lambda result, error: answers.append((result, error)))
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(np.ones((1, 2), np.float32))
        client.async_stream_infer("identity", [tensor], request_id="s")
        client.stop_stream()  # waits for the answers
        assert [(r.get_response().id, e) for r, e in answers] == [("s", None)]
    with grpc.insecure_channel(server.grpc_url) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_unknown_transport_is_a_command_line_error(repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(repo), "--grpc-transport=carrier-pigeon"], wait=False)
    assert server.process.wait(timeout=60) == 2
    assert "argument --grpc-transport: invalid choice: 'carrier-pigeon'" in server.logs()
