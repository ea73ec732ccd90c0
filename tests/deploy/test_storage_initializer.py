"""KServe's storage-initializer path for deploy/kserve/inferenceservice-s3.yaml, without a cluster:
KServe's own downloader (the `kserve-storage` package its storage-initializer image runs) pulls
the example's storageUri from a real S3 server (moto, on loopback) into a folder, with the
environment KServe's controller derives from the example's Secret; then the naiad runtime's
container (deploy/kserve/naiad-runtime.yaml) serves that folder as its /mnt/models.

kserve-storage is installed here with --no-deps into the git-ignored tests/.node/: its
requirements pin google-cloud-storage<3 (naiad's environment has 3.x) and pull in Azure, Hugging
Face, ModelScope, git and OCI clients; its S3 path needs only boto3, requests, certifi and PyYAML,
which the `test` extra already has (moto[server] brings boto3).
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cloud_servers import Uploader, moto_server

from deploy.pod import infer_simple_grpc, infer_simple_http, run_container, write_simple_repository
from deploy.tools import KSERVE, TESTS, load_manifests

KSERVE_STORAGE_VERSION = "0.21.0"
KSERVE_STORAGE_DIR = TESTS / ".node" / "kserve-storage"  # git-ignored

# What KServe's storage-initializer image runs (python/storage-initializer/scripts/
# initializer-entrypoint): pairs of source URI and destination folder.
INITIALIZER = """
import sys
from kserve_storage import Storage
Storage.download_files(sys.argv[1::2], sys.argv[2::2])
"""


def kserve_storage_path() -> Path:
    if not (KSERVE_STORAGE_DIR / f"kserve_storage-{KSERVE_STORAGE_VERSION}.dist-info").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--upgrade", "--target", str(KSERVE_STORAGE_DIR),
                        f"kserve-storage=={KSERVE_STORAGE_VERSION}"], check=True, timeout=300)
    return KSERVE_STORAGE_DIR


def kserve_s3_env(secret: dict[str, Any]) -> dict[str, str]:
    """The initializer's environment as KServe's controller builds it from an S3 Secret
    (pkg/credentials/s3): its keys, and the endpoint, scheme and region annotations."""
    annotations = secret["metadata"]["annotations"]
    endpoint = annotations["serving.kserve.io/s3-endpoint"]
    https = annotations.get("serving.kserve.io/s3-usehttps", "1")
    env = {key: str(value) for key, value in secret["stringData"].items()}
    env |= {"S3_ENDPOINT": endpoint, "S3_USE_HTTPS": https,
            "AWS_ENDPOINT_URL": f"{'http' if https == '0' else 'https'}://{endpoint}"}
    if "serving.kserve.io/s3-region" in annotations:
        env["AWS_DEFAULT_REGION"] = annotations["serving.kserve.io/s3-region"]
    return env


@pytest.mark.e2e
def test_storage_initializer_downloads_the_repository_that_naiad_then_serves(tmp_path: Path) -> None:
    example = load_manifests(KSERVE / "inferenceservice-s3.yaml")
    secret = next(obj for obj in example if obj["kind"] == "Secret")
    service = next(obj for obj in example if obj["kind"] == "InferenceService")
    storage_uri = service["spec"]["predictor"]["model"]["storageUri"]
    bucket, _, prefix = storage_uri.removeprefix("s3://").partition("/")
    runtime = next(obj for obj in load_manifests(KSERVE / "naiad-runtime.yaml")
                   if obj["metadata"]["name"] == service["spec"]["predictor"]["model"]["runtime"])

    source = write_simple_repository(tmp_path / "source")
    with moto_server(tmp_path) as s3:
        uploader = Uploader(s3)
        uploader.create_bucket(bucket)
        uploader.put_tree(bucket, prefix, source)

        # The example Secret, pointed at moto instead of AWS: endpoint annotation and plain HTTP.
        secret["metadata"]["annotations"] |= {"serving.kserve.io/s3-endpoint": s3.endpoint.removeprefix("http://"),
                                              "serving.kserve.io/s3-usehttps": "0"}
        secret["stringData"] = {key: s3.env[key] for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        models = tmp_path / "mnt" / "models"
        env = {**os.environ, **kserve_s3_env(secret), "PYTHONPATH": str(kserve_storage_path())}
        result = subprocess.run([sys.executable, "-c", INITIALIZER, storage_uri, str(models)], env=env,
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stdout + result.stderr

    # Every file arrived byte for byte, in the repository's layout.
    comparison = filecmp.dircmp(source, models)
    assert not comparison.left_only and not comparison.right_only
    for relative in ("simple/config.pbtxt", "simple/1/model.onnx"):
        assert (models / relative).read_bytes() == (source / relative).read_bytes()

    # The runtime's container serves the downloaded folder in place of /mnt/models.
    container = runtime["spec"]["containers"][0]
    with run_container(container, models, tmp_path / "naiad.log") as pod:
        # The runtime sets no probe (Knative's default TCP probe applies); readiness as KServe's
        # V2 protocol defines it, on KServe's HTTP port 8080 and then gRPC on 9000, both mapped.
        pod.wait_http("/v2/health/ready", 8080)
        infer_simple_http(f"127.0.0.1:{pod.local_port(8080)}")
        infer_simple_grpc(f"127.0.0.1:{pod.local_port(9000)}")
