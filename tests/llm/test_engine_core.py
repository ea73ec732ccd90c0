"""The engine core behind its socket: in a thread and in its own process, the same tokens as the
in-process engine; aborts, rejections, a failing step and a dying process reach the client,
whether its reader thread or the server's event loop reads the socket."""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import uvloop

from naiad import channel
from naiad.channel import Watch
from naiad.core.backend_host import BackendHost
from naiad.llm.engine import engine_core
from naiad.llm.engine.engine_core import (
    AddRequest,
    CoreMessage,
    EngineClient,
    EngineFailed,
    RequestOutput,
    RequestRejected,
    StepOutputs,
)
from naiad.llm.engine.llm_engine import EngineConfig, LLMEngine
from naiad.llm.engine.sampling_params import GREEDY, SamplingParams
from naiad.llm.loading.gguf import smollm2_path

PROMPTS = [[5, 9, 2, 7, 1, 8], [3, 3, 4], list(range(3, 40))]


def _config(path: Path) -> EngineConfig:
    return EngineConfig(model=path, dtype="float32", block_size=4, kv_cache_memory=4 << 20, max_model_len=96,
                        max_num_batched_tokens=16)


class Collector:
    """The client's callback: every message, in order, on a queue (and the thread it came on)."""

    def __init__(self) -> None:
        self.messages: queue.Queue[CoreMessage] = queue.Queue()
        self.threads: list[int] = []

    def __call__(self, message: CoreMessage) -> None:
        self.threads.append(threading.get_ident())
        self.messages.put(message)

    def until_finished(self, request_ids: set[str], timeout: float = 60) -> dict[str, list[RequestOutput]]:
        """Every output of `request_ids`, collected until each has finished."""
        outputs: dict[str, list[RequestOutput]] = {request_id: [] for request_id in request_ids}
        open_ids = set(request_ids)
        while open_ids:
            message = self.messages.get(timeout=timeout)
            assert isinstance(message, StepOutputs), message
            for output in message.outputs:
                outputs[output.request_id].append(output)
                if output.finish_reason is not None:
                    open_ids.discard(output.request_id)
        return outputs


@pytest.fixture(params=[True, False], ids=["thread", "process"])
def in_process(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_the_core_streams_the_engines_tokens(tiny_models: dict[str, Path], in_process: bool) -> None:
    expected = LLMEngine(_config(tiny_models["llama"])).generate(PROMPTS, max_tokens=9, sampling_params=GREEDY)
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, in_process=in_process)
    try:
        assert client.info.max_model_len == 96 and client.info.vocab_size == 128
        for i, prompt in enumerate(PROMPTS):
            client.add(AddRequest(f"r{i}", prompt, 9, GREEDY))
        outputs = collector.until_finished({"r0", "r1", "r2"})
        for i, prompt in enumerate(PROMPTS):
            pieces = outputs[f"r{i}"]
            assert [t for piece in pieces for t in piece.new_token_ids] == expected[i]
            assert len(pieces) > 1  # streamed step by step, not in one piece at the end
            assert pieces[-1].finish_reason == "length"
            assert all(piece.finish_reason is None for piece in pieces[:-1])
            assert pieces[-1].num_prompt_tokens == len(prompt)
    finally:
        client.close()
    assert not client.is_alive()


def test_logprobs_cross_the_socket(tiny_models: dict[str, Path]) -> None:
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, in_process=True)
    try:
        client.add(AddRequest("lp", PROMPTS[0], 4, SamplingParams(temperature=0, logprobs=2)))
        pieces = collector.until_finished({"lp"})["lp"]
        logprobs = [entry for piece in pieces for entry in piece.new_logprobs or []]
        assert len(logprobs) == 4
        for own, top_ids, top_values in logprobs:
            assert own <= 0 and len(top_ids) == len(top_values) == 2
    finally:
        client.close()


def test_an_aborted_request_sends_nothing_more(tiny_models: dict[str, Path]) -> None:
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, in_process=True)
    try:
        client.add(AddRequest("long", PROMPTS[2], 50, GREEDY))
        client.abort(["long"])
        client.add(AddRequest("short", PROMPTS[1], 3, GREEDY))
        outputs = collector.until_finished({"short"})
        assert sum(len(piece.new_token_ids) for piece in outputs["short"]) == 3
        while not collector.messages.empty():
            message = collector.messages.get()
            assert not (isinstance(message, StepOutputs) and any(o.request_id == "long" for o in message.outputs
                                                                 if o.finish_reason is not None))
    finally:
        client.close()


