"""Hostile HTTP/1.1 clients against a real server, one test per finding of the hardening issue:
each attacker gets its answer (status, or reading stopped) within 1 s, the server's RSS stays
bounded during and after, and a tritonclient bystander on another connection is served
throughout (tests/frontends/hostile.py). Bounded and loopback only.

The server runs with a bearer token (--auth-token): the attacks of the issue that need none
send one, the bystander too.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess
from e2e.repo_builder import write_model
from frontends.hostile import ECHO, MIB, Bystander, Watch, attack_server
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "attack-suite-secret"
AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()
ANSWER_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("http-attacks")
    write_model(root / "repo", "echo", ECHO, {1: lambda path: None})
    args = ["--model-repository", str(root / "repo"), "--model-control-mode=explicit", "--load-model=echo",
            f"--auth-token={TOKEN}"]
    with attack_server(args, root / "naiad.log") as process:
        yield process


@pytest.fixture(scope="module")
def bystander(server: ServerProcess) -> Iterator[Bystander]:
    client = Bystander("http", server.url, "echo", TOKEN)
    yield client
    client.stop()


def _connect(url: str) -> socket.socket:
    host, port = url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


class Reader:
    """Reads a connection in a thread, splitting what comes into HTTP/1.1 responses."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = bytearray()
        self.statuses: list[tuple[int, float]] = []  # (status, monotonic time it arrived)
        self.closed = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(None)
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.data += chunk
            self._split(time.monotonic())

    def _split(self, now: float) -> None:
        while True:
            end = self.data.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.data[:end]).decode("latin-1").lower()
            lines = head.split("\r\n")
            length = next((int(line.split(":")[1]) for line in lines if line.startswith("content-length:")), 0)
            if len(self.data) < end + 4 + length:
                return
            self.statuses.append((int(head.split()[1]), now))
            del self.data[:end + 4 + length]

    def wait(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.statuses) < count and not self.closed and time.monotonic() < deadline:
            time.sleep(0.01)


# -- 6. pipelining holds unbounded responses --------------------------------------------------------


def test_pipelined_requests_from_a_client_that_never_reads_are_not_read(server: ServerProcess,
                                                                       bystander: Bystander) -> None:
    """~256 KiB of pipelined GETs for a 59 KB document, the answers never read: the server
    stops reading once its send buffer is full instead of answering (and holding) them all."""
    request = b"GET /openapi.json HTTP/1.1\r\nHost: naiad\r\n" + AUTH + b"\r\n"
    batch = request * 64
    sock = _connect(server.url)
    sock.setblocking(False)
    try:
        with Watch("pipelined GETs, answers never read", server.process.pid, bystander) as figures:
            start = time.monotonic()
            sent = 0
            stalled_since = 0.0
            while sent < 256 * 1024 and time.monotonic() - start < 5:
                try:
                    sent += sock.send(batch)
                    stalled_since = 0.0
                except BlockingIOError:
                    stalled_since = stalled_since or time.monotonic()
                    if time.monotonic() - stalled_since > 0.5:
                        break
                    time.sleep(0.01)
            time.sleep(1.0)  # what the server would do with what it read, it does now
            reading = time.monotonic()
            reader = Reader(sock)
            reader.wait(1, ANSWER_S)
            first = reader.statuses[0] if reader.statuses else (0, float("inf"))
            sock.close()
            figures.response = (f"{sent // 1024} KiB sent ({sent // len(request)} requests); once read, the "
                                f"first answer {first[0]} after {first[1] - reading:.2f} s")
        assert first[0] == 200 and first[1] - reading < ANSWER_S, figures
    finally:
        sock.close()


# -- 7. a spurious 431 loses valid requests ----------------------------------------------------------


