"""Model repositories in object storage, end to end: a real `naiad serve` reads from moto (S3),
fake-gcs-server (GCS) and Azurite (Azure Blob), all on loopback, driven by tritonclient.

Covered: loading from each store; a local and a cloud repository mixed; poll mode seeing a new
version, a changed config and a removed model; an explicit load of a model uploaded after start;
wrong credentials and a missing bucket reported per repository while the others serve; a
half-uploaded model (config without weights) that does not replace the serving version.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from cloud_servers import AZURITE_ACCOUNT, CloudServer, Uploader, azurite_server, gcs_server, moto_server
from conftest import running_server
from tritonclient.utils import InferenceServerException

from e2e.lifecycle_util import index_by_name, tagged, tagged_config, wait_for
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

SERVERS = {"s3": moto_server, "gs": gcs_server, "as": azurite_server}


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, CloudServer]]:
    """All three servers, started once for the module."""
    root = tmp_path_factory.mktemp("clouds")
    with moto_server(root) as s3, gcs_server(root) as gs, azurite_server(root) as azure:
        yield {"s3": s3, "gs": gs, "as": azure}


@pytest.fixture
def cloud_env(clouds: dict[str, CloudServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The servers' credentials and endpoints in the environment naiad inherits; returns the cache dir."""
    for server in clouds.values():
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _bucket(server: CloudServer, request: pytest.FixtureRequest, suffix: str = "") -> str:
    name = (request.node.name.split("[")[0].replace("_", "-")[:40] + suffix).strip("-").lower()
    Uploader(server).create_bucket(name)
    return name


def _upload_model(server: CloudServer, bucket: str, prefix: str, name: str, tag: int, tmp_path: Path,
                  config: str | None = None, versions: tuple[int, ...] = (1,)) -> None:
    staging = tmp_path / f"staging-{name}-{tag}"
    writers = {v: tagged(tag + v - 1) for v in versions}
    write_model(staging, name, tagged_config() if config is None else config, writers)
    Uploader(server).put_tree(bucket, f"{prefix}/{name}", staging / name)


def _infer(url: str, model: str, version: str = "") -> tuple[str, int]:
    """(model_version, tag) of one request to a `tagged` model."""
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.int32))
    result = client.infer(model, [tensor], model_version=version)
    return result.get_response()["model_version"], int(result.as_numpy("OUTPUT0")[0, 0])


def _answer(url: str, model: str) -> tuple[str, int] | None:
    try:
        return _infer(url, model)
    except InferenceServerException:
        return None


@pytest.mark.parametrize("scheme", sorted(SERVERS))
def test_loads_from_each_store(scheme: str, clouds: dict[str, CloudServer], cloud_env: Path, tmp_path: Path,
                               request: pytest.FixtureRequest) -> None:
    server = clouds[scheme]
    bucket = _bucket(server, request, f"-{scheme}")
    _upload_model(server, bucket, "models/repo", "simple", 40, tmp_path)
    args = ["--model-repository", server.repository(bucket, "models/repo")]
    with running_server(args, tmp_path / "naiad.log") as naiad:
        assert _infer(naiad.url, "simple") == ("1", 40)
        config = httpclient.InferenceServerClient(naiad.url).get_model_config("simple")
        assert config["backend"] == "onnxruntime"
        assert "downloading 2 file(s)" in naiad.logs()
    assert any(cloud_env.rglob("model.onnx"))  # served from the local cache
    # A restart finds the unchanged model in the cache and downloads nothing.
    with running_server(args, tmp_path / "naiad-again.log") as naiad:
        assert _infer(naiad.url, "simple") == ("1", 40)
        assert "downloading" not in naiad.logs()


