"""Triton's sequence batcher: requests that carry a correlation ID (`sequence_id`) form sequences,
each pinned to one batch slot of one instance from its START to its END.

What it keeps for each sequence and feeds the model with every request (SPEC §3
ModelSequenceBatching, Triton's sequence_batch_scheduler):

* control inputs: START / END / READY as the configured false/true pair, CORRID as the ID, each
  shape [1] per request (plus the batch dimension when the model batches);
* implicit state: the `input_name` tensor holds what the model returned as `output_name` for the
  sequence's previous request (the initial state on START); the state output reaches the client
  only when the config declares it as an output and the client asks for it.

Requests of one sequence run in order, one at a time: a slot holds its sequence's queued requests
and hands out the next only once the previous one was answered. A new sequence takes the free
slot with the lowest index (spreading over instances first) or, when every slot is taken, waits
in the backlog until one frees. A sequence that sends nothing for max_sequence_idle is released.

Two strategies decide which requests run together on an instance:

* direct: an idle instance gets a batch of the next request of each of its slots (slot order),
  after waiting up to max_queue_delay for minimum_slot_utilization of the batch;
* oldest: each instance has a dynamic batcher that gets the next request of each candidate
  sequence (max_candidate_sequences slots) and batches the oldest ones (preferred sizes, delay).

No thread of its own (see base.PumpedScheduler): batches start from whoever has news, and one
timer wakes the batcher for queue delays, idle sequences and backlog timeouts.

Unlike Triton, direct batches hold only the slots that have a request ready: no "null" requests
pad the slots in between, so READY is always true for the requests a model sees.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.errors import InvalidArgument, Unavailable
from naiad.scheduling.base import Drop, Job, Plan, PumpedScheduler, ResponseSink, Worker
from naiad.scheduling.dynamic import BatcherSettings, DynamicBatcher
from naiad.scheduling.timers import TimerHandle, Timers
from naiad.types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor

_UINT64_MASK = (1 << 64) - 1

SequenceKey = int | str


@dataclass(frozen=True, slots=True)
class Control:
    """A control input: kind START, END, READY (false/true values) or CORRID (the ID)."""

    name: str
    kind: str
    datatype: DataType
    false_true: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True, slots=True)
class State:
    """An implicit state: `initial` has the per-request shape (leading 1 when batching)."""

    input_name: str
    output_name: str
    datatype: DataType
    initial: np.ndarray


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    """ModelSequenceBatching as the batcher needs it (built by the core from the model config)."""

    model_name: str
    batched: bool  # max_batch_size > 0: inputs carry a batch dimension
    max_batch_size: int = 1
    slots: int = 1  # per instance: max_batch_size, or oldest.max_candidate_sequences
    oldest: bool = False
    max_queue_delay_ns: int = 0
    minimum_slot_utilization: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    max_sequence_idle_ns: int = 1_000_000_000
    controls: tuple[Control, ...] = ()
    states: tuple[State, ...] = ()
    outputs: tuple[str, ...] = ()  # the declared outputs: what a client gets when it names none


def sequence_key(request: InferRequest) -> SequenceKey:
    """The request's correlation ID (uint64 or string); 0 / "" when it has none."""
    value = request.parameters.get("sequence_id", 0)
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value & _UINT64_MASK  # gRPC carries it as int64: Triton reads the same bits as uint64
    return value if isinstance(value, str) else 0


def _prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


@dataclass(slots=True)
class _Entry:
    job: Job
    key: SequenceKey
    start: bool
    end: bool


class _Slot:
    """One batch slot of one instance and the sequence that holds it."""

    __slots__ = ("busy", "closing", "index", "instance", "key", "queue", "retry", "states")

    def __init__(self, instance: int, index: int) -> None:
        self.instance = instance
        self.index = index
        self.key: SequenceKey | None = None  # None: free
        self.queue: collections.deque[_Entry] = collections.deque()
        self.retry: Job | None = None  # prepared already, refused by its instance: runs next
        self.busy = False  # a request of the sequence is executing
        self.closing = False  # END was queued (or the sequence idled out): release once drained
        self.states: dict[str, np.ndarray] | None = None


class _Backlog:
    __slots__ = ("entries", "expires_ns", "key")

    def __init__(self, key: SequenceKey) -> None:
        self.key = key
        self.entries: collections.deque[_Entry] = collections.deque()
        self.expires_ns = 0  # the earliest `timeout` of its requests (monotonic); 0 = never


