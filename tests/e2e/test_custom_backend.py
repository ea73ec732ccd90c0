"""C custom backends (examples/custom_backend, built with gcc) served by a real naiad through
tritonclient: a segfault in execute fails only its own batch and the instance comes back, the
other models never notice; create() errors, unusable libraries and ABI mismatches fail their
load with the reason."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from backends import custom_examples
from backends.conformance import mlp
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

FAULTY = """name: "{name}"
backend: "custom"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""
MLP = f"""name: "mlp"
backend: "custom"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {mlp.IN} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {mlp.OUT} ] }} ]
"""
FUTURE_VERSION = """
#include "naiad_backend.h"
uint32_t naiad_backend_abi_version(void) { return 7; }
int32_t naiad_backend_create(const char *c, const char *d, uint32_t i, void **s, char **e) { return 0; }
int32_t naiad_backend_execute(void *s, const naiad_request *r, uint32_t n, naiad_allocate_fn a, void *x,
                              char **re, char **e) { return 0; }
void naiad_backend_destroy(void *s) {}
void naiad_backend_free(void *p) { free(p); }
"""


def _model(repo: Path, name: str, config: str, example: str) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    custom_examples.install(example, version)
    return version


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("custom")
    custom_examples.write_weights(_model(repo, "mlp", MLP, "mlp"))
    _model(repo, "faulty", FAULTY.format(name="faulty", extra=(
        "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]")), "faulty")
    _model(repo, "refuses", FAULTY.format(name="refuses", extra=(
        'parameters { key: "fail_create" value { string_value: "1" } }')), "faulty")
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "mlp",
            "--load-model", "faulty"]
    with running_server(args, repo.parent / "custom.log") as running:
        yield running


def _infer(server: ServerProcess, model: str, value: float, **parameters: Any) -> np.ndarray:
    x = np.full((1, 4), value, np.float32)
    tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with httpclient.InferenceServerClient(server.url) as client:
        return client.infer(model, [tensor], parameters=parameters or None).as_numpy("OUTPUT0")


def _mlp_serves(server: ServerProcess) -> None:
    x = np.random.default_rng(2).standard_normal((2, mlp.IN)).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("mlp", [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(result, mlp.reference(x), rtol=1e-4, atol=1e-5)


def test_mlp_over_both_protocols(server: ServerProcess) -> None:
    _mlp_serves(server)
    with httpclient.InferenceServerClient(server.url) as client:
        metadata = client.get_model_metadata("mlp")
    assert metadata["platform"] == "custom"


def test_a_request_error_fails_only_that_request(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException, match="request failed on purpose"):
        _infer(server, "faulty", 1.0, fail=True)
    assert _infer(server, "faulty", 2.0).tolist() == [[2.0] * 4]


def test_a_segfault_fails_its_batch_and_the_instance_is_replaced(server: ServerProcess) -> None:
    assert _infer(server, "faulty", 1.0).tolist() == [[1.0] * 4]
    errors: list[str] = []

    def call(**parameters: Any) -> None:
        try:
            _infer(server, "faulty", 3.0, **parameters)
        except InferenceServerException as error:
            errors.append(str(error))

    # Both requests wait in the batcher's queue delay and run as one batch in the process that dies.
    threads = [threading.Thread(target=call), threading.Thread(target=call, kwargs={"crash": True})]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(errors) == 2, errors
    for error in errors:
        assert "the custom backend's model process was killed by signal SIGSEGV" in error
    _mlp_serves(server)  # another model never noticed
    assert _infer(server, "faulty", 5.0).tolist() == [[5.0] * 4]  # a new process, create() again
    with httpclient.InferenceServerClient(server.url) as client:
        assert client.is_model_ready("faulty")


def test_create_error_fails_the_load_with_its_message(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match="create refused on purpose"):
            client.load_model("refuses")
        assert not client.is_model_ready("refuses")
        index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "create refused on purpose" in index["refuses"]["reason"]
    _mlp_serves(server)


@pytest.mark.parametrize(("library", "reason"), [
    (b"not a shared library", "unable to load custom backend library"),
    ("future", "implements ABI version 7; this server implements version 1"),
])
def test_unusable_library_fails_its_load(server: ServerProcess, tmp_path: Path, library: bytes | str,
                                         reason: str) -> None:
    if library == "future":
        library = custom_examples.compile_library(FUTURE_VERSION, tmp_path / "future.so").read_bytes()
    assert isinstance(library, bytes)
    config = json.dumps({"name": "uploaded", "backend": "custom", "max_batch_size": 8,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match=reason):
            client.load_model("uploaded", config=config, files={"file:1/model.so": library})
        assert not client.is_model_ready("uploaded")
    _mlp_serves(server)


def test_missing_library_fails_its_load(server: ServerProcess) -> None:
    config = json.dumps({"name": "nolib", "backend": "custom", "max_batch_size": 8,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    with (httpclient.InferenceServerClient(server.url) as client,
          pytest.raises(InferenceServerException, match=r"unable to find custom backend library '.*model\.so'")):
        client.load_model("nolib", config=config, files={"file:1/weights.bin": b"\0"})
