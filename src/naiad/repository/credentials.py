"""Credentials for a remote repository, taken as Triton takes them (SPEC §2 "Cloud storage").

A JSON file named by TRITON_CLOUD_CREDENTIAL_PATH wins when one of its prefixes matches the
repository URL (the longest match); otherwise the environment decides: boto3's own chain for S3
(AWS_* variables, then `aws configure` files), GOOGLE_APPLICATION_CREDENTIALS for GCS (else the
default credentials, else anonymous), AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY for Azure.

naiad adds one setting Triton lacks, for Azure-compatible servers such as Azurite: the blob
endpoint, from AZURE_STORAGE_BLOB_ENDPOINT or `blob_endpoint` in the credential file
(default `https://<account>.blob.core.windows.net`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from naiad.repository.location import RemoteLocation

CREDENTIAL_PATH_VAR = "TRITON_CLOUD_CREDENTIAL_PATH"


class CredentialError(ValueError):
    """A credential file that cannot be read or does not have Triton's shape."""


@dataclass(frozen=True, slots=True)
class S3Credentials:
    """Empty fields leave the choice to boto3's default chain."""

    key_id: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    region: str | None = None
    profile: str | None = None


@dataclass(frozen=True, slots=True)
class GcsCredentials:
    service_account_file: str | None = None  # None: default credentials, else anonymous


@dataclass(frozen=True, slots=True)
class AzureCredentials:
    account: str
    key: str | None = None  # None: anonymous, unless auth_type says otherwise
    endpoint: str | None = None  # None: https://<account>.blob.core.windows.net
    auth_type: str | None = None  # managed_identity | default (azure-identity)
    client_id: str | None = None

    @property
    def account_url(self) -> str:
        return self.endpoint or f"https://{self.account}.blob.core.windows.net"


Credentials = S3Credentials | GcsCredentials | AzureCredentials


def credentials_for(location: RemoteLocation, environ: Mapping[str, str] | None = None) -> Credentials:
    """The credentials for `location`: the credential file's longest matching prefix, else the environment."""
    env = os.environ if environ is None else environ
    entry = _file_entry(location, env.get(CREDENTIAL_PATH_VAR))
    if location.scheme == "s3":
        if entry is not None:
            return _s3(entry)
        # The environment wins over `aws configure` files; what it leaves unset, boto3's chain finds.
        return S3Credentials(env.get("AWS_ACCESS_KEY_ID") or None, env.get("AWS_SECRET_ACCESS_KEY") or None,
                             env.get("AWS_SESSION_TOKEN") or None,
                             env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or None,
                             env.get("AWS_PROFILE") or None)
    if location.scheme == "gs":
        if entry is not None:
            if not isinstance(entry, str):
                raise CredentialError(f"{CREDENTIAL_PATH_VAR}: a 'gs' entry is the path of a credentials file")
            return GcsCredentials(entry or None)
        return GcsCredentials(env.get("GOOGLE_APPLICATION_CREDENTIALS") or None)
    return _azure(location, entry, env)


def _file_entry(location: RemoteLocation, path: str | None) -> Any:
    if not path:
        return None
    try:
        document = json.loads(Path(path).read_text())
    except OSError as error:
        raise CredentialError(f"{CREDENTIAL_PATH_VAR}: cannot read '{path}': {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise CredentialError(f"{CREDENTIAL_PATH_VAR}: '{path}' is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise CredentialError(f"{CREDENTIAL_PATH_VAR}: '{path}' must hold a JSON object")
    section = document.get(location.scheme, {})
    if not isinstance(section, dict):
        raise CredentialError(f"{CREDENTIAL_PATH_VAR}: '{location.scheme}' must map prefixes to credentials")
    matches = [prefix for prefix in section if location.spec.startswith(prefix)]
    return section[max(matches, key=len)] if matches else None


def _fields(entry: Any, scheme: str, names: tuple[str, ...]) -> dict[str, str | None]:
    if not isinstance(entry, dict):
        raise CredentialError(f"{CREDENTIAL_PATH_VAR}: an '{scheme}' entry must be a JSON object")
    unknown = sorted(set(entry) - set(names))
    if unknown:
        raise CredentialError(f"{CREDENTIAL_PATH_VAR}: unknown '{scheme}' field(s) {unknown} "
                              f"(expected some of {list(names)})")
    return {name: (str(entry[name]) or None) if name in entry else None for name in names}


def _s3(entry: Any) -> S3Credentials:
    fields = _fields(entry, "s3", ("key_id", "secret_key", "session_token", "region", "profile"))
    return S3Credentials(**fields)


def _azure(location: RemoteLocation, entry: Any, env: Mapping[str, str]) -> AzureCredentials:
    account = location.account or ""
    if entry is not None:
        fields = _fields(entry, "as", ("account_str", "account_key", "auth_type", "client_id", "blob_endpoint"))
        return AzureCredentials(fields["account_str"] or account, fields["account_key"], fields["blob_endpoint"],
                                fields["auth_type"], fields["client_id"])
    return AzureCredentials(account, env.get("AZURE_STORAGE_KEY") or None,
                            env.get("AZURE_STORAGE_BLOB_ENDPOINT") or None,
                            env.get("AZURE_STORAGE_AUTH_TYPE") or None, env.get("AZURE_STORAGE_CLIENT_ID") or None)
