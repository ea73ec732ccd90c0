"""ModelManager in process: routing, load / reload / unload, overrides, polling, the index."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.lifecycle_util import add_version, broken, remove_model, replace_file, tagged, tagged_config
from e2e.repo_builder import write_model
from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import config_from_json
from naiad.config.options import ServerOptions
from naiad.core.lifecycle import ModelManager
from naiad.errors import InvalidArgument, NotFound, Unavailable


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_model(root, "m", tagged_config(), {1: tagged(1), 2: tagged(2)})
    return root


@pytest.fixture
def manager(repo: Path) -> Iterator[ModelManager]:
    models = ModelManager(ServerOptions(model_repositories=(repo,)))
    yield models
    models.stop_all(1.0)


def _override(max_batch_size: int) -> mc.ModelConfig:
    return config_from_json({
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [4]}],
    })


# ----------------------------------------------------------------------------- routing


def test_load_routes_to_the_highest_serving_version(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "all", tagged_config("version_policy: { all: {} }"), {1: tagged(1), 3: tagged(3)})
    manager.load("m")
    manager.load("all")
    assert manager.serving_versions("m") == [2]  # latest 1 by default
    assert manager.get("m", None).version == 2
    assert manager.serving_versions("all") == [1, 3]
    assert manager.get("all", None).version == 3
    assert manager.get("all", 1).version == 1
    assert sorted((v.name, v.version) for v in manager.loaded()) == [("all", 1), ("all", 3), ("m", 2)]


def test_unknown_model_and_version_texts(manager: ModelManager) -> None:
    manager.load("m")
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'x' is not found$"):
        manager.get("x", None)
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'm' version 1 is not found$"):
        manager.get("m", 1)
    with pytest.raises(NotFound):
        manager.router.acquire("x", None)


def test_acquire_holds_an_unload_until_release(manager: ModelManager) -> None:
    manager.load("m")
    loaded, _ = manager.router.acquire("m", None)
    unloading = threading.Thread(target=manager.unload, args=("m", 10.0))
    unloading.start()
    unloading.join(0.3)
    assert unloading.is_alive()  # draining the request in flight
    with pytest.raises(NotFound):
        manager.get("m", None)  # no new requests are routed meanwhile
    loaded.release()
    unloading.join(10)
    assert not unloading.is_alive()


# ------------------------------------------------------------------------ load / unload


def test_load_of_unknown_model(manager: ModelManager) -> None:
    with pytest.raises(InvalidArgument, match=r"^failed to load 'x', failed to poll from model repository$"):
        manager.load("x")


@pytest.mark.parametrize(("name", "message"), [
    ("", "Model name cannot be empty. Please enter a valid name to deploy."),
    ("..", "model name must not contain path traversal characters"),
    ("../m", "model name must not contain path traversal characters"),
    ("a/b", "model name must not contain path traversal characters"),
    ("a\\b", "model name must not contain path traversal characters"),
])
def test_invalid_names(manager: ModelManager, name: str, message: str) -> None:
    for call in (manager.load, manager.unload):
        with pytest.raises(InvalidArgument) as caught:
            call(name)
        assert str(caught.value) == message


def test_reload_without_changes_is_a_no_op(manager: ModelManager) -> None:
    manager.load("m")
    first = manager.get("m", 2)
    manager.load("m")
    assert manager.get("m", 2) is first


def test_reload_after_a_change_swaps_the_version(repo: Path, manager: ModelManager) -> None:
    manager.load("m")
    first = manager.get("m", 2)
    replace_file(repo / "m" / "2" / "model.onnx", tagged(20))
    manager.load("m")
    assert manager.get("m", 2) is not first


def test_failed_reload_keeps_the_old_version(repo: Path, manager: ModelManager) -> None:
    manager.load("m")
    serving = manager.get("m", 2)
    replace_file(repo / "m" / "2" / "model.onnx", broken)
    with pytest.raises(InvalidArgument, match=r"^load failed for model 'm': version 2 is at UNAVAILABLE state: "):
        manager.load("m")
    assert manager.get("m", None) is serving
    assert manager.index() == [{"name": "m", "version": "2", "state": "READY"}]


def test_failed_first_load_shows_in_the_index(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "bad", tagged_config(), {1: broken})
    with pytest.raises(InvalidArgument, match=r"^load failed for model 'bad': "):
        manager.load("bad")
    (entry,) = [e for e in manager.index() if e["name"] == "bad"]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"]
    assert not manager.all_ready()


def test_missing_version_of_a_specific_policy_fails(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "spec", tagged_config("version_policy: { specific: { versions: [1, 4] } }"), {1: tagged(1)})
    with pytest.raises(InvalidArgument, match="version 4"):
        manager.load("spec")
    with pytest.raises(NotFound):
        manager.get("spec", 1)


def test_model_without_versions_fails(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "empty", tagged_config(), {})
    with pytest.raises(InvalidArgument, match=r"^load failed for model 'empty': "):
        manager.load("empty")


def test_unload(manager: ModelManager) -> None:
    manager.load("m")
    manager.unload("m")
    with pytest.raises(NotFound):
        manager.get("m", None)
    assert manager.index() == [{"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}]
    manager.unload("m")  # again: nothing to do
    manager.unload("never_there")
    manager.load("m")
    assert manager.get("m", None).version == 2


# ---------------------------------------------------------------------------- overrides


def test_config_override_is_remembered(manager: ModelManager) -> None:
    manager.load("m", _override(2))
    assert manager.get("m", None).config.max_batch_size == 2
    manager.load("m")
    assert manager.get("m", None).config.max_batch_size == 2


def test_file_overrides_need_a_config(manager: ModelManager, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="config"):
        manager.load("files", None, {"1/model.onnx": b"x"})


def test_file_overrides_form_the_model_directory(manager: ModelManager, tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    tagged(7)(path)
    manager.load("m", _override(8), {"5/model.onnx": path.read_bytes()})
    assert manager.serving_versions("m") == [5]
    temporary = manager.get("m", 5).model_dir
    assert temporary.is_dir()
    manager.load("fresh", _override(8), {"1/model.onnx": path.read_bytes()})
    assert manager.serving_versions("fresh") == [1]
    manager.unload("m")
    assert not temporary.exists()  # the temporary directory goes with the unload


def test_file_override_paths_cannot_escape(manager: ModelManager) -> None:
    with pytest.raises(InvalidArgument, match="path traversal"):
        manager.load("escape", _override(8), {"../../outside/model.onnx": b"x"})


# ------------------------------------------------------------------------ startup, poll


def test_load_many_reports_each_failure(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "bad", tagged_config(), {1: broken})
    errors = manager.load_many(["m", "bad", "ghost"])
    assert sorted(errors) == ["bad", "ghost"]
    assert errors["ghost"] == "failed to load 'ghost', failed to poll from model repository"
    assert errors["bad"].startswith("load failed for model 'bad': ")
    assert manager.get("m", None).version == 2


def test_auto_complete_failure_is_a_load_failure(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "bad_auto", None, {1: broken})  # no config: auto-complete reads the bad file
    with pytest.raises(InvalidArgument, match=r"^load failed for model 'bad_auto': "):
        manager.load("bad_auto")
    (entry,) = [e for e in manager.index() if e["name"] == "bad_auto"]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"]


def test_poll_loads_reloads_and_unloads(repo: Path, manager: ModelManager) -> None:
    manager.poll()
    assert manager.serving_versions("m") == [2]
    serving = manager.get("m", 2)
    manager.poll()
    assert manager.get("m", 2) is serving  # nothing changed: nothing reloaded

    add_version(repo / "m", 3, tagged(3))
    write_model(repo, "new", tagged_config(), {1: tagged(1)})
    manager.poll()
    assert manager.serving_versions("m") == [3]
    assert manager.serving_versions("new") == [1]

    remove_model(repo, "new")
    manager.poll()
    with pytest.raises(NotFound):
        manager.get("new", None)
    assert "new" not in {e["name"] for e in manager.index()}


def test_poll_retries_a_broken_model_only_after_it_changes(repo: Path, manager: ModelManager) -> None:
    model_dir = write_model(repo, "flaky", tagged_config(), {1: broken})
    manager.poll()
    assert manager.serving_versions("flaky") == []
    manager.poll()  # unchanged: not retried (no second failure logged, still unavailable)
    replace_file(model_dir / "1" / "model.onnx", tagged(1))
    manager.poll()
    assert manager.serving_versions("flaky") == [1]


def test_duplicates_across_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_model(first, "twice", tagged_config(), {1: tagged(1)})
    write_model(second, "twice", tagged_config(), {1: tagged(2)})
    write_model(second, "once", tagged_config(), {1: tagged(3)})
    manager = ModelManager(ServerOptions(model_repositories=(first, second)))
    try:
        with pytest.raises(Unavailable, match=r"^failed to load 'twice', model appears in two or more repositories$"):
            manager.load("twice")
        manager.load("once")
        assert manager.index() == [
            {"name": "once", "version": "1", "state": "READY"},
            {"name": "twice", "state": "UNAVAILABLE", "reason": "model appears in two or more repositories"},
        ]
    finally:
        manager.stop_all(1.0)


def test_index_lists_unloaded_names_and_filters_ready(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "idle", tagged_config(), {1: tagged(1)})
    manager.load("m")
    assert manager.index() == [{"name": "idle"}, {"name": "m", "version": "2", "state": "READY"}]
    assert manager.index(ready_only=True) == [{"name": "m", "version": "2", "state": "READY"}]
    assert manager.all_ready()


def test_stop_all_unloads_everything(manager: ModelManager) -> None:
    manager.load("m")
    manager.stop_all(1.0)
    assert manager.loaded() == []


# ----------------------------------------------------------------------------- instance-count updates

_IDENTITY = """
backend: "identity"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


def _identity_config(repo: Path, count: int, mbs: int = 4) -> None:
    config = repo / "idm" / "config.pbtxt"
    config.write_text(_IDENTITY.format(count=count, mbs=mbs))


def test_an_instance_count_change_keeps_the_backend_model(repo: Path, manager: ModelManager) -> None:
    write_model(repo, "idm", _IDENTITY.format(count=1, mbs=4), {1: lambda path: None})
    manager.load("idm")
    before = manager.get("idm", None)
    _identity_config(repo, count=3)
    manager.load("idm")
    after = manager.get("idm", None)
    assert after is not before and after.model is before.model  # not reloaded from disk
    assert [g.count for g in after.config.instance_group] == [3]
    assert after.owns_model and not before.owns_model
    _identity_config(repo, count=3, mbs=8)  # any other change reloads the model
    manager.load("idm")
    assert manager.get("idm", None).model is not after.model
