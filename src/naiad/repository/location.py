"""Where a model repository lives: a local path, or an object-storage location parsed from its URL.

Triton's forms (SPEC §2 "Cloud storage"): `s3://bucket/path`, `s3://host:port/bucket/path` and
`s3://http(s)://host:port/bucket/path` for S3-compatible endpoints, `gs://bucket/path`,
`as://account/container/path`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SCHEMES = ("s3", "gs", "as")
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# An S3 endpoint is recognised as Triton does: an optional http(s):// then host:port (port required).
_S3_ENDPOINT = re.compile(r"^(?:(?P<proto>https?)://)?(?P<host>[A-Za-z0-9.-]+):(?P<port>[0-9]+)/(?P<rest>.*)$")


class LocationError(ValueError):
    """A repository spec that cannot be understood; the message names the spec and what is wrong."""


@dataclass(frozen=True, slots=True)
class RemoteLocation:
    """A repository in object storage: `bucket` is the S3/GCS bucket or the Azure container."""

    spec: str  # the URL as given: names the repository in logs, errors and credential matching
    scheme: str  # s3 | gs | as
    bucket: str
    prefix: str  # "" or a key prefix ending with "/"
    endpoint: str | None = None  # s3: http(s)://host:port of an S3-compatible server
    account: str | None = None  # as: the storage account

    def __str__(self) -> str:
        return self.spec


def is_remote(spec: str | Path) -> bool:
    return isinstance(spec, str) and "://" in spec


def parse_repository(spec: str | Path) -> Path | RemoteLocation:
    """A local path (strings without `scheme://`) or a RemoteLocation; LocationError when malformed."""
    if not is_remote(spec):
        return Path(spec)
    text = str(spec)
    scheme, _, rest = text.partition("://")
    if scheme not in SCHEMES:
        raise LocationError(f"model repository '{text}': unsupported scheme '{scheme}://' "
                            f"(expected a local path, s3://, gs:// or as://)")
    if scheme == "s3":
        return _parse_s3(text, rest)
    if scheme == "gs":
        bucket, prefix = _bucket_and_prefix(text, rest, "bucket")
        return RemoteLocation(text, "gs", bucket, prefix)
    account, slash, rest = rest.partition("/")
    if not account or not _NAME.match(account) or not slash:
        raise LocationError(f"model repository '{text}': expected as://account/container[/path]")
    container, prefix = _bucket_and_prefix(text, rest, "container")
    return RemoteLocation(text, "as", container, prefix, account=account)


def _parse_s3(text: str, rest: str) -> RemoteLocation:
    endpoint = None
    match = _S3_ENDPOINT.match(rest)
    if match:
        endpoint = f"{match['proto'] or 'http'}://{match['host']}:{match['port']}"
        rest = match["rest"]
    elif rest.startswith(("http://", "https://")):
        raise LocationError(f"model repository '{text}': an S3 endpoint needs host:port, "
                            f"as in s3://https://host:port/bucket/path")
    bucket, prefix = _bucket_and_prefix(text, rest, "bucket")
    return RemoteLocation(text, "s3", bucket, prefix, endpoint=endpoint)


def _bucket_and_prefix(text: str, rest: str, what: str) -> tuple[str, str]:
    bucket, _, path = rest.partition("/")
    if not bucket:
        raise LocationError(f"model repository '{text}': no {what} name")
    if not _NAME.match(bucket):
        raise LocationError(f"model repository '{text}': '{bucket}' is not a valid {what} name")
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise LocationError(f"model repository '{text}': the path must not contain '.' or '..'")
    return bucket, "".join(part + "/" for part in parts)
