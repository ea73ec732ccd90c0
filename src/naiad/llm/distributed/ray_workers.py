"""Ranks 1..N-1 of a tensor- or pipeline-parallel engine as Ray actors: `WorkerGroup`'s interface,
with Ray in place of spawned processes (the optional `ray` extra; never imported otherwise).

Placement (the trap of vLLM issue #30016): an actor created with only `num_cpus` / `num_gpus`
goes wherever Ray finds room, whatever placement group the caller reserved. Here every rank is
pinned to its own bundle: rank r runs in bundle r of the placement group
(`PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=r)`), with the
bundle's CPUs (and GPU) as its resources. The group has one bundle per rank; bundle 0 is rank 0's,
the engine's own process (not an actor): it reserves rank 0's share where the engine runs. Pass
the group explicitly (`placement_group=`); without one, a group is created with `strategy`
(PACK: one node if it fits; STRICT_SPREAD: one rank per node), bundle 0 pinned to the engine's
node, and removed at `close`.

The rendezvous: rank 0 (in the engine) listens on its node's Ray IP (`ray.util.get_node_ip_address`),
not 127.0.0.1, so that ranks on other nodes reach it; gloo and NCCL are pointed at the network
interface that holds each rank's node IP (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, unless set),
since the host name's address may be one that other nodes cannot reach.

Steps: `actor.step.remote(plan)` per worker, fired and forgotten — Ray runs one caller's calls to
an actor in the order they were made, as the pipe of `WorkerGroup` does. A rank whose step fails
exits its process at once (as a worker process would): its peers' collectives then fail instead
of waiting `COLLECTIVE_TIMEOUT`, and `check` reports it from the failed call (RayActorError).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.placement_group import placement_group as reserve_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from naiad.llm.distributed.parallel import TensorParallel, destroy_group, free_port, init_group, leave_process
from naiad.llm.distributed.step_sync import TableMirror, WireStep
from naiad.llm.distributed.workers import WorkerDied, WorkerInfo, worker_name
from naiad.llm.engine.model_runner import ModelRunner, RunnerConfig

log = logging.getLogger(__name__)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

#: How often `check` asks an idle rank whether it lives (the engine core calls it while idle).
PROBE_SECS = 1.0

_SIOCGIFADDR = 0x8915


def interface_of(ip: str) -> str | None:
    """The name of the network interface that holds IPv4 address `ip` (Linux), or None."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None


def _use_interface(ip: str) -> None:
    """Point gloo and NCCL at the interface holding `ip`, unless the environment already chose one."""
    name = interface_of(ip)
    if name is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)


