"""naiad.repository.credentials: TRITON_CLOUD_CREDENTIAL_PATH with longest-prefix matching, else the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from naiad.repository.credentials import (
    AzureCredentials,
    CredentialError,
    GcsCredentials,
    S3Credentials,
    credentials_for,
)
from naiad.repository.location import RemoteLocation, parse_repository


def _location(spec: str) -> RemoteLocation:
    parsed = parse_repository(spec)
    assert isinstance(parsed, RemoteLocation)
    return parsed


def _file(tmp_path: Path, document: object) -> dict[str, str]:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(document))
    return {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)}


CREDENTIALS = {
    "s3": {
        "": {"key_id": "default-id", "secret_key": "default-secret", "region": "us-east-1"},
        "s3://bucket": {"key_id": "bucket-id", "secret_key": "bucket-secret"},
        "s3://bucket/team": {"key_id": "team-id", "secret_key": "team-secret", "session_token": "tok",
                             "profile": "p"},
    },
    "gs": {"": "/default.json", "gs://bucket/team": "/team.json"},
    "as": {"as://acct/container": {"account_str": "acct", "account_key": "k",
                                   "blob_endpoint": "http://127.0.0.1:10000/acct"}},
}


def test_the_longest_matching_prefix_wins(tmp_path: Path) -> None:
    env = _file(tmp_path, CREDENTIALS)
    assert credentials_for(_location("s3://bucket/team/models"), env) == S3Credentials(
        "team-id", "team-secret", "tok", None, "p")
    assert credentials_for(_location("s3://bucket/other"), env) == S3Credentials("bucket-id", "bucket-secret")
    assert credentials_for(_location("s3://elsewhere/x"), env) == S3Credentials(
        "default-id", "default-secret", region="us-east-1")
    assert credentials_for(_location("gs://bucket/team/m"), env) == GcsCredentials("/team.json")
    assert credentials_for(_location("gs://other"), env) == GcsCredentials("/default.json")
    azure = credentials_for(_location("as://acct/container/repo"), env)
    assert azure == AzureCredentials("acct", "k", "http://127.0.0.1:10000/acct")
    assert azure.account_url == "http://127.0.0.1:10000/acct"


def test_without_a_matching_entry_the_environment_decides(tmp_path: Path) -> None:
    env = {**_file(tmp_path, {"s3": {"s3://bucket": {"key_id": "x"}}}),
           "AWS_ACCESS_KEY_ID": "env-id", "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_REGION": "eu-west-1",
           "GOOGLE_APPLICATION_CREDENTIALS": "/sa.json",
           "AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "key"}
    assert credentials_for(_location("s3://other/x"), env) == S3Credentials("env-id", "env-secret", region="eu-west-1")
    assert credentials_for(_location("gs://b/x"), env) == GcsCredentials("/sa.json")
    azure = credentials_for(_location("as://acct/c"), env)
    assert azure == AzureCredentials("acct", "key")
    assert azure.account_url == "https://acct.blob.core.windows.net"


def test_an_empty_environment_leaves_the_sdks_default_chains() -> None:
    assert credentials_for(_location("s3://b"), {}) == S3Credentials()
    assert credentials_for(_location("gs://b"), {}) == GcsCredentials(None)
    assert credentials_for(_location("as://a/c"), {}) == AzureCredentials("a")


def test_azure_endpoint_and_identity_from_the_environment() -> None:
    env = {"AZURE_STORAGE_BLOB_ENDPOINT": "http://127.0.0.1:1/a", "AZURE_STORAGE_AUTH_TYPE": "managed_identity",
           "AZURE_STORAGE_CLIENT_ID": "cid"}
    assert credentials_for(_location("as://a/c"), env) == AzureCredentials(
        "a", None, "http://127.0.0.1:1/a", "managed_identity", "cid")


@pytest.mark.parametrize(("document", "message"), [
    ([1, 2], "must hold a JSON object"),
    ({"s3": []}, "'s3' must map prefixes to credentials"),
    ({"s3": {"": "a string"}}, "an 's3' entry must be a JSON object"),
    ({"s3": {"": {"key": "x"}}}, "unknown 's3' field(s) ['key']"),
    ({"gs": {"": {"path": "x"}}}, "a 'gs' entry is the path of a credentials file"),
    ({"as": {"": {"account_name": "x"}}}, "unknown 'as' field(s) ['account_name']"),
])
def test_malformed_credential_files(tmp_path: Path, document: object, message: str) -> None:
    env = _file(tmp_path, document)
    scheme = "gs://b" if "'gs'" in message else "as://a/c" if "'as'" in message else "s3://b"
    with pytest.raises(CredentialError) as caught:
        credentials_for(_location(scheme), env)
    assert message in str(caught.value)


def test_unreadable_and_invalid_credential_files(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="cannot read"):
        credentials_for(_location("s3://b"), {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / "missing.json")})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CredentialError, match="is not valid JSON"):
        credentials_for(_location("s3://b"), {"TRITON_CLOUD_CREDENTIAL_PATH": str(bad)})