def test_poll_mode_sees_changes_in_a_bucket_beside_a_local_repository(
        clouds: dict[str, CloudServer], cloud_env: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    s3 = clouds["s3"]
    bucket = _bucket(s3, request)
    up = Uploader(s3)
    local = tmp_path / "local"
    write_model(local, "on_disk", tagged_config(), {1: tagged(1)})
    for name, tag in (("growing", 10), ("reconfigured", 20), ("leaving", 30), ("half", 50)):
        _upload_model(s3, bucket, "repo", name, tag, tmp_path)
    args = ["--model-repository", str(local), "--model-repository", s3.repository(bucket, "repo"),
            "--model-control-mode=poll", "--repository-poll-secs=0.3"]
    with running_server(args, tmp_path / "naiad.log") as naiad:
        url = naiad.url
        assert _infer(url, "on_disk") == ("1", 1)
        assert _infer(url, "growing") == ("1", 10)

        # A new version: the default route moves to it.
        _upload_model(s3, bucket, "repo", "growing", 11, tmp_path, versions=(2,))
        assert wait_for(lambda: _answer(url, "growing") == ("2", 12), 30, "version 2 of 'growing'")

        # A changed config: both versions served after `version_policy: { all {} }`.
        _upload_model(s3, bucket, "repo", "reconfigured", 20, tmp_path, versions=(2,))
        wait_for(lambda: _answer(url, "reconfigured") == ("2", 21), 30, "version 2 of 'reconfigured'")
        up.put(bucket, "repo/reconfigured/config.pbtxt", tagged_config("version_policy: { all {} }").encode())
        wait_for(lambda: len(index_by_name(url).get("reconfigured", [])) == 2
                 and all(e["state"] == "READY" for e in index_by_name(url)["reconfigured"]), 30, "both versions")
        assert _infer(url, "reconfigured", "1") == ("1", 20)

        # A removed model: unloaded.
        up.delete_prefix(bucket, "repo/leaving/")
        wait_for(lambda: _answer(url, "leaving") is None, 30, "'leaving' to be unloaded")

        # Half-uploaded: the new config names weights not uploaded yet. The load fails and the
        # serving version keeps answering; once the weights arrive, the new version serves.
        assert _infer(url, "half") == ("1", 50)
        half_config = tagged_config('default_model_filename: "model_v2.onnx"')
        up.put(bucket, "repo/half/config.pbtxt", half_config.encode())
        wait_for(lambda: "model_v2.onnx" in naiad.logs(), 30, "the failed load of the half-uploaded model")
        assert _infer(url, "half") == ("1", 50)
        (tmp_path / "v2").mkdir()
        tagged(55)(tmp_path / "v2" / "model_v2.onnx")
        up.put(bucket, "repo/half/1/model_v2.onnx", (tmp_path / "v2" / "model_v2.onnx").read_bytes())
        wait_for(lambda: _answer(url, "half") == ("1", 55), 30, "the completed upload of 'half'")

        # A brand-new model with only its config fails alone; everything else keeps serving.
        up.put(bucket, "repo/config_only/config.pbtxt", tagged_config().encode())
        wait_for(lambda: any(e.get("state") == "UNAVAILABLE" for e in index_by_name(url).get("config_only", [])),
                 30, "'config_only' to fail")
        assert _infer(url, "on_disk") == ("1", 1)
        assert _infer(url, "growing") == ("2", 12)
    # Only snapshots that served are kept in the cache: one per remaining model.
    snapshots = [p for p in cloud_env.rglob("*.json") if not p.name.startswith(".")]
    assert len(snapshots) == 3, snapshots


def test_explicit_load_of_a_model_uploaded_after_start(clouds: dict[str, CloudServer], cloud_env: Path,
                                                       tmp_path: Path, request: pytest.FixtureRequest) -> None:
    gs = clouds["gs"]
    bucket = _bucket(gs, request)
    _upload_model(gs, bucket, "repo", "first", 60, tmp_path)
    args = ["--model-repository", gs.repository(bucket, "repo"), "--model-control-mode=explicit",
            "--load-model=first"]
    with running_server(args, tmp_path / "naiad.log") as naiad:
        client = httpclient.InferenceServerClient(naiad.url)
        assert _infer(naiad.url, "first") == ("1", 60)
        assert "later" not in index_by_name(naiad.url)
        _upload_model(gs, bucket, "repo", "later", 70, tmp_path)
        assert "later" in index_by_name(naiad.url)  # the index lists the bucket as it is now
        client.load_model("later")
        assert _infer(naiad.url, "later") == ("1", 70)
        client.unload_model("later")
        assert not client.is_model_ready("later")


def test_unavailable_repositories_fail_alone(clouds: dict[str, CloudServer], cloud_env: Path, tmp_path: Path,
                                             request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrong credentials for one container (through TRITON_CLOUD_CREDENTIAL_PATH's longest prefix)
    and a missing S3 bucket: loads name them; a local repository and a good container serve on."""
    azure, s3 = clouds["as"], clouds["s3"]
    good = _bucket(azure, request, "-good")
    denied = _bucket(azure, request, "-denied")
    _upload_model(azure, good, "repo", "azure_ok", 80, tmp_path)
    _upload_model(azure, denied, "repo", "locked", 90, tmp_path)
    local = tmp_path / "local"
    write_model(local, "on_disk", tagged_config(), {1: tagged(2)})
    denied_repo = azure.repository(denied, "repo")
    missing_repo = s3.repository("no-such-bucket", "repo")
    credentials = {"as": {
        f"as://{AZURITE_ACCOUNT}/": {"account_str": AZURITE_ACCOUNT, "account_key": azure.env["AZURE_STORAGE_KEY"],
                                     "blob_endpoint": azure.endpoint},
        denied_repo: {"account_str": AZURITE_ACCOUNT, "account_key": "d3Jvbmcta2V5LXdyb25nLWtleQ==",
                      "blob_endpoint": azure.endpoint},
    }}
    (tmp_path / "credentials.json").write_text(json.dumps(credentials))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(tmp_path / "credentials.json"))
    args = ["--model-repository", str(local), "--model-repository", azure.repository(good, "repo"),
            "--model-repository", denied_repo, "--model-repository", missing_repo,
            "--model-control-mode=explicit", "--load-model=*"]
    with running_server(args, tmp_path / "naiad.log") as naiad:
        client = httpclient.InferenceServerClient(naiad.url)
        assert _infer(naiad.url, "on_disk") == ("1", 2)
        assert _infer(naiad.url, "azure_ok") == ("1", 80)
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("locked")
        message = str(caught.value)
        assert f"model repository '{denied_repo}' is not available: access denied" in message
        assert f"model repository '{missing_repo}' is not available: no such bucket" in message
        assert _infer(naiad.url, "azure_ok") == ("1", 80)
        logs = naiad.logs()
        assert f"model repository '{denied_repo}' is not available: access denied" in logs
        assert logs.count(f"model repository '{missing_repo}' is not available") == 1  # logged once, not per scan


def test_a_malformed_repository_url_stops_the_server_with_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "naiad.cli", "serve", "--model-repository", "s3://https://host/b"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "model repository 's3://https://host/b': an S3 endpoint needs host:port" in result.stderr


def test_a_bucket_that_goes_away_keeps_its_models_serving(cloud_env: Path, tmp_path: Path) -> None:
    """An S3 server that stops answering in poll mode: its models are not unloaded, the outage is
    logged once with the reason, and the server stays live."""
    with moto_server(tmp_path) as s3:
        Uploader(s3).create_bucket("outage")
        _upload_model(s3, "outage", "repo", "steady", 100, tmp_path)
        args = ["--model-repository", s3.repository("outage", "repo"), "--model-control-mode=poll",
                "--repository-poll-secs=0.2"]
        with running_server(args, tmp_path / "naiad.log") as naiad:
            assert _infer(naiad.url, "steady") == ("1", 100)
            assert s3.process is not None
            s3.process.terminate()
            s3.process.wait(10)
            unavailable = f"model repository '{s3.repository('outage', 'repo')}' is not available: unreachable"
            wait_for(lambda: unavailable in naiad.logs(), 30, "the outage to be logged")
            time.sleep(1.5)  # several polls of the unreachable server
            assert _infer(naiad.url, "steady") == ("1", 100)
            assert naiad.logs().count(unavailable) == 1  # once, not on every poll
