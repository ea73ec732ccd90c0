"""naiad.repository.remote against real servers on loopback: moto (S3), fake-gcs-server (GCS), Azurite.

Listing, fingerprints without downloads, snapshots (reused, hard-linked, pruned), verification
of downloads, and the errors of a missing bucket, wrong credentials and an unreachable endpoint.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cloud_servers import CloudServer, Uploader, azurite_server, gcs_server, moto_server
from conftest import free_port

from naiad.repository.catalog import Repositories
from naiad.repository.location import parse_repository
from naiad.repository.remote import RemoteRepository, RepositoryUnavailable

SERVERS = {"s3": moto_server, "gs": gcs_server, "as": azurite_server}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    with SERVERS[request.param](tmp_path_factory.mktemp(f"{request.param}-server")) as running:
        yield running


@pytest.fixture
def env(server: CloudServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    # google-cloud-storage finds its emulator in the process environment only.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.env.get("STORAGE_EMULATOR_HOST", ""))
    if server.scheme != "gs":
        monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    return {**server.env, "NAIAD_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture
def bucket(server: CloudServer, request: pytest.FixtureRequest) -> str:
    """A fresh bucket per test (names must be DNS-like: no underscores)."""
    name = request.node.name.split("[")[0].replace("_", "-")[:50].strip("-").lower()
    Uploader(server).create_bucket(name)
    return name


def _repo(server: CloudServer, bucket: str, env: dict[str, str], path: str = "repo") -> RemoteRepository:
    return RemoteRepository(parse_repository(server.repository(bucket, path)), env)


def _fill(server: CloudServer, bucket: str) -> Uploader:
    up = Uploader(server)
    up.put(bucket, "repo/alpha/config.pbtxt", b"name: 'alpha'")
    up.put(bucket, "repo/alpha/1/model.onnx", b"weights-1" * 100)
    up.put(bucket, "repo/alpha/2/model.onnx", b"weights-2" * 100)
    up.put(bucket, "repo/beta/1/model.onnx", b"beta")
    up.put(bucket, "repo/.hidden/1/model.onnx", b"no")
    up.put(bucket, "repo/README.md", b"not a model")
    up.put(bucket, "elsewhere/gamma/1/model.onnx", b"outside the prefix")
    return up


def test_lists_models_and_fingerprints_without_downloading(server: CloudServer, bucket: str,
                                                           env: dict[str, str]) -> None:
    _fill(server, bucket)
    repo = _repo(server, bucket, env)
    models = repo.models()
    assert sorted(models) == ["alpha", "beta"]
    stamp = repo.fingerprint("alpha", models["alpha"])
    assert [(key, size) for key, size, _ in stamp] == [("1/model.onnx", 900), ("2/model.onnx", 900),
                                                       ("config.pbtxt", 13)]
    assert not (Path(env["NAIAD_CACHE_DIR"])).exists()  # nothing was downloaded


def test_materialize_reuse_link_and_prune(server: CloudServer, bucket: str, env: dict[str, str]) -> None:
    up = _fill(server, bucket)
    repo = _repo(server, bucket, env)
    first = repo.materialize("alpha", repo.models()["alpha"])
    assert (first / "1" / "model.onnx").read_bytes() == b"weights-1" * 100
    assert (first / "config.pbtxt").read_text() == "name: 'alpha'"
    # Unchanged: the same snapshot, not downloaded again.
    mtime = (first / "1" / "model.onnx").stat().st_mtime_ns
    assert repo.materialize("alpha", repo.models()["alpha"]) == first
    assert (first / "1" / "model.onnx").stat().st_mtime_ns == mtime
    # One file changed: a new snapshot; the old one is untouched and unchanged files are hard links.
    up.put(bucket, "repo/alpha/2/model.onnx", b"weights-2b" * 100)
    second = repo.materialize("alpha", repo.models()["alpha"])
    assert second != first
    assert (second / "2" / "model.onnx").read_bytes() == b"weights-2b" * 100
    assert (first / "2" / "model.onnx").read_bytes() == b"weights-2" * 100
    assert (second / "1" / "model.onnx").stat().st_ino == (first / "1" / "model.onnx").stat().st_ino
    # A download left half-done by a process that died is removed too; a live one's is not.
    dead = repo.model_path("alpha") / ".partial-0123-999999999-abcd"
    live = repo.model_path("alpha") / f".partial-0123-{os.getpid()}-abcd"
    dead.mkdir()
    live.mkdir()
    repo.prune("alpha", {second})
    assert not first.exists() and second.exists()
    assert not dead.exists() and live.exists()
    repo.prune("alpha", set())
    assert not second.exists()


def test_directory_markers_become_empty_directories(server: CloudServer, bucket: str, env: dict[str, str]) -> None:
    up = Uploader(server)
    up.put(bucket, "repo/half/config.pbtxt", b"config only")
    up.put(bucket, "repo/half/3/", b"")
    repo = _repo(server, bucket, env)
    snapshot = repo.materialize("half", repo.models()["half"])
    assert (snapshot / "3").is_dir() and not any((snapshot / "3").iterdir())


def test_a_blob_changed_after_listing_fails_verification(server: CloudServer, bucket: str,
                                                         env: dict[str, str]) -> None:
    up = _fill(server, bucket)
    repo = _repo(server, bucket, env)
    listing = repo.models()["beta"]
    up.put(bucket, "repo/beta/1/model.onnx", b"longer than before")
    with pytest.raises(RepositoryUnavailable, match=re.escape(
            "download incomplete: 'repo/beta/1/model.onnx' has 18 bytes, the listing said 4")):
        repo.materialize("beta", listing)
    listing = repo.models()["beta"]
    assert listing[0].md5 is not None  # each of the three services states the MD5 of a single-shot upload
    up.put(bucket, "repo/beta/1/model.onnx", b"LONGER THAN BEFORE")  # same size, other bytes
    with pytest.raises(RepositoryUnavailable, match="download corrupt"):
        repo.materialize("beta", listing)
    assert not list((repo.model_path("beta")).glob(".partial-*"))  # no half-made snapshot is left


def test_large_models_log_progress(server: CloudServer, bucket: str, env: dict[str, str],
                                   caplog: pytest.LogCaptureFixture) -> None:
    up = Uploader(server)
    for index in range(10):
        up.put(bucket, f"repo/big/1/part{index}.bin", os.urandom(1000))
    repo = _repo(server, bucket, env)
    repo.large_model_bytes = 5000
    with caplog.at_level(logging.INFO, logger="naiad.repository.remote"):
        repo.materialize("big", repo.models()["big"])
    messages = [r.getMessage() for r in caplog.records if r.name == "naiad.repository.remote"]
    assert "downloading 10 file(s), 0.0 MB" in messages[0]
    assert any("(100%)" in m for m in messages) and any("(50%)" in m for m in messages)


def test_a_missing_bucket_is_named(server: CloudServer, env: dict[str, str]) -> None:
    repo = _repo(server, "no-such-bucket", env)
    with pytest.raises(RepositoryUnavailable) as caught:
        repo.models()
    assert str(caught.value).startswith(f"model repository '{server.repository('no-such-bucket', 'repo')}' "
                                        f"is not available: no such bucket")


def test_catalog_keeps_other_repositories_when_one_is_missing(server: CloudServer, bucket: str,
                                                              env: dict[str, str], tmp_path: Path) -> None:
    _fill(server, bucket)
    local = tmp_path / "local"
    (local / "delta" / "1").mkdir(parents=True)
    missing = server.repository("no-such-bucket")
    catalog = Repositories([local, server.repository(bucket, "repo"), missing], env)
    found = catalog.discover()
    assert sorted(found.models) == ["alpha", "beta", "delta"]
    assert list(found.unavailable) == [missing]
    assert "no such bucket" in found.unavailable[missing]
    assert catalog.materialize(found.models["delta"]) == local / "delta"
    assert (catalog.materialize(found.models["beta"]) / "1" / "model.onnx").read_bytes() == b"beta"


def test_a_model_in_two_repositories_is_a_duplicate(server: CloudServer, bucket: str, env: dict[str, str],
                                                    tmp_path: Path) -> None:
    _fill(server, bucket)
    (tmp_path / "local" / "beta" / "1").mkdir(parents=True)
    found = Repositories([tmp_path / "local", server.repository(bucket, "repo")], env).discover()
    assert "beta" in found.duplicates and "beta" not in found.models


# ------------------------------------------------------------------------ credentials and reachability


def test_wrong_azure_key_is_access_denied(tmp_path: Path) -> None:
    with azurite_server(tmp_path) as azure:
        Uploader(azure).create_bucket("models")
        env = {**azure.env, "AZURE_STORAGE_KEY": "d3Jvbmcta2V5LXdyb25nLWtleQ==", "NAIAD_CACHE_DIR": str(tmp_path)}
        with pytest.raises(RepositoryUnavailable, match="is not available: access denied"):
            RemoteRepository(parse_repository(azure.repository("models")), env).models()


def test_wrong_s3_key_is_access_denied(tmp_path: Path) -> None:
    with moto_server(tmp_path, auth=True) as s3:
        env = {**s3.env, "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG1", "NAIAD_CACHE_DIR": str(tmp_path)}
        with pytest.raises(RepositoryUnavailable, match="is not available: access denied"):
            RemoteRepository(parse_repository(s3.repository("models")), env).models()


def test_unreadable_gcs_credentials_are_access_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    (tmp_path / "sa.json").write_text('{"type": "service_account"}')
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "sa.json"), "NAIAD_CACHE_DIR": str(tmp_path)}
    with pytest.raises(RepositoryUnavailable, match="access denied: cannot use the GCS credentials"):
        RemoteRepository(parse_repository("gs://models/repo"), env).models()


def test_an_unreachable_endpoint_is_named(tmp_path: Path) -> None:
    env = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "NAIAD_CACHE_DIR": str(tmp_path)}
    spec = f"s3://127.0.0.1:{free_port()}/models"
    with pytest.raises(RepositoryUnavailable, match=f"model repository '{spec}' is not available: unreachable"):
        RemoteRepository(parse_repository(spec), env).models()


def test_a_bad_credential_file_is_reported_per_repository(tmp_path: Path) -> None:
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / "missing.json"), "NAIAD_CACHE_DIR": str(tmp_path)}
    found = Repositories(["s3://models/repo"], env).discover()
    assert "TRITON_CLOUD_CREDENTIAL_PATH: cannot read" in found.unavailable["s3://models/repo"]


def test_mount_directory_pins_the_cache(tmp_path: Path) -> None:
    env = {"TRITON_AWS_MOUNT_DIRECTORY": str(tmp_path / "mount")}
    repo = RemoteRepository(parse_repository("s3://models/repo"), env)
    assert repo.model_path("m").is_relative_to(tmp_path / "mount")
