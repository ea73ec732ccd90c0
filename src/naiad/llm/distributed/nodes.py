"""Multi-node parallelism: ranks of one engine on several machines.

One naiad serves the model on node 0 (its engine is rank 0); every other node runs a node agent,
`naiad llm-node --master-addr HOST --master-port PORT --node-rank N`, with the same model files at
the same path and the same secret in `NAIAD_CLUSTER_KEY`. Ranks are split into equal, contiguous
shares per node (`ranks_per_node = tensor x pipeline size / nnodes`): node 0 holds ranks 0..k-1,
node n ranks n*k..n*k+k-1, so with pipeline parallelism a whole stage (tensor-parallel group)
stays on one node and only the stage-to-stage hidden states cross the network.

Rank 0 listens at `master_addr:master_port` (multiprocessing's connection listener: pickled
messages over TCP, each side proving it knows the key by HMAC before anything is read). A node
agent connects, says its node rank (or asks for the next free one) and gets the engine's
`NodeAssignment` (the runner config, the
ranks it runs, where the process group meets: `master_addr:master_port + 1`); it starts one process
per rank, each of which connects again, says its rank, and from then on is driven exactly like a
local worker over that connection (`naiad.llm.distributed.workers.run_worker`): steps in, "ready" out, EOF when
rank 0 is gone. The agent then waits for the next engine (after a restart of the engine core,
say) unless told `--once`.

Supervision of a remote rank has no process to look at: it is alive while its connection is
open; a remote rank that dies closes it (its host's kernel does), which rank 0 reads as an exit.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runner imports torch; an agent imports it only in its ranks' processes
    from naiad.llm.engine.model_runner import RunnerConfig

log = logging.getLogger(__name__)

KEY_ENV = "NAIAD_CLUSTER_KEY"
#: How long rank 0 waits for every node's ranks to connect, and an agent for rank 0 to listen.
NODE_WAIT_SECS = 300.0


@dataclass(frozen=True, slots=True)
class Cluster:
    """Where the engine's ranks run: `nnodes` machines meeting at rank 0's address."""

    nnodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500  # the step channel; the process group meets at the next port

    @property
    def active(self) -> bool:
        return self.nnodes > 1

    def ranks_per_node(self, size: int) -> int:
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be at least 1, got {self.nnodes}")
        if size % self.nnodes:
            raise ValueError(f"{size} ranks (tensor_parallel_size x pipeline_parallel_size) do not split "
                             f"evenly over {self.nnodes} nodes")
        return size // self.nnodes

    def check(self, size: int) -> None:
        """Refuse a cluster the ranks cannot use, before any process starts."""
        if self.ranks_per_node(size) and self.active and not cluster_key():
            raise ValueError(f"a multi-node engine needs the shared secret in ${KEY_ENV} on every node")


#: What an agent started without a node rank asks for: rank 0 hands out the next free node (the
#: pods of one Kubernetes Deployment have no ordinal to take theirs from).
ANY_NODE = 0


def _listen_host(master_addr: str) -> str:
    """Where rank 0 listens: loopback stays loopback (one machine); any other address is taken to
    be this machine's name on the cluster's network (a host, a DNS name of a Service), so listen on
    every interface rather than resolve it here."""
    return master_addr if master_addr in ("127.0.0.1", "localhost", "::1") else ""


def cluster_key() -> bytes:
    return os.environ.get(KEY_ENV, "").encode()


@dataclass(frozen=True, slots=True)
class NodeAssignment:
    """What rank 0 tells a node agent: what to load, which ranks to run, where the group meets."""

    config: RunnerConfig
    size: int
    tp_size: int
    ranks: list[int]
    group_host: str
    group_port: int


class RemoteProcess:
    """A rank on another node, seen through its connection (the `multiprocessing.Process` calls
    `WorkerGroup` makes): alive while the connection is open."""

    def __init__(self, conn: Connection, pid: int, node: int) -> None:
        self._conn = conn
        self.pid = pid
        self.node = node
        self._closed = False

    @property
    def exitcode(self) -> int | None:
        return None  # a remote exit status is not known here

    def is_alive(self) -> bool:
        if self._closed:
            return False
        try:
            # A remote rank sends nothing after "ready": readable means closed.
            if self._conn.poll(0):
                self._conn.recv_bytes()
        except (EOFError, OSError):
            self._closed = True
        return not self._closed

    def join(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or 0.0)
        while self.is_alive() and time.monotonic() < deadline:
            self._conn.poll(min(0.1, max(0.0, deadline - time.monotonic())))

    def kill(self) -> None:
        """Nothing to kill from here: closing the connection ends the remote rank (EOF)."""
        self._conn.close()
        self._closed = True


class NodeListener:
    """Rank 0's side: accept every other node's agent and ranks."""

    def __init__(self, cluster: Cluster, config: RunnerConfig, size: int, tp_size: int) -> None:
        self.cluster = cluster
        self.per_node = cluster.ranks_per_node(size)
        self._assignment = {
            node: NodeAssignment(config, size, tp_size, list(range(node * self.per_node, (node + 1) * self.per_node)),
                                 cluster.master_addr, cluster.master_port + 1)
            for node in range(1, cluster.nnodes)
        }
        self._given: set[int] = set()  # nodes whose agent has its assignment
        self._listener = Listener((_listen_host(cluster.master_addr), cluster.master_port), authkey=cluster_key())

    def accept_ranks(self, timeout: float | None = None) -> dict[int, tuple[Connection, RemoteProcess]]:
        """Wait until every remote rank has connected: {rank: (its connection, its process view)}."""
        timeout = NODE_WAIT_SECS if timeout is None else timeout
        expected = {rank for assignment in self._assignment.values() for rank in assignment.ranks}
        ranks: dict[int, tuple[Connection, RemoteProcess]] = {}
        failure: list[BaseException] = []

        def accept() -> None:
            while len(ranks) < len(expected):
                try:
                    conn = self._listener.accept()
                except (multiprocessing.AuthenticationError, EOFError, ConnectionError) as error:
                    failure[:] = [error]  # a peer without the key, or one that hung up: not ours
                    log.warning("refused a connection to the node listener: %s", error)
                    continue
                except OSError as error:  # the listener was closed: the wait is over
                    failure.append(error)
                    return
                try:
                    self._greet(conn, ranks)
                except (EOFError, OSError, ValueError, TypeError) as error:
                    conn.close()
                    log.warning("refused a peer of the node listener: %s", error)

        thread = threading.Thread(target=accept, name="naiad-node-listener", daemon=True)
        thread.start()
        thread.join(timeout)
        if len(ranks) < len(expected):
            self.close()
            missing = sorted(expected - ranks.keys())
            nodes = sorted({rank // self.per_node for rank in missing})
            reason = f": {failure[0]}" if failure else ""
            raise RuntimeError(
                f"node(s) {nodes} did not connect their ranks {missing} to {self.cluster.master_addr}:"
                f"{self.cluster.master_port} within {timeout:.0f}s (start `naiad llm-node` there){reason}")
        return ranks

    def _greet(self, conn: Connection, ranks: dict[int, tuple[Connection, RemoteProcess]]) -> None:
        kind, number, pid = conn.recv()
        if kind == "node" and number == ANY_NODE:  # the lowest node not handed out yet
            number = min((node for node in self._assignment if node not in self._given), default=-1)
        if kind == "node" and number in self._assignment and number not in self._given:
            self._given.add(number)
            conn.send(self._assignment[number])
            conn.close()  # the agent's ranks connect on their own
        elif kind == "rank" and self.per_node <= number < self.per_node * self.cluster.nnodes:
            ranks[number] = (conn, RemoteProcess(conn, pid, number // self.per_node))
        else:
            conn.close()
            log.warning("refused a %s %s that is not part of this engine", kind, number)

    def close(self) -> None:
        self._listener.close()


# ---------------------------------------------------------------------------------- node agent


def _connect(cluster: Cluster, deadline: float) -> Connection:
    """Connect to rank 0, retrying while it is not listening yet."""
    while True:
        try:
            return Client((cluster.master_addr, cluster.master_port), authkey=cluster_key())
        except (ConnectionRefusedError, ConnectionResetError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _run_remote_rank(cluster: Cluster, rank: int, assignment: NodeAssignment, local_ranks: int) -> None:
    """A remote rank's process: connect, say who it is, then serve steps as a local worker does."""
    from naiad.llm.distributed.workers import run_worker

    conn = Client((cluster.master_addr, cluster.master_port), authkey=cluster_key())
    conn.send(("rank", rank, os.getpid()))
    run_worker(assignment.config, rank, assignment.size, assignment.group_port, conn, assignment.tp_size,
               host=assignment.group_host, local_ranks=local_ranks)