def test_a_request_the_engine_refuses_is_rejected_and_others_go_on(tiny_models: dict[str, Path]) -> None:
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, in_process=True)
    try:
        client.add(AddRequest("bad", [1, 2, 999], 3, GREEDY))  # 999 is outside the 128-token vocabulary
        rejected = collector.messages.get(timeout=30)
        assert isinstance(rejected, RequestRejected) and rejected.request_id == "bad"
        assert "vocabulary" in rejected.message
        client.add(AddRequest("good", PROMPTS[0], 2, GREEDY))
        assert collector.until_finished({"good"})["good"][-1].finish_reason == "length"
    finally:
        client.close()


def test_a_failing_step_fails_its_requests_and_the_core_serves_on(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = LLMEngine.step
    calls = {"n": 0}

    def flaky_step(self: LLMEngine) -> list:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("out of luck")
        return original(self)

    monkeypatch.setattr(LLMEngine, "step", flaky_step)
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, in_process=True)
    try:
        client.add(AddRequest("a", PROMPTS[0], 20, GREEDY))
        message = collector.messages.get(timeout=30)
        while isinstance(message, StepOutputs):
            message = collector.messages.get(timeout=30)
        assert isinstance(message, EngineFailed) and message.request_ids == ["a"]
        assert "out of luck" in message.message
        client.add(AddRequest("b", PROMPTS[1], 2, GREEDY))
        assert collector.until_finished({"b"})["b"][-1].finish_reason == "length"
    finally:
        client.close()


def test_a_dead_core_process_fails_the_open_requests(tiny_models: dict[str, Path]) -> None:
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector)
    try:
        client.add(AddRequest("a", PROMPTS[2], 80, GREEDY))
        first = collector.messages.get(timeout=30)
        assert isinstance(first, StepOutputs)
        os.kill(client._core.pid, signal.SIGKILL)  # type: ignore[union-attr]
        message = first
        while not isinstance(message, EngineFailed):
            message = collector.messages.get(timeout=30)
        assert message.request_ids == ["a"] and "exited" in message.message
        assert not client.is_alive()
        with pytest.raises(RuntimeError, match="not running"):
            client.add(AddRequest("b", PROMPTS[0], 2, GREEDY))
    finally:
        client.close()


def test_a_core_that_cannot_start_raises_its_reason(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="could not start"):
        EngineClient(EngineConfig(model=tmp_path / "missing"), Collector(), in_process=True)


# ----------------------------------------------------------- the server's event loop reads the socket


class Loop:
    """A uvloop running on a thread of its own, and the server's `watch` on it."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.runner = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner.start()
        host = BackendHost(SimpleNamespace(loop=self.loop))  # type: ignore[arg-type]
        self.watch: Watch = host.watch
        self.watch_writable: Watch = host.watch_writable
        self.thread = self.run(threading.get_ident)

    def run(self, call: object) -> object:
        """`call()` on the loop's thread; its result."""
        done: queue.Queue[object] = queue.Queue()
        self.loop.call_soon_threadsafe(lambda: done.put(call()))  # type: ignore[operator]
        return done.get(timeout=10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.runner.join(10)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


def test_the_event_loop_reads_the_cores_outputs(tiny_models: dict[str, Path], in_process: bool, loop: Loop) -> None:
    expected = LLMEngine(_config(tiny_models["llama"])).generate(PROMPTS, max_tokens=9, sampling_params=GREEDY)
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, in_process=in_process, watch=loop.watch,
                          watch_writable=loop.watch_writable)
    try:
        assert client._reader is None  # no thread of its own: the loop reads
        for i, prompt in enumerate(PROMPTS):
            client.add(AddRequest(f"r{i}", prompt, 9, GREEDY))
        outputs = collector.until_finished({"r0", "r1", "r2"})
        for i in range(len(PROMPTS)):
            assert [t for piece in outputs[f"r{i}"] for t in piece.new_token_ids] == expected[i]
            assert len(outputs[f"r{i}"]) > 1
        assert set(collector.threads) == {loop.thread}
    finally:
        client.close()
    assert not client.is_alive()