def test_thousands_of_pipelined_infers_in_one_write_are_all_answered(server: ServerProcess,
                                                                     bystander: Bystander) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                                   "data": [1, 2, 3, 4]}]}).encode()
    request = (b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: naiad\r\n" + AUTH
               + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    count = 3000
    sock = _connect(server.url)
    try:
        with Watch("3,000 pipelined infers in one write", server.process.pid, bystander) as figures:
            reader = Reader(sock)
            start = time.monotonic()
            sock.sendall(request * count)
            reader.wait(count, 30)
            statuses = [status for status, _ in reader.statuses]
            first = reader.statuses[0][1] - start if reader.statuses else float("inf")
            sock.close()
            figures.response = (f"{statuses.count(200)} of {count} answered 200 (first after {first:.2f} s), "
                                f"other statuses {sorted(set(statuses) - {200})}")
        assert statuses == [200] * count, figures
        assert first < ANSWER_S, figures
    finally:
        sock.close()


# -- 8. auth before the body ------------------------------------------------------------------------


def test_unauthenticated_uploads_are_refused_from_their_headers(server: ServerProcess,
                                                                bystander: Bystander) -> None:
    """8 uploads of 32 MiB without the token: each gets 401 as soon as its headers are in, and
    its body is read and dropped, never held."""
    size = 32 * MIB
    head = (b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: naiad\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % size)
    socks = [_connect(server.url) for _ in range(8)]
    try:
        with Watch("8 unauthenticated 32 MiB uploads", server.process.pid, bystander) as figures:
            readers = [Reader(sock) for sock in socks]
            start = time.monotonic()
            for sock in socks:
                sock.sendall(head)
            for reader in readers:
                reader.wait(1, ANSWER_S)
            answered = [reader.statuses[0] if reader.statuses else (None, float("inf")) for reader in readers]
            chunk = b"x" * MIB
            for _ in range(size // MIB):  # the bodies, as the client sends them anyway
                for sock in socks:
                    with contextlib.suppress(OSError):
                        sock.sendall(chunk)
            for sock in socks:
                sock.close()
            figures.response = (f"statuses {sorted({status for status, _ in answered}, key=str)}, the last after "
                                f"{max(at for _, at in answered) - start:.2f} s (before any body byte)")
        assert all(status == 401 for status, _ in answered), figures
        assert all(at - start < ANSWER_S for _, at in answered), figures
    finally:
        for sock in socks:
            sock.close()


# -- 10. metric tags --------------------------------------------------------------------------------

ECHO_CONFIG = {"name": "echo", "backend": "identity", "max_batch_size": 0,
               "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
               "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}


def test_metric_tags_that_would_break_the_metrics_page_are_refused_at_load(server: ServerProcess,
                                                                          bystander: Bystander) -> None:
    """A load-API config override with a tag named like a label the page sets, or not a label
    name at all: refused with a load error; /metrics stays whole for every model."""
    with Watch("metric_tags reason / le / quantile / my-tag", server.process.pid, bystander) as figures:
        answers = {}
        for key in ("reason", "le", "quantile", "my-tag", "__name"):
            config = dict(ECHO_CONFIG, metric_tags={key: "x"})
            body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
            start = time.monotonic()
            status, reply = _http(server.url, "POST", "/v2/repository/models/echo/load", body)
            answers[key] = (status, json.loads(reply).get("error", ""), time.monotonic() - start)
        page = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        families = {family.name: family for family in text_string_to_metric_families(page)}
        figures.response = ", ".join(f"{key}: {status}" for key, (status, _, _) in answers.items())
    assert all(status == 400 and key in error for key, (status, error, _) in answers.items()), answers
    assert all(elapsed < ANSWER_S for _, _, elapsed in answers.values()), answers
    success = families["nv_inference_request_success"].samples
    assert any(sample.labels.get("model") == "echo" for sample in success), page[:500]


# -- 11. bad input ----------------------------------------------------------------------------------


def _http(url: str, method: str, path: str, body: bytes = b"", token: bool = True) -> tuple[int, bytes]:
    sock = _connect(url)
    try:
        head = b"%s %s HTTP/1.1\r\nHost: naiad\r\nConnection: close\r\nContent-Length: %d\r\n" % (
            method.encode(), path.encode(), len(body))
        sock.sendall(head + (AUTH if token else b"") + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(1 << 20):
            data += chunk
    finally:
        sock.close()
    head_text, _, payload = data.partition(b"\r\n\r\n")
    return int(head_text.split()[1]), payload


NESTED = b"[" * 100_000 + b"]" * 100_000
NESTED_ROUTES = [("POST", "/v2/repository/models/echo/load"), ("POST", "/v2/logging"), ("POST", "/v2/trace/setting"),
                 ("POST", "/v2/systemsharedmemory/region/r/register"), ("POST", "/v1/chat/completions"),
                 ("POST", "/v1/completions"), ("POST", "/v2/models/echo/infer"), ("POST", "/v2/models/echo/generate")]


def test_deeply_nested_json_is_a_400_on_every_route(server: ServerProcess, bystander: Bystander) -> None:
    with Watch("JSON nested 10^5 deep", server.process.pid, bystander) as figures:
        start = time.monotonic()
        answers = {path: _http(server.url, method, path, NESTED) for method, path in NESTED_ROUTES}
        elapsed = time.monotonic() - start
        figures.response = ", ".join(f"{path} {status}" for path, (status, _) in answers.items())
    assert all(status == 400 for status, _ in answers.values()), figures
    assert all(json.loads(body)["error"] for _, body in answers.values()), figures
    assert elapsed < ANSWER_S * len(NESTED_ROUTES), figures


def test_failed_file_override_loads_leave_no_files_behind(server: ServerProcess, bystander: Bystander) -> None:
    """Ten loads whose `file:` override fails (a corrupt ONNX file): each temporary model
    directory goes with its failure, not at some later load, unload or exit."""
    config = json.dumps({"backend": "onnxruntime", "max_batch_size": 0,
                         "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                         "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]})
    prefix = f"leak{os.getpid()}x"

    def load(name: str) -> int:
        onnx = base64.b64encode(os.urandom(MIB)).decode()
        body = json.dumps({"parameters": {"config": config, "file:1/model.onnx": onnx}}).encode()
        return _http(server.url, "POST", f"/v2/repository/models/{name}/load", body)[0]

    load(f"{prefix}warm")  # the first one imports onnxruntime (~35 MiB, once): not what is measured
    with Watch("10 failed file: override loads", server.process.pid, bystander) as figures:
        statuses = [load(f"{prefix}{i}") for i in range(10)]
        left = sorted(Path(tempfile.gettempdir()).glob(f"naiad-{prefix}*"))
        figures.response = f"statuses {sorted(set(statuses))}, {len(left)} temporary directories left"
    assert statuses == [400] * 10, figures
    assert not left, figures
