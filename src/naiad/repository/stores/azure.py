"""Azure Blob Storage (and Azurite) through azure-storage-blob: shared key, anonymous, or azure-identity."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import azure.core.exceptions as aexc
from azure.storage.blob import ContainerClient

from naiad.repository.credentials import AzureCredentials
from naiad.repository.location import RemoteLocation
from naiad.repository.stores import ACCESS_DENIED, NO_SUCH_BUCKET, UNREACHABLE, Blob, StoreError

# The SDK logs every HTTP request and response at INFO; naiad's own log says what matters.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)


class AzureStore:
    def __init__(self, location: RemoteLocation, credentials: AzureCredentials) -> None:
        self.container = ContainerClient(
            credentials.account_url, location.bucket, credential=_credential(credentials),
            connection_timeout=5, read_timeout=60, retry_total=1)

    def list(self, prefix: str) -> list[Blob]:
        try:
            return [Blob(item.name, int(item.size), str(item.etag).strip('"'),
                         bytes(item.content_settings.content_md5) if item.content_settings.content_md5 else None)
                    for item in self.container.list_blobs(name_starts_with=prefix)]
        except Exception as error:
            raise _store_error(error) from None

    def download(self, blob: Blob, dest: Path) -> None:
        try:
            with open(dest, "wb") as out:
                self.container.download_blob(blob.key).readinto(out)
        except Exception as error:
            raise _store_error(error) from None


def _credential(credentials: AzureCredentials) -> Any:
    if credentials.auth_type in ("managed_identity", "default"):
        try:
            import azure.identity
        except ImportError:
            raise StoreError(f"AZURE_STORAGE_AUTH_TYPE={credentials.auth_type} needs azure-identity "
                             f"(pip install azure-identity)") from None
        if credentials.auth_type == "managed_identity":
            return azure.identity.ManagedIdentityCredential(client_id=credentials.client_id)
        return azure.identity.DefaultAzureCredential(managed_identity_client_id=credentials.client_id)
    if credentials.auth_type:
        raise StoreError(f"unknown Azure auth type '{credentials.auth_type}' (expected managed_identity or default)")
    if credentials.key:
        return {"account_name": credentials.account, "account_key": credentials.key}
    return None  # anonymous: public containers


def _store_error(error: Exception) -> StoreError:
    if isinstance(error, aexc.ResourceNotFoundError):
        code = getattr(error, "error_code", "") or ""
        return StoreError(NO_SUCH_BUCKET if "Container" in str(code) else str(code) or "not found",
                          error.message.splitlines()[0] if error.message else "")
    if isinstance(error, aexc.ClientAuthenticationError):
        return StoreError(ACCESS_DENIED, error.message.splitlines()[0] if error.message else "")
    if isinstance(error, aexc.HttpResponseError) and error.status_code == 403:
        return StoreError(ACCESS_DENIED, error.message.splitlines()[0] if error.message else "")
    if isinstance(error, aexc.ServiceRequestError):
        return StoreError(UNREACHABLE, str(error).splitlines()[0])
    if isinstance(error, ValueError) and "account" in str(error).lower():
        return StoreError(ACCESS_DENIED, str(error))
    return StoreError(str(error).splitlines()[0] if str(error) else type(error).__name__)
