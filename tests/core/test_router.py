"""The Router: requests pick their version from the snapshot in force, without a lock, and a
version switched away from never gains a request."""

from __future__ import annotations

from typing import Any

import pytest

from naiad.core.labels import VersionLabels
from naiad.core.router import Router
from naiad.errors import InvalidArgument, NotFound, Unavailable


class Version:
    def __init__(self, version: int) -> None:
        self.version = version
        self.inflight = 0
        self.on_acquire: Any = None

    def acquire(self) -> None:
        self.inflight += 1
        if self.on_acquire is not None:
            hook, self.on_acquire = self.on_acquire, None
            hook()

    def release(self, count: int = 1) -> None:
        self.inflight -= count


def _router(*versions: int, labels: VersionLabels | None = None) -> tuple[Router, dict[int, Version]]:
    made = {v: Version(v) for v in versions}
    router = Router()
    router.publish("m", made, labels)  # type: ignore[arg-type]
    return router, made


def test_the_default_is_the_highest_version_and_a_slot_is_taken() -> None:
    router, versions = _router(1, 3)
    loaded, label = router.acquire("m", None)
    assert (loaded, label) == (versions[3], None) and versions[3].inflight == 1
    assert router.acquire("m", 1)[0] is versions[1]
    assert router.versions("m") == [1, 3] and router.serves("m")


def test_unknown_models_and_versions_are_not_found() -> None:
    router, _ = _router(1)
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'x' is not found$"):
        router.acquire("x", None)
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'm' version 2 is not found$"):
        router.acquire("m", 2)


def test_a_switch_between_choosing_and_taking_the_slot_sends_the_request_to_the_new_version() -> None:
    router, versions = _router(1)
    new = Version(2)
    # The lifecycle switches to version 2 just as the request takes its slot on version 1.
    versions[1].on_acquire = lambda: router.publish("m", {2: new}, None)  # type: ignore[arg-type, dict-item]
    loaded, _ = router.acquire("m", None)
    assert loaded is new and new.inflight == 1
    assert versions[1].inflight == 0  # the draining version kept no request


def test_withdrawn_models_take_no_requests() -> None:
    router, _ = _router(1)
    router.withdraw("m")
    with pytest.raises(NotFound):
        router.get("m", None)
    assert router.loaded() == [] and router.versions("m") == []


def test_labels_route_and_the_split_chooses() -> None:
    labels = VersionLabels("m").changed("stable=1,canary=2", "canary:100")
    router, versions = _router(1, 2, labels=labels)
    assert router.acquire("m", None, "stable") == (versions[1], "stable")
    assert router.acquire("m", None) == (versions[2], "canary")  # the split sends everything to canary
    assert router.acquire("m", 1) == (versions[1], None)  # a version named outright skips the split
    assert router.label_version("m", "canary") == 2
    with pytest.raises(InvalidArgument, match="version 1 was requested but label 'canary' names version 2"):
        router.acquire("m", 1, "canary")
    router.relabel("m", VersionLabels("m").changed("stable=3", None))
    with pytest.raises(Unavailable, match="version 3 of model 'm'"):
        router.acquire("m", None, "stable")
