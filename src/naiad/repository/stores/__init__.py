"""One small interface over each object-storage SDK: list the blobs under a prefix, download one.

The SDKs (boto3, google-cloud-storage, azure-storage-blob) are optional extras, imported only
when a repository of their scheme is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from naiad.repository.credentials import AzureCredentials, Credentials, GcsCredentials, S3Credentials
from naiad.repository.location import RemoteLocation

ACCESS_DENIED = "access denied"
NO_SUCH_BUCKET = "no such bucket"
UNREACHABLE = "unreachable"


class StoreError(Exception):
    """A storage call that failed; `reason` is one of the kinds above or the service's own words."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Blob:
    key: str  # the full key in the bucket
    size: int
    etag: str  # changes whenever the content does
    md5: bytes | None = None  # the content's MD5 when the service states it (checked after download)


class Store(Protocol):
    def list(self, prefix: str) -> list[Blob]: ...

    def download(self, blob: Blob, dest: Path) -> None: ...


def open_store(location: RemoteLocation, credentials: Credentials) -> Store:
    """A client for `location`; StoreError when the scheme's SDK is not installed."""
    try:
        if isinstance(credentials, S3Credentials):
            from naiad.repository.stores.s3 import S3Store
            return S3Store(location, credentials)
        if isinstance(credentials, GcsCredentials):
            from naiad.repository.stores.gcs import GcsStore
            return GcsStore(location, credentials)
        if isinstance(credentials, AzureCredentials):
            from naiad.repository.stores.azure import AzureStore
            return AzureStore(location, credentials)
    except ImportError as error:
        extra = {"s3": "s3", "gs": "gcs", "as": "azure"}[location.scheme]
        raise StoreError(f"the {location.scheme}:// client is not installed "
                         f"(pip install 'naiad[{extra}]'): {error}") from None
    raise TypeError(f"no store for {type(credentials).__name__}")
