"""The custom backend: the ctypes side of naiad_backend.h (library.py, run here in-process on the
example libraries that behave), and the backend's model / instance with real model processes
(crashes, create errors, unusable libraries)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from backends import custom_examples
from backends.conformance import mlp
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Batch
from naiad.backends.blocking import execute_blocking
from naiad.backends.custom import library
from naiad.backends.custom.backend import CustomModel
from naiad.config.model_config import parse_config_text
from naiad.errors import InternalError, InvalidArgument, NaiadError, Unavailable
from naiad.types import DataType, InferRequest, Tensor

FP32_OUT = {"OUTPUT0": library.OutputSpec("FP32", (-1,))}
WITHOUT_EXECUTE = """
#include "naiad_backend.h"
uint32_t naiad_backend_abi_version(void) { return NAIAD_BACKEND_ABI_VERSION; }
int32_t naiad_backend_create(const char *c, const char *d, uint32_t i, void **s, char **e) { return 0; }
void naiad_backend_destroy(void *s) {}
void naiad_backend_free(void *p) { free(p); }
"""
FUTURE_VERSION = """
#include "naiad_backend.h"
uint32_t naiad_backend_abi_version(void) { return 2; }
int32_t naiad_backend_create(const char *c, const char *d, uint32_t i, void **s, char **e) { return 0; }
int32_t naiad_backend_execute(void *s, const naiad_request *r, uint32_t n, naiad_allocate_fn a, void *x,
                              char **re, char **e) { return 0; }
void naiad_backend_destroy(void *s) {}
void naiad_backend_free(void *p) { free(p); }
"""
CRASHES_IN_CREATE = """
#include "naiad_backend.h"
uint32_t naiad_backend_abi_version(void) { return NAIAD_BACKEND_ABI_VERSION; }
int32_t naiad_backend_create(const char *c, const char *d, uint32_t i, void **s, char **e) {
  volatile int *volatile nowhere = NULL;
  *nowhere = 1;
  return 0;
}
int32_t naiad_backend_execute(void *s, const naiad_request *r, uint32_t n, naiad_allocate_fn a, void *x,
                              char **re, char **e) { return 0; }
void naiad_backend_destroy(void *s) {}
void naiad_backend_free(void *p) { free(p); }
"""
# create() refuses, saying what it was given.
ECHOES_CREATE = """
#include <string.h>
#include "naiad_backend.h"
uint32_t naiad_backend_abi_version(void) { return NAIAD_BACKEND_ABI_VERSION; }
int32_t naiad_backend_create(const char *c, const char *d, uint32_t i, void **s, char **e) {
  *e = naiad_backend_message("instance %u in %s, config %s", i, d, strstr(c, "\\"name\\": \\"m\\"") ? "named m" : c);
  return 3;
}
int32_t naiad_backend_execute(void *s, const naiad_request *r, uint32_t n, naiad_allocate_fn a, void *x,
                              char **re, char **e) { return 0; }