def test_messages_split_over_many_reads_arrive_whole_and_in_order(
    tiny_models: dict[str, Path], loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel, "READ_SIZE", 3)  # every message takes several wake-ups of the loop
    expected = LLMEngine(_config(tiny_models["llama"])).generate(PROMPTS, max_tokens=6, sampling_params=GREEDY)
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, in_process=True, watch=loop.watch,
                          watch_writable=loop.watch_writable)
    try:
        for i, prompt in enumerate(PROMPTS):
            client.add(AddRequest(f"r{i}", prompt, 6, GREEDY))
        outputs = collector.until_finished({"r0", "r1", "r2"})
        for i in range(len(PROMPTS)):
            assert [t for piece in outputs[f"r{i}"] for t in piece.new_token_ids] == expected[i]
    finally:
        client.close()


def test_a_dead_core_is_reported_off_the_loop_which_stops_watching_its_socket(
    tiny_models: dict[str, Path], loop: Loop
) -> None:
    collector = Collector()
    exits: list[tuple[str, int]] = []
    reads: list[int] = []  # each call of the client's readable callback
    stops: list[int] = []  # the thread of each call of the stop function the watch returned

    def watch(fd: int, on_readable: object) -> object:
        def counted() -> None:
            reads.append(fd)
            on_readable()  # type: ignore[operator]

        stop = loop.watch(fd, counted)
        assert stop is not None

        def recorded() -> None:
            stops.append(threading.get_ident())
            stop()

        return recorded

    client = EngineClient(_config(tiny_models["llama"]), collector, watch=watch,  # type: ignore[arg-type]
                          on_exit=lambda cause: exits.append((cause, threading.get_ident())))
    try:
        client.add(AddRequest("a", PROMPTS[2], 80, GREEDY))
        assert isinstance(collector.messages.get(timeout=30), StepOutputs)
        os.kill(client._core.pid, signal.SIGKILL)  # type: ignore[union-attr]
        message = collector.messages.get(timeout=30)
        while not isinstance(message, EngineFailed):
            message = collector.messages.get(timeout=30)
        assert message.request_ids == ["a"] and "exited" in message.message
        # Waiting for the process (up to seconds) and the restart's callback stay off the loop.
        (cause, exit_thread), = exits
        assert "exited" in cause and exit_thread != loop.thread
        assert collector.threads[-1] == exit_thread
        # The loop stopped watching at the end of the socket, itself: an ended socket stays readable,
        # and a watch left on it would call back on every turn of the loop.
        assert stops[:1] == [loop.thread]
        seen = len(reads)
        time.sleep(0.3)
        assert len(reads) == seen
        with pytest.raises(RuntimeError, match="not running"):
            client.add(AddRequest("b", PROMPTS[0], 2, GREEDY))
    finally:
        client.close()


def _add_huge_then_small(client: EngineClient, add: Callable[[Callable[[], None]], object]) -> None:
    """A core that is stopped reads nothing: a ~4 MB prompt (the socket holds ~200 kB) and one
    behind it, added by `add(call)` (on the loop, or on a thread), must not wait for it."""
    pid = client._core.pid  # type: ignore[union-attr]
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        add(lambda: client.add(AddRequest("huge", [1] * 4_000_000, 2, GREEDY)))
        add(lambda: client.add(AddRequest("after", PROMPTS[0], 2, GREEDY)))
        assert time.monotonic() - started < 5, "the add waited for the core to read"
    finally:
        os.kill(pid, signal.SIGCONT)


def _on_a_thread(call: Callable[[], None]) -> None:
    thread = threading.Thread(target=call)
    thread.start()
    thread.join(10)  # a sender that waits fails the test instead of hanging it
    assert not thread.is_alive(), "the add waited for the core to read"


