"""One model process seen from the server: start it, talk to it, notice when it dies.

`StubProcess` owns the child process, the socket pair, the server's arena (what the server writes
for the model: request inputs, BLS outputs) and the map of the model's arena (its outputs, BLS
inputs). It starts a reader thread once the model initialized; every message after that goes to
the `on_message` callback, and end of stream (the process died or closed) to `on_exit`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from typing import Any

from naiad.backends.python import messages as p
from naiad.backends.python.shm import Arena, PendingFrees, SegmentMap
from naiad.channel import Watch
from naiad.errors import InternalError, Unavailable

log = logging.getLogger("naiad.backends.python")

#: how many finished-with locations wait before they go back without other traffic
FREES_FLUSH = 64
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


def log_from_model(model: str, message: p.Log) -> None:
    """A pb_utils.Logger line from model code, in the server's log."""
    level = _LOG_LEVELS.get(message.level, logging.INFO)
    if log.isEnabledFor(level):
        log.log(level, "%s:%d] %s: %s", os.path.basename(message.filename), message.line, model, message.message)


class StubProcess:
    def __init__(self, name: str, python: str, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self._python = python
        self._env = env
        self.frees = PendingFrees()  # the model's allocations the server is done with
        self.segments = SegmentMap(self.frees)
        self.channel: p.Channel | None = None
        self.arena: Arena | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._unwatch: Callable[[], None] | None = None  # stops the event loop's reading
        self._outbox: list[Any] = []  # messages gathered during one event-loop turn
        self._outbox_lock = threading.Lock()
        self._early: list[Any] = []  # messages the model sent before it was ready, for `run`

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            command = [self._python, "-m", "naiad.backends.python.stub", str(theirs.fileno())]
            # A session of its own: Ctrl-C or a signal to the server's process group must not kill
            # the model before the server unloads it (it exits by itself when the server goes away).
            self.process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=self._env,
                                            start_new_session=True)
        except OSError as error:
            ours.close()
            raise Unavailable(f"failed to start the model process for '{self.name}': {error}") from None
        finally:
            theirs.close()
        self.channel = p.Channel(ours)
        self.arena = Arena(f"naiad-{self.name}", self._announce)

    def handshake(self, first: p.Init | p.AutoComplete, timeout: float) -> p.Ready | p.AutoCompleted:
        """Send the first message and wait for the model's answer. Logs may come first; other
        messages sent before the answer (custom metrics created in initialize) wait for `run`."""
        assert self.channel is not None
        self.channel.send(first)
        self.channel.sock.settimeout(timeout)
        try:
            while True:
                message = self.channel.recv()
                if isinstance(message, p.Ready | p.AutoCompleted):
                    return message
                if isinstance(message, p.Log):
                    log_from_model(self.name, message)
                elif isinstance(message, p.Segment):
                    self.segments.add(message.segment, self.channel.take_fd(), message.size)
                else:
                    self._early.append(message)
        except p.ChannelClosed as error:
            if "timed out" in str(error):
                raise Unavailable(f"timed out after {timeout:g} s waiting for the model process of "
                                  f"'{self.name}' to start") from None
            code = self._exit_code()
            raise Unavailable(f"the model process of '{self.name}' exited during start-up (exit code {code})"
                              ) from None
        finally:
            self.channel.sock.settimeout(None)

    def _exit_code(self) -> int | None:
        """The exit status of a process whose socket just closed (it may not be reaped yet)."""
        if self.process is None:
            return None
        try:
            return self.process.wait(0.5)
        except subprocess.TimeoutExpired:
            return None

    def run(self, on_message: Callable[[Any], None], on_exit: Callable[[], None],
            watch: Watch | None = None, watch_writable: Watch | None = None) -> None:
        """Hand every message from now on to `on_message` and end of stream to `on_exit`: from
        the server's event loop when `watch` is given (no thread hand-off: the loop that answers
        clients reads the model's answers), else from a reader thread of this process's own.
        With the loop reading, sends never wait for the model to read (`Channel`): what the
        socket cannot take goes out when `watch_writable` says it has room."""
        assert self.channel is not None
        # First what came before (or with) the handshake's answer: the event loop is only woken by
        # new bytes, and these are already read.
        early, self._early = self._early, []
        for message in early:
            on_message(message)
        while self.channel.has_frame():
            self._dispatch(self.channel.recv(), on_message)
        if watch is not None:
            self.channel.set_nonblocking()

            def readable() -> None:
                try:
                    messages = self.channel.recv_ready() if self.channel is not None else []
                except p.ChannelClosed:
                    if self._unwatch is not None:
                        self._unwatch()
                    on_exit()
                    return
                for message in messages:
                    if isinstance(message, p.Segment):
                        self._dispatch(message, on_message)
                    else:  # (most messages: `_dispatch`'s other branch without its call)
                        on_message(message)

            # Safe to call more than once, from the loop or an unloading thread (Host.watch).
            self._unwatch = watch(self.channel.sock.fileno(), readable)
            if self._unwatch is not None:
                if watch_writable is not None:
                    self.channel.never_wait(watch_writable)
                return
            self.channel.sock.setblocking(True)  # no loop after all: read on a thread

        def read() -> None:
            assert self.channel is not None
            try:
                while True:
                    self._dispatch(self.channel.recv(), on_message)
            except p.ChannelClosed:
                pass
            except Exception:  # a bug here must not leave requests waiting forever
                log.exception("model process reader for '%s' failed", self.name)
            on_exit()

        self._reader = threading.Thread(target=read, name=f"{self.name}-reader", daemon=True)
        self._reader.start()

    def _dispatch(self, message: Any, on_message: Callable[[Any], None]) -> None:
        if isinstance(message, p.Segment):
            assert self.channel is not None
            self.segments.add(message.segment, self.channel.take_fd(), message.size)
        else:
            on_message(message)

    def send(self, message: Any) -> None:
        if self.channel is None:
            raise InternalError(f"the model process of '{self.name}' is not running")
        self.channel.send(message)

    def send_soon(self, message: Any, call_soon: Callable[[Callable[[], None]], bool] | None) -> None:
        """Send `message` with whatever else the event loop sends this process in this turn (one
        write, one wake-up of the model process for all of them); at once off the loop."""
        with self._outbox_lock:
            if self._outbox:
                self._outbox.append(message)
                return
            if call_soon is not None and call_soon(self.flush):
                self._outbox.append(message)
                return
        self.send(message)

    def send_now(self, message: Any) -> None:
        """Send `message` at once, after whatever `send_soon` holds (in order, in one write)."""
        if self.channel is None:
            raise InternalError(f"the model process of '{self.name}' is not running")
        if not self._outbox:
            self.channel.send(message)  # (nearly always: nothing else was sent this turn)
            return
        with self._outbox_lock:
            messages, self._outbox = self._outbox, []
        messages.append(message)
        self.channel.send_many(messages)

    def flush(self) -> None:
        """Send what `send_soon` holds for the end of this turn of the event loop, now."""
        if not self._outbox:
            return  # (most calls from an answer's handling) a message added later has a flush coming
        with self._outbox_lock:
            messages, self._outbox = self._outbox, []
        if messages and self.channel is not None:
            try:  # noqa: SIM105 - contextlib.suppress is three calls more, once or twice a request
                self.channel.send_many(messages)
            except p.ChannelClosed:
                pass  # the exit handler fails what was in flight

    def take_frees(self) -> list[int]:
        items = self.frees.take()
        return p.flat_frees(items) if items else []

    def flush_frees(self) -> None:
        """Give back what the server finished reading, when enough waits and nothing else goes out."""
        if len(self.frees) >= FREES_FLUSH:
            self.send(p.Frees(self.take_frees()))

    def _announce(self, segment: int, fd: int, size: int) -> None:
        assert self.channel is not None
        self.channel.send(p.Segment(segment, size), fds=(fd,))

    def stop(self, timeout: float) -> None:
        """Ask the model to finalize and exit; kill it after `timeout` seconds."""
        if self.channel is not None:
            with contextlib.suppress(p.ChannelClosed):
                self.channel.send(p.Shutdown())
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("model process of '%s' did not exit in %g s: killing it", self.name, timeout)
                self.process.kill()
                self.process.wait()
        self.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.close()

    def close(self) -> None:
        if self._unwatch is not None:
            self._unwatch()  # before the socket closes: its number may be reused at once
        if self.channel is not None:
            self.channel.close()  # (stops the loop's sending of a backlog first)
        if self.arena is not None:
            self.arena.close()
        # the model's segments stay mapped while the server still holds views of them (responses
        # being written): the mappings go with the last view
