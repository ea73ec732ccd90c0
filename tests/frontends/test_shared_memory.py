"""The protocol-neutral shared-memory helpers both frontends call (frontends/shared_memory.py)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from naiad.core.shared_memory import DISABLED_ERROR, SharedMemoryRegistry
from naiad.errors import InternalError, InvalidArgument, NaiadError, NotFound, Status, Unavailable, Unsupported
from naiad.frontends import shared_memory as shm
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor

SIZE = 256


@pytest.fixture
def region_file() -> Iterator[Path]:
    """One 256-byte POSIX shared-memory object, unlinked at the end."""
    path = Path("/dev/shm") / f"naiad-test-{uuid.uuid4().hex}"
    path.write_bytes(bytes(SIZE))
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def registry(region_file: Path) -> Iterator[SharedMemoryRegistry]:
    """Region "r" is the whole object, "half" its second half."""
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("r", "/" + region_file.name, 0, SIZE)
    registry.register("half", "/" + region_file.name, SIZE // 2, SIZE // 2)
    yield registry
    registry.close()


def _params(region: str = "r", byte_size: int = SIZE, offset: int | None = None, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {shm.REGION: region, shm.BYTE_SIZE: byte_size, **extra}
    if offset is not None:
        params[shm.OFFSET] = offset
    return params


def _shm_input(datatype: DataType, shape: tuple[int, ...], **params: Any) -> Tensor:
    return Tensor("INPUT0", datatype, shape, np.empty(0, dtype=datatype.numpy), _params(**params))


def _request(inputs: list[Tensor], outputs: list[RequestedOutput] | None = None, request_id: str = "") -> InferRequest:
    return InferRequest("m", None, inputs, outputs, request_id)


def _put(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(data)


def _bytes_wire(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _begun(request: InferRequest, registry: SharedMemoryRegistry) -> InferRequest:
    """`begin` (inputs read, outputs checked), then let go at once."""
    shm.begin(request, registry).release()
    return request


def _written(request: InferRequest, response: InferResponse, registry: SharedMemoryRegistry) -> set[str]:
    held = shm.begin(request, registry)
    try:
        return held.write_outputs(response)
    finally:
        held.release()


def _error(call: Any) -> NaiadError:
    with pytest.raises(NaiadError) as info:
        call()
    return info.value


# ------------------------------------------------------------------------------------ parameters


def test_shm_ref_reads_region_offset_and_size() -> None:
    assert shm.shm_ref("T", {}) is None
    assert shm.shm_ref("T", {"binary_data": True}) is None
    assert shm.shm_ref("T", _params("a", 8)) == shm.ShmRef("a", 0, 8)
    assert shm.shm_ref("T", _params("a", 8, offset=16)) == shm.ShmRef("a", 16, 8)
    # Like Triton, which reads these as size_t: a negative int64 wraps and fails the bounds checks.
    assert shm.shm_ref("T", _params("a", -1, offset=-32)) == shm.ShmRef("a", 2**64 - 32, 2**64 - 1)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({shm.OFFSET: 0}, "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter "
                          "for tensor 'T'"),
        ({shm.BYTE_SIZE: 8}, "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
                             "parameter for tensor 'T'"),
        ({shm.REGION: 3, shm.BYTE_SIZE: 8}, "invalid value type for 'shared_memory_region' parameter for tensor "
                                            "'T', expected string_param."),
        ({shm.REGION: "r"}, "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
                            "parameter for tensor 'T'"),
        ({shm.REGION: "r", shm.BYTE_SIZE: "8"}, "invalid value type for 'shared_memory_byte_size' parameter for "
                                                "tensor 'T', expected int64_param."),
        ({shm.REGION: "r", shm.BYTE_SIZE: True}, "invalid value type for 'shared_memory_byte_size' parameter for "
                                                 "tensor 'T', expected int64_param."),
        ({shm.REGION: "r", shm.BYTE_SIZE: 8, shm.OFFSET: 2**64}, "invalid value type for 'shared_memory_offset' "
                                                                 "parameter for tensor 'T', expected int64_param."),
    ],
)
def test_shm_ref_errors(parameters: dict[str, Any], message: str) -> None:
    error = _error(lambda: shm.shm_ref("T", parameters))
    assert isinstance(error, InvalidArgument) and error.message == message


def test_uses_shared_memory_and_region_names() -> None:
    plain = _request([Tensor("A", DataType.FP32, (1,), np.zeros(1, np.float32))], [RequestedOutput("B")])
    assert not shm.uses_shared_memory(plain)
    assert shm.region_names(plain) == set()
    mixed = _request([_shm_input(DataType.FP32, (1,), region="in")],
                     [RequestedOutput("B", _params("out")), RequestedOutput("C", {shm.REGION: 5})])
    assert shm.uses_shared_memory(mixed)
    assert shm.region_names(mixed) == {"in", "out"}
    assert shm.uses_shared_memory(_request([], [RequestedOutput("B", _params("out"))]))


# ----------------------------------------------------------------------------------------- inputs


@pytest.mark.parametrize(
    "values",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([[True, False, True]]),
        np.array([[-(2**63), 2**63 - 1]], dtype=np.int64),
        np.array([1.5, -2.0], dtype=np.float16),
        np.array([0, 255], dtype=np.uint8),
    ],
)
def test_begin_reads_inputs_fixed_size(registry: SharedMemoryRegistry, region_file: Path, values: np.ndarray) -> None:
    datatype = DataType.from_numpy(values.dtype)
    _put(region_file, 40, values.tobytes())
    request = _request([_shm_input(datatype, values.shape, byte_size=values.nbytes, offset=40)])
    _begun(request, registry)
    np.testing.assert_array_equal(request.inputs[0].data, values)
    assert request.inputs[0].data.dtype == values.dtype


def test_begin_reads_inputs_bf16_and_bytes(registry: SharedMemoryRegistry, region_file: Path) -> None:
    bf16 = np.array([1.0, -2.5], dtype=ml_dtypes.bfloat16)
    words = [b"", b"a\x00b", "h\u00e9llo".encode()]
    _put(region_file, 0, bf16.tobytes())
    _put(region_file, SIZE // 2 + 8, _bytes_wire(words))
    request = _request([
        _shm_input(DataType.BF16, (2,), byte_size=4),
        Tensor("INPUT1", DataType.BYTES, (1, 3), np.empty(0, object),
               _params("half", len(_bytes_wire(words)), offset=8)),
        Tensor("INPUT2", DataType.INT32, (1,), np.array([7], np.int32)),  # not in shared memory
    ])
    _begun(request, registry)
    assert request.inputs[0].data.tolist() == bf16.view(np.uint16).tolist()
    assert request.inputs[1].data.tolist() == [words]
    assert request.inputs[2].data.tolist() == [7]


def test_begin_reads_inputs_size_mismatch_has_the_request_prefix(registry: SharedMemoryRegistry) -> None:
    request = _request([_shm_input(DataType.FP32, (1, 4), byte_size=20)], request_id="abc")
    error = _error(lambda: _begun(request, registry))
    assert isinstance(error, InvalidArgument)
    assert error.message == (
        "[request id: abc] input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 20"
    )


def test_begin_reads_inputs_bad_bytes_elements(registry: SharedMemoryRegistry, region_file: Path) -> None:
    _put(region_file, 0, struct.pack("<I", 100) + b"abc")
    request = _request([_shm_input(DataType.BYTES, (1,), byte_size=7)])
    assert _error(lambda: _begun(request, registry)).message == (
        "[request id: <id_unknown>] incomplete string data for inference input 'INPUT0' for model 'm', "
        "expecting string of length 100 but only 3 bytes available"
    )


@pytest.mark.parametrize(
    ("params", "kind", "message"),
    [
        ({"region": "nope"}, NotFound, "Unable to find shared memory region: 'nope'"),
        ({"byte_size": 16, "offset": SIZE}, InvalidArgument, "Invalid offset for shared memory region: 'r'"),
        ({"byte_size": 16, "offset": SIZE - 8}, InvalidArgument,
         "Invalid offset + byte size for shared memory region: 'r'"),
        ({"region": "half", "byte_size": SIZE}, InvalidArgument,
         "Invalid offset + byte size for shared memory region: 'half'"),
    ],
)
def test_begin_reads_inputs_region_errors(registry: SharedMemoryRegistry, params: dict[str, Any], kind: type,
                                          message: str) -> None:
    request = _request([_shm_input(DataType.FP32, (1, 4), **params)])
    error = _error(lambda: _begun(request, registry))
    assert isinstance(error, kind) and error.message == message


def test_disabled_registry_refuses_requests_in_shared_memory() -> None:
    registry = SharedMemoryRegistry(enabled=False)
    request = _request([_shm_input(DataType.FP32, (1, 4), byte_size=16)], [RequestedOutput("OUT", _params())])
    for each in (request, _request([], request.outputs)):
        error = _error(lambda r=each: _begun(r, registry))
        assert isinstance(error, Unavailable) and error.message == DISABLED_ERROR


# ---------------------------------------------------------------------------------------- outputs


def test_begin_checks_outputs(registry: SharedMemoryRegistry) -> None:
    good = _request([], [RequestedOutput("A", _params(byte_size=16, offset=8)), RequestedOutput("B")])
    _begun(good, registry)
    cases = {
        "Unable to find shared memory region: 'x'": _params("x", 16),
        "Invalid offset for shared memory region: 'half'": _params("half", 16, offset=SIZE // 2),
        "Output can't set both 'shared_memory_region' and 'classification'": _params(classification=2),
    }
    for message, params in cases.items():
        request = _request([], [RequestedOutput("A", params)])
        assert _error(lambda r=request: _begun(r, registry)).message == message


def _response(*tensors: Tensor) -> InferResponse:
    return InferResponse("m", "1", outputs=list(tensors))


def test_write_outputs(registry: SharedMemoryRegistry, region_file: Path) -> None:
    values = np.arange(4, dtype=np.int32)
    words = np.array([b"x", b"yz"], dtype=object)
    request = _request([], [
        RequestedOutput("A", _params(byte_size=16, offset=4)),
        RequestedOutput("B", _params("half", 64)),
        RequestedOutput("C"),
    ])
    response = _response(Tensor("A", DataType.INT32, (4,), values), Tensor("B", DataType.BYTES, (2,), words),
                         Tensor("C", DataType.INT32, (1,), np.array([1], np.int32)))
    assert _written(request, response, registry) == {"A", "B"}
    content = region_file.read_bytes()
    assert content[4:20] == values.tobytes()
    assert content[SIZE // 2:SIZE // 2 + 11] == _bytes_wire([b"x", b"yz"])


def test_write_outputs_without_shared_memory_outputs(registry: SharedMemoryRegistry) -> None:
    response = _response(Tensor("A", DataType.INT32, (1,), np.array([1], np.int32)))
    assert _written(_request([]), response, registry) == set()
    assert _written(_request([], [RequestedOutput("A")]), response, registry) == set()


def test_write_outputs_too_small_region_writes_nothing(registry: SharedMemoryRegistry, region_file: Path) -> None:
    request = _request([], [RequestedOutput("A", _params(byte_size=8)), RequestedOutput("B", _params(byte_size=64,
                                                                                                     offset=64))])
    response = _response(Tensor("B", DataType.INT32, (1,), np.array([5], np.int32)),
                         Tensor("A", DataType.FP32, (16,), np.ones(16, np.float32)))
    error = _error(lambda: _written(request, response, registry))
    assert isinstance(error, InternalError) and error.status is Status.INTERNAL
    assert error.message == (
        "shared memory size specified with the request for output 'A' (8 bytes) should be at least 64 bytes to "
        "hold the results"
    )
    assert region_file.read_bytes() == bytes(SIZE)


def test_write_outputs_after_the_server_closed_the_region(registry: SharedMemoryRegistry) -> None:
    """A held region outlives an unregister, not the server's shutdown: the write is NotFound."""
    held = shm.begin(_request([], [RequestedOutput("A", _params(byte_size=4))]), registry)
    registry.close()
    response = _response(Tensor("A", DataType.INT32, (1,), np.array([5], np.int32)))
    assert isinstance(_error(lambda: held.write_outputs(response)), NotFound)
    held.release()


