"""Hostile HTTP/2 clients against a real server's gRPC port (naiad's own transport), one test per
finding of the hardening issue: each attacker gets the protocol's answer (GOAWAY, RST_STREAM or a
grpc-status) within 1 s, the server's RSS stays bounded during and after the attack, and a
tritonclient bystander on another connection is served throughout (tests/frontends/hostile.py).

Attacks are bounded (a few seconds, a few hundred MiB at most) and loopback only.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess
from e2e.repo_builder import write_model
from frontends.hostile import (
    CANCEL,
    CONTINUATION,
    DATA,
    ECHO,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    ERRORS,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    H2,
    HEADERS,
    MIB,
    PING,
    PRIORITY,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Bystander,
    Frame,
    Watch,
    attack_server,
    frame,
    grpc_message,
    settings,
    u32,
)
from tritonclient.grpc import service_pb2 as pb

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
ANSWER_S = 1.0  # the protocol's answer must come within this
BIG = """
name: "big"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""
SLOW = BIG.replace('"big"', '"slow"') + 'parameters { key: "execute_delay_ms" value { string_value: "50" } }\n'


def _repo(root: Path) -> Path:
    repo = root / "repo"
    for name, config in (("echo", ECHO), ("big", BIG), ("slow", SLOW)):
        write_model(repo, name, config, {1: lambda path: None})
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc-attacks")
    with attack_server(["--model-repository", str(_repo(root))], root / "naiad.log") as process:
        yield process


@pytest.fixture(scope="module")
def bystander(server: ServerProcess) -> Iterator[Bystander]:
    client = Bystander("grpc", server.grpc_url, "echo")
    yield client
    client.stop()


def infer_message(model: str, size: int) -> bytes:
    """A ModelInfer request for `model` with one UINT8 input of `size` bytes, framed for gRPC."""
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT0", datatype="UINT8")
    tensor.shape.append(size)
    request.raw_input_contents.append(b"\x01" * size)
    return grpc_message(request.SerializeToString())


def data_frames(stream_id: int, payload: bytes, size: int = 16384, end: bool = False) -> list[bytes]:
    pieces = [payload[i:i + size] for i in range(0, len(payload), size)] or [b""]
    frames = [frame(DATA, 0, stream_id, piece) for piece in pieces]
    if end:
        frames[-1] = frame(DATA, END_STREAM, stream_id, pieces[-1])
    return frames


class Windowed:
    """Sends DATA as fast as the server's flow-control windows allow (a well-behaved sender),
    watching for what the server answers."""

    def __init__(self, h2: H2) -> None:
        self.h2 = h2
        self.connection = 65_535
        self.streams: dict[int, int] = {}
        self.initial = 65_535
        self.seen: list[Frame] = []

    def absorb(self, frames: list[Frame]) -> None:
        for got in frames:
            self.seen.append(got)
            if got.kind == SETTINGS and not got.flags & 1:
                for i in range(0, len(got.payload), 6):
                    key = int.from_bytes(got.payload[i:i + 2], "big")
                    value = int.from_bytes(got.payload[i + 2:i + 6], "big")
                    if key == 4:
                        for stream in self.streams:
                            self.streams[stream] += value - self.initial
                        self.initial = value
            elif got.kind == WINDOW_UPDATE:
                increment = int.from_bytes(got.payload, "big")
                if got.stream_id == 0:
                    self.connection += increment
                elif got.stream_id in self.streams:
                    self.streams[got.stream_id] += increment

    def open(self, stream_id: int) -> None:
        self.streams[stream_id] = self.initial

    def push(self, stream_id: int, payload: bytes, until: float) -> bool:
        """Send `payload` within the windows; False if `until` passes or the server answered on
        the stream (RST_STREAM or trailers) or the connection first."""
        view = memoryview(payload)
        while view:
            if time.monotonic() > until or self.answered(stream_id):
                return False
            room = min(self.connection, self.streams[stream_id], 16384, len(view))
            if room <= 0:
                self.absorb(self.h2.read(0.01))
                continue
            self.h2.send(frame(DATA, 0, stream_id, bytes(view[:room])))
            self.connection -= room
            self.streams[stream_id] -= room
            view = view[room:]
            self.absorb(self.h2.read(0.0001) if len(view) % 8 == 0 else [])
        return True

    def answered(self, stream_id: int) -> Frame | None:
        for got in self.seen:
            if got.kind == GOAWAY or (got.stream_id == stream_id and (got.kind == RST_STREAM or (
                    got.kind == HEADERS and got.flags & END_STREAM))):
                return got
        return None