@pytest.mark.parametrize("where", ["loop", "thread"])
def test_adds_never_wait_for_a_core_that_is_not_reading(tiny_models: dict[str, Path], loop: Loop, where: str) -> None:
    """The loop both reads the core's outputs and adds requests: a blocking add there (a prompt
    larger than the socket, a core in a long step) would stop the reading too, and a core blocked
    sending a large output would then never read again. What the socket cannot take waits, in
    order, for the loop to send it when there is room; from another thread the same."""
    collector = Collector()
    client = EngineClient(_config(tiny_models["llama"]), collector, watch=loop.watch,
                          watch_writable=loop.watch_writable)
    try:
        _add_huge_then_small(client, loop.run if where == "loop" else _on_a_thread)
        rejected = collector.messages.get(timeout=30)  # in order: the huge one first, too long to run
        assert isinstance(rejected, RequestRejected) and rejected.request_id == "huge"
        assert collector.until_finished({"after"})["after"][-1].finish_reason == "length"
        assert set(collector.threads) == {loop.thread}
    finally:
        client.close()


def test_messages_decode_to_their_types() -> None:
    add = AddRequest("x", [1, 2], 3, SamplingParams(temperature=0.5, stop_token_ids=(7,)))
    assert engine_core._client_decoder.decode(msgspec.msgpack.encode(add)) == add


# ------------------------------------------------------------------ grammars compile off the loop


def _huge_schema(properties: int = 5000) -> str:
    """A JSON schema llguidance takes seconds to compile (1.5 s on the 2-core CI class of machine)."""
    props = {f"p{i}": {"type": "integer"} for i in range(properties)}
    return json.dumps({"type": "object", "properties": props, "required": ["p0"]})


def _smollm2_core(collector: Collector) -> EngineClient:
    pytest.importorskip("llguidance")
    return EngineClient(EngineConfig(smollm2_path(), kv_cache_memory=64 << 20), collector, in_process=True)


def test_a_slow_grammar_compiles_while_other_streams_step_on() -> None:
    """The attack: a request with a schema that compiles for seconds. The bystander, a stream
    already decoding, must keep getting tokens meanwhile: its longest gap between steps stays
    far below the compile, which on the core's loop would be its gap (stalled for all)."""
    collector = Collector()
    client = _smollm2_core(collector)
    try:
        client.add(AddRequest("bystander", [1, 2, 3, 4], 2000, GREEDY, ignore_eos=True))
        assert isinstance(collector.messages.get(timeout=60), StepOutputs)  # decoding
        added = time.monotonic()
        client.add(AddRequest("attack", [1, 2, 3], 2, SamplingParams(temperature=0.0,
                                                                       guide=("json_schema", _huge_schema()))))
        bystander_times, attack_first = [added], None
        while attack_first is None:
            message = collector.messages.get(timeout=120)
            assert isinstance(message, StepOutputs), message
            now = time.monotonic()
            for output in message.outputs:
                if output.request_id == "bystander" and output.new_token_ids:
                    bystander_times.append(now)
                elif output.request_id == "attack":
                    attack_first = now
        client.abort(["bystander"])
    finally:
        client.close()
    waited = attack_first - added  # its compile, then its prefill
    gaps = [b - a for a, b in itertools.pairwise(bystander_times)]
    assert len(gaps) >= 5, f"the bystander got {len(gaps)} steps in the {waited:.2f} s the attack waited"
    assert max(gaps) < waited / 3, f"the bystander stalled {max(gaps):.2f} s of the attack's {waited:.2f} s"


def test_requests_waiting_for_a_grammar_are_aborted_and_rejected_as_others() -> None:
    collector = Collector()
    client = _smollm2_core(collector)
    try:
        slow = ("json_schema", _huge_schema())
        client.add(AddRequest("aborted", [1, 2, 3], 2, SamplingParams(temperature=0.0, guide=slow)))
        client.abort(["aborted"])
        client.add(AddRequest("bad", [1, 2, 3], 2, SamplingParams(guide=("regex", "(unclosed"))))
        client.add(AddRequest("same", [1, 2, 3], 2, SamplingParams(temperature=0.0, guide=slow)))
        rejected, finished = None, None
        while rejected is None or finished is None:  # in either order: the two compile one after the other
            message = collector.messages.get(timeout=120)
            if isinstance(message, RequestRejected):
                rejected = message
                continue
            assert isinstance(message, StepOutputs), message
            for output in message.outputs:
                assert output.request_id == "same"  # nothing for the aborted request
                finished = output if output.finish_reason is not None else finished
        assert rejected.request_id == "bad" and "regex" in rejected.message
        assert collector.messages.empty()
    finally:
        client.close()