def test_begin_holds_reads_and_checks_then_lets_go_on_release(registry: SharedMemoryRegistry,
                                                               region_file: Path) -> None:
    """The callback form: `begin` holds the regions and reads the inputs; an unregister meanwhile
    waits for `release`, which the answer and a cancellation may both call."""
    _put(region_file, 0, np.array([4.0], np.float32).tobytes())
    request = _request([_shm_input(DataType.FP32, (1,), byte_size=4)], [RequestedOutput("OUT", _params("half", 4))])
    held = shm.begin(request, registry)
    assert request.inputs[0].data.tolist() == [4.0]
    registry.unregister()
    assert sorted(r.name for r in registry.status()) == ["half", "r"]
    cancelled: list[bool] = []
    cancel = shm.cancelling(lambda: cancelled.append(True), held)
    response = _response(Tensor("OUT", DataType.FP32, (1,), request.inputs[0].data + 1))
    assert held.write_outputs(response) == {"OUT"}
    held.release()  # answered
    cancel()  # and cancelled too: the job is told, the hold is already gone
    assert cancelled == [True]
    assert registry.status() == []
    assert region_file.read_bytes()[SIZE // 2:SIZE // 2 + 4] == np.array([5.0], np.float32).tobytes()


def test_begin_holds_nothing_after_a_bad_request(registry: SharedMemoryRegistry) -> None:
    """An output window past its region fails `begin` with Triton's error, and the regions the
    request named are free to unregister at once."""
    request = _request([_shm_input(DataType.FP32, (1,), byte_size=4)],
                       [RequestedOutput("OUT", _params("half", SIZE))])
    assert "Invalid offset + byte size" in _error(lambda: shm.begin(request, registry)).message
    registry.unregister()
    assert registry.status() == []


# ------------------------------------------------------------------------------------------- CUDA


def test_cuda_status_and_register(registry: SharedMemoryRegistry) -> None:
    assert shm.cuda_status(registry, None) == []
    assert _error(lambda: shm.cuda_status(registry, "c")).message == "Unable to find cuda shared memory region: 'c'"
    assert _error(lambda: shm.cuda_status(registry, "r")).message == (
        "The region named 'r' is registered as system shared memory, not CUDA shared memory"
    )
    error = shm.cuda_register_error("c")
    assert isinstance(error, Unsupported)
    assert error.message == "failed to register CUDA shared memory region: 'c', GPUs not supported"
