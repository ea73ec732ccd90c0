"""The tensor- and pipeline-parallel worker processes: ranks 1..N-1 of the engine's model (rank 0 is
the engine), N = tensor_parallel_size x pipeline_parallel_size.

Rank 0 starts them (spawn: the engine process may hold threads or CUDA that a fork would copy
broken); each joins the process group (`parallel.init_group`), builds a `ModelRunner` over its
shard (under pipeline parallelism, its stage's layers) with its own KV cache, says "ready", then
loops: receive a step, run its part of the forward (the collectives and point-to-point transfers
inside it meet the other ranks'), wait for the next one. Only rank 0 samples.

The steps travel over one pipe per worker, pickled once — not through a torch.distributed
broadcast: a worker waits for the next step for as long as the engine is idle, and a collective
would time out after `COLLECTIVE_TIMEOUT` (gloo and NCCL both enforce it), while a pipe read
waits forever and ends with EOF the moment rank 0's process dies, which is what stops orphaned
workers. A step's plan is a few lists of ints; the forward's collectives stay in torch.distributed.

Supervision: rank 0 checks that every worker is alive before sending a step, and when a step
fails it looks for the workers that exited; either way it raises `WorkerDied`, naming each (rank,
stage, exit code; one killed by a signal first: the others' exits are its consequences). The
group cannot go on without the rank (its process group is broken), so the engine-core process
fails the open requests and exits (see `engine_core`), and the model instance reports itself not
ready until it is loaded again.
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

from naiad.llm.distributed.nodes import Cluster, NodeListener, RemoteProcess
from naiad.llm.distributed.parallel import TensorParallel, free_port, init_group, leave_process, rank_device
from naiad.llm.distributed.step_sync import TableMirror, WireStep
from naiad.llm.engine.model_runner import ModelRunner, RunnerConfig

log = logging.getLogger(__name__)

_SHUTDOWN = b""  # an empty message: the worker leaves its loop


class WorkerDied(RuntimeError):
    """A tensor- or pipeline-parallel worker exited: the engine cannot run another step."""


def cpu_threads_per_rank(size: int) -> int:
    """The ranks share the machine's cores: each takes its share, or they fight over all of them."""
    return max(1, (os.cpu_count() or 1) // size)


def worker_name(rank: int, tp_size: int, pp_size: int) -> str:
    """How errors name a worker: its rank, and under pipeline parallelism its stage."""
    if pp_size == 1:
        return f"tensor-parallel worker {rank}"
    stage, tp_rank = divmod(rank, tp_size)
    return f"pipeline worker {rank} (stage {stage}, tensor-parallel rank {tp_rank})"


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker reports once loaded: its stage's layers and the parameter bytes it holds."""

    layers: range
    parameter_bytes: int


def run_worker(config: RunnerConfig, rank: int, size: int, port: int, conn: Connection, tp_size: int = 0,
               host: str = "127.0.0.1", local_ranks: int = 0) -> None:
    """A worker process's entry point: join, load the shard, then run steps until told to stop.

    `tp_size` is the ranks of one pipeline stage (0: all `size`, no pipeline); the group meets at
    `host`:`port`; `local_ranks` is how many ranks share this machine (0: all `size`)."""
    local_ranks = local_ranks or size
    config = dataclasses.replace(config, device=rank_device(config.device, rank % local_ranks))
    device = torch.device(config.device)
    tp_size = tp_size or size
    name = worker_name(rank, tp_size, size // tp_size)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(local_ranks))
    try:
        tp = init_group(rank, size, port, device, tp_size, host)
        runner = ModelRunner(config, tp)
    except Exception as error:  # reported to rank 0, which fails the engine's start with it
        log.exception("%s could not start", name)
        conn.send(("failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", WorkerInfo(runner.model.model.layer_range, runner.weight_bytes())))
    try:
        tables = TableMirror()
        while (message := conn.recv_bytes()) != _SHUTDOWN:
            step: WireStep = pickle.loads(message)
            with torch.inference_mode():
                runner.forward_plan(tables.plan(step))
    except (EOFError, OSError):
        pass  # rank 0 is gone: nothing left to serve
    leave_process(0)


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
    name: str
    process: BaseProcess | RemoteProcess
    conn: Connection
    info: WorkerInfo | None = None


class WorkerGroup:
    """Rank 0's handle on ranks 1..size-1 (size = `tp_size x pp_size`): started before rank 0's own
    runner, which meets them in the process group; `send_step` is that runner's `send_step`."""

    def __init__(self, config: RunnerConfig, tp_size: int, pp_size: int = 1, cluster: Cluster | None = None) -> None:
        self.tp_size, self.pp_size = tp_size, pp_size
        self.size = size = tp_size * pp_size
        self.cluster = cluster = cluster or Cluster()
        self.local_ranks = cluster.ranks_per_node(size)  # this node's: ranks 0..local_ranks-1
        listener = None
        if cluster.active:  # the other nodes' ranks connect to rank 0 (naiad.llm.distributed.nodes)
            self.host, self.port = cluster.master_addr, cluster.master_port + 1
            listener = NodeListener(cluster, config, size, tp_size)
        else:
            self.host, self.port = "127.0.0.1", free_port()
        self._threads: int | None = None  # rank 0's torch threads before it took its share
        self.workers: list[_Worker] = []
        with _may_start_processes():
            for rank in range(1, self.local_ranks):
                self.workers.append(self._start(config, rank))
        if listener is not None:
            try:
                remote = listener.accept_ranks()
            except Exception:
                self.close()
                raise
            listener.close()  # every rank is in: nobody else may join
            for rank, (conn, process) in sorted(remote.items()):
                name = f"{worker_name(rank, tp_size, pp_size)} on node {process.node}"
                self.workers.append(_Worker(rank, name, process, conn))

    def _start(self, config: RunnerConfig, rank: int) -> _Worker:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        process = context.Process(
            target=run_worker,
            args=(config, rank, self.size, self.port, theirs, self.tp_size, self.host, self.local_ranks),
            name=f"naiad-rank{rank}", daemon=True,
        )
        process.start()
        theirs.close()  # the child's copy is its own: ours would hide its death
        return _Worker(rank, worker_name(rank, self.tp_size, self.pp_size), process, ours)

    def join(self, device: str | torch.device) -> TensorParallel:
        """Rank 0 joins the group (blocks until every worker has), on its share of the CPU's cores."""
        device = torch.device(device)
        if device.type == "cpu":
            self._threads = torch.get_num_threads()
            torch.set_num_threads(cpu_threads_per_rank(self.local_ranks))
        return init_group(0, self.size, self.port, device, self.tp_size, self.host)

    def wait_ready(self) -> None:
        """Wait for every worker's shard to be loaded; raise with a worker's own error if one failed."""
        for worker in self.workers:
            try:
                status, message = worker.conn.recv()
            except (EOFError, OSError):
                raise WorkerDied(self._exit_message(worker, wait=5.0)) from None
            if status != "ready":
                raise RuntimeError(f"{worker.name} could not start: {message}")
            worker.info = message

    def start_failure(self, timeout: float = 5.0) -> str | None:
        """What a worker reported if it failed to start (rank 0's own error is then a consequence)."""
        for worker in self.workers:
            if worker.conn.poll(timeout):
                try:
                    status, message = worker.conn.recv()
                except (EOFError, OSError):
                    continue
                if status == "failed":
                    return f"{worker.name} could not start: {message}"
        return None

    def send_step(self, step: WireStep) -> None:
        self.check()
        message = pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)
        for worker in self.workers:
            try:
                worker.conn.send_bytes(message)
            except OSError:
                raise WorkerDied(self._exit_message(worker, wait=1.0)) from None

    def check(self, wait: float = 0.0) -> None:
        """Raise `WorkerDied` if a worker has exited (waiting up to `wait` seconds for each to be
        seen exiting: after a failed collective, the socket closes before the process is reaped).

        It names every exited worker, one killed by a signal first: when a pipeline stage dies,
        the ranks that sent to it or shared its collectives fail in turn, with exit code 1."""
        dead = []
        for worker in self.workers:
            if wait:
                worker.process.join(wait)
            if not worker.process.is_alive():
                dead.append(worker)
        if dead:
            dead.sort(key=lambda worker: (worker.process.exitcode or 0) >= 0)  # signals (< 0) first
            raise WorkerDied("; ".join(self._exit_message(worker, reload=False) for worker in dead)
                             + "; the engine must be restarted")

    def _exit_message(self, worker: _Worker, wait: float = 0.0, reload: bool = True) -> str:
        worker.process.join(wait)
        code = worker.process.exitcode
        if isinstance(worker.process, RemoteProcess):
            how = "is not responding" if worker.process.is_alive() else "closed its connection"
        else:
            how = "is not responding" if code is None else f"exited with code {code}"
        return f"{worker.name} (pid {worker.process.pid}) {how}" + ("; the engine must be restarted" if reload else "")

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