void naiad_backend_destroy(void *s) {}
void naiad_backend_free(void *p) { free(p); }
"""
# Allocates OUTPUT0 as the request's parameters JSON says ({"dtype": code, "dims": [..], "twice": 1}).
ALLOCATOR_PROBE = """
#include <string.h>
#include "naiad_backend.h"
uint32_t naiad_backend_abi_version(void) { return NAIAD_BACKEND_ABI_VERSION; }
int32_t naiad_backend_create(const char *c, const char *d, uint32_t i, void **s, char **e) { return 0; }
int32_t naiad_backend_execute(void *s, const naiad_request *r, uint32_t n, naiad_allocate_fn allocate, void *x,
                              char **re, char **e) {
  for (uint32_t k = 0; k < n; k++) {
    const char *p = r[k].parameters;
    const char *name = strstr(p, "\\"other\\"") ? "OTHER" : "OUTPUT0";
    int dtype = strstr(p, "\\"int32\\"") ? NAIAD_TYPE_INT32 : NAIAD_TYPE_FP32;
    int64_t shape[2] = {1, strstr(p, "\\"negative\\"") ? -1 : 3};
    if (strstr(p, "\\"none\\"")) continue;
    float *out = allocate(x, k, name, dtype, 2, shape);
    if (out != NULL) for (int j = 0; j < 3; j++) out[j] = (float)j;
    if (strstr(p, "\\"twice\\"")) allocate(x, k, name, dtype, 2, shape);
  }
  return 0;
}
void naiad_backend_destroy(void *s) {}
void naiad_backend_free(void *p) { free(p); }
"""


def _library(name: str, tmp_path: Path) -> library.Library:
    return library.load(custom_examples.install(name, tmp_path))


# -- library.py, in this process ---------------------------------------------------------------


def test_mlp_matches_numpy_per_request(tmp_path: Path) -> None:
    custom_examples.write_weights(tmp_path)
    instance = _library("mlp", tmp_path).create("{}", tmp_path, 0, {"OUTPUT0": library.OutputSpec("FP32", (mlp.OUT,))},
                                                batched=True)
    x = np.random.default_rng(0).standard_normal((5, mlp.IN)).astype(np.float32)
    first, second = instance.execute([library.Request({"INPUT0": x[:3]}, ["OUTPUT0"]),
                                      library.Request({"INPUT0": x[3:]}, ["OUTPUT0"])])
    assert isinstance(first, dict) and isinstance(second, dict)
    np.testing.assert_allclose(np.concatenate([first["OUTPUT0"], second["OUTPUT0"]]), mlp.reference(x),
                               rtol=1e-5, atol=1e-6)
    instance.close()


def test_mlp_refuses_a_wrong_input_alone(tmp_path: Path) -> None:
    custom_examples.write_weights(tmp_path)
    instance = _library("mlp", tmp_path).create("{}", tmp_path, 0, {"OUTPUT0": library.OutputSpec("FP32", (mlp.OUT,))},
                                                batched=True)
    bad, good = instance.execute([library.Request({"INPUT0": np.ones((1, 3), np.float32)}, ["OUTPUT0"]),
                                  library.Request({"INPUT0": np.ones((1, mlp.IN), np.float32)}, ["OUTPUT0"])])
    assert bad == "input 'INPUT0' must be FP32 [batch, 16]"
    assert isinstance(good, dict) and good["OUTPUT0"].shape == (1, mlp.OUT)


def test_create_error_is_the_library_s_message(tmp_path: Path) -> None:
    with pytest.raises(library.LibraryError, match=r"^unable to open '.*weights.bin'$"):
        _library("mlp", tmp_path).create("{}", tmp_path, 0, {}, batched=True)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 12)
    with pytest.raises(library.LibraryError, match="must start with three positive int32 sizes"):
        _library("mlp", tmp_path).create("{}", tmp_path, 0, {}, batched=True)
    (tmp_path / "weights.bin").write_bytes(np.array([16, 32, 8], "<i4").tobytes() + b"\0" * 12)
    with pytest.raises(library.LibraryError, match="must hold exactly 808 float32 values after its sizes"):
        _library("mlp", tmp_path).create("{}", tmp_path, 0, {}, batched=True)


@pytest.mark.parametrize("datatype", sorted(library.DATATYPES))
def test_identity_passes_every_numeric_datatype_bit_exact(tmp_path: Path, datatype: str) -> None:
    dtype = library.DATATYPES[datatype][1]
    data = np.arange(12).reshape(2, 6).astype(dtype) if datatype != "BOOL" else np.arange(12).reshape(2, 6) % 3 == 0
    instance = _library("identity", tmp_path).create("{}", tmp_path, 0,
                                                     {"OUTPUT0": library.OutputSpec(datatype, (-1,))}, batched=True)
    (result,) = instance.execute([library.Request({"INPUT0": data}, ["OUTPUT0"])])
    assert isinstance(result, dict)
    assert result["OUTPUT0"].dtype == data.dtype and result["OUTPUT0"].tobytes() == data.tobytes()


def test_zero_element_tensors_pass(tmp_path: Path) -> None:
    instance = _library("identity", tmp_path).create("{}", tmp_path, 0, FP32_OUT, batched=True)
    (result,) = instance.execute([library.Request({"INPUT0": np.zeros((1, 0), np.float32)}, ["OUTPUT0"])])
    assert isinstance(result, dict) and result["OUTPUT0"].shape == (1, 0)


def test_request_error_and_batch_error(tmp_path: Path) -> None:
    instance = _library("faulty", tmp_path).create("{}", tmp_path, 0, FP32_OUT, batched=True)
    x = np.ones((1, 2), np.float32)
    failed, served = instance.execute([library.Request({"INPUT0": x}, ["OUTPUT0"], parameters='{"fail": true}'),
                                       library.Request({"INPUT0": x}, ["OUTPUT0"])])
    assert failed == "request failed on purpose"
    assert isinstance(served, dict)
    with pytest.raises(RuntimeError, match=r"^batch failed on purpose$"):
        instance.execute([library.Request({"INPUT0": x}, ["OUTPUT0"], parameters='{"fail_batch": 1}')])


@pytest.mark.parametrize(("parameters", "refusal"), [
    ({"other": 1}, "the model has no output 'OTHER'"),
    ({"int32": 1}, "output 'OUTPUT0' is FP32, not INT32"),
    ({"negative": 1}, r"output 'OUTPUT0' has shape \[1, -1\]; the config allows \[-1, 3\]"),
    ({"twice": 1}, "output 'OUTPUT0' was allocated twice"),
    ({"none": 1}, "custom backend produced no output 'OUTPUT0'"),
])
def test_the_allocator_refuses_what_the_config_does_not_allow(tmp_path: Path, parameters: dict[str, Any],
                                                              refusal: str) -> None:
    probe = library.load(custom_examples.compile_library(ALLOCATOR_PROBE, tmp_path / "probe.so"))
    instance = probe.create("{}", tmp_path, 0, {"OUTPUT0": library.OutputSpec("FP32", (3,))}, batched=True)
    x = np.ones((1, 1), np.float32)
    refused, fine = instance.execute([library.Request({"INPUT0": x}, ["OUTPUT0"], parameters=json.dumps(parameters)),
                                      library.Request({"INPUT0": x}, ["OUTPUT0"])])
    assert isinstance(refused, str) and re.search(refusal, refused), refused
    assert isinstance(fine, dict) and fine["OUTPUT0"].tolist() == [[0, 1, 2]]


def test_unusable_libraries_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(library.LibraryError, match="unable to find custom backend library"):
        library.load(tmp_path / "absent.so")
    (tmp_path / "garbage.so").write_bytes(b"this is not a shared library")
    with pytest.raises(library.LibraryError, match=r"unable to load custom backend library .*garbage\.so"):
        library.load(tmp_path / "garbage.so")
    partial = custom_examples.compile_library(WITHOUT_EXECUTE, tmp_path / "partial.so")
    with pytest.raises(library.LibraryError, match=r"does not export naiad_backend_execute \(see naiad_backend.h\)"):
        library.load(partial)
    future = custom_examples.compile_library(FUTURE_VERSION, tmp_path / "future.so")
    with pytest.raises(library.LibraryError, match="implements ABI version 2; this server implements version 1"):
        library.load(future)


def test_the_header_and_library_agree_on_the_version() -> None:
    assert f"#define NAIAD_BACKEND_ABI_VERSION {library.ABI_VERSION}u" in library.HEADER.read_text()


# -- the backend: model processes ----------------------------------------------------------------


def _config(name: str, body: str = "") -> mc.ModelConfig:
    return parse_config_text(f'name: "{name}"\nbackend: "custom"\nmax_batch_size: 8\n'
                             'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                             f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]\n{body}', name)


def _model(tmp_path: Path, example: str | Callable[[Path], object] | None, body: str = "",
           name: str = "m") -> CustomModel:
    """A model of `example` (an example's name, or a function writing the version's model.so)."""
    version = tmp_path / name / "1"
    version.mkdir(parents=True)
    if isinstance(example, str):
        custom_examples.install(example, version)
    elif example is not None:
        example(version / "model.so")
    return CustomModel(_config(name, body), version, 1)


def _group(name: str = "m") -> mc.ModelInstanceGroup:
    return mc.ModelInstanceGroup(name=name, kind=mc.ModelInstanceGroup.KIND_CPU, count=1)


def _request(value: float, **parameters: Any) -> InferRequest:
    data = np.full((1, 2), value, np.float32)
    return InferRequest("m", None, [Tensor("INPUT0", DataType.FP32, data.shape, data)], parameters=parameters)


def test_a_segfault_fails_its_batch_and_a_new_process_serves_the_next(tmp_path: Path) -> None:
    instance = _model(tmp_path, "faulty").create_instance(_group(), 0)
    try:
        (ok,) = execute_blocking(instance, Batch([_request(1.0)], batched=True))
        assert isinstance(ok, dict) and ok["OUTPUT0"].tolist() == [[1.0, 1.0]]
        results = execute_blocking(instance, Batch([_request(2.0), _request(3.0, crash=True)], batched=True))
        for result in results:  # both requests of the batch were in the process that died
            assert isinstance(result, InternalError)
            assert "model instance 'm_0'" in str(result)
            assert "the custom backend's model process was killed by signal SIGSEGV" in str(result)
        (after,) = execute_blocking(instance, Batch([_request(4.0)], batched=True))  # waits for the new process
        assert isinstance(after, dict) and after["OUTPUT0"].tolist() == [[4.0, 4.0]]
    finally:
        instance.close()


def test_per_request_and_batch_errors_through_the_process(tmp_path: Path) -> None:
    instance = _model(tmp_path, "faulty").create_instance(_group(), 0)
    try:
        failed, served = execute_blocking(instance, Batch([_request(1.0, fail=True), _request(2.0)], batched=True))
        assert isinstance(failed, NaiadError) and str(failed) == "request failed on purpose"
        assert isinstance(served, dict)
        both = execute_blocking(instance, Batch([_request(1.0), _request(2.0, fail_batch=True)], batched=True))
        assert all(isinstance(r, NaiadError) and "batch failed on purpose" in str(r) for r in both)
    finally:
        instance.close()


def test_create_error_fails_the_load_with_the_library_s_message(tmp_path: Path) -> None:
    model = _model(tmp_path, "faulty", 'parameters { key: "fail_create" value { string_value: "yes" } }\n')
    with pytest.raises(InternalError, match="custom backend library of model 'm': create refused on purpose"):
        model.create_instance(_group(), 0)


def test_create_gets_the_config_the_version_dir_and_an_index_per_instance(tmp_path: Path) -> None:
    model = _model(tmp_path, lambda path: custom_examples.compile_library(ECHOES_CREATE, path))
    for index, group in ((0, _group("a")), (1, _group("a")), (2, _group("b"))):
        with pytest.raises(InternalError, match=f"instance {index} in {model.version_dir}, config named m$"):
            model.create_instance(group, index % 2)


def test_an_abi_version_mismatch_fails_the_load(tmp_path: Path) -> None:
    model = _model(tmp_path, lambda path: custom_examples.compile_library(FUTURE_VERSION, path))
    with pytest.raises(InternalError, match="implements ABI version 2; this server implements version 1"):
        model.create_instance(_group(), 0)


def test_a_crash_in_create_fails_the_load(tmp_path: Path) -> None:
    model = _model(tmp_path, lambda path: custom_examples.compile_library(CRASHES_IN_CREATE, path))
    with pytest.raises(Unavailable, match=r"the model process of 'm_0' exited during start-up \(exit code -11\)"):
        model.create_instance(_group(), 0)


def test_an_invalid_library_fails_the_load(tmp_path: Path) -> None:
    model = _model(tmp_path, lambda path: path.write_bytes(b"not ELF"))
    with pytest.raises(InternalError, match=r"unable to load custom backend library '.*model\.so'"):
        model.create_instance(_group(), 0)


def test_load_errors_found_before_any_process(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"unable to find custom backend library '.*/1/model.so'"):
        _model(tmp_path, None, name="absent")
    with pytest.raises(InvalidArgument, match="does not support decoupled models"):
        _model(tmp_path, "identity", "model_transaction_policy { decoupled: true }\n", name="decoupled")
    version = tmp_path / "text" / "1"
    version.mkdir(parents=True)
    custom_examples.install("identity", version)
    config = parse_config_text('name: "text"\nbackend: "custom"\n'
                               'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
                               'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n', "text")
    with pytest.raises(InvalidArgument, match="input 'INPUT0' is BYTES, which the custom backend's C ABI"):
        CustomModel(config, version, 1)


def test_default_model_filename_names_another_library(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    custom_examples.install("identity", version, "libidentity.so")
    model = CustomModel(_config("m", 'default_model_filename: "libidentity.so"\n'), version, 1)
    instance = model.create_instance(_group(), 0)
    try:
        (result,) = execute_blocking(instance, Batch([_request(5.0)], batched=True))
        assert isinstance(result, dict) and result["OUTPUT0"].tolist() == [[5.0, 5.0]]
    finally:
        instance.close()
