"""SharedMemoryRegistry: registration, bounds, thread safety and closing, with Triton's texts."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from naiad.core.shared_memory import (
    DISABLED_ERROR,
    RESERVED_PREFIX,
    Region,
    SharedMemoryRegistry,
)
from naiad.errors import AlreadyExists, InternalError, InvalidArgument, NaiadError, NotFound, Status, Unavailable

MakeObject = Callable[..., str]


@pytest.fixture
def make_object() -> Iterator[MakeObject]:
    """`make_object(size, data=b"")` creates a POSIX shared-memory object and returns its key;
    every object is unlinked at the end."""
    paths: list[Path] = []

    def make(size: int, data: bytes = b"") -> str:
        name = f"naiad-test-{uuid.uuid4().hex}"
        path = Path("/dev/shm") / name
        with path.open("wb") as file:
            file.truncate(size)
            file.write(data)
        paths.append(path)
        return "/" + name

    yield make
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    registry = SharedMemoryRegistry(enabled=True)
    yield registry
    registry.close()


def _path(key: str) -> Path:
    return Path("/dev/shm") / key.lstrip("/")


def _read(registry: SharedMemoryRegistry, name: str, offset: int, byte_size: int) -> bytes:
    """One access as a request makes it: through a hold of the region, let go after."""
    held = registry.acquire({name})
    try:
        return held.read(name, offset, byte_size)
    finally:
        held.release()


def _write(registry: SharedMemoryRegistry, name: str, offset: int, data: bytes | memoryview) -> None:
    held = registry.acquire({name})
    try:
        held.write(name, offset, data)
    finally:
        held.release()


def _error(call: Callable[[], object]) -> NaiadError:
    with pytest.raises(NaiadError) as info:
        call()
    return info.value


# ------------------------------------------------------------------------------ registration


def test_register_status_read_write_round_trip(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(64, bytes(range(64)))
    registry.register("in", key, 0, 64)
    registry.register("tail", key, 48, 16)
    assert registry.status() == [Region("in", key, 0, 64), Region("tail", key, 48, 16)]
    assert registry.status("tail") == [Region("tail", key, 48, 16)]
    assert _read(registry, "in", 4, 4) == bytes([4, 5, 6, 7])
    assert _read(registry, "tail", 0, 16) == bytes(range(48, 64))
    _write(registry, "tail", 2, np.array([258], dtype=np.uint16).data)
    assert _path(key).read_bytes()[50:52] == b"\x02\x01"


def test_read_returns_a_copy(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(8, b"abcdefgh")
    registry.register("r", key, 0, 8)
    data = _read(registry, "r", 0, 8)
    _write(registry, "r", 0, b"zzzzzzzz")
    registry.unregister("r")
    assert data == b"abcdefgh"


def test_offset_need_not_be_page_aligned(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    size = mmap.ALLOCATIONGRANULARITY * 2
    payload = os.urandom(size)
    key = make_object(size, payload)
    offset = mmap.ALLOCATIONGRANULARITY + 3
    registry.register("r", key, offset, 100)
    assert _read(registry, "r", 5, 10) == payload[offset + 5:offset + 15]


def test_a_zero_sized_region_registers_but_holds_nothing(registry: SharedMemoryRegistry,
                                                          make_object: MakeObject) -> None:
    key = make_object(8)
    registry.register("empty", key, 8, 0)
    assert registry.status("empty") == [Region("empty", key, 8, 0)]
    assert _error(lambda: _read(registry, "empty", 0, 0)).message == "Invalid offset for shared memory region: 'empty'"


def test_duplicate_name(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(8)
    registry.register("r", key, 0, 8)
    error = _error(lambda: registry.register("r", key, 0, 8))
    assert isinstance(error, AlreadyExists)
    assert error.message == "shared memory region 'r' already in manager"


@pytest.mark.parametrize(
    "key", ["/naiad-test-does-not-exist", "", "/", "/../etc/passwd", "/a/b", "..", "/.", "/x\0y"]
)
def test_a_key_that_cannot_be_opened_is_internal(registry: SharedMemoryRegistry, key: str) -> None:
    error = _error(lambda: registry.register("r", key, 0, 1))
    assert isinstance(error, InternalError)  # Triton: 500 (SPEC §0)
    assert error.message == f"Unable to open shared memory region: '{key}'"
    assert registry.status() == []


def test_symlinks_and_directories_are_refused(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    target = make_object(8)
    link = Path("/dev/shm") / f"naiad-test-link-{uuid.uuid4().hex}"
    folder = Path("/dev/shm") / f"naiad-test-dir-{uuid.uuid4().hex}"
    link.symlink_to(_path(target))
    folder.mkdir()
    try:
        for path in (link, folder):
            error = _error(lambda p=path: registry.register("r", "/" + p.name, 0, 1))
            assert error.message == f"Unable to open shared memory region: '/{path.name}'"
    finally:
        link.unlink()
        folder.rmdir()


@pytest.mark.parametrize(("offset", "byte_size"), [(0, 65), (1, 64), (64, 1), (65, 0), (-1, 8), (0, -1)])
def test_register_out_of_bounds(registry: SharedMemoryRegistry, make_object: MakeObject, offset: int,
                                byte_size: int) -> None:
    key = make_object(64)
    error = _error(lambda: registry.register("big", key, offset, byte_size))
    assert isinstance(error, InvalidArgument)
    assert error.message == "failed to register shared memory region 'big': invalid args"
    assert registry.status() == []


def test_reserved_key_prefix(registry: SharedMemoryRegistry) -> None:
    key = f"{RESERVED_PREFIX}_mine"
    error = _error(lambda: registry.register("mine", key, 0, 8))
    assert error.message == (
        f"cannot register shared memory region 'mine' with key '{key}' as the key contains the reserved prefix "
        f"'{RESERVED_PREFIX}'"
    )


def test_disabled_registry_refuses_everything_but_status(make_object: MakeObject) -> None:
    registry = SharedMemoryRegistry(enabled=False)
    key = make_object(8)
    for call in (lambda: registry.register("r", key, 0, 8), lambda: registry.unregister(None),
                 lambda: registry.unregister("r"), lambda: _read(registry, "r", 0, 1),
                 lambda: _write(registry, "r", 0, b"x"), registry.require_enabled):
        error = _error(call)
        assert isinstance(error, Unavailable) and error.message == DISABLED_ERROR
    assert registry.status() == []
    registry.acquire({"r"}).release()  # holds nothing, refuses nothing


# ----------------------------------------------------------------------- status / unregister


def test_status_and_unregister_of_unknown_names(registry: SharedMemoryRegistry) -> None:
    error = _error(lambda: registry.status("nope"))
    assert isinstance(error, NotFound)
    assert error.message == "Unable to find system shared memory region: 'nope'"
    registry.unregister("nope")  # not an error, as in Triton


def test_unregister_one_and_all(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(16)
    for name in ("a", "b", "c"):
        registry.register(name, key, 0, 16)
    registry.unregister("b")
    assert [r.name for r in registry.status()] == ["a", "c"]
    registry.unregister()
    assert registry.status() == []
    registry.register("b", key, 0, 16)  # the name is free again


def test_unregister_of_a_held_region_waits_for_the_holder(registry: SharedMemoryRegistry,
                                                          make_object: MakeObject) -> None:
    key = make_object(16, b"0123456789abcdef")
    registry.register("r", key, 0, 16)
    registry.register("other", key, 0, 16)
    held = registry.acquire({"r", "unknown"})
    registry.unregister()
    # Still listed and usable by the request that holds it (Triton's newer behaviour).
    assert [r.name for r in registry.status()] == ["r"]
    assert held.read("r", 0, 4) == b"0123"
    held.write("r", 0, b"WXYZ")
    assert isinstance(_error(lambda: registry.register("r", key, 0, 16)), AlreadyExists)
    held.release()
    assert registry.status() == []
    assert _error(lambda: _read(registry, "r", 0, 4)).message == "Unable to find shared memory region: 'r'"
    assert _path(key).read_bytes()[:4] == b"WXYZ"


def test_nested_holds_release_on_the_last(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(8)
    registry.register("r", key, 0, 8)
    outer = registry.acquire({"r"})
    inner = registry.acquire({"r"})
    registry.unregister("r")
    inner.release()
    assert outer.read("r", 0, 1) == b"\0"
    outer.release()
    assert registry.status() == []


def test_an_acquired_hold_lets_go_once_however_often_released(registry: SharedMemoryRegistry,
                                                               make_object: MakeObject) -> None:
    """A request answered from a callback holds its regions until `release`; a request both
    answered and cancelled releases twice, and the second must not free another holder's count."""
    key = make_object(8)
    registry.register("r", key, 0, 8)
    first, second = registry.acquire({"r"}), registry.acquire({"r"})
    registry.unregister("r")
    first.release()
    first.release()  # the second call does nothing: `second` still holds "r"
    assert [r.name for r in registry.status()] == ["r"]
    assert _read(registry, "r", 0, 1) == b"\0"
    second.release()
    assert registry.status() == []


