"""naiad.repository.location: local paths and s3:// gs:// as:// URLs, and clear errors for malformed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from naiad.repository.location import LocationError, RemoteLocation, is_remote, parse_repository


def test_local_paths_stay_paths() -> None:
    assert parse_repository("/models") == Path("/models")
    assert parse_repository(Path("rel/models")) == Path("rel/models")
    assert not is_remote("/models") and not is_remote(Path("s3:/x"))


@pytest.mark.parametrize(("spec", "expected"), [
    ("s3://bucket", RemoteLocation("s3://bucket", "s3", "bucket", "")),
    ("s3://bucket/a/b", RemoteLocation("s3://bucket/a/b", "s3", "bucket", "a/b/")),
    ("s3://bucket/a/b/", RemoteLocation("s3://bucket/a/b/", "s3", "bucket", "a/b/")),
    ("s3://localhost:9000/bucket/models",
     RemoteLocation("s3://localhost:9000/bucket/models", "s3", "bucket", "models/", endpoint="http://localhost:9000")),
    ("s3://http://10.0.0.1:80/bucket",
     RemoteLocation("s3://http://10.0.0.1:80/bucket", "s3", "bucket", "", endpoint="http://10.0.0.1:80")),
    ("s3://https://s3.example.com:443/bucket/p",
     RemoteLocation("s3://https://s3.example.com:443/bucket/p", "s3", "bucket", "p/",
                    endpoint="https://s3.example.com:443")),
    ("gs://bucket/path/to/repo", RemoteLocation("gs://bucket/path/to/repo", "gs", "bucket", "path/to/repo/")),
    ("as://account/container/repo",
     RemoteLocation("as://account/container/repo", "as", "container", "repo/", account="account")),
    ("as://account/container", RemoteLocation("as://account/container", "as", "container", "", account="account")),
])
def test_remote_urls(spec: str, expected: RemoteLocation) -> None:
    assert parse_repository(spec) == expected
    assert str(parse_repository(spec)) == spec


@pytest.mark.parametrize(("spec", "message"), [
    ("hdfs://namenode/models", "unsupported scheme 'hdfs://'"),
    ("s3://", "no bucket name"),
    ("s3:///path", "no bucket name"),
    ("gs://", "no bucket name"),
    ("s3://https://host/bucket", "an S3 endpoint needs host:port"),
    ("gs://bad bucket/x", "'bad bucket' is not a valid bucket name"),
    ("s3://bucket/../other", "must not contain '.' or '..'"),
    ("as://account", "expected as://account/container"),
    ("as://account/", "no container name"),
])
def test_malformed_urls_are_named_in_the_error(spec: str, message: str) -> None:
    with pytest.raises(LocationError) as caught:
        parse_repository(spec)
    assert message in str(caught.value)
    assert spec in str(caught.value)
