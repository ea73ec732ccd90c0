"""What a client of the load API can and cannot reach, on a real server in explicit mode:
`file:` overrides and config file names stay inside the model directory, a pickle hidden in an
uploaded PT2 archive is not run, and symlinks the operator put in the repository are followed."""

from __future__ import annotations

import io
import json
import pathlib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from e2e.repo_builder import write_model

IDENTITY = {
    "backend": "identity",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory beside the repository: nothing may be written to or read from it by a client."""
    return tmp_path_factory.mktemp("outside")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, outside: Path) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("safety") / "repo"
    write_model(repo, "inside", json.dumps(IDENTITY), {1: lambda path: None})
    # The operator links a model kept elsewhere into the repository.
    elsewhere = write_model(outside, "linked_target", None, {1: lambda path: None})
    (elsewhere / "config.pbtxt").write_text('backend: "identity"\nmax_batch_size: 0\n'
                                            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                                            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    (repo / "linked").symlink_to(elsewhere, target_is_directory=True)
    args = ["--model-repository", str(repo), "--model-control-mode=explicit"]
    with running_server(args, tmp_path_factory.mktemp("safety-log") / "naiad.log") as process:
        yield process


@pytest.fixture
def client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def _load_error(client: Any, name: str, config: dict[str, Any], files: dict[str, bytes] | None = None) -> Any:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(name, config=json.dumps(config), files=files)
    return caught.value


@pytest.mark.parametrize("path", [
    "../escaped.txt", "1/../../escaped.txt", "1/sub/../../../escaped.txt", "/tmp/naiad-escaped.txt",
])
def test_file_overrides_cannot_leave_the_model_directory(client: Any, outside: Path, path: str) -> None:
    if path.startswith("/"):
        path = str(outside / "escaped.txt")  # an absolute path into a directory we can check
    error = _load_error(client, "uploaded", IDENTITY, {f"file:{path}": b"x", "file:1/model.bin": b"y"})
    assert error.status() == "400"
    assert error.message() == "file override path must not contain path traversal characters"
    assert not (outside / "escaped.txt").exists()
    assert not list(outside.parent.glob("escaped.txt"))
    assert not client.is_model_ready("uploaded")


@pytest.mark.parametrize("filename", ["../../../etc/passwd", "/etc/passwd", "1/../../x.py"])
def test_a_config_cannot_name_a_model_file_outside_the_version_directory(client: Any, filename: str) -> None:
    config = {**IDENTITY, "default_model_filename": filename}
    error = _load_error(client, "inside", config)
    assert error.status() == "400"
    assert f"default_model_filename '{filename}' must name a file inside the version directory" in error.message()
    error = _load_error(client, "inside", {**IDENTITY, "cc_model_filenames": {"8.0": filename}})
    assert f"cc_model_filenames[8.0] '{filename}' must name a file inside" in error.message()


@pytest.mark.parametrize(("name", "status", "message"), [
    ("..", "400", "model name must not contain path traversal characters"),
    ("a\\b", "400", "model name must not contain path traversal characters"),
    ("../inside", "404", "Not Found"),  # a slash: no such route (gRPC, where it reaches the check: 400)
])
def test_model_names_cannot_leave_the_repository(client: Any, name: str, status: str, message: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(name)
    assert (caught.value.status(), caught.value.message()) == (status, message)


def test_symlinks_placed_by_the_operator_are_followed(client: Any) -> None:
    """The repository is the operator's (as in Triton, which follows them too): a linked model loads."""
    client.load_model("linked")
    assert client.is_model_ready("linked")
    client.unload_model("linked")


def _pickle_bomb_pt2(marker: Path) -> bytes:
    """A real torch.export archive whose weight is swapped for a pickle that creates `marker`
    when unpickled (torch.export.load would run it through torch.load(weights_only=False))."""
    import torch  # here, so that the other tests of this module do not pay for importing it

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (pathlib.Path.touch, (marker,))

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x: Any) -> Any:
            return x * self.w

    saved = io.BytesIO()
    torch.export.save(torch.export.export(Scale(), (torch.ones(4),)), saved)
    archive = zipfile.ZipFile(io.BytesIO(saved.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as evil:
        for entry in archive.namelist():
            data = archive.read(entry)
            if entry.endswith("model_weights_config.json"):
                weights = json.loads(data)
                weights["config"]["w"]["use_pickle"] = True
                data = json.dumps(weights).encode()
            elif entry.endswith("data/weights/weight_0"):
                bomb = io.BytesIO()
                torch.save(Evil(), bomb)
                data = bomb.getvalue()
            evil.writestr(entry, data)
    return out.getvalue()


def test_a_pickle_in_an_uploaded_pt2_archive_is_not_run(client: Any, tmp_path: Path) -> None:
    marker = tmp_path / "pickle-ran"
    archive = _pickle_bomb_pt2(marker)
    config = {"backend": "pytorch", "default_model_filename": "model.pt2"}
    error = _load_error(client, "bomb", config, {"file:1/model.pt2": archive})
    assert error.status() == "400"
    assert "naiad does not unpickle Python objects from model files" in error.message()
    assert not marker.exists()
    assert not client.is_model_ready("bomb")
