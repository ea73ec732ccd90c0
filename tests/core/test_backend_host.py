"""The server's side of the backend contract (`BackendHost`) where it touches the event loop."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import uvloop

from naiad.core.backend_host import BackendHost


def test_a_watch_stopped_by_an_unloading_thread_and_by_the_loop_leaves_a_reused_number_watched() -> None:
    """A model process's socket is unwatched twice when it exits while being unloaded: by the
    unloading thread (queued on the busy loop) and by the loop, which then closes the socket. If
    the loop reuses the number for a new connection before the queued stop runs, that stop must
    not remove the newcomer's watch."""
    loop = uvloop.new_event_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    host = BackendHost(SimpleNamespace(loop=loop))  # type: ignore[arg-type]
    model, model_peer = socket.socketpair()
    stop = host.watch(model.fileno(), lambda: None)
    assert stop is not None
    number = model.fileno()
    newcomer_read = threading.Event()
    pairs: list[tuple[socket.socket, socket.socket]] = []
    unloading_thread_queued = threading.Event()

    def loop_sees_the_exit() -> None:
        unloading_thread_queued.wait(5)
        time.sleep(0.3)  # the unloading thread's stop is in the loop's queue by now
        stop()
        model.close()
        newcomer, peer = socket.socketpair()  # takes the lowest free number: the model's
        pairs.append((newcomer, peer))
        loop.add_reader(newcomer.fileno(), newcomer_read.set)

    def unload() -> None:
        unloading_thread_queued.set()
        stop()

    try:
        loop.call_soon_threadsafe(loop_sees_the_exit)
        unloader = threading.Thread(target=unload)
        unloader.start()
        unloader.join(10)
        assert not unloader.is_alive()
        (newcomer, peer), = pairs
        assert newcomer.fileno() == number  # else the test shows nothing
        peer.send(b"x")
        assert newcomer_read.wait(5), "the queued stop removed the newcomer's watch"
        assert errors == []
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
        model_peer.close()
        for a, b in pairs:
            a.close()
            b.close()


def test_a_writable_watch_calls_back_while_there_is_room_and_stops_when_told() -> None:
    loop = uvloop.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    host = BackendHost(SimpleNamespace(loop=loop))  # type: ignore[arg-type]
    ours, theirs = socket.socketpair()
    calls: list[int] = []
    called = threading.Event()

    def on_writable() -> None:
        calls.append(threading.get_ident())
        called.set()

    try:
        stop = host.watch_writable(ours.fileno(), on_writable)
        assert stop is not None
        assert called.wait(5)  # an empty socket has room
        stop()
        seen = len(calls)
        time.sleep(0.2)
        assert len(calls) == seen  # stopped: no more calls though the room stays
        assert set(calls) == {runner.ident}  # on the loop's thread
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
        ours.close()
        theirs.close()
