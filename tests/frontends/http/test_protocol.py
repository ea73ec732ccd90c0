"""HttpProtocol driven in-process with a fake transport: framing, ordering, limits."""

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator

from naiad.frontends.http.protocol import Connections, HttpProtocol
from naiad.frontends.http.reply import Reply


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = b""
        self.writes = 0
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes += 1

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def _run(requests: bytes, dispatch, max_body: int = 1 << 20) -> FakeTransport:
    async def main() -> FakeTransport:
        transport = FakeTransport()
        protocol = HttpProtocol(dispatch, max_body, Connections())
        protocol.connection_made(transport)
        protocol.data_received(requests)
        for _ in range(50):
            await asyncio.sleep(0.001)
        return transport

    return asyncio.run(main())


async def _echo_path(method, path, headers, body):
    await asyncio.sleep(0.005 if path == "/slow" else 0)
    return Reply(200, f"{method} {path} {len(body)}".encode(), b"text/plain"), []


def test_pipelined_requests_answer_in_order_even_when_the_first_is_slow():
    transport = _run(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", _echo_path)
    first = transport.data.index(b"GET /slow 0")
    assert first < transport.data.index(b"POST /fast 3")
    assert transport.data.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert not transport.closed and not transport.paused


def test_one_write_holds_status_headers_and_body():
    transport = _run(b"GET /a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n", _echo_path)
    assert transport.data == b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 10\r\n\r\nGET /a/b 0"
    assert transport.writes == 1


def test_body_over_the_limit_is_refused_and_the_connection_closed():
    transport = _run(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + b"a" * 20, _echo_path, max_body=10)
    assert transport.data.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"exceeds the maximum allowed value of 10 bytes" in transport.data
    assert b"connection: close" in transport.data and transport.closed


def test_malformed_request_gets_400_and_close():
    transport = _run(b"NOT HTTP AT ALL\r\n\r\n", _echo_path)
    assert transport.data.startswith(b"HTTP/1.1 400 Bad Request\r\n") and transport.closed


def test_connection_close_is_honoured():
    transport = _run(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", _echo_path)
    assert b"connection: close\r\n" in transport.data and transport.closed


def test_expect_100_continue_is_answered_before_the_body():
    transport = _run(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi", _echo_path)
    assert transport.data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")


def test_a_dispatch_crash_is_a_500_and_the_connection_survives():
    async def crash(method, path, headers, body):
        raise RuntimeError("bug")

    transport = _run(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", crash)
    assert transport.data.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and not transport.closed


def test_one_read_of_many_pipelined_requests_is_no_oversized_head():
    """Head bytes count per request: a read that begins inside one head and holds 3,000 more
    requests (~93 KiB, past the 64 KiB head limit together) gets them all answered, no 431."""
    async def main() -> FakeTransport:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 20, Connections())
        protocol.connection_made(transport)
        protocol.data_received(b"GET /first HTTP/1.1\r\nHo")
        requests = b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3000))
        protocol.data_received(b"st: x\r\n\r\n" + requests + b"GET /tail")  # ... and the start of one more
        for _ in range(10_000):  # until all are answered (or a 431 closed the connection)
            if transport.closed or transport.data.count(b"HTTP/1.1 200 OK\r\n") == 3001:
                break
            await asyncio.sleep(0.001)
        return transport

    transport = asyncio.run(main())
    assert transport.data.count(b"HTTP/1.1 200 OK\r\n") == 3001 and b" 431 " not in transport.data


def test_reading_and_answering_wait_while_the_client_reads_nothing():
    async def main() -> FakeTransport:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 20, Connections())
        protocol.connection_made(transport)
        protocol.pause_writing()  # the socket's send buffer is full
        assert transport.paused
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.01)
        assert transport.data == b""  # nothing answered into a full buffer
        protocol.resume_writing()
        await asyncio.sleep(0.02)
        assert not transport.paused
        return transport

    transport = asyncio.run(main())
    assert transport.data.count(b"HTTP/1.1 200 OK\r\n") == 2


