"""Workers for scheduler tests (scheduling.base.Worker): a blocking callable on a thread of its
own, like a framework backend's instance, and a hand-driven one, like a model process."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from naiad.scheduling.base import Job


class ThreadWorker:
    """Runs `runner(jobs)` (blocking) on its own thread, one batch at a time, then reports the
    batch executed."""

    def __init__(self, runner: Callable[[list[Job]], None], depth: int = 1) -> None:
        self.runner = runner
        self.depth = depth
        self._work: collections.deque[tuple[list[Job], Callable[[], None]]] = collections.deque()
        self._wake = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def run(self, jobs: list[Job], executed: Callable[[], None]) -> bool:
        with self._wake:
            self._work.append((jobs, executed))
            self._wake.notify()
        return True

    def set_on_room(self, callback: Callable[[], None]) -> None:
        pass

    def _loop(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._work)
                jobs, executed = self._work.popleft()
            self.runner(jobs)
            executed()


def threads(*runners: Callable[[list[Job]], None]) -> list[ThreadWorker]:
    return [ThreadWorker(runner) for runner in runners]


class FakeWorker:
    """Takes batches while it has `room` (else refuses them); `finish()` ends the oldest one,
    freeing room, as a model process's answer would."""

    def __init__(self, room: int, depth: int = 1 << 20) -> None:
        self.room = room
        self.depth = depth
        self.started: list[str] = []
        self.batches: list[list[str]] = []
        self.on_room: Callable[[], None] | None = None
        self.lock = threading.Lock()
        self._executed: collections.deque[Callable[[], None]] = collections.deque()

    def run(self, jobs: list[Job], executed: Callable[[], None]) -> bool:
        with self.lock:
            if self.room == 0:
                return False
            self.room -= 1
            self.started.extend(j.request.id for j in jobs)
            self.batches.append([j.request.id for j in jobs])
            self._executed.append(executed)
        return True

    def set_on_room(self, callback: Callable[[], None]) -> None:
        self.on_room = callback

    def finish(self) -> None:
        with self.lock:
            self.room += 1
            executed = self._executed.popleft() if self._executed else None
        if executed is not None:
            executed()
        assert self.on_room is not None
        self.on_room()


class PullWorker:
    """Like a framework backend's instance under the default scheduler (scheduling.base.PullingWorker):
    its own thread takes the next jobs whenever it is idle and runs `runner(jobs)` (blocking);
    with `here`, an idle one also runs jobs on the thread that submits them (`run_here`)."""

    depth = 1

    def __init__(self, runner: Callable[[list[Job]], None], here: bool = False) -> None:
        self.runner = runner
        self.here = here
        self.thread: threading.Thread | None = None
        self._executing = threading.Lock()  # one batch at a time, whichever thread runs it

    def run(self, jobs: list[Job], executed: Callable[[], None]) -> bool:
        raise AssertionError("a pulling worker is never handed batches")

    def set_on_room(self, callback: Callable[[], None]) -> None:
        pass

    def run_here(self, jobs: list[Job]) -> bool:
        if not self.here or not self._executing.acquire(blocking=False):
            return False
        try:
            self.runner(jobs)
        finally:
            self._executing.release()
        return True

    def pull(self, take: Callable[[], list[Job] | None]) -> None:
        def serve() -> None:
            while (jobs := take()) is not None:
                with self._executing:
                    self.runner(jobs)

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
