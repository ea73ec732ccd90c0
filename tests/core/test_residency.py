"""core.residency against a lifecycle that records what it is asked (no server, no processes):
which model is evicted, when loads wait, and what the footprints add up to."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.residency import Residency, process_tree_rss
from naiad.errors import NotFound, Unavailable

MB = 1 << 20


class FakeVersion:
    def __init__(self, config: mc.ModelConfig) -> None:
        self.config = config
        self.inflight = 0

    def busy(self) -> bool:
        return self.inflight > 0

    def host_bytes_reserved(self) -> int:
        return self.reserved

    reserved = 0


class FakeLifecycle:
    """Models of `sizes` bytes: a load adds its size to the measured memory, an eviction takes it off."""

    def __init__(self, sizes: dict[str, int], configs: dict[str, mc.ModelConfig] | None = None) -> None:
        self.sizes = sizes
        self.configs = configs or {}
        self.serving_now: dict[str, FakeVersion] = {}
        self.memory = 0
        self.events: list[str] = []

    def load(self, name: str) -> None:
        config = self.configs.get(name, mc.ModelConfig(name=name))
        for step in config.ensemble_scheduling.step:
            if step.model_name not in self.serving_now:
                self.load(step.model_name)
        self.serving_now[name] = FakeVersion(config)
        self.memory += self.sizes[name]
        self.events.append(f"load {name}")

    def evict(self, name: str) -> None:
        self.serving_now.pop(name)
        self.memory -= self.sizes[name]
        self.events.append(f"evict {name}")

    def serving(self, name: str) -> list[Any]:
        return [self.serving_now[name]] if name in self.serving_now else []

    def serving_names(self) -> list[str]:
        return list(self.serving_now)

    def source_path(self, name: str) -> Path | None:
        return None

    def in_repository(self, name: str) -> bool:
        return name in self.sizes


def _residency(lifecycle: FakeLifecycle, budget: int) -> Residency:
    return Residency(lifecycle, budget, measure=lambda: lifecycle.memory, fresh_secs=0.0)


def _use(residency: Residency, *names: str) -> None:
    """Requests for `names`, in order: cold ones load first."""
    for name in names:
        if name not in residency.resident():
            residency.ensure(name).result(timeout=10)
        residency.touch(name)


def test_footprints_are_measured_and_the_least_recently_used_is_evicted_first() -> None:
    lifecycle = FakeLifecycle({"a": 10 * MB, "b": 10 * MB, "c": 10 * MB, "d": 10 * MB})
    residency = _residency(lifecycle, 30 * MB)
    _use(residency, "a", "b", "c", "a", "b", "c", "b", "a")  # c is now the least recently used
    assert residency.resident() == {"a": 10 * MB, "b": 10 * MB, "c": 10 * MB}
    _use(residency, "d")
    assert lifecycle.events[-2:] == ["evict c", "load d"]
    assert residency.resident_bytes() == 30 * MB


def test_models_asked_for_once_go_before_models_asked_for_twice() -> None:
    """LRU-2: a run of one-off requests does not push out the model most requests use."""
    lifecycle = FakeLifecycle({name: 10 * MB for name in ("hot", "x", "y", "z")})
    residency = _residency(lifecycle, 20 * MB)
    _use(residency, "hot", "hot", "x", "y", "z")
    assert set(residency.resident()) == {"hot", "z"}
    assert lifecycle.events.count("evict hot") == 0


def test_busy_and_pinned_models_stay_and_a_load_waits_for_room() -> None:
    pinned = mc.ModelConfig(name="pinned")
    pinned.parameters["pinned"].string_value = "true"
    lifecycle = FakeLifecycle({"pinned": 10 * MB, "busy": 10 * MB, "new": 10 * MB}, {"pinned": pinned})
    residency = _residency(lifecycle, 20 * MB)
    _use(residency, "pinned", "busy")
    lifecycle.serving_now["busy"].inflight = 1
    load = residency.ensure("new")
    time.sleep(0.2)
    assert not load.done()  # nothing can be evicted: it waits
    lifecycle.serving_now["busy"].inflight = 0
    load.result(timeout=10)
    assert set(residency.resident()) == {"pinned", "new"}


def test_an_ensemble_carries_its_steps_and_they_leave_with_it() -> None:
    ensemble = mc.ModelConfig(name="ens", platform="ensemble")
    for step in ("s1", "s2"):
        ensemble.ensemble_scheduling.step.add(model_name=step)
    lifecycle = FakeLifecycle({"ens": 0, "s1": 10 * MB, "s2": 10 * MB, "other": 10 * MB}, {"ens": ensemble})
    residency = _residency(lifecycle, 25 * MB)
    _use(residency, "ens")
    assert residency.resident() == {"ens": 20 * MB}  # the steps' memory is the ensemble's
    _use(residency, "other")
    assert sorted(lifecycle.events[-4:-1]) == ["evict ens", "evict s1", "evict s2"]
    assert set(residency.resident()) == {"other"}


def test_unknown_and_oversized_models_fail_clearly() -> None:
    lifecycle = FakeLifecycle({"big": 50 * MB, "small": 1 * MB})
    residency = _residency(lifecycle, 20 * MB)
    with pytest.raises(NotFound, match="unknown model: 'nothere'"):
        residency.ensure("nothere").result(timeout=10)
    _use(residency, "small")
    residency._measured["big"] = 50 * MB  # measured on an earlier load
    with pytest.raises(Unavailable, match="more than the model memory budget"):
        residency.ensure("big").result(timeout=10)


def test_requests_for_a_loading_model_share_its_load() -> None:
    lifecycle = FakeLifecycle({"a": MB})
    gate = threading.Event()
    original = lifecycle.load
    lifecycle.load = lambda name: (gate.wait(10), original(name))  # type: ignore[method-assign]
    residency = _residency(lifecycle, 0)
    first, second = residency.ensure("a"), residency.ensure("a")
    assert first is second
    gate.set()
    first.result(timeout=10)
    assert lifecycle.events == ["load a"]


def test_process_tree_rss_counts_children(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, pages, children in ((1, 10, "2 3"), (2, 5, ""), (3, 7, "4"), (4, 1, "")):
        task = proc / str(pid) / "task" / str(pid)
        task.mkdir(parents=True)
        (proc / str(pid) / "statm").write_text(f"100 {pages} 0 0 0 0 0\n")
        (task / "children").write_text(children)
    page = os.sysconf("SC_PAGE_SIZE")
    assert process_tree_rss(1, proc) == 23 * page
    assert process_tree_rss(3, proc) == 8 * page


def test_a_load_that_measures_more_than_estimated_evicts_others_never_itself() -> None:
    lifecycle = FakeLifecycle({"a": 10 * MB, "b": 10 * MB, "heavy": 15 * MB})
    residency = _residency(lifecycle, 30 * MB)
    _use(residency, "a", "b")
    residency.ensure("heavy").result(timeout=10)  # estimated at 10 MiB (the mean), measured 15
    assert "heavy" in residency.resident()
    assert residency.resident_bytes() <= 30 * MB
    assert lifecycle.events[-1] == "evict a"


def test_a_reservation_larger_than_what_was_touched_is_what_counts() -> None:
    """An LLM's KV cache is zeroed pages that take no memory until tokens are written there."""
    lifecycle = FakeLifecycle({"llm": 1 * MB})
    original = lifecycle.load

    def load(name: str) -> None:
        original(name)
        lifecycle.serving_now[name].reserved = 64 * MB

    lifecycle.load = load  # type: ignore[method-assign]
    residency = _residency(lifecycle, 0)
    _use(residency, "llm")
    assert residency.resident() == {"llm": 64 * MB}