@contextlib.contextmanager
def _using_interface(ip: str) -> Iterator[None]:
    """`_use_interface` while rank 0 joins its group, then the engine process's environment as it
    was: other groups it starts later (another engine, a test's child process) must not inherit a
    network interface chosen for this one."""
    saved = {name: os.environ.get(name) for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    _use_interface(ip)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class RankActor:
    """One rank in its Ray actor: joins the group, loads its shard, runs the steps it is sent."""

    def __init__(self, config: RunnerConfig, rank: int, size: int, tp_size: int, threads: int) -> None:
        self.config, self.rank, self.size, self.tp_size = config, rank, size, tp_size
        self.name = worker_name(rank, tp_size, size // tp_size)
        self.runner: ModelRunner | None = None
        self.tables = TableMirror()  # the block tables rank 0 last sent (steps arrive in order)
        if torch.device(config.device).type == "cpu":
            torch.set_num_threads(threads)

    def where(self) -> dict[str, Any]:
        """Where this rank runs: Ray node id and IP, pid, placement group id (None outside one)."""
        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "placement_group_id": context.get_placement_group_id()}

    def start(self, host: str, port: int) -> tuple[str, Any]:
        """Join the group at rank 0's `host`:`port` and load the shard: ("ready", WorkerInfo) or
        ("failed", why). Blocks until every rank has joined."""
        _use_interface(ray.util.get_node_ip_address())
        try:
            tp = init_group(self.rank, self.size, port, torch.device(self.config.device), self.tp_size, host)
            self.runner = ModelRunner(self.config, tp)
        except Exception as error:  # reported to rank 0, which fails the engine's start with it
            log.exception("%s could not start", self.name)
            return "failed", f"{type(error).__name__}: {error}"
        return "ready", WorkerInfo(self.runner.model.model.layer_range, self.runner.weight_bytes())

    def step(self, step: WireStep) -> None:
        try:
            assert self.runner is not None, "a step before the rank started"
            with torch.inference_mode():
                self.runner.forward_plan(self.tables.plan(step))
        except BaseException:
            # The group is broken now: leave at once, so that the peers' collectives fail fast
            # (as when a worker process dies) rather than wait for this rank until the timeout.
            log.exception("%s failed a step", self.name)
            leave_process(1)

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            destroy_group()


@dataclass(slots=True)
class _Rank:
    rank: int
    name: str
    actor: Any  # a Ray ActorHandle
    started: Any = None  # the ObjectRef of its start call
    last_step: Any = None  # the ObjectRef of its latest step call
    probe: Any = None  # the ObjectRef of a pending `alive` call
    probed: float = 0.0  # when that call was made
    info: WorkerInfo | None = None


class RayWorkerGroup:
    """Rank 0's handle on ranks 1..size-1 as Ray actors; a drop-in for `workers.WorkerGroup`.

    `placement_group`: one bundle per rank (bundle r for rank r; bundle 0 reserves rank 0's
    share where the engine runs); None creates one with `strategy`, `cpus_per_rank` CPUs
    (and one GPU on CUDA) per bundle. Each actor asks for its bundle's CPUs (and one GPU on
    CUDA), and runs torch on that many threads. Ray must be initialised in this process, or
    reachable through `ray.init(address="auto")` (RAY_ADDRESS)."""

    def __init__(
        self,
        config: RunnerConfig,
        tp_size: int,
        pp_size: int = 1,
        *,
        placement_group: PlacementGroup | None = None,
        strategy: str = "PACK",
        cpus_per_rank: float = 1.0,
        ready_timeout: float = 600.0,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"placement strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        if cpus_per_rank <= 0:
            raise ValueError(f"cpus_per_rank must be positive, got {cpus_per_rank}")
        if not ray.is_initialized():
            ray.init(address="auto")
        self.tp_size, self.pp_size = tp_size, pp_size
        self.size = size = tp_size * pp_size
        self.ready_timeout = ready_timeout
        self.cuda = torch.device(config.device).type == "cuda"
        self.host = ray.util.get_node_ip_address()  # rank 0's node, reachable from the others
        self.port = free_port(self.host)
        self._own_group = placement_group is None
        self.placement_group = self._reserve(strategy, cpus_per_rank) if placement_group is None else placement_group
        if self.placement_group.bundle_count != size:
            raise ValueError(
                f"the placement group has {self.placement_group.bundle_count} bundles; "
                f"{size} ranks need one each (bundle r for rank r, bundle 0 for the engine's rank 0)"
            )
        self._threads: int | None = None
        self.workers: list[_Rank] = []
        try:
            for rank in range(1, size):
                self.workers.append(self._start(config, rank))
        except BaseException:
            self.close()
            raise

    def _reserve(self, strategy: str, cpus: float) -> PlacementGroup:
        bundle: dict[str, float] = {"CPU": cpus, **({"GPU": 1} if self.cuda else {})}
        # Bundle 0 on the engine's node: `node:<ip>` is the resource Ray gives every node.
        bundles = [{**bundle, f"node:{self.host}": 0.001}] + [dict(bundle) for _ in range(self.size - 1)]
        group = reserve_group(bundles, strategy=strategy, name=f"naiad-llm-{os.getpid()}-{self.port}")
        try:
            ray.get(group.ready(), timeout=self.ready_timeout)
        except GetTimeoutError:
            remove_placement_group(group)
            raise RuntimeError(
                f"Ray could not place {self.size} ranks ({bundle} each, {strategy}) within "
                f"{self.ready_timeout}s: not enough resources in the cluster"
            ) from None
        return group

    def _start(self, config: RunnerConfig, rank: int) -> _Rank:
        # The actor asks for exactly its bundle's CPUs (and GPU): more would never be scheduled.
        bundle = self.placement_group.bundle_specs[rank]
        cpus, gpus = float(bundle.get("CPU", 0)), float(bundle.get("GPU", 0))
        if cpus <= 0:
            raise ValueError(f"bundle {rank} of the placement group has no CPU for rank {rank}: {bundle}")
        if self.cuda:  # Ray's CUDA_VISIBLE_DEVICES shows the actor its one GPU as cuda:0
            if gpus < 1:
                raise ValueError(f"rank {rank} runs on CUDA and bundle {rank} has no GPU: {bundle}")
            config = dataclasses.replace(config, device="cuda:0")
        actor_cls = _remote_rank().options(
            num_cpus=cpus,
            num_gpus=1 if self.cuda else 0,
            max_restarts=0,  # a restarted rank would not be in the group: the model must be reloaded
            max_task_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=rank,
                placement_group_capture_child_tasks=True,
            ),
        )
        actor = actor_cls.remote(config, rank, self.size, self.tp_size, max(1, int(cpus)))
        worker = _Rank(rank, worker_name(rank, self.tp_size, self.pp_size), actor)
        worker.started = actor.start.remote(self.host, self.port)
        return worker

    def join(self, device: str | torch.device) -> TensorParallel:
        """Rank 0 joins the group (blocks until every rank has), on its share of the CPU."""
        device = torch.device(device)
        if device.type == "cpu":
            self._threads = torch.get_num_threads()
            bundle = self.placement_group.bundle_specs[0]
            torch.set_num_threads(max(1, int(bundle.get("CPU", 1))))
        with _using_interface(self.host):
            return init_group(0, self.size, self.port, device, self.tp_size, self.host)

    def wait_ready(self) -> None:
        """Wait for every rank's shard to be loaded; raise with a rank's own error if one failed."""
        for worker in self.workers:
            try:
                status, message = ray.get(worker.started, timeout=self.ready_timeout)
            except GetTimeoutError:
                raise WorkerDied(f"{worker.name} is not responding; the model must be reloaded") from None
            except RayError as error:
                raise WorkerDied(f"{worker.name} died: {_reason(error)}; the model must be reloaded") from None
            if status != "ready":
                raise RuntimeError(f"{worker.name} could not start: {message}")
            worker.info = message

    def start_failure(self, timeout: float = 5.0) -> str | None:
        """What a rank reported if it failed to start (rank 0's own error is then a consequence)."""
        for worker in self.workers:
            with contextlib.suppress(RayError):
                status, message = ray.get(worker.started, timeout=timeout)
                if status == "failed":
                    return f"{worker.name} could not start: {message}"
        return None

    def send_step(self, step: WireStep) -> None:
        self.check()
        for worker in self.workers:
            worker.last_step = worker.actor.step.remote(step)

    def check(self, wait: float = 0.0) -> None:
        """Raise `WorkerDied` if a rank's actor has died (waiting up to `wait` seconds for each
        rank's calls to end: after a failed collective the peer's exit is seen later).

        A death shows as the failure of the rank's latest step or of a liveness probe, one made
        at most every `PROBE_SECS` (an idle rank has no step in flight to fail)."""
        dead = []
        now = time.monotonic()
        for worker in self.workers:
            for ref in (worker.last_step, worker.probe):
                if ref is None:
                    continue
                done, _ = ray.wait([ref], timeout=wait)
                if not done:
                    continue
                try:
                    ray.get(ref)
                except RayActorError as error:
                    dead.append(f"{worker.name} died: {_reason(error)}")
                    break
                except RayError as error:
                    dead.append(f"{worker.name} failed: {_reason(error)}")
                    break
                if ref is worker.probe:
                    worker.probe = None
            if worker.probe is None and now - worker.probed >= PROBE_SECS:
                worker.probe, worker.probed = worker.actor.alive.remote(), now
        if dead:
            raise WorkerDied("; ".join(dead) + "; the model must be reloaded")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the actors (leave the group, then kill) and release the group if it was ours."""
        stops = []
        for worker in self.workers:
            with contextlib.suppress(RayError):
                stops.append(worker.actor.stop.remote())
        if stops:
            with contextlib.suppress(RayError):
                ray.wait(stops, num_returns=len(stops), timeout=timeout)
        for worker in self.workers:
            with contextlib.suppress(RayError):
                ray.kill(worker.actor)
        self.workers = []
        if self._own_group and getattr(self, "placement_group", None) is not None:
            with contextlib.suppress(RayError):
                remove_placement_group(self.placement_group)
            self.placement_group = None  # type: ignore[assignment]
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            self._threads = None


_REMOTE_RANK: Any = None


def _remote_rank() -> Any:
    """RankActor as a Ray actor class, made once (each `ray.remote` registers a new class)."""
    global _REMOTE_RANK
    if _REMOTE_RANK is None:
        _REMOTE_RANK = ray.remote(RankActor)
    return _REMOTE_RANK


def _reason(error: BaseException) -> str:
    """The first line of Ray's error: its full text includes the remote traceback."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