def test_a_request_refused_from_its_headers_is_answered_before_its_body():
    def admit(url, headers):
        return None if headers.get(b"authorization") == b"ok" else Reply(401, b'{"error":"no"}')

    async def main() -> FakeTransport:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 30, Connections(), admit=admit)
        protocol.connection_made(transport)
        protocol.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        assert transport.data.startswith(b"HTTP/1.1 401 ") and b"connection: close" in transport.data
        protocol.data_received(b"a" * 1_000_000)  # read and dropped
        assert not protocol.current.body and not transport.closed
        return transport

    asyncio.run(main())


def test_an_idle_keep_alive_connection_is_closed():
    async def main() -> FakeTransport:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 20, Connections(), idle_timeout=0.05)
        protocol.connection_made(transport)
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.03)
        assert not transport.closed
        await asyncio.sleep(0.05)
        return transport

    assert asyncio.run(main()).closed


def test_the_read_deadline_counts_from_each_request_s_first_byte():
    """The read timer is lazy: armed for an earlier wait, it must not cut a later request off
    early, but re-arm for that request's own deadline. (Margins of 0.1-0.4 s: a busy machine's
    late wake-ups cannot make the checks pass or fail by luck.)"""
    async def main() -> tuple[FakeTransport, list[bool]]:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 20, Connections(), read_timeout=0.5)
        protocol.connection_made(transport)
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")  # armed at 0 (the connection's wait)
        await asyncio.sleep(0.3)
        protocol.data_received(b"GET /b HTTP/1.1\r\n")  # begun at 0.3: due at 0.8, not at 0.5
        closed = []
        await asyncio.sleep(0.3)  # 0.6: the first arming has fired (0.5) and found time left
        closed.append(transport.closed)
        await asyncio.sleep(0.6)  # 1.2: past this request's deadline
        closed.append(transport.closed)
        return transport, closed

    transport, closed = asyncio.run(main())
    assert closed == [False, True]
    assert transport.data.count(b"HTTP/1.1 200") == 1 and b"HTTP/1.1 408" in transport.data


def test_a_keep_alive_connection_between_requests_is_not_cut_off_by_the_read_timer():
    async def main() -> FakeTransport:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 20, Connections(), read_timeout=0.05)
        protocol.connection_made(transport)
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.15)  # idle well past the read timeout: that is the idle timeout's business
        protocol.data_received(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.02)
        return transport

    transport = asyncio.run(main())
    assert not transport.closed and transport.data.count(b"HTTP/1.1 200") == 2


class _Later:
    """A dispatch_now that answers /now inside the call, /later from a later loop callback (as
    an inference's response arrives), and hands anything else to the task path."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.cancelled: list[str] = []

    def __call__(self, method, path, headers, body, answer):
        self.calls.append(path)
        if path == "/crash":
            raise RuntimeError("bug")
        if path == "/now":
            answer(Reply(400, b"refused at once", b"text/plain"), [])
            return lambda: None
        if path.startswith("/later"):
            asyncio.get_running_loop().call_later(0.005, answer, Reply(200, path.encode(), b"text/plain"), [])
            return lambda: self.cancelled.append(path)
        return _echo_path(method, path, headers, body)


def _protocol(dispatch_now: _Later) -> tuple[HttpProtocol, FakeTransport]:
    transport = FakeTransport()
    protocol = HttpProtocol(_echo_path, 1 << 20, Connections(), dispatch_now=dispatch_now)
    protocol.connection_made(transport)
    return protocol, transport


async def _answered(transport: FakeTransport, count: int, status: bytes = b"HTTP/1.1 ") -> None:
    """Wait (up to ~0.2 s) until `count` responses starting with `status` have been written."""
    for _ in range(100):
        if transport.data.count(status) >= count:
            return
        await asyncio.sleep(0.002)


@contextlib.contextmanager
def _no_cyclic_collector() -> Iterator[None]:
    """The cyclic garbage collector off: what is freed meanwhile went with its last reference."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_requests_answered_without_a_task_keep_their_order():
    later = _Later()

    async def main() -> FakeTransport:
        protocol, transport = _protocol(later)
        protocol.data_received(b"GET /later1 HTTP/1.1\r\nHost: x\r\n\r\nGET /now HTTP/1.1\r\nHost: x\r\n\r\n"
                               b"GET /task HTTP/1.1\r\nHost: x\r\n\r\nGET /later2 HTTP/1.1\r\nHost: x\r\n\r\n")
        await _answered(transport, 4)
        return transport

    data = asyncio.run(main()).data
    order = [data.index(b"/later1"), data.index(b"refused at once"), data.index(b"GET /task 0"), data.index(b"/later2")]
    assert order == sorted(order) and later.calls == ["/later1", "/now", "/task", "/later2"]