def test_a_hold_reads_and_writes_the_regions_it_holds(registry: SharedMemoryRegistry,
                                                     make_object: MakeObject) -> None:
    """A request's accesses go through its hold: to the regions registered when it was taken,
    even once unregistered, and to no other (Triton's text for an unknown region)."""
    key = make_object(8, b"abcdefgh")
    registry.register("r", key, 0, 8)
    held = registry.acquire({"r", "not-registered"})
    registry.register("later", make_object(8), 0, 8)
    registry.unregister("r")
    assert held.read("r", 2, 3) == b"cde"
    held.write("r", 0, b"XY")
    held.check("r", 4, 4)
    for name in ("not-registered", "later"):
        for call in (lambda n=name: held.read(n, 0, 1), lambda n=name: held.write(n, 0, b"1"),
                     lambda n=name: held.check(n, 0, 1)):
            error = _error(call)
            assert isinstance(error, NotFound) and error.message == f"Unable to find shared memory region: '{name}'"
    held.release()
    assert [r.name for r in registry.status()] == ["later"]
    assert isinstance(_error(lambda: held.read("r", 0, 1)), NotFound)  # let go: nothing is held
    assert _path(key).read_bytes() == b"XYcdefgh"


def test_a_hold_on_a_disabled_registry_refuses_access(make_object: MakeObject) -> None:
    registry = SharedMemoryRegistry(enabled=False)
    held = registry.acquire({"r"})
    for call in (lambda: held.read("r", 0, 1), lambda: held.write("r", 0, b"1"), lambda: held.check("r", 0, 1)):
        error = _error(call)
        assert isinstance(error, Unavailable) and error.message == DISABLED_ERROR
    held.release()


