"""Tensors in system shared memory, for every frontend (HTTP and gRPC alike).

A tensor lives in shared memory when its parameters carry `shared_memory_region` (a registered
region's name), `shared_memory_byte_size` and optionally `shared_memory_offset` (default 0).
A frontend serving one request does:

    if uses_shared_memory(request):                  # cheap; first
        held = begin(request, registry)              # regions held, inputs read, outputs checked
        ...  queue the request; when its response comes without error:
        written = held.write_outputs(response)       # encode the outputs in `written` without data
        held.release()                               # also (or instead) if the request is cancelled

so a region stays open, even if its client unregisters it, until the outputs are written.

Every function raises NaiadError subclasses carrying Triton's texts; the frontend maps them.
Integer parameters may be Python ints of either sign: like Triton, which reads them as size_t,
a negative int64 wraps to a huge unsigned value and fails the bounds checks with Triton's text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from naiad.core.shared_memory import Hold, SharedMemoryRegistry
from naiad.errors import InternalError, InvalidArgument, NotFound, Unsupported
from naiad.frontends.tensors import tensor_from_raw, tensor_to_raw
from naiad.types import InferRequest, InferResponse

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
_INT_RANGE = range(-(2**63), 2**64)
_UINT64 = 2**64


class ShmRef(NamedTuple):
    """Where one tensor lives: `byte_size` bytes at `offset` inside region `region` (a tuple:
    made for every tensor of every such request, and a frozen dataclass costs twice as much)."""

    region: str
    offset: int
    byte_size: int


def shm_ref(tensor_name: str, parameters: Mapping[str, Any]) -> ShmRef | None:
    """The tensor's shared-memory reference, or None when its parameters name no region.

    InvalidArgument (Triton's gRPC texts) for an offset or size without a region, a region
    without a size, or values of the wrong type.
    """
    if REGION not in parameters:
        for key in (OFFSET, BYTE_SIZE):
            if key in parameters:
                raise InvalidArgument(
                    f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{tensor_name}'"
                )
        return None
    region = parameters[REGION]
    if not isinstance(region, str):
        raise InvalidArgument(
            f"invalid value type for 'shared_memory_region' parameter for tensor '{tensor_name}', "
            "expected string_param."
        )
    if BYTE_SIZE not in parameters:
        raise InvalidArgument(
            f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor "
            f"'{tensor_name}'"
        )
    offset = _unsigned(parameters.get(OFFSET, 0), OFFSET, tensor_name)
    return ShmRef(region, offset, _unsigned(parameters[BYTE_SIZE], BYTE_SIZE, tensor_name))


def _unsigned(value: Any, key: str, tensor_name: str) -> int:
    if type(value) is not int or value not in _INT_RANGE:
        raise InvalidArgument(
            f"invalid value type for '{key}' parameter for tensor '{tensor_name}', expected int64_param."
        )
    return value % _UINT64  # Triton's size_t view of an int64


def uses_shared_memory(request: InferRequest) -> bool:
    """Whether any input or requested output names a shared-memory region (cheap; call first)."""
    # Loops, not any(): no generator per request on the hot path.
    for tensor in request.inputs:
        if tensor.parameters and REGION in tensor.parameters:
            return True
    for output in request.outputs or ():  # noqa: SIM110 - see above
        if output.parameters and REGION in output.parameters:
            return True
    return False


def region_names(request: InferRequest) -> set[str]:
    """The regions a request reads or writes, which `begin` holds."""
    names = set()
    for tensor in request.inputs:
        if isinstance(name := tensor.parameters.get(REGION), str):
            names.add(name)
    for output in request.outputs or ():
        if isinstance(name := output.parameters.get(REGION), str):
            names.add(name)
    return names


def begin(request: InferRequest, registry: SharedMemoryRegistry) -> InSharedMemory:
    """Hold the request's regions, read its inputs from them (each a copy, checked against the
    input's datatype and shape; BYTES: 4-byte length + bytes each) and check, before inference,
    that every output asked for in shared memory names a held region and a window inside it, so a
    bad request fails before it runs (as in Triton).

    Errors, in Triton's order and words: per input, its parameters, then the region (NotFound,
    InvalidArgument for offsets and sizes, shared memory disabled), then the byte size prefixed
    with the request id; then per output the same. Nothing stays held after an error; else the
    caller releases the result once the outputs are written, or once the request is cancelled.
    """
    hold = registry.acquire(region_names(request))
    try:
        for tensor in request.inputs:
            ref = shm_ref(tensor.name, tensor.parameters)
            if ref is None:
                continue
            raw = hold.read(ref.region, ref.offset, ref.byte_size)
            try:
                tensor.data = tensor_from_raw(tensor.name, tensor.datatype, tensor.shape, raw, request.model_name)
            except InvalidArgument as error:
                raise InvalidArgument(_request_prefix(request) + error.message) from None
        outputs: dict[str, ShmRef] = {}
        for output in request.outputs or ():
            ref = shm_ref(output.name, output.parameters)
            if ref is None:
                continue
            if "classification" in output.parameters:
                raise InvalidArgument("Output can't set both 'shared_memory_region' and 'classification'")
            hold.check(ref.region, ref.offset, ref.byte_size)
            outputs[output.name] = ref
    except BaseException:
        hold.release()
        raise
    return InSharedMemory(hold, outputs)


class InSharedMemory:
    """A request `begin` accepted: its regions held until `release` (which may be called more
    than once: a request both answered and cancelled lets go once), its shared-memory outputs
    remembered for `write_outputs`."""

    __slots__ = ("_hold", "_outputs")

    def __init__(self, hold: Hold, outputs: dict[str, ShmRef]) -> None:
        self._hold = hold
        self._outputs = outputs

    def write_outputs(self, response: InferResponse) -> set[str]:
        """Write every output the request asked for in shared memory into its region; return the
        names written (encode those without data). Call only for a response without error, before
        `release`.

        InternalError (HTTP 500, as Triton) when a region is smaller than its output; nothing is
        written then. NotFound once the server closed the region (it is shutting down).
        """
        refs = self._outputs
        if not refs:
            return set()
        payloads = {t.name: tensor_to_raw(t.data, t.datatype) for t in response.outputs if t.name in refs}
        for name, raw in payloads.items():
            _check_fits(name, refs[name], memoryview(raw).nbytes)
        for name, raw in payloads.items():
            self._hold.write(refs[name].region, refs[name].offset, raw)
        return set(payloads)

    def release(self) -> None:
        self._hold.release()


def cancelling(cancel: Callable[[], None], held: InSharedMemory) -> Callable[[], None]:
    """What cancels a request begun with `begin`: `cancel` (its job's), then the hold."""

    def cancelled() -> None:
        cancel()
        held.release()

    return cancelled


def _check_fits(name: str, ref: ShmRef, size: int) -> None:
    if size > ref.byte_size:
        raise InternalError(
            f"shared memory size specified with the request for output '{name}' ({ref.byte_size} bytes) should be "
            f"at least {size} bytes to hold the results"
        )


def _request_prefix(request: InferRequest) -> str:
    # The core reports byte-size mismatches; Triton prefixes its messages with the request id.
    return f"[request id: {request.id or '<id_unknown>'}] "


# ---------------------------------------------------------------------------------- CUDA memory


def cuda_status(registry: SharedMemoryRegistry, name: str | None) -> list[dict[str, Any]]:
    """CUDA shared-memory status on a server without GPUs: nothing is registered (Triton's texts
    for a named region, which may be a system region)."""
    if name is None:
        return []
    if any(region.name == name for region in registry.status()):
        raise NotFound(f"The region named '{name}' is registered as system shared memory, not CUDA shared memory")
    raise NotFound(f"Unable to find cuda shared memory region: '{name}'")


def cuda_register_error(name: str) -> Unsupported:
    """The error for registering CUDA shared memory: naiad has no GPU support (Triton's CPU-only
    build text, with UNSUPPORTED: HTTP 501, gRPC UNIMPLEMENTED)."""
    return Unsupported(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")