def test_requests_are_dispatched_once_the_loop_has_read_every_ready_connection():
    """Each connection's read only queues its request; the dispatches run after them, from the
    loop's next callbacks (an instance's thread woken by the first submit would otherwise
    fight the reading thread for the GIL)."""
    later = _Later()

    async def main() -> None:
        connections = [_protocol(later) for _ in range(3)]
        for index, (protocol, _) in enumerate(connections):
            protocol.data_received(b"GET /later%d HTTP/1.1\r\nHost: x\r\n\r\n" % index)
        assert later.calls == []
        await asyncio.sleep(0)
        assert later.calls == ["/later0", "/later1", "/later2"]
        await asyncio.sleep(0.02)
        assert all(transport.data.startswith(b"HTTP/1.1 200 OK") for _, transport in connections)

    asyncio.run(main())


def test_a_client_gone_before_its_dispatch_starts_nothing_and_one_gone_after_cancels():
    later = _Later()

    async def main() -> None:
        early, _ = _protocol(later)
        early.data_received(b"GET /later-early HTTP/1.1\r\nHost: x\r\n\r\n")
        early.connection_lost(None)
        gone, transport = _protocol(later)
        gone.data_received(b"GET /later-gone HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0)
        gone.connection_lost(None)
        await asyncio.sleep(0.02)
        assert transport.data == b""

    asyncio.run(main())
    assert later.calls == ["/later-gone"] and later.cancelled == ["/later-gone"]


def test_a_crash_in_dispatch_now_is_a_500_and_the_connection_goes_on() -> None:
    later = _Later()

    async def main() -> FakeTransport:
        protocol, transport = _protocol(later)
        protocol.data_received(b"GET /crash HTTP/1.1\r\nHost: x\r\n\r\nGET /later HTTP/1.1\r\nHost: x\r\n\r\n")
        await _answered(transport, 2)
        return transport

    transport = asyncio.run(main())
    assert transport.data.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"\r\n\r\n/later" in transport.data and not transport.closed


def test_an_answered_request_leaves_no_reference_cycle() -> None:
    """An inference's canceller leads back to its answer (the job holds the sink that answers
    it): once the answer is written the protocol drops the canceller, so the request's objects
    go with their last reference instead of waiting for the cyclic garbage collector, which ran
    every few requests and stopped the server for milliseconds (docs/benchmarks.md)."""

    class Job:
        def __init__(self, answer) -> None:
            self.answer = answer

        def cancel(self) -> None:
            pass

    jobs: list[weakref.ref[Job]] = []

    def dispatch_now(method, path, headers, body, answer):
        job = Job(answer)
        jobs.append(weakref.ref(job))
        asyncio.get_running_loop().call_soon(job.answer, Reply(200, b"ok", b"text/plain"), [])
        return job.cancel

    async def main() -> None:
        protocol, transport = _protocol(dispatch_now)
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        await _answered(transport, 2, b"HTTP/1.1 200 OK")
        assert transport.data.count(b"HTTP/1.1 200 OK") == 2
        assert len(jobs) == 2 and all(job() is None for job in jobs)  # freed without a collection

    with _no_cyclic_collector():
        asyncio.run(main())


def test_a_closed_connection_leaves_no_reference_cycle() -> None:
    """Its parser and idle timer call back into the protocol: dropped when the connection is
    lost, so a client that opens a connection per request leaves nothing to the collector."""

    async def main() -> weakref.ref[HttpProtocol]:
        transport = FakeTransport()
        protocol = HttpProtocol(_echo_path, 1 << 20, Connections(), idle_timeout=30.0)
        protocol.connection_made(transport)
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await _answered(transport, 1)
        protocol.connection_lost(None)
        return weakref.ref(protocol)

    with _no_cyclic_collector():
        gone = asyncio.run(main())
        assert gone() is None
