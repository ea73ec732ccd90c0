"""Keeps an llm model instance's engine core running: after it dies, a fresh one is started.

A core dies when its process is killed, when a tensor-parallel worker dies (the core exits: the
group cannot go on without the rank), or when it crashes. The `EngineClient` has already failed
the requests that were open; the supervisor then starts a new core (a new process, with its
workers) on a thread of its own, after a backoff that doubles with each failed attempt
(`RestartPolicy`). Until it is ready the instance is not ready and new requests are refused with
`reason` (503, as vLLM's server answers while its engine is dead: a client may retry). After
`limit` consecutive failed attempts it gives up: the instance stays not ready, and `reason`
carries the last error until the model is loaded again.

Attempts count as consecutive across deaths unless the core lived at least `stable_secs`: a core
that starts and dies again at once (a worker that cannot stay up) ends in the limit too, rather
than restarting forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from naiad.channel import Watch
from naiad.llm.engine.engine_core import AddRequest, CoreMessage, EngineClient, EngineInfo
from naiad.llm.engine.llm_engine import EngineConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How a dead engine core is restarted: `limit` attempts in a row at most (0: never), the
    first after `backoff` seconds, each later one after twice the wait of the one before, up to
    `max_backoff`."""

    limit: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0
    stable_secs: float = 60.0

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"the restart limit must be 0 or more, got {self.limit}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"the restart backoff must be 0 or more seconds, got {self.backoff}")

    def delay(self, attempt: int) -> float:
        """The wait before attempt `attempt` (1, 2, ...)."""
        return min(self.backoff * 2 ** (attempt - 1), self.max_backoff)


class EngineSupervisor:
    """One instance's engine core, restarted when it dies; `add`/`abort` go to the current one.

    The first core starts in the constructor (its failure is the model load's, a RuntimeError);
    later ones on the restart thread. `on_message` is the same callback for every core.
    """

    def __init__(self, config: EngineConfig, on_message: Callable[[CoreMessage], None], *, model_name: str,
                 in_process: bool = False, policy: RestartPolicy | None = None, watch: Watch | None = None,
                 watch_writable: Watch | None = None) -> None:
        self.config = config
        self.model_name = model_name
        self.policy = policy or RestartPolicy()
        self._on_message = on_message
        self._in_process = in_process
        # The server's event loop reads each core's outputs and sends what waits for room (EngineClient).
        self._watch, self._watch_writable = watch, watch_writable
        self._lock = threading.Lock()  # guards client, reason, restarts and closed
        self._wake = threading.Event()  # set by close(): cuts a backoff short
        self._restarter: threading.Thread | None = None
        self._attempts = 0  # restart attempts since the last core that stayed up
        self.restarts = 0  # cores started after one died
        self.reason = ""  # why no core serves ("" while one does)
        self.closed = False
        self.client = self._start()
        self._started_at = time.monotonic()
        self.info: EngineInfo = self.client.info

    def _start(self) -> EngineClient:
        client = EngineClient(self.config, self._on_message, in_process=self._in_process,
                              name=f"llm-{self.model_name}", on_exit=self._died, watch=self._watch,
                              watch_writable=self._watch_writable)
        where = f"pid {client.pid}" if client.pid is not None else "a thread"
        log.info("model '%s': engine core started (%s)", self.model_name, where)
        return client

    # ------------------------------------------------------------------------------ serving

    def add(self, request: AddRequest) -> None:
        """Hand a request to the core; RuntimeError (saying why) while there is none."""
        with self._lock:
            client, reason = self.client, self.reason
        try:
            client.add(request)
        except RuntimeError:
            raise RuntimeError(reason or "its engine core is not running") from None

    def abort(self, request_ids: list[str]) -> None:
        self.client.abort(request_ids)

    def is_ready(self) -> bool:
        with self._lock:
            return not self.closed and not self.reason and self.client.is_alive()

    def not_ready_reason(self) -> str:
        """Why it does not serve now ("" when it does)."""
        with self._lock:
            if self.closed:
                return "the model is unloading"
            if self.reason or self.client.is_alive():
                return self.reason
        return "its engine core is not running"

    # ---------------------------------------------------------------------------- restarting

    def _died(self, cause: str) -> None:
        """The client's reader thread: the core ended on its own. Restart it, off this thread."""
        with self._lock:
            if self.closed:
                return
            if time.monotonic() - self._started_at >= self.policy.stable_secs:
                self._attempts = 0
            if self.policy.limit == 0:
                self.reason = f"its engine core died and is not restarted (engine_restart_limit 0): {cause}"
                log.error("model '%s': %s", self.model_name, self.reason)
                return
            self.reason = f"its engine core died ({cause}); restarting it"
            self._restarter = threading.Thread(target=self._restart, args=(cause,),
                                               name=f"llm-{self.model_name}-restart", daemon=True)
        log.error("model '%s': its engine core died: %s", self.model_name, cause)
        self._restarter.start()

    def _restart(self, cause: str) -> None:
        self.client.close(timeout=5)  # reaps the dead process and closes its pipe
        last_error = cause
        while self._attempts < self.policy.limit:
            self._attempts += 1
            attempt, delay = self._attempts, self.policy.delay(self._attempts)
            with self._lock:
                self.reason = (f"its engine core died ({cause}); restarting it "
                               f"(attempt {attempt} of {self.policy.limit})")
            log.info("model '%s': restarting its engine core in %.1f s (attempt %d of %d)",
                     self.model_name, delay, attempt, self.policy.limit)
            if self._wake.wait(delay):
                return  # closed
            try:
                client = self._start()
            except RuntimeError as error:
                last_error = str(error)
                log.error("model '%s': restarting its engine core failed (attempt %d of %d): %s",
                          self.model_name, attempt, self.policy.limit, last_error)
                continue
            with self._lock:
                installed = not self.closed
                if installed:
                    self.client, self.reason = client, ""
                    self.restarts += 1
                    self._started_at = time.monotonic()
            if not installed:  # closed while it started
                client.close()
                return
            log.info("model '%s': engine core restarted; the model is ready", self.model_name)
            return
        with self._lock:
            self.reason = (f"its engine core died and {self.policy.limit} restart attempt(s) failed; "
                           f"the last error: {last_error}")
        log.error("model '%s': %s; it stays not ready until it is loaded again", self.model_name, self.reason)

    def close(self, timeout: float = 30) -> None:
        """Stop the core, and a restart in progress (a core it is starting closes once started)."""
        with self._lock:
            self.closed = True
            client, restarter = self.client, self._restarter
        self._wake.set()
        if restarter is not None and restarter is not threading.current_thread():
            restarter.join(timeout)
        client.close()