def test_close_unmaps_everything_even_held(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(8)
    registry.register("r", key, 0, 8)
    held = registry.acquire({"r"})
    registry.close()
    assert isinstance(_error(lambda: _read(registry, "r", 0, 1)), NotFound)
    for call in (lambda: held.read("r", 0, 1), lambda: held.write("r", 0, b"1")):
        assert isinstance(_error(call), NotFound)
    held.release()
    assert registry.status() == []


# ---------------------------------------------------------------------------- read / write bounds


@pytest.mark.parametrize(
    ("offset", "byte_size", "message"),
    [
        (64, 1, "Invalid offset for shared memory region: 'r'"),
        (2**64 - 32, 16, "Invalid offset for shared memory region: 'r'"),
        (-1, 1, "Invalid offset for shared memory region: 'r'"),
        (60, 16, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, 65, "Invalid offset + byte size for shared memory region: 'r'"),
        (32, 2**64 - 32, "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds maximum "
                         "value (18446744073709551615) for region 'r'"),
        (0, -1, "Integer overflow detected: byte_size (-1) + offset (0) exceeds maximum value "
                "(18446744073709551615) for region 'r'"),
    ],
)
def test_out_of_bounds_accesses(registry: SharedMemoryRegistry, make_object: MakeObject, offset: int,
                                byte_size: int, message: str) -> None:
    key = make_object(128)
    registry.register("r", key, 32, 64)
    held = registry.acquire({"r"})
    for call in (lambda: held.read("r", offset, byte_size), lambda: held.check("r", offset, byte_size)):
        error = _error(call)
        assert isinstance(error, InvalidArgument) and error.message == message
    if byte_size > 0:
        data = b"\xff" * min(byte_size, 256)
        assert isinstance(_error(lambda: held.write("r", offset, data)), InvalidArgument)
    held.release()
    assert _path(key).read_bytes() == bytes(128)  # nothing was written anywhere


def test_unknown_region_on_access(registry: SharedMemoryRegistry) -> None:
    held = registry.acquire({"x"})
    for call in (lambda: held.read("x", 0, 1), lambda: held.write("x", 0, b"1"), lambda: held.check("x", 0, 1)):
        error = _error(call)
        assert isinstance(error, NotFound) and error.message == "Unable to find shared memory region: 'x'"


def test_an_object_shrunk_under_a_region_fails_cleanly(registry: SharedMemoryRegistry,
                                                       make_object: MakeObject) -> None:
    """A mapping would raise SIGBUS past the end of a truncated object: a read there is refused,
    and a write inside the registered window grows the object back to it."""
    page = mmap.ALLOCATIONGRANULARITY
    key = make_object(page * 2)
    registry.register("r", key, 0, page * 2)
    os.truncate(_path(key), 16)
    assert _read(registry, "r", 0, 16) == bytes(16)
    error = _error(lambda: _read(registry, "r", 0, page + 1))
    assert error.message == f"Invalid shared memory region: '{key}'"
    assert error.status is Status.INVALID_ARG
    _write(registry, "r", page, b"x")
    assert _path(key).stat().st_size == page + 1
    assert _read(registry, "r", page - 1, 2) == b"\0x"


def test_a_client_truncating_its_object_never_kills_the_server(make_object: MakeObject) -> None:
    """A hostile client shrinks and regrows its object as fast as it can while the server reads
    and writes the region: each access works or is refused, the process never takes SIGBUS (a
    size check before a copy from a mapping left a window for exactly that). Run in a child
    process, so that a fault fails this test instead of killing the test run."""
    key = make_object(1 << 20)
    child = subprocess.run([sys.executable, "-c", _TRUNCATION_RACE, key], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, f"the reader died ({child.returncode}): {child.stderr[-2000:]}"
    done, refused = map(int, child.stdout.split())
    assert done + refused > 100, child.stdout  # it raced for real


_TRUNCATION_RACE = """
import os, sys, threading, time
from naiad.core.shared_memory import SharedMemoryRegistry
from naiad.errors import InvalidArgument
key, size = sys.argv[1], 1 << 20
registry = SharedMemoryRegistry(enabled=True)
registry.register("r", key, 0, size)
held = registry.acquire({"r"})
stop = threading.Event()
def shrink_and_regrow():
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    while not stop.is_set():
        os.ftruncate(fd, 4096)
        os.ftruncate(fd, size)
threading.Thread(target=shrink_and_regrow, daemon=True).start()
done = refused = 0
data = bytes(size)
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    try:
        held.read("r", 0, size)
        held.write("r", 0, data)
        done += 1
    except InvalidArgument:
        refused += 1
stop.set()
print(done, refused)
"""


def test_unlinked_object_stays_readable(registry: SharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(8, b"12345678")
    registry.register("r", key, 0, 8)
    _path(key).unlink()
    assert _read(registry, "r", 0, 8) == b"12345678"


# ----------------------------------------------------------------------------------- threads


def test_concurrent_unregister_never_crashes_readers_or_writers(registry: SharedMemoryRegistry,
                                                                make_object: MakeObject) -> None:
    """Readers and writers (each access through a hold of its own) race registrations and
    unregistrations of the same name: each access either works on a live region or fails with
    NotFound, never touches a closed one."""
    key = make_object(4096, b"\x01" * 4096)
    stop = threading.Event()
    failures: list[BaseException] = []
    counts = {"ok": 0, "missing": 0}

    def access() -> None:
        while not stop.is_set():
            try:
                assert _read(registry, "r", 0, 4096) == b"\x01" * 4096
                _write(registry, "r", 0, b"\x01" * 4096)
                counts["ok"] += 1
            except NotFound:
                counts["missing"] += 1
            except BaseException as error:  # pragma: no cover - reported below
                failures.append(error)
                return

    threads = [threading.Thread(target=access) for _ in range(4)]
    for thread in threads:
        thread.start()
    registered = 0
    try:
        for _ in range(300):
            try:
                registry.register("r", key, 0, 4096)
                registered += 1
            except AlreadyExists:  # a reader still holds the one unregistered last: listed until it lets go
                pass
            registry.unregister("r")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert registered > 0 and counts["ok"] + counts["missing"] > 0