def _describe(got: Frame | None, h2: H2) -> str:
    if got is None:
        return "nothing"
    if got.kind == HEADERS:
        trailers = h2.trailers(got)
        return f"grpc-status {trailers.get('grpc-status')} {trailers.get('grpc-message', '')!r}"
    name = {GOAWAY: "GOAWAY", RST_STREAM: "RST_STREAM"}.get(got.kind, str(got.kind))
    return f"{name} {ERRORS.get(got.code(), got.code())}"


# -- 1. a unary call buffers without limit -----------------------------------------------------------


def test_a_unary_call_fails_at_its_second_message(server: ServerProcess, bystander: Bystander) -> None:
    """Valid messages on a ModelInfer stream that never ends: the call fails at the second
    message (grpcio's behaviour), instead of buffering every message until END_STREAM."""
    message = infer_message("big", MIB - 64)
    h2 = H2(server.grpc_url)
    try:
        with Watch("unary call streaming messages", server.process.pid, bystander) as figures:
            sender = Windowed(h2)
            h2.send(h2.headers(1, INFER))
            sender.open(1)
            start = time.monotonic()
            sent = second = 0
            while time.monotonic() - start < 4 and sent < 64:  # at most 64 MiB
                if sent == 1:
                    second = time.monotonic()
                if not sender.push(1, message, start + 4):
                    break
                sent += 1
            got, _ = h2.read_until(HEADERS, ANSWER_S, 1) if sender.answered(1) is None else (sender.answered(1), [])
            figures.response = _describe(got, h2) + f" after {sent} MiB sent"
            h2.close()
        assert got is not None and second, figures
        assert got.at - second < ANSWER_S, figures
        assert sent <= 10, figures  # the first message and, at most, the 8 MiB window
        if got.kind == HEADERS:
            assert h2.trailers(got)["grpc-status"] == "13", figures  # INTERNAL, as grpc-go and grpcio
    finally:
        h2.close()


# -- 2. flow control is not enforced ----------------------------------------------------------------


def test_a_client_that_ignores_the_windows_gets_flow_control_error(server: ServerProcess,
                                                                    bystander: Bystander) -> None:
    message = infer_message("slow", 256 * 1024)
    h2 = H2(server.grpc_url)
    try:
        with Watch("DATA past the stream window", server.process.pid, bystander) as figures:
            h2.drain()  # it reads its answers: only the windows hold it back
            h2.send(h2.headers(1, STREAM))
            start = time.monotonic()
            overrun = 0.0  # when it first sent past the window the server had granted it
            granted = 8 * MIB  # the server's SETTINGS_INITIAL_WINDOW_SIZE, then its WINDOW_UPDATEs
            got = None
            sent = 0
            while time.monotonic() - start < 4 and sent < 800:  # at most 200 MiB, windows ignored
                try:
                    h2.send(b"".join(data_frames(1, message)))
                except OSError:
                    break
                sent += 1
                for seen in h2.read(0):
                    if seen.kind == WINDOW_UPDATE and seen.stream_id == 1:
                        granted += int.from_bytes(seen.payload, "big")
                    elif seen.kind in (RST_STREAM, GOAWAY) and got is None:
                        got = seen
                if sent * len(message) > granted and not overrun:
                    overrun = time.monotonic()
                if got is not None:
                    break
            if got is None:
                got, _ = h2.read_until(RST_STREAM, ANSWER_S, 1)
            figures.response = _describe(got, h2) + f" after {sent * len(message) // MIB} MiB"
            h2.close()
        assert got is not None and overrun, figures
        assert got.code() == FLOW_CONTROL_ERROR, figures
        assert got.at - overrun < ANSWER_S, figures
    finally:
        h2.close()


def test_a_fast_streamer_within_its_windows_is_held_back(server: ServerProcess, bystander: Bystander) -> None:
    """Back-pressure: a ModelStreamInfer client that respects the windows but sends faster than
    the (slow) model serves gets no more window once the stream's reader falls behind."""
    message = infer_message("slow", 64 * 1024)
    h2 = H2(server.grpc_url)
    try:
        with Watch("fast streamer within its windows", server.process.pid, bystander) as figures:
            sender = Windowed(h2)
            sender.absorb(h2.read(0.2))
            h2.send(h2.headers(1, STREAM))
            sender.open(1)
            start = time.monotonic()
            sent = 0
            while time.monotonic() - start < 3 and sender.push(1, message, start + 3):
                sent += 1
            figures.response = f"{sent} messages of 64 KiB accepted in 3 s by a model serving one per 50 ms"
            h2.close()
        # 64 requests in flight, a few queued, and the 8 MiB window: far below 3 s at full speed.
        assert sent * len(message) < 16 * MIB, figures
    finally:
        h2.close()


