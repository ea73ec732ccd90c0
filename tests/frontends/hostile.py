"""What the attack suites share: a bystander client in its own process, the server's RSS sampled
during an attack, and a raw HTTP/2 client that writes any frame, valid or not.

Every attack test follows one shape (`Watch`): note the server's RSS and start sampling it, run
the attack (bounded, loopback only), then check that RSS grew by less than 64 MiB during it and
came back to within 32 MiB of the start after it, and that the bystander, on its own connection
all along, was answered with a p99 latency under 1 s.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import hpack
from conftest import ServerProcess

MIB = 1 << 20
#: The identity model every attack suite serves (a bystander's requests echo).
ECHO = """
name: "echo"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
MAX_GROWTH = 64 * MIB  # RSS growth allowed while an attack runs
MAX_LEFT = 32 * MIB  # and left over once it is done
MAX_P99_S = 1.0  # the bystander's 99th percentile latency
SETTLE_S = 5.0  # how long RSS may take to come back after the attack
SEND_TIMEOUT_S = 10.0  # a raw client's send blocked this long: the server stopped reading
_BYSTANDER = Path(__file__).with_name("bystander.py")


@contextmanager
def attack_server(args: list[str], log_path: Path) -> Iterator[ServerProcess]:
    """A `naiad serve` for an attack suite, with glibc told to hand freed buffers of 64 KiB and
    more straight back to the system (MALLOC_MMAP_THRESHOLD_), so that RSS after an attack
    measures memory still in use. By default glibc keeps freed buffers cached once it has seen
    large ones: a repeated attack then plateaus ~40 MiB above the start (measured: five rounds of
    the flow-control attack, RSS flat from the second), which is not a leak but would hide one."""
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    try:
        server = ServerProcess(args, log_path)
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    try:
        server.wait_live()
        yield server
    finally:
        server.stop()


def rss(pid: int) -> int:
    """Resident set size of process `pid` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class RssSampler:
    """Samples a process's RSS every few milliseconds in a thread; `peak` is the highest seen."""

    def __init__(self, pid: int, every_s: float = 0.01) -> None:
        self.pid = pid
        self.every_s = every_s
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss(self.pid))
            except (OSError, RuntimeError):
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Bystander:
    """tests/frontends/bystander.py in a child process; its latencies are collected here."""

    def __init__(self, protocol: str, url: str, model: str, token: str = "") -> None:
        command = [sys.executable, str(_BYSTANDER), protocol, url, model] + ([token] if token else [])
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.records: list[tuple[float, float, bool]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            started, latency, ok = line.split()
            with self._lock:
                self.records.append((float(started), float(latency), ok == "1"))

    def wait_served(self, timeout: float = 60.0) -> None:
        """Until the bystander has been answered (its process has started and connected)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if any(ok for _, _, ok in self.records):
                    return
            if self.process.poll() is not None:
                raise RuntimeError("the bystander exited")
            time.sleep(0.05)
        raise TimeoutError("the bystander was never served")

    def between(self, start: float, end: float) -> list[tuple[float, bool]]:
        """(latency, ok) of the requests that were running at some point in [start, end]."""
        with self._lock:
            return [(latency, ok) for began, latency, ok in self.records
                    if began <= end and began + latency >= start]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@dataclass
class Figures:
    """What one attack did to the server and the bystander (printed for docs/reliability.md)."""

    name: str
    rss_start: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    response: str = ""

    @property
    def p99(self) -> float:
        if not self.latencies:
            return float("inf")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def __str__(self) -> str:
        return (f"[attack] {self.name}: {self.response}; RSS +{(self.rss_peak - self.rss_start) / MIB:.1f} MiB "
                f"during, {(self.rss_after - self.rss_start) / MIB:+.1f} MiB after; bystander "
                f"{len(self.latencies)} requests, p99 {self.p99 * 1000:.0f} ms, {self.failures} failed")


class Watch:
    """Measure one attack: `with Watch(name, pid, bystander) as figures: <attack>`, then assert."""

    def __init__(self, name: str, pid: int, bystander: Bystander | None) -> None:
        self.figures = Figures(name)
        self.pid = pid
        self.bystander = bystander
        self._sampler = RssSampler(pid)
        self._start = 0.0

    def __enter__(self) -> Figures:
        if self.bystander is not None:
            self.bystander.wait_served()
        self.figures.rss_start = rss(self.pid)
        self._start = time.monotonic()
        self._sampler.__enter__()
        return self.figures

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._sampler.__exit__()
        end = time.monotonic()
        figures = self.figures
        figures.rss_peak = self._sampler.peak
        deadline = end + SETTLE_S
        figures.rss_after = rss(self.pid)
        while figures.rss_after - figures.rss_start > MAX_LEFT and time.monotonic() < deadline:
            time.sleep(0.1)
            figures.rss_after = rss(self.pid)
        if self.bystander is not None:
            time.sleep(0.2)  # a request or two after the attack, too
            served = self.bystander.between(self._start, time.monotonic())
            figures.latencies = [latency for latency, _ in served]
            figures.failures = sum(1 for _, ok in served if not ok)
        print(figures)
        if exc_type is None:
            check(figures)


def check(figures: Figures) -> None:
    """The suite's common bar: memory bounded during and after, the bystander served."""
    growth, left = figures.rss_peak - figures.rss_start, figures.rss_after - figures.rss_start
    assert growth < MAX_GROWTH, f"{figures}: RSS grew {growth / MIB:.0f} MiB during the attack"
    assert left < MAX_LEFT, f"{figures}: RSS still {left / MIB:.0f} MiB above the start after the attack"
    if figures.latencies or figures.failures:
        assert figures.failures == 0, f"{figures}: the bystander had failures"
        assert figures.p99 < MAX_P99_S, f"{figures}: the bystander waited"


# -- a raw HTTP/2 client --------------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS = 4, 3
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0, 1, 3, 7, 8, 11
ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 6: "FRAME_SIZE_ERROR",
          7: "REFUSED_STREAM", 8: "CANCEL", 11: "ENHANCE_YOUR_CALM"}