def test_a_model_loaded_for_a_lookup_is_kept_a_moment_and_one_loaded_for_infer_is_not() -> None:
    lifecycle = FakeLifecycle({"looked_up": MB, "plain": MB, "next": MB})
    residency = Residency(lifecycle, 1 * MB, measure=lambda: lifecycle.memory, fresh_secs=0.5)
    residency.ensure("looked_up", lookup=True).result(timeout=10)
    started = time.monotonic()
    residency.ensure("plain").result(timeout=10)  # waits for the looked-up model's moment to pass
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    residency.ensure("next").result(timeout=10)  # evicts the plain one at once
    assert time.monotonic() - started < 0.4
    assert lifecycle.events == ["load looked_up", "evict looked_up", "load plain", "evict plain", "load next"]


def test_a_load_that_loads_another_model_does_not_wait_for_itself() -> None:
    """A Python model's initialize() may load another model (pb_utils model control)."""
    lifecycle = FakeLifecycle({"parent": MB, "child": MB})
    residency = _residency(lifecycle, 0)
    original = lifecycle.load

    def load(name: str) -> None:
        if name == "parent":
            residency.load_now("child", lambda: original("child"))
        original(name)

    lifecycle.load = load  # type: ignore[method-assign]
    residency.ensure("parent").result(timeout=10)
    assert lifecycle.events == ["load child", "load parent"]
    assert set(residency.resident()) == {"parent", "child"}