# -- 3. floods ------------------------------------------------------------------------------------


def _flood(h2: H2, batch: bytes, seconds: float = 4.0) -> tuple[Frame | None, float]:
    """Send `batch` again and again until the server sends GOAWAY or closes (or `seconds` pass)."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            h2.send(batch)
        except OSError:
            break
        goaway = next((x for x in h2.read(0) if x.kind == GOAWAY), None)
        if goaway is not None:
            return goaway, start
    goaway, _ = h2.read_until(GOAWAY, ANSWER_S)
    return goaway, start


def test_rapid_reset_gets_goaway(server: ServerProcess, bystander: Bystander) -> None:
    """CVE-2023-44487: streams opened and reset at once, as fast as the socket takes them."""
    h2 = H2(server.grpc_url)
    try:
        with Watch("rapid reset", server.process.pid, bystander) as figures:
            h2.send(h2.headers(1, INFER) + frame(RST_STREAM, 0, 1, u32(CANCEL)))
            block = h2.headers_block(INFER)  # now all indexed: the same bytes for every stream
            stream_ids = iter(range(3, 2**31, 2))
            batches = [b"".join(frame(HEADERS, 4, s, block) + frame(RST_STREAM, 0, s, u32(CANCEL))
                                for s in [next(stream_ids) for _ in range(500)]) for _ in range(400)]
            start = time.monotonic()
            goaway = None
            for batch in batches:
                try:
                    h2.send(batch)
                except OSError:
                    break
                goaway = next((x for x in h2.read(0) if x.kind == GOAWAY), None)
                if goaway is not None or time.monotonic() - start > 4:
                    break
            if goaway is None:
                goaway, _ = h2.read_until(GOAWAY, ANSWER_S)
            figures.response = _describe(goaway, h2)
            h2.close()
        assert goaway is not None and goaway.code() == ENHANCE_YOUR_CALM, figures
        assert goaway.at - start < ANSWER_S, figures
    finally:
        h2.close()


def test_endless_continuation_frames_get_goaway(server: ServerProcess, bystander: Bystander) -> None:
    h2 = H2(server.grpc_url)
    try:
        with Watch("empty CONTINUATION flood", server.process.pid, bystander) as figures:
            h2.send(frame(HEADERS, 0, 1, h2.headers_block(INFER)))  # no END_HEADERS
            goaway, start = _flood(h2, frame(CONTINUATION, 0, 1) * 20_000)
            figures.response = _describe(goaway, h2)
            h2.close()
        assert goaway is not None and goaway.code() in (ENHANCE_YOUR_CALM, PROTOCOL_ERROR), figures
        assert goaway.at - start < ANSWER_S, figures
    finally:
        h2.close()


@pytest.mark.parametrize("kind", ["PRIORITY", "WINDOW_UPDATE", "empty DATA", "PING ACK"])
def test_control_frame_floods_get_goaway(kind: str, server: ServerProcess, bystander: Bystander) -> None:
    """Frames that cost the server work and ask for nothing, sent without end."""
    h2 = H2(server.grpc_url)
    try:
        flood = {
            "PRIORITY": frame(PRIORITY, 0, 1, u32(0) + b"\x10"),
            "WINDOW_UPDATE": frame(WINDOW_UPDATE, 0, 0, u32(1)),
            "empty DATA": frame(DATA, 0, 1),
            "PING ACK": frame(PING, 1, 0, b"12345678"),
        }[kind]
        with Watch(f"{kind} flood", server.process.pid, bystander) as figures:
            h2.send(h2.headers(1, STREAM))  # an open stream for the frames that name one
            goaway, start = _flood(h2, flood * 20_000)
            figures.response = _describe(goaway, h2)
            h2.close()
        assert goaway is not None and goaway.code() == ENHANCE_YOUR_CALM, figures
        assert goaway.at - start < ANSWER_S, figures
    finally:
        h2.close()


def test_settings_flood_from_a_client_that_never_reads(server: ServerProcess, bystander: Bystander) -> None:
    """SETTINGS sent without end by a client that never reads the server's ACKs: the server
    stops taking them (GOAWAY, or reading paused once its writes back up) within a second."""
    h2 = H2(server.grpc_url)
    h2.sock.setblocking(False)
    flood = settings(initial_window_size=65_535) * 10_000
    try:
        with Watch("SETTINGS flood, never reading", server.process.pid, bystander) as figures:
            start = time.monotonic()
            cut = 0.0
            stalled_since = 0.0
            while time.monotonic() - start < 4:
                try:
                    h2.sock.send(flood)
                    stalled_since = 0.0
                except BlockingIOError:
                    stalled_since = stalled_since or time.monotonic()
                    if time.monotonic() - stalled_since > 0.5:
                        cut = stalled_since
                        break
                    time.sleep(0.01)
                except OSError as error:  # reset or closed by the server
                    assert error.errno in (errno.EPIPE, errno.ECONNRESET), error
                    cut = time.monotonic()
                    break
            h2.sock.setblocking(True)
            goaway, _ = h2.read_until(GOAWAY, 5)
            figures.response = (f"{_describe(goaway, h2)}; sending cut off after "
                                f"{cut - start if cut else float('inf'):.2f} s")
            h2.close()
        assert cut and cut - start < ANSWER_S, figures
        assert goaway is not None and goaway.code() == ENHANCE_YOUR_CALM, figures
    finally:
        h2.close()


# -- 4. limits advertised and enforced ----------------------------------------------------------------


def test_streams_past_max_concurrent_streams_are_refused(server: ServerProcess, bystander: Bystander) -> None:
    h2 = H2(server.grpc_url)
    try:
        with Watch("streams past the limit", server.process.pid, bystander) as figures:
            frames = h2.read(0.3)
            server_settings = next(x for x in frames if x.kind == SETTINGS and not x.flags & 1)
            values = {int.from_bytes(server_settings.payload[i:i + 2], "big"):
                      int.from_bytes(server_settings.payload[i + 2:i + 6], "big")
                      for i in range(0, len(server_settings.payload), 6)}
            limit = values.get(3, 50_000)  # SETTINGS_MAX_CONCURRENT_STREAMS
            streams = min(limit + 20, 60_000)
            start = time.monotonic()
            h2.send(b"".join(h2.headers(s, INFER) for s in range(1, 2 * streams, 2)))  # all left open
            seen = h2.read(ANSWER_S)
            refused = [x for x in seen if x.kind == RST_STREAM and x.code() == REFUSED_STREAM]
            figures.response = (f"SETTINGS_MAX_CONCURRENT_STREAMS {values.get(3, 'not sent')}; "
                                f"{len(refused)} of {streams} streams refused")
            h2.close()
        assert 3 in values and values[3] <= 1024, figures
        assert len(refused) == streams - limit, figures
        assert all(x.at - start < ANSWER_S for x in refused), figures
    finally:
        h2.close()


PROTOCOL_CASES = {
    # name: (frames after a stream is opened, the frame expected, its error code)
    "stream window past 2^31-1": (frame(WINDOW_UPDATE, 0, 1, u32(2**31 - 1)), RST_STREAM, FLOW_CONTROL_ERROR),
    "WINDOW_UPDATE of 0 on a stream": (frame(WINDOW_UPDATE, 0, 1, u32(0)), RST_STREAM, PROTOCOL_ERROR),
    "WINDOW_UPDATE of 0 on the connection": (frame(WINDOW_UPDATE, 0, 0, u32(0)), GOAWAY, PROTOCOL_ERROR),
    "DATA on stream 0": (frame(DATA, 0, 0, b"x"), GOAWAY, PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", list(PROTOCOL_CASES))
def test_protocol_violations_are_errors(case: str, server: ServerProcess, bystander: Bystander) -> None:
    bad, kind, code = PROTOCOL_CASES[case]
    h2 = H2(server.grpc_url)
    try:
        with Watch(case, server.process.pid, bystander) as figures:
            h2.send(h2.headers(1, STREAM))
            start = time.monotonic()
            h2.send(bad)
            got, _ = h2.read_until(kind, ANSWER_S)
            figures.response = _describe(got, h2)
            h2.close()
        assert got is not None and got.code() == code, figures
        assert got.at - start < ANSWER_S, figures
    finally:
        h2.close()


# -- 8. auth before the body -----------------------------------------------------------------------

TOKEN = "attack-suite-secret"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc-auth")
    args = ["--model-repository", str(_repo(root)), f"--auth-token={TOKEN}"]
    with attack_server(args, root / "naiad.log") as process:
        yield process


def test_unauthenticated_calls_are_refused_from_their_headers(auth_server: ServerProcess) -> None:
    """8 ModelInfer calls of 32 MiB without the token: each is answered UNAUTHENTICATED as soon
    as its headers are in, and its body is dropped, never buffered."""
    bystander = Bystander("grpc", auth_server.grpc_url, "echo", TOKEN)
    connections = [H2(auth_server.grpc_url) for _ in range(8)]
    try:
        with Watch("8 unauthenticated 32 MiB calls", auth_server.process.pid, bystander) as figures:
            for h2 in connections:
                h2.drain()
            start = time.monotonic()
            for h2 in connections:
                h2.send(h2.headers(1, INFER))
            answers = [h2.read_until(HEADERS, ANSWER_S, 1)[0] for h2 in connections]
            message = infer_message("big", 32 * MIB)
            for h2 in connections:  # the bodies, as the clients send them anyway (within the windows)
                sender = Windowed(h2)
                sender.initial = sender.streams[1] = 8 << 20
                sender.connection = 64 << 20
                sender.push(1, message, time.monotonic() + 2)
            for h2 in connections:
                h2.close()
            statuses = [h2.trailers(got).get("grpc-status") if got is not None else None
                        for h2, got in zip(connections, answers, strict=True)]
            figures.response = (f"grpc-status {sorted(set(statuses), key=str)}, the last after "
                                f"{max(got.at if got else float('inf') for got in answers) - start:.2f} s")
        assert statuses == ["16"] * len(connections), figures  # UNAUTHENTICATED
        assert all(got is not None and got.at - start < ANSWER_S for got in answers), figures
    finally:
        for h2 in connections:
            h2.close()
        bystander.stop()


# -- 5. slow readers ------------------------------------------------------------------------------

SEND_TIMEOUT_S = 2.0
UNSENT_LIMIT = 16 * MIB


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc-slow-readers")
    args = ["--model-repository", str(_repo(root)), f"--grpc-send-timeout-secs={SEND_TIMEOUT_S}",
            f"--grpc-max-unsent-bytes={UNSENT_LIMIT}"]
    with attack_server(args, root / "naiad.log") as process:
        yield process


def test_responses_to_a_client_that_never_reads_are_dropped(strict_server: ServerProcess) -> None:
    """A zero window and 40 calls for 2 MiB answers, one after the other: an answer that does not
    fit the connection's unsent limit fails at once (RESOURCE_EXHAUSTED); one that does waits, and
    is reset once it has made no progress for the send timeout."""
    bystander = Bystander("grpc", strict_server.grpc_url, "echo")
    h2 = H2(strict_server.grpc_url, settings(initial_window_size=0))
    calls, size = 40, 2 * MIB
    try:
        with Watch("zero window, 40 x 2 MiB answers", strict_server.process.pid, bystander) as figures:
            message = infer_message("big", size)
            seen: list[Frame] = []
            start = time.monotonic()
            for stream_id in range(1, 2 * calls, 2):
                h2.send(h2.headers(stream_id, INFER) + b"".join(data_frames(stream_id, message, end=True)))
                _, more = h2.read_until(HEADERS, 5, stream_id)  # its answer's headers (its DATA cannot come)
                seen += more
            sending = time.monotonic() - start
            seen += h2.read(SEND_TIMEOUT_S + ANSWER_S)
            h2.close()
            waiting_since = {x.stream_id: x.at for x in seen if x.kind == HEADERS and not x.flags & END_STREAM}
            refused = [x for x in seen if x.kind == HEADERS and x.flags & END_STREAM]
            reset = [x for x in seen if x.kind == RST_STREAM]
            figures.response = (f"{len(refused)} answered RESOURCE_EXHAUSTED at once, {len(reset)} reset after "
                                f"{max((x.at - waiting_since[x.stream_id] for x in reset), default=0):.1f} s")
        assert len(refused) + len(reset) == calls, figures
        assert all(h2.trailers(x)["grpc-status"] == "8" for x in refused), figures
        assert all(x.at - waiting_since[x.stream_id] < ANSWER_S for x in refused), figures
        assert reset and all(x.at - waiting_since[x.stream_id] < SEND_TIMEOUT_S + ANSWER_S for x in reset), figures
        # What fits the limit, once per send timeout while the 40 calls were being sent.
        assert len(reset) <= (UNSENT_LIMIT // size) * (2 + int(sending / SEND_TIMEOUT_S)), figures
    finally:
        h2.close()
        bystander.stop()
