"""Access control on real servers with tritonclient (HTTP and gRPC, both gRPC transports):
Triton's restricted API groups (--http-restricted-api / --grpc-restricted-protocol) with its
exact refusals, naiad's bearer token, HTTPS with a certificate made at test time, and bad flag
values refused at start with the reason."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.client import HTTPSConnection
from pathlib import Path

import build_models
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ROOT, ServerProcess
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from e2e.raw_http import http
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

IDENTITY = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
INFER = {"infer-key": "infer-value"}
ADMIN = {"admin-key": "admin-value"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "infer-value"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "admin-value"}
TOKEN = "naiad-test-token"
BEARER = {"authorization": f"Bearer {TOKEN}"}
HTTP_REFUSED = "This API is restricted, expecting header 'infer-key'"
GRPC_REFUSED = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("access")
    write_model(root, "identity", IDENTITY, {1: lambda path: build_models.identity(path, TensorProto.FLOAT)})
    return root


@contextmanager
def serving(args: list[str], log: Path, env: dict[str, str] | None = None,
            ready: str | None = "plain") -> Iterator[ServerProcess]:
    """A server started with `env` added to the environment; `ready`: how to wait for it
    ("plain": the open HTTP health endpoint; None: the caller waits)."""
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        server = ServerProcess(args, log)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        if ready == "plain":
            server.wait_live()
        yield server
    finally:
        server.stop()


def _http_infer(client: httpclient.InferenceServerClient, headers: dict[str, str] | None = None) -> np.ndarray:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32").set_data_from_numpy(data)
    # A copy: tritonclient.http adds Inference-Header-Content-Length to the dict it is given.
    return client.infer("identity", [tensor], headers=dict(headers or {})).as_numpy("OUTPUT0")


def _grpc_infer(client: grpcclient.InferenceServerClient, headers: dict[str, str] | None = None) -> np.ndarray:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32").set_data_from_numpy(data)
    return client.infer("identity", [tensor], headers=headers, client_timeout=20).as_numpy("OUTPUT0")


# ------------------------------------------------------------------------- restricted groups


@pytest.fixture(scope="module")
def restricted(repo: Path) -> Iterator[ServerProcess]:
    """Inference needs infer-key; the repository and model config need admin-key (naiad's own gRPC transport)."""
    args = ["--model-repository", str(repo), "--model-control-mode=explicit", "--load-model=identity",
            "--http-restricted-api=inference:infer-key=infer-value",
            "--http-restricted-api=model-repository,model-config:admin-key=admin-value",
            "--grpc-restricted-protocol=inference:infer-key=infer-value",
            "--grpc-restricted-protocol=model-repository,model-config:admin-key=admin-value"]
    with serving(args, repo.parent / "restricted.log") as server:
        yield server


def test_http_restricted_group(restricted: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(restricted.url)
    with pytest.raises(InferenceServerException, match=HTTP_REFUSED):
        _http_infer(client)
    with pytest.raises(InferenceServerException, match=HTTP_REFUSED):
        _http_infer(client, {"infer-key": "wrong"})
    with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'infer-key'"):
        _http_infer(client, ADMIN)  # another group's header opens nothing here
    assert _http_infer(client, INFER).tolist() == [[0, 1, 2, 3]]
    # Exactly Triton's answer: 403 and a JSON error body.
    answer = http(restricted.url, "/v2/models/identity/infer", "POST", b"{}")
    assert (answer.status, answer.error()) == (403, HTTP_REFUSED)
    answer = http(restricted.url, "/v2/models/identity/config")
    assert (answer.status, answer.error()) == (403, "This API is restricted, expecting header 'admin-key'")
    assert http(restricted.url, "/v2/models/identity/config", headers=ADMIN).status == 200


def test_http_other_groups_open(restricted: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(restricted.url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("identity")
    assert client.get_model_metadata("identity")["name"] == "identity"
    assert client.get_inference_statistics("identity")["model_stats"]
    with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'admin-key'"):
        client.get_model_repository_index(headers=INFER)
    assert client.get_model_repository_index(headers=ADMIN)[0]["name"] == "identity"


def test_grpc_restricted_group(restricted: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(restricted.grpc_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            _grpc_infer(client)
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert caught.value.message() == GRPC_REFUSED
        with pytest.raises(InferenceServerException) as caught:
            _grpc_infer(client, INFER)  # HTTP's header name is not the gRPC one
        assert caught.value.message() == GRPC_REFUSED
        assert _grpc_infer(client, GRPC_INFER).tolist() == [[0, 1, 2, 3]]
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_config("identity")
        assert caught.value.message() == GRPC_REFUSED.replace("infer-key", "admin-key")
        assert client.get_model_config("identity", headers=GRPC_ADMIN).config.name == "identity"
        # Other groups stay open.
        assert client.is_server_ready() and client.is_model_ready("identity")
        assert client.get_model_metadata("identity").name == "identity"
        assert client.get_inference_statistics("identity").model_stats


def test_grpc_restricted_stream(restricted: ServerProcess) -> None:
    """The streaming RPC is in the inference group too: refused before any request is read."""
    results: list[object] = []
    with grpcclient.InferenceServerClient(restricted.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.append(error or result))
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(np.ones((1, 2), np.float32))
        try:
            client.async_stream_infer("identity", [tensor])
        except InferenceServerException as error:  # the refusal may end the stream before the send
            assert "no longer in valid state" in error.message()
        deadline = time.monotonic() + 20
        while not results and time.monotonic() < deadline:
            time.sleep(0.05)
        client.stop_stream()
    assert len(results) == 1 and isinstance(results[0], InferenceServerException)
    assert results[0].message() == GRPC_REFUSED


# ----------------------------------------------------------------------------- bearer token


@pytest.fixture(scope="module")
def token_server(repo: Path) -> Iterator[ServerProcess]:
    """The token from NAIAD_AUTH_TOKEN, grpcio's transport, and a restricted gRPC group on top."""
    args = ["--model-repository", str(repo), "--grpc-transport=grpcio",
            "--grpc-restricted-protocol=inference:infer-key=infer-value"]
    with serving(args, repo.parent / "token.log", env={"NAIAD_AUTH_TOKEN": TOKEN}) as server:
        yield server


def test_http_bearer_token(token_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(token_server.url)
    with pytest.raises(InferenceServerException, match="missing bearer token"):
        client.get_model_metadata("identity")
    with pytest.raises(InferenceServerException, match="invalid bearer token"):
        client.get_model_metadata("identity", headers={"authorization": "Bearer wrong"})
    assert client.get_model_metadata("identity", headers=BEARER)["name"] == "identity"
    assert _http_infer(client, BEARER).tolist() == [[0, 1, 2, 3]]
    # Health stays open for probes; everything else, unknown paths included, needs the token.
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("identity")
    missing = http(token_server.url, "/v2/models/identity/stats")
    assert missing.status == 401 and missing.error().startswith("missing bearer token")
    assert missing.headers["www-authenticate"] == 'Bearer realm="naiad"'
    wrong = http(token_server.url, "/v2/no/such/path", headers={"authorization": "Bearer nope"})
    assert (wrong.status, wrong.error()) == (401, "invalid bearer token")
    assert wrong.headers["www-authenticate"] == 'Bearer realm="naiad", error="invalid_token"'
    assert http(token_server.url, "/v2/no/such/path", headers=BEARER).status == 404


def test_grpc_bearer_token(token_server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(token_server.grpc_url) as client:
        for headers, message in ((None, "missing bearer token: send the header 'Authorization: Bearer <token>'"),
                                 ({"authorization": "Bearer wrong"}, "invalid bearer token")):
            with pytest.raises(InferenceServerException) as caught:
                client.get_model_metadata("identity", headers=headers)
            assert (caught.value.status(), caught.value.message()) == ("StatusCode.UNAUTHENTICATED", message)
        assert client.get_model_metadata("identity", headers=BEARER).name == "identity"
        assert client.is_server_live() and client.is_model_ready("identity")  # health: open
        # The token first, then the restricted group's header.
        with pytest.raises(InferenceServerException) as caught:
            _grpc_infer(client, BEARER)
        assert (caught.value.status(), caught.value.message()) == ("StatusCode.UNAVAILABLE", GRPC_REFUSED)
        with pytest.raises(InferenceServerException) as caught:
            _grpc_infer(client, GRPC_INFER)
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        assert _grpc_infer(client, {**BEARER, **GRPC_INFER}).tolist() == [[0, 1, 2, 3]]
    with grpc.insecure_channel(token_server.grpc_url) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


# ------------------------------------------------------------------------------------- HTTPS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for 127.0.0.1, and the token in a file."""
    root = tmp_path_factory.mktemp("https")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.crt",
             "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", cwd=root)
    (root / "token").write_text(TOKEN + "\n")
    return root


def _https_ready(url: str, certs: Path, server: ServerProcess, timeout: float = 60.0) -> None:
    context = ssl.create_default_context(cafile=str(certs / "server.crt"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"naiad exited with {server.process.returncode}:\n{server.logs()}")
        try:
            request = urllib.request.Request(f"https://{url}/v2/health/ready", headers=BEARER)
            with urllib.request.urlopen(request, timeout=2, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"naiad not ready over HTTPS after {timeout}s:\n{server.logs()}")


@pytest.fixture(scope="module")
def https_server(repo: Path, certs: Path) -> Iterator[ServerProcess]:
    """HTTPS, the token from a file guarding health too."""
    args = ["--model-repository", str(repo), f"--http-ssl-cert={certs / 'server.crt'}",
            f"--http-ssl-key={certs / 'server.key'}", f"--auth-token-file={certs / 'token'}", "--auth-health"]
    with serving(args, repo.parent / "https.log", ready=None) as server:
        _https_ready(server.url, certs, server)
        yield server


def test_https(https_server: ServerProcess, certs: Path) -> None:
    client = httpclient.InferenceServerClient(https_server.url, ssl=True,
                                              ssl_options={"ca_certs": str(certs / "server.crt")})
    assert client.is_server_ready(headers=BEARER)
    assert _http_infer(client, BEARER).tolist() == [[0, 1, 2, 3]]
    assert not client.is_server_live()  # --auth-health: probes need the token too (tritonclient: False on 401)
    assert client.is_server_live(headers=BEARER)
    context = ssl.create_default_context(cafile=str(certs / "server.crt"))
    connection = HTTPSConnection("127.0.0.1", https_server.http_port, context=context, timeout=10)
    connection.request("GET", "/v2/health/live")
    assert connection.getresponse().status == 401
    connection.close()
    # gRPC (naiad's own transport here): with --auth-health, health needs the token as well.
    with grpcclient.InferenceServerClient(https_server.grpc_url) as grpc_client:
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.is_server_live()
        assert (caught.value.status(), caught.value.message()) == ("StatusCode.UNAUTHENTICATED",
                                                                   "missing bearer token: send the header "
                                                                   "'Authorization: Bearer <token>'")
        assert grpc_client.is_server_live(headers=BEARER)
        assert _grpc_infer(grpc_client, BEARER).tolist() == [[0, 1, 2, 3]]
    # Plain HTTP to the HTTPS port gets no HTTP answer.
    with pytest.raises(Exception):  # noqa: B017 - a reset or a malformed status line
        http(https_server.url, "/v2/health/live", headers=BEARER, timeout=5)


# ---------------------------------------------------------------------------- bad flag values


def _serve(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "naiad.cli", "serve", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize(("flags", "message"), [
    (["--http-restricted-api=model-repository,health:k1=v1", "--http-restricted-api=metadata,health:k2=v2"],
     "restricted api 'health' can not be specified in multiple config groups"),
    (["--grpc-restricted-protocol=model-reposit,health:k1=v1"], "unknown restricted protocol 'model-reposit'"),
    (["--http-restricted-api=inference:key"],
     "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference:key"),
    (["--auth-token-file=/nonexistent/token"], "failed to read --auth-token-file '/nonexistent/token'"),
    (["--http-ssl-key=server.key"], "HTTPS needs both --http-ssl-cert and --http-ssl-key"),
])
def test_bad_flags_refused(flags: list[str], message: str, tmp_path: Path) -> None:
    result = _serve("--model-repository", str(tmp_path), *flags)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_unreadable_certificate_fails_start(tmp_path: Path) -> None:
    (tmp_path / "bad.crt").write_text("not a certificate\n")
    result = _serve("--model-repository", str(tmp_path), f"--http-ssl-cert={tmp_path / 'bad.crt'}",
                    f"--http-ssl-key={tmp_path / 'bad.crt'}", "--http-port=0", "--grpc-port=0",
                    "--allow-metrics=false")
    assert result.returncode == 1
    assert "failed to load the HTTPS certificate" in result.stdout + result.stderr
