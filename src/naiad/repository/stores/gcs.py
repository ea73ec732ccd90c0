"""Google Cloud Storage through google-cloud-storage.

Credentials: a service-account file (GOOGLE_APPLICATION_CREDENTIALS or the credential file), else
the default credentials, else anonymous. STORAGE_EMULATOR_HOST points the client at an emulator.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import google.api_core.exceptions as gexc
import google.auth.exceptions
from google.cloud import storage

from naiad.repository.credentials import GcsCredentials
from naiad.repository.location import RemoteLocation
from naiad.repository.stores import ACCESS_DENIED, NO_SUCH_BUCKET, UNREACHABLE, Blob, StoreError

_TIMEOUT = (5, 60)  # connect, read: an unreachable server fails a load in seconds


class GcsStore:
    def __init__(self, location: RemoteLocation, credentials: GcsCredentials) -> None:
        self.bucket_name = location.bucket
        try:
            self.client = _client(credentials)
        except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as error:
            raise StoreError(ACCESS_DENIED, f"cannot use the GCS credentials: {error}") from None
        self.bucket = self.client.bucket(location.bucket)

    def list(self, prefix: str) -> list[Blob]:
        try:
            return [Blob(item.name, int(item.size or 0), str(item.etag or item.generation),
                         base64.b64decode(item.md5_hash) if item.md5_hash else None)
                    for item in self.client.list_blobs(self.bucket_name, prefix=prefix, timeout=_TIMEOUT)]
        except Exception as error:
            raise _store_error(error) from None

    def download(self, blob: Blob, dest: Path) -> None:
        try:
            self.bucket.blob(blob.key).download_to_filename(str(dest), timeout=_TIMEOUT, checksum=None)
        except Exception as error:
            raise _store_error(error) from None


def _client(credentials: GcsCredentials) -> storage.Client:
    if credentials.service_account_file:
        return storage.Client.from_service_account_json(credentials.service_account_file)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client.create_anonymous_client()
    try:
        return storage.Client()
    except (google.auth.exceptions.DefaultCredentialsError, OSError):
        return storage.Client.create_anonymous_client()  # public buckets need no credentials


def _store_error(error: Exception) -> StoreError:
    if isinstance(error, gexc.NotFound):
        return StoreError(NO_SUCH_BUCKET, error.message)
    if isinstance(error, (gexc.Forbidden, gexc.Unauthorized)):
        return StoreError(ACCESS_DENIED, error.message)
    if isinstance(error, google.auth.exceptions.GoogleAuthError):
        return StoreError(ACCESS_DENIED, str(error))
    if isinstance(error, gexc.GoogleAPICallError):
        return StoreError(error.message or str(error))
    if isinstance(error, (OSError, gexc.RetryError)) or "Connection" in type(error).__name__:
        return StoreError(UNREACHABLE, str(error))
    return StoreError(str(error) or type(error).__name__)