class _BatcherWorker:
    """oldest: the per-instance dynamic batcher, seen by the sequence batcher as its worker. The
    sequence batcher hands it each sequence's next request (one per sequence at a time) and the
    batcher forms batches of them on its instance."""

    depth = 1 << 30  # the batcher queues them: its own instance is what limits

    def __init__(self, batcher: DynamicBatcher) -> None:
        self.batcher = batcher

    def run(self, jobs: list[Job], executed: Callable[[], None]) -> bool:
        for job in jobs:
            self.batcher.submit(job)
        executed()
        return True

    def set_on_room(self, callback: Callable[[], None]) -> None:
        """Never called back: it always takes its jobs."""


class SequenceBatcher(PumpedScheduler):
    def __init__(self, workers: Sequence[Worker], settings: SequenceSettings, drop: Drop, timers: Timers,
                 name: str = "model") -> None:
        self._settings = settings
        self._batchers: list[DynamicBatcher] = []
        if settings.oldest:
            batching = BatcherSettings(
                max_batch_size=max(settings.max_batch_size, 1),
                preferred_batch_sizes=settings.preferred_batch_sizes,
                max_queue_delay_ns=settings.max_queue_delay_ns,
                preserve_ordering=settings.preserve_ordering,
            )
            self._batchers = [DynamicBatcher([worker], batching, self._dropped, timers, name=f"{name}-{i}")
                              for i, worker in enumerate(workers)]
            super().__init__([_BatcherWorker(b) for b in self._batchers], drop, timers, name)
        else:
            super().__init__(workers, drop, timers, name, depth_limit=1)
        self._slots = [[_Slot(i, s) for s in range(max(settings.slots, 1))] for i in range(len(workers))]
        # Free slots, lowest slot index first across instances (Triton's ready-slot order).
        self._free = [(slot.index, slot.instance) for slots in self._slots for slot in slots]
        heapq.heapify(self._free)
        self._active: dict[SequenceKey, _Slot] = {}
        self._backlog: collections.deque[_Backlog] = collections.deque()
        self._backlog_by_key: dict[SequenceKey, _Backlog] = {}
        self._last_seen: dict[SequenceKey, int] = {}
        self._in_batcher: dict[int, _Slot] = {}  # oldest: id(job) -> its slot, while queued there
        self._slot_of: dict[int, _Slot] = {}  # direct: id(job) -> its slot, while running
        self._state_inputs = {s.output_name: s.input_name for s in settings.states}
        self._corrid = next((c for c in settings.controls if c.kind == "CORRID"), None)
        self._reaper: TimerHandle | None = None
        self._reap_ns = 0
        self._drained = threading.Condition(self._lock)  # a slot went idle (stop waits for all)

    # -- Scheduler -----------------------------------------------------------------------------

    def start(self) -> None:
        for batcher in self._batchers:
            batcher.start()
        super().start()

    def submit(self, job: Job) -> None:
        """Route a request to its sequence's slot (or the backlog); InvalidArgument for requests
        the sequence batcher cannot take, with Triton's messages."""
        request = job.request
        model = self._settings.model_name
        if job.batch_size > 1:
            raise InvalidArgument(_prefix(request) + f"inference request to model '{model}' must specify "
                                  "batch-size 1 due to requirements of sequence batcher")
        key = sequence_key(request)
        if key == 0 or key == "":
            raise InvalidArgument(_prefix(request) + f"inference request to model '{model}' must specify a "
                                  "non-zero or non-empty correlation ID")
        if isinstance(key, str) and self._corrid is not None and self._corrid.datatype is not DataType.BYTES:
            raise InvalidArgument(
                _prefix(request) + f"inference request to model '{model}' has a string correlation ID, but "
                f"control input '{self._corrid.name}' (CONTROL_SEQUENCE_CORRID) has data type "
                f"{self._corrid.datatype.config_name}"
            )
        parameters = request.parameters
        entry = _Entry(job, key, bool(parameters.get("sequence_start")), bool(parameters.get("sequence_end")))
        with self._lock:
            self._queue_entry(entry)
        self._pump()

    def _queue_entry(self, entry: _Entry) -> None:
        key, request, model = entry.key, entry.job.request, self._settings.model_name
        if self._stopping and entry.start:
            raise Unavailable("Server is stopping, scheduler for model has stopped accepting new "
                              "inference requests")
        slot = self._active.get(key)
        backlog = self._backlog_by_key.get(key)
        if not entry.start and slot is None and backlog is None:
            raise InvalidArgument(
                _prefix(request) + f"inference request for sequence {key} to model '{model}' must "
                "specify the START flag on the first request of the sequence"
            )
        now = entry.job.enqueued_ns
        self._last_seen[key] = now
        self._arm_reaper(now + self._settings.max_sequence_idle_ns)
        if slot is None and backlog is None and self._free:
            slot = self._take_free(key)
        if slot is not None:
            slot.queue.append(entry)
            if entry.end:  # a later START with this ID begins a new sequence elsewhere
                self._active.pop(key, None)
                slot.closing = True
            return
        if backlog is None:
            backlog = _Backlog(key)
            self._backlog.append(backlog)
            self._backlog_by_key[key] = backlog
        backlog.entries.append(entry)
        job = entry.job
        if job.deadline_ns and (not backlog.expires_ns or job.deadline_ns < backlog.expires_ns):
            backlog.expires_ns = job.deadline_ns  # the request's `timeout` bounds its wait for a slot
            self._arm_reaper(job.deadline_ns)
        if entry.end:
            self._backlog_by_key.pop(key, None)

    def pending(self) -> int:
        with self._lock:
            queued = sum(len(slot.queue) for slots in self._slots for slot in slots)
            return queued + sum(len(b.entries) for b in self._backlog)

    def stop(self, wait: bool = True) -> None:
        with self._lock:
            self._stopping = True
            if self._reaper is not None:
                self._reaper.cancel()
                self._reaper = None
        self._pump()
        if wait:  # what the sequences queued still runs, one request after the other
            with self._lock:
                self._drained.wait_for(self._all_idle)
        for batcher in self._batchers:
            batcher.stop(wait)
        super().stop(wait)
        with self._lock:  # sequences that never ended: nobody will run what they left queued
            left = [e for slots in self._slots for slot in slots for e in slot.queue]
            left += [e for backlog in self._backlog for e in backlog.entries]
            for slots in self._slots:
                for slot in slots:
                    slot.queue.clear()
            self._backlog.clear()
        for entry in left:
            self._drop(entry.job, Unavailable("Server is stopping, scheduler for model has stopped "
                                              "accepting new inference requests"))

    def _all_idle(self) -> bool:
        return not any(slot.queue or slot.busy or slot.retry for slots in self._slots for slot in slots)

    # -- PumpedScheduler -----------------------------------------------------------------------

    def _plan(self, now: int) -> Plan:
        plan = Plan()
        if self._settings.oldest:
            for slots in self._slots:
                for slot in slots:
                    self._plan_next(slot, plan)
            return plan
        for instance in self._free_workers():
            self._plan_direct(instance, now, plan)
        return plan

    def _requeue(self, jobs: list[Job]) -> None:
        """A direct batch its instance refused: each job runs next in its slot, as prepared."""
        for job in jobs:
            slot = self._slot_of.pop(id(job), None)
            if slot is not None:
                slot.busy = False
                slot.retry = job

    def _plan_next(self, slot: _Slot, plan: Plan) -> None:
        """oldest: hand the slot's next request to its instance's batcher, if it may run now."""
        while not slot.busy and slot.queue:
            job = self._prepare(slot, slot.queue.popleft(), plan)
            if job is not None:
                self._in_batcher[id(job)] = slot  # so a job the batcher drops frees its slot
                plan.starts.append((slot.instance, [job]))
                return
        self._release_if_done(slot, plan)

    def _plan_direct(self, instance: int, now: int, plan: Plan) -> None:
        """direct: a batch of the next request of each ready slot of an idle instance."""
        ready = [slot for slot in self._slots[instance] if (slot.queue or slot.retry) and not slot.busy]
        if not ready:
            return
        first = _next_job(ready[0]).shape_key
        ready = [slot for slot in ready if _next_job(slot).shape_key == first]
        wait_ns = self._delay(ready, now)
        if wait_ns > 0 and not self._stopping:
            plan.wake_ns = min(plan.wake_ns, now + wait_ns) if plan.wake_ns else now + wait_ns
            return
        jobs = []
        for slot in ready:
            job: Job | None
            if slot.retry is not None:
                job, slot.retry, slot.busy = slot.retry, None, True
            else:
                job = self._prepare(slot, slot.queue.popleft(), plan)
            if job is None:
                self._release_if_done(slot, plan)
            else:
                self._slot_of[id(job)] = slot
                jobs.append(job)
        if jobs:
            plan.starts.append((instance, jobs))
        elif any(slot.queue and not slot.busy for slot in self._slots[instance]):
            self._plan_direct(instance, now, plan)  # every job was dropped: the next ones may run

    def _delay(self, ready: list[_Slot], now: int) -> int:
        """ns to wait for more slots (max_queue_delay with minimum_slot_utilization), else 0."""
        settings = self._settings
        if settings.max_queue_delay_ns == 0 or settings.minimum_slot_utilization == 0.0:
            return 0
        if len(ready) / max(settings.max_batch_size, 1) >= settings.minimum_slot_utilization:
            return 0
        waited = now - min(_next_job(slot).enqueued_ns for slot in ready)
        return max(settings.max_queue_delay_ns - waited, 0)

    # -- slots (called with the lock held) -----------------------------------------------------

    def _take_free(self, key: SequenceKey) -> _Slot:
        index, instance = heapq.heappop(self._free)
        slot = self._slots[instance][index]
        slot.key, slot.closing, slot.states = key, False, None
        self._active[key] = slot
        return slot

    def _release_if_done(self, slot: _Slot, plan: Plan) -> None:
        if slot.closing and not slot.busy and not slot.queue:
            self._release(slot, plan)

    def _release(self, slot: _Slot, plan: Plan | None = None) -> None:
        """The slot's sequence is over: drop its state and give the slot to the oldest backlog
        sequence, or free it."""
        if self._active.get(slot.key) is slot:  # type: ignore[arg-type]
            del self._active[slot.key]  # type: ignore[arg-type]
        slot.key, slot.closing, slot.states = None, False, None
        self._drained.notify_all()
        if not self._backlog:
            heapq.heappush(self._free, (slot.index, slot.instance))
            return
        backlog = self._backlog.popleft()
        slot.key = backlog.key
        slot.queue.extend(backlog.entries)
        if self._backlog_by_key.get(backlog.key) is backlog:  # still open: later requests go to the slot
            del self._backlog_by_key[backlog.key]
            self._active[backlog.key] = slot
        else:
            slot.closing = True  # its END is already queued
        if plan is not None and self._settings.oldest:
            self._plan_next(slot, plan)

    def _prepare(self, slot: _Slot, entry: _Entry, plan: Plan) -> Job | None:
        """Turn the entry into the job the instance executes: controls and state added to its
        inputs, state outputs requested, the sink watching for the answer. None (and the job
        dropped) when its client went away."""
        job = entry.job
        if job.cancelled:
            plan.drops.append((job, None))
            return None
        settings = self._settings
        if entry.start or slot.states is None:
            slot.states = {s.input_name: s.initial for s in settings.states}
        request = job.request
        inputs = list(request.inputs)
        inputs.extend(self._control(control, entry) for control in settings.controls)
        for state in settings.states:
            array = slot.states[state.input_name]
            inputs.append(Tensor(state.input_name, state.datatype, array.shape, array))
        wanted = [o.name for o in request.outputs] if request.outputs is not None else list(settings.outputs)
        outputs = [RequestedOutput(o.name, o.parameters) for o in request.outputs or ()]
        if request.outputs is None:
            outputs = [RequestedOutput(name) for name in settings.outputs]
        outputs.extend(RequestedOutput(s.output_name) for s in settings.states if s.output_name not in wanted)
        job.request = dataclasses.replace(request, inputs=inputs, outputs=outputs)
        job.sink = _SequenceSink(self, slot, entry, job.sink, frozenset(wanted))
        slot.busy = True
        return job

    def _control(self, control: Control, entry: _Entry) -> Tensor:
        shape = (1, 1) if self._settings.batched else (1,)
        if control.kind == "CORRID":
            if control.datatype is DataType.BYTES:
                key = entry.key
                value: Any = key.encode() if isinstance(key, str) else str(key).encode()
                array = np.empty(shape, dtype=object)
                array.fill(value)
            else:
                array = np.full(shape, np.uint64(entry.key)).astype(control.datatype.numpy)
            return Tensor(control.name, control.datatype, shape, array)
        on = {"START": entry.start, "END": entry.end, "READY": True}[control.kind]
        array = np.full(shape, control.false_true[1 if on else 0], dtype=control.datatype.numpy)
        return Tensor(control.name, control.datatype, shape, array)

    # -- answers -------------------------------------------------------------------------------

    def _answered(self, slot: _Slot, job: Job) -> None:
        """A sequence's request got its final answer: the slot may run its next one."""
        with self._lock:
            self._in_batcher.pop(id(job), None)
            self._slot_of.pop(id(job), None)
            slot.busy = False
            if slot.closing and not slot.queue:
                self._release(slot)
            if not slot.busy and not slot.queue:
                self._drained.notify_all()
        self._pump()

    def _keep_state(self, slot: _Slot, entry: _Entry, state_input: str, tensor: Tensor) -> None:
        # A copy: the array may be a view into memory the backend reuses once answered.
        data = np.array(tensor.data, copy=True)
        with self._lock:
            if slot.key == entry.key and slot.states is not None:
                slot.states[state_input] = data

    def _dropped(self, job: Job, error: Exception | None) -> None:
        """A job its dynamic batcher dropped (its client went away): the sequence goes on."""
        self._drop(job, error)
        with self._lock:
            slot = self._in_batcher.pop(id(job), None)
            if slot is not None:
                slot.busy = False
                if slot.closing and not slot.queue:
                    self._release(slot)
        self._pump()

    # -- idle sequences and backlog timeouts (the reaper timer) --------------------------------

    def _arm_reaper(self, when_ns: int) -> None:
        """Under the lock: make sure the reaper looks by `when_ns`."""
        if self._stopping or (self._reaper is not None and self._reap_ns <= when_ns):
            return
        if self._reaper is not None:
            self._reaper.cancel()
        self._reap_ns = when_ns
        self._reaper = self._timers.call_at(when_ns, self._reap)

    def _reap(self) -> None:
        idle_ns = self._settings.max_sequence_idle_ns
        expired: list[_Entry] = []
        with self._lock:
            self._reaper = None
            if self._stopping:
                return
            now = time.monotonic_ns()
            next_check = self._expire_backlog(now, expired)
            for key, seen in list(self._last_seen.items()):
                remaining = idle_ns - (now - seen)
                if remaining > 0:
                    next_check = min(next_check, remaining) if next_check else remaining
                    continue
                slot = self._active.get(key)
                if slot is not None:
                    # Released once what it queued has run; later requests need a START.
                    del self._active[key]
                    del self._last_seen[key]
                    slot.closing = True
                    if not slot.busy and not slot.queue:
                        self._release(slot)
                elif key in self._backlog_by_key:
                    next_check = min(next_check, 50_000_000) if next_check else 50_000_000  # waiting: not idle
                else:
                    del self._last_seen[key]  # ended normally
            if next_check:
                self._arm_reaper(now + next_check)
        for entry in expired:  # answered outside the lock: a sink may call back into the server
            self._drop(entry.job, Unavailable("timeout of the corresponding sequence has been expired"))
        self._pump()

    def _expire_backlog(self, now: int, expired: list[_Entry]) -> int:
        """Take out backlog sequences whose requests' `timeout` passed before they got a slot
        (Triton rejects them); ns until the next one expires (0: none)."""
        next_check = 0
        for backlog in list(self._backlog):
            if not backlog.expires_ns:
                continue
            if backlog.expires_ns > now:
                left = backlog.expires_ns - now
                next_check = min(next_check, left) if next_check else left
                continue
            self._backlog.remove(backlog)
            if self._backlog_by_key.get(backlog.key) is backlog:
                del self._backlog_by_key[backlog.key]
            expired.extend(backlog.entries)
        return next_check


def _next_job(slot: _Slot) -> Job:
    return slot.retry if slot.retry is not None else slot.queue[0].job


class _SequenceSink:
    """A sequence request's sink: keeps the state outputs for the sequence's next request, passes
    on only what the client asked for, and frees the slot at the final response."""

    __slots__ = ("batcher", "entry", "sink", "slot", "wanted")

    def __init__(self, batcher: SequenceBatcher, slot: _Slot, entry: _Entry, sink: ResponseSink,
                 wanted: frozenset[str]) -> None:
        self.batcher = batcher
        self.slot = slot
        self.entry = entry
        self.sink = sink
        self.wanted = wanted

    def __call__(self, response: InferResponse) -> None:
        batcher, wanted = self.batcher, self.wanted
        state_inputs = batcher._state_inputs
        if response.error is None and (state_inputs or len(response.outputs) != len(wanted)):
            kept = []
            for tensor in response.outputs:
                state_input = state_inputs.get(tensor.name)
                if state_input is not None:
                    batcher._keep_state(self.slot, self.entry, state_input, tensor)
                if tensor.name in wanted:
                    kept.append(tensor)
            response.outputs = kept
        if response.final:
            batcher._answered(self.slot, self.entry.job)
        self.sink(response)
