"""System shared memory regions that clients register (Triton's system shared-memory extension).

A region is a window `[offset, offset + byte_size)` of a POSIX shared-memory object (the `key`,
e.g. "/input0", which lives at /dev/shm/input0 on Linux), opened read-write. Frontends read
input tensors from regions and write output tensors into them; error texts are Triton's
(shared_memory_manager.cc) so clients that match on them keep working.

Safety rules, because the client owns the object and may truncate it at any moment: the server
never maps it. A mapped page past the end of a truncated object raises SIGBUS when touched, which
would kill the whole server, and a size check before each copy leaves a window in which the
client can still truncate; `pread` and `pwrite` on the object's file cannot fault. A read that
comes up short (the object shrank under the window) is refused; a write inside the registered
window may grow a shrunk object back to it, and a full /dev/shm is an error, not a fault. Reads
return copies, every access is bounds-checked against the registered window, and every access
goes through a `Hold` (`acquire`): a request's regions, which an unregister only closes once the
last request holding them lets go (the server's shutdown closes them at once, and a later access
is then NotFound).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from naiad.errors import AlreadyExists, InternalError, InvalidArgument, NotFound, Unavailable

UINT64_MAX = 2**64 - 1
SHM_DIR = "/dev/shm"
# Keys Triton keeps for its Python backend's own regions (kTritonSharedMemoryRegionPrefix).
RESERVED_PREFIX = "triton_python_backend_shm_region_"
DISABLED_ERROR = (
    "Client shared memory is disabled: start the server with --allow-client-shm=true to register "
    "or use system shared memory regions"
)


@dataclass(frozen=True, slots=True)
class Region:
    """A registered region as status reports it."""

    name: str
    key: str
    offset: int
    byte_size: int


class _OpenRegion:
    """One registered region: its object's open file and who holds it."""

    __slots__ = ("closed", "doomed", "fd", "lock", "region", "users")

    def __init__(self, region: Region, fd: int) -> None:
        self.region = region
        self.fd = fd
        self.users = 0
        self.doomed = False
        self.closed = False
        self.lock = threading.Lock()

    def read(self, offset: int, byte_size: int) -> bytes:
        with self.lock:
            self._check_open()
            if byte_size == 0:
                return b""
            data = _pread_all(self.fd, byte_size, self.region.offset + offset)
        if len(data) < byte_size:
            raise InvalidArgument(f"Invalid shared memory region: '{self.region.key}'")  # it shrank
        return data

    def write(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        with self.lock:
            self._check_open()
            if view.nbytes:
                _pwrite_all(self.fd, view, self.region.offset + offset, self.region.key)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            os.close(self.fd)

    def _check_open(self) -> None:
        if self.closed:
            raise NotFound(f"Unable to find shared memory region: '{self.region.name}'")


class SharedMemoryRegistry:
    """The system shared-memory regions clients registered, by name; safe to use from any thread.

    With `enabled` False (the default of --allow-client-shm), registering, unregistering and
    reading or writing regions fail with DISABLED_ERROR; status lists nothing.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._regions: dict[str, _OpenRegion] = {}

    # -- registration ------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `byte_size` bytes at `offset` of the shared-memory object `key` as region `name`.

        Errors (Triton's): AlreadyExists for a name in use, InternalError (HTTP 500) when the
        key cannot be opened, InvalidArgument when the window is negative or past the object's end.
        """
        self.require_enabled()
        _check_key(name, key)
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region '{name}' already in manager")
            self._regions[name] = _open_region(Region(name, key, offset, byte_size))

    def unregister(self, name: str | None = None) -> None:
        """Forget region `name` (None: every region). An unknown name is not an error, as in
        Triton. A region that in-flight requests hold stays usable and listed until they finish."""
        self.require_enabled()
        with self._lock:
            names = list(self._regions) if name is None else [name]
            for each in names:
                mapping = self._regions.get(each)
                if mapping is None:
                    continue
                mapping.doomed = True
                if mapping.users == 0:
                    del self._regions[each]
                    mapping.close()

    def status(self, name: str | None = None) -> list[Region]:
        """Every region (None) or the one named; NotFound for an unknown name."""
        with self._lock:
            if name is None:
                return [m.region for m in self._regions.values()]
            mapping = self._regions.get(name)
        if mapping is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [mapping.region]

    def close(self) -> None:
        """Close every region, held or not (server shutdown); later accesses fail cleanly."""
        with self._lock:
            mappings = list(self._regions.values())
            self._regions.clear()
        for mapping in mappings:
            mapping.close()

    # -- holds (every read and write of a region goes through one) ----------------------------

    def acquire(self, names: Iterable[str]) -> Hold:
        """Keep the named regions (those registered) open until the returned hold's `release`,
        even if a client unregisters them meanwhile (the unregister takes effect then); the hold
        reads and writes them."""
        return Hold(self, self._acquire(names))

    # -- internals ---------------------------------------------------------------------------

    def require_enabled(self) -> None:
        """Raise DISABLED_ERROR (UNAVAILABLE) unless clients may use shared memory."""
        if not self.enabled:
            raise Unavailable(DISABLED_ERROR)

    def _acquire(self, names: Iterable[str]) -> dict[str, _OpenRegion]:
        if not self.enabled:
            return {}
        with self._lock:
            held = {name: self._regions[name] for name in names if name in self._regions}
            for mapping in held.values():
                mapping.users += 1
        return held

    def _release(self, held: Iterable[_OpenRegion]) -> None:
        with self._lock:
            for mapping in held:
                mapping.users -= 1
                if mapping.doomed and mapping.users == 0 and self._regions.get(mapping.region.name) is mapping:
                    del self._regions[mapping.region.name]
                    mapping.close()


class Hold:
    """Regions one request keeps open (SharedMemoryRegistry.acquire) until `release`, which
    may be called more than once: a request that is answered and cancelled lets go once.

    `read` (a copy), `write` and `check` (the window only) work on the regions held: those
    registered when the hold was taken; any other name is NotFound, as an unknown region is.
    They take no registry lock, since what they use cannot be unregistered under them."""

    __slots__ = ("_held", "_registry")

    def __init__(self, registry: SharedMemoryRegistry, held: dict[str, _OpenRegion]) -> None:
        self._registry = registry
        self._held: dict[str, _OpenRegion] | None = held

    def read(self, name: str, offset: int, byte_size: int) -> bytes:
        return self._window(name, offset, byte_size).read(offset, byte_size)

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        self._window(name, offset, memoryview(data).nbytes).write(offset, data)

    def check(self, name: str, offset: int, byte_size: int) -> None:
        self._window(name, offset, byte_size)

    def release(self) -> None:
        held, self._held = self._held, None
        if held:
            self._registry._release(held.values())

    def _window(self, name: str, offset: int, byte_size: int) -> _OpenRegion:
        self._registry.require_enabled()
        mapping = None if self._held is None else self._held.get(name)
        if mapping is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        _check_window(mapping.region, offset, byte_size)
        return mapping


def _check_key(name: str, key: str) -> None:
    if key.lstrip("/").startswith(RESERVED_PREFIX):
        raise InvalidArgument(
            f"cannot register shared memory region '{name}' with key '{key}' as the key contains the "
            f"reserved prefix '{RESERVED_PREFIX}'"
        )


def _check_window(region: Region, offset: int, byte_size: int) -> None:
    """Triton's GetMemoryInfo checks, in its order and words."""
    if offset < 0 or offset >= region.byte_size:
        raise InvalidArgument(f"Invalid offset for shared memory region: '{region.name}'")
    if byte_size < 0 or byte_size > UINT64_MAX - offset:
        raise InvalidArgument(
            f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value "
            f"({UINT64_MAX}) for region '{region.name}'"
        )
    if offset + byte_size > region.byte_size:
        raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{region.name}'")


def _open_region(region: Region) -> _OpenRegion:
    """Open the region's object and check its window; the caller owns the result."""
    fd = _open(region.key)
    if region.offset < 0 or region.byte_size < 0 or region.offset + region.byte_size > _object_size(fd):
        os.close(fd)
        raise InvalidArgument(f"failed to register shared memory region '{region.name}': invalid args")
    return _OpenRegion(region, fd)


def _pread_all(fd: int, size: int, position: int) -> bytes:
    """`size` bytes at `position`, fewer only where the object ends first (a loop for tensors of
    gigabytes: Linux moves at most ~2 GiB a call)."""
    parts: list[bytes] = []
    done = 0
    while done < size and (part := os.pread(fd, size - done, position + done)):
        parts.append(part)
        done += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _pwrite_all(fd: int, view: memoryview, position: int, key: str) -> None:
    """All of `view` at `position`; a full /dev/shm (or any other failure) is an InternalError
    (HTTP 500), not a fault."""
    try:
        while view.nbytes:
            written = os.pwrite(fd, view, position)
            view, position = view[written:], position + written
    except OSError as error:
        raise InternalError(f"failed to write to shared memory region '{key}': {error.strerror}") from None


def _open(key: str) -> int:
    """shm_open(key, O_RDWR) through /dev/shm, refusing names shm_open would (no path tricks)."""
    name = key[1:] if key.startswith("/") else key
    error = InternalError(f"Unable to open shared memory region: '{key}'")
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise error
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise error from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error
    return fd


def _object_size(fd: int) -> int:
    return os.fstat(fd).st_size