_HEAD = struct.Struct(">BHBBI")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) >> 16, len(payload) & 0xFFFF, kind, flags, stream_id) + payload


def settings(**values: int) -> bytes:
    ids = {"initial_window_size": INITIAL_WINDOW_SIZE, "max_concurrent_streams": MAX_CONCURRENT_STREAMS}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


@dataclass
class Frame:
    kind: int
    flags: int
    stream_id: int
    payload: bytes
    at: float  # monotonic seconds when it was read

    def code(self) -> int:
        """The error code of a RST_STREAM or GOAWAY."""
        return int.from_bytes(self.payload[4:8] if self.kind == GOAWAY else self.payload[:4], "big")


class H2:
    """One raw HTTP/2 connection: send any bytes, read frames as they come (with their time)."""

    def __init__(self, url: str, settings_frame: bytes | None = None) -> None:
        host, port = url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = bytearray()
        self.unread: list[Frame] = []  # read from the socket but not yet returned
        self.closed = False
        self._lock = threading.Lock()
        self._drainer: threading.Thread | None = None
        self.sock.sendall(PREFACE + (settings_frame if settings_frame is not None else settings()))

    def send(self, data: bytes) -> None:
        if self._drainer is None:
            self.sock.settimeout(SEND_TIMEOUT_S)  # read() leaves its own, maybe tiny, timeout
        self.sock.sendall(data)

    def headers_block(self, path: str, **extra: str) -> bytes:
        pairs = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "naiad"),
                 ("content-type", "application/grpc"), ("te", "trailers"), *extra.items()]
        return self.encoder.encode(pairs)

    def headers(self, stream_id: int, path: str, end: bool = False, **extra: str) -> bytes:
        flags = END_HEADERS | (END_STREAM if end else 0)
        return frame(HEADERS, flags, stream_id, self.headers_block(path, **extra))

    def read(self, timeout: float) -> list[Frame]:
        """Frames that arrive within `timeout` seconds (fewer if the server closes); read(0)
        returns what has already arrived."""
        if self._drainer is not None:
            return self._collect(timeout)
        frames, self.unread = self.unread, []
        deadline = time.monotonic() + timeout
        tries = 0
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0 and tries:
                break
            tries += 1
            self.sock.settimeout(max(left, 0.0001))
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                break
            except OSError:
                self.closed = True
                break
            if not chunk:
                self.closed = True
            frames.extend(self._parse(chunk))
        return frames

    def drain(self) -> None:
        """From now on read in a thread, as real clients do while they write; read() returns
        what the thread has collected."""
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        self.sock.settimeout(SEND_TIMEOUT_S)  # shared with sends from the test's thread
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            with self._lock:
                if not chunk:
                    self.closed = True
                    return
                self.unread.extend(self._parse(chunk))

    def _collect(self, timeout: float) -> list[Frame]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self.unread or self.closed or time.monotonic() >= deadline:
                    frames, self.unread = self.unread, []
                    return frames
            time.sleep(0.002)

    def read_until(self, kind: int, timeout: float, stream_id: int | None = None) -> tuple[Frame | None, list[Frame]]:
        """Read until a frame of `kind` (on `stream_id` when given) arrives: (it or None, all read)."""
        seen: list[Frame] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (self.closed and not self.unread):
            batch = self.read(min(0.05, max(deadline - time.monotonic(), 0.001)))
            for index, got in enumerate(batch):
                seen.append(got)
                if got.kind == kind and (stream_id is None or got.stream_id == stream_id):
                    with self._lock:
                        self.unread = batch[index + 1:] + self.unread
                    return got, seen
        return None, seen

    def _parse(self, chunk: bytes) -> list[Frame]:
        now = time.monotonic()
        buffer = self.buffer
        buffer += chunk
        frames: list[Frame] = []
        position = 0
        while len(buffer) - position >= 9:
            high, low, kind, flags, stream_id = _HEAD.unpack_from(buffer, position)
            size = high << 16 | low
            if len(buffer) - position < 9 + size:
                break
            payload = bytes(buffer[position + 9:position + 9 + size])
            frames.append(Frame(kind, flags, stream_id & 0x7FFFFFFF, payload, now))
            position += 9 + size
        del buffer[:position]
        return frames

    def trailers(self, got: Frame) -> dict[str, str]:
        return {k: v for k, v in self.decoder.decode(got.payload) if not k.startswith(":")}

    def close(self) -> None:
        self.sock.close()


@contextmanager
def connections(url: str, count: int) -> Iterator[list[socket.socket]]:
    """`count` plain TCP connections to `url`, all closed at the end."""
    host, port = url.rsplit(":", 1)
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            opened.append(socket.create_connection((host, int(port)), timeout=10))
        yield opened
    finally:
        for sock in opened:
            sock.close()
