"""Replicas that converge (docs/scaling.md): poll mode over one shared S3 repository is how a new
version rolls out to every replica. Two naiad instances, each with its own download cache (as two
pods would have), poll one bucket on a real moto S3 server; clients keep inferring without naming
a version while version 2 is uploaded. Both must serve version 2 within the poll interval (plus
the time to download and load it) and no request may fail on the way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from cloud_servers import CloudServer, Uploader, moto_server

from e2e.lifecycle_util import tagged, tagged_config
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

POLL_SECS = 1.0
SLACK_SECS = 14.0  # download, load and a busy 2-core machine; measured 0.3-1.0 s in all


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


def _upload(s3: CloudServer, bucket: str, version: int, tag: int, tmp_path: Path) -> None:
    """Version `version` of `rolling`, whose answer is INPUT0 + `tag`."""
    staging = tmp_path / f"staging-{version}"
    write_model(staging, "rolling", tagged_config(), {version: tagged(tag)})
    Uploader(s3).put_tree(bucket, "repo/rolling", staging / "rolling")


class Caller:
    """Infers on one replica in a loop without naming a version; records what answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[float, str, int]] = []  # (monotonic time, model_version, tag)
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
        tensor.set_data_from_numpy(np.zeros((1, 4), np.int32))
        try:
            while not self.stop.is_set():
                try:
                    result = client.infer("rolling", [tensor])
                except Exception as error:  # counted: the test asserts there are none
                    self.failures.append(error)
                    continue
                self.answers.append((time.monotonic(), result.get_response()["model_version"],
                                     int(result.as_numpy("OUTPUT0")[0, 0])))
                time.sleep(0.01)
        finally:
            client.close()

    def first_answer_of(self, version: str) -> float | None:
        return next((at for at, answered, _ in self.answers if answered == version), None)


def test_a_new_version_in_the_shared_bucket_reaches_both_replicas_without_a_failed_request(
        s3: CloudServer, tmp_path: Path, start_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = "shared-repository"
    Uploader(s3).create_bucket(bucket)
    _upload(s3, bucket, 1, 10, tmp_path)
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    args = ["--model-repository", s3.repository(bucket, "repo"), "--model-control-mode=poll",
            f"--repository-poll-secs={POLL_SECS}"]
    replicas = []
    for index in range(2):  # each pod has its own cache
        monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / f"cache-{index}"))
        replicas.append(start_server(args))
    callers = [Caller(replica.url) for replica in replicas]
    for caller in callers:
        caller.thread.start()
    try:
        time.sleep(1.0)  # both serving version 1 under load
        _upload(s3, bucket, 2, 20, tmp_path)
        uploaded = time.monotonic()
        deadline = uploaded + POLL_SECS + SLACK_SECS
        while time.monotonic() < deadline and not all(c.first_answer_of("2") for c in callers):
            time.sleep(0.1)
        time.sleep(0.5)  # and they keep serving it
    finally:
        for caller in callers:
            caller.stop.set()
            caller.thread.join(30)
    for caller in callers:
        assert not caller.failures, caller.failures[:3]
        switched = caller.first_answer_of("2")
        assert switched is not None, f"{caller.url} never served version 2"
        print(f"{caller.url}: version 2 {switched - uploaded:.2f} s after the upload, "  # shown with -rP
              f"{len(caller.answers)} answers, {len(caller.failures)} failures")
        assert switched - uploaded <= POLL_SECS + SLACK_SECS
        before = [(version, tag) for at, version, tag in caller.answers if at < switched]
        after = [(version, tag) for at, version, tag in caller.answers if at >= switched]
        assert before and set(before) == {("1", 10)}
        assert set(after) == {("2", 20)}  # once switched, never back to version 1