def serve_node(cluster: Cluster, node_rank: int, once: bool = False, wait: float = NODE_WAIT_SECS) -> int:
    """The node agent: run this node's ranks of each engine that rank 0 starts (one if `once`)."""
    if not cluster_key():
        raise ValueError(f"set the cluster's shared secret in ${KEY_ENV}")
    if not 0 <= node_rank < cluster.nnodes:
        raise ValueError(f"node rank must be in 1..{cluster.nnodes - 1} (node 0 runs the engine), or 0 for any, "
                         f"got {node_rank}")
    status = 0
    while True:
        conn = _connect(cluster, time.monotonic() + (wait if once else float("inf")))
        conn.send(("node", node_rank, os.getpid()))
        try:
            assignment: NodeAssignment = conn.recv()
        except EOFError:  # refused: not a node this engine expects
            conn.close()
            which = "any more nodes" if node_rank == ANY_NODE else f"node {node_rank}"
            raise RuntimeError(f"{cluster.master_addr}:{cluster.master_port} has no place for {which}") from None
        conn.close()
        node = assignment.ranks[0] // len(assignment.ranks)
        log.info("node %d: running ranks %s of %s", node, assignment.ranks, assignment.config.model)
        context = multiprocessing.get_context("spawn")
        processes = [context.Process(target=_run_remote_rank, args=(cluster, rank, assignment, len(assignment.ranks)),
                                     name=f"naiad-rank{rank}") for rank in assignment.ranks]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        status = max((abs(process.exitcode or 0) for process in processes), default=0)
        log.info("node %d: the engine's ranks ended (exit status %d)", node, status)
        if once:
            return status
