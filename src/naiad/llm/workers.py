"""The tensor-parallel worker processes: ranks 1..N-1 of the engine's model (rank 0 is the engine).

Rank 0 starts them (spawn: the engine process may hold threads or CUDA that a fork would copy
broken); each joins the process group (`parallel.init_group`), builds a `ModelRunner` over its
shard with its own KV cache, says "ready", then loops: receive a step, run the same forward as
rank 0 (the collectives inside it meet rank 0's), wait for the next one. Only rank 0 samples.

The steps travel over one pipe per worker, pickled once — not through a torch.distributed
broadcast: a worker waits for the next step for as long as the engine is idle, and a collective
would time out after `COLLECTIVE_TIMEOUT` (gloo and NCCL both enforce it), while a pipe read
waits forever and ends with EOF the moment rank 0's process dies, which is what stops orphaned
workers. A step's plan is a few lists of ints; the forward's collectives stay in torch.distributed.

Supervision: rank 0 checks that every worker is alive before sending a step, and when a step
fails it looks for a worker that exited; either way it raises `WorkerDied`, naming the rank and
its exit code. The group cannot go on without the rank (its process group is broken), so the
engine-core process fails the open requests and exits (see `engine_core`), and the model
instance reports itself not ready until it is loaded again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch

from naiad.llm.model_runner import ModelRunner, RunnerConfig, StepPlan
from naiad.llm.parallel import TensorParallel, destroy_group, free_loopback_port, init_group, rank_device

log = logging.getLogger(__name__)

_SHUTDOWN = b""  # an empty message: the worker leaves its loop


class WorkerDied(RuntimeError):
    """A tensor-parallel worker exited: the engine cannot run another step."""


def cpu_threads_per_rank(size: int) -> int:
    """The ranks share the machine's cores: each takes its share, or they fight over all of them."""
    return max(1, (os.cpu_count() or 1) // size)


def run_worker(config: RunnerConfig, rank: int, size: int, port: int, conn: Connection) -> None:
    """A worker process's entry point: join, load the shard, then run steps until told to stop."""
    config = dataclasses.replace(config, device=rank_device(config.device, rank))
    device = torch.device(config.device)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(size))
    try:
        tp = init_group(rank, size, port, device)
        runner = ModelRunner(config, tp)
    except Exception as error:  # reported to rank 0, which fails the engine's start with it
        log.exception("tensor-parallel worker %d could not start", rank)
        conn.send(("failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", None))
    try:
        while (message := conn.recv_bytes()) != _SHUTDOWN:
            plan: StepPlan = pickle.loads(message)
            with torch.inference_mode():
                runner.forward_plan(plan)
    except (EOFError, OSError):
        return  # rank 0 is gone: nothing left to serve
    destroy_group()


@contextlib.contextmanager
def _may_start_processes() -> Iterator[None]:
    """Let a daemonic process (the engine core is one) start the workers.

    multiprocessing forbids it because a daemon is killed at its parent's exit without stopping
    its own children; ours stop on their own, at EOF on their pipe from rank 0.
    """
    me = multiprocessing.current_process()
    was_daemon = me.daemon
    me.daemon = False
    try:
        yield
    finally:
        me.daemon = was_daemon


@dataclass(slots=True)
class _Worker:
    rank: int
    process: BaseProcess
    conn: Connection


class WorkerGroup:
    """Rank 0's handle on ranks 1..size-1: started before rank 0's own runner, which meets them in
    the process group; `send_step` is that runner's `send_step`."""

    def __init__(self, config: RunnerConfig, size: int) -> None:
        self.size = size
        self.port = free_loopback_port()
        self._threads: int | None = None  # rank 0's torch threads before it took its share
        self.workers: list[_Worker] = []
        with _may_start_processes():
            for rank in range(1, size):
                self.workers.append(self._start(config, rank))

    def _start(self, config: RunnerConfig, rank: int) -> _Worker:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        process = context.Process(
            target=run_worker, args=(config, rank, self.size, self.port, theirs), name=f"naiad-tp-rank{rank}",
            daemon=True,
        )
        process.start()
        theirs.close()  # the child's copy is its own: ours would hide its death
        return _Worker(rank, process, ours)

    def join(self, device: str | torch.device) -> TensorParallel:
        """Rank 0 joins the group (blocks until every worker has), on its share of the CPU's cores."""
        device = torch.device(device)
        if device.type == "cpu":
            self._threads = torch.get_num_threads()
            torch.set_num_threads(cpu_threads_per_rank(self.size))
        return init_group(0, self.size, self.port, device)

    def wait_ready(self) -> None:
        """Wait for every worker's shard to be loaded; raise with a worker's own error if one failed."""
        for worker in self.workers:
            try:
                status, message = worker.conn.recv()
            except (EOFError, OSError):
                raise WorkerDied(self._exit_message(worker, wait=5.0)) from None
            if status != "ready":
                raise RuntimeError(f"tensor-parallel worker {worker.rank} could not start: {message}")

    def start_failure(self, timeout: float = 5.0) -> str | None:
        """What a worker reported if it failed to start (rank 0's own error is then a consequence)."""
        for worker in self.workers:
            if worker.conn.poll(timeout):
                try:
                    status, message = worker.conn.recv()
                except (EOFError, OSError):
                    continue
                if status == "failed":
                    return f"tensor-parallel worker {worker.rank} could not start: {message}"
        return None

    def send_step(self, plan: StepPlan) -> None:
        self.check()
        message = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        for worker in self.workers:
            try:
                worker.conn.send_bytes(message)
            except OSError:
                raise WorkerDied(self._exit_message(worker, wait=1.0)) from None

    def check(self, wait: float = 0.0) -> None:
        """Raise `WorkerDied` if a worker has exited (waiting up to `wait` seconds for each to be
        seen exiting: after a failed collective, the socket closes before the process is reaped)."""
        for worker in self.workers:
            if wait:
                worker.process.join(wait)
            if not worker.process.is_alive():
                raise WorkerDied(self._exit_message(worker))

    def _exit_message(self, worker: _Worker, wait: float = 0.0) -> str:
        worker.process.join(wait)
        code = worker.process.exitcode
        how = "is not responding" if code is None else f"exited with code {code}"
        return (f"tensor-parallel worker {worker.rank} (pid {worker.process.pid}) {how}; "
                "the model must be reloaded")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers: a shutdown message, then a kill for those that do not leave."""
        for worker in self.workers:
            with contextlib.suppress(OSError):  # already gone
                worker.conn.send_bytes(_SHUTDOWN)
        for worker in self.workers:
            worker.process.join(timeout)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5)
            worker.conn.close()
        if self._threads is not None:
            torch.set_num_threads(self._threads)
