"""S3 and S3-compatible servers through boto3 (its default credential chain unless told otherwise)."""

from __future__ import annotations

import re
from pathlib import Path

import boto3
import botocore.exceptions
from botocore.config import Config

from naiad.repository.credentials import S3Credentials
from naiad.repository.location import RemoteLocation
from naiad.repository.stores import ACCESS_DENIED, NO_SUCH_BUCKET, UNREACHABLE, Blob, StoreError

_MD5 = re.compile(r"^[0-9a-f]{32}$")
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
           "AllAccessDisabled", "403"}
# A few quick retries: an unreachable endpoint should fail a load in seconds, not minutes.
_CONFIG = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 2, "mode": "standard"})


class S3Store:
    def __init__(self, location: RemoteLocation, credentials: S3Credentials) -> None:
        self.bucket = location.bucket
        try:
            session = boto3.Session(
                aws_access_key_id=credentials.key_id, aws_secret_access_key=credentials.secret_key,
                aws_session_token=credentials.session_token, region_name=credentials.region,
                profile_name=credentials.profile)
        except botocore.exceptions.ProfileNotFound as error:
            raise StoreError(ACCESS_DENIED, str(error)) from None
        self.client = session.client("s3", endpoint_url=location.endpoint, config=_CONFIG)

    def list(self, prefix: str) -> list[Blob]:
        blobs = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    etag = item["ETag"].strip('"')
                    # A single-part upload's ETag is the content's MD5; a multipart one's is not.
                    md5 = bytes.fromhex(etag) if _MD5.match(etag) else None
                    blobs.append(Blob(item["Key"], int(item["Size"]), etag, md5))
        except Exception as error:
            raise _store_error(error) from None
        return blobs

    def download(self, blob: Blob, dest: Path) -> None:
        try:
            self.client.download_file(self.bucket, blob.key, str(dest))
        except Exception as error:
            raise _store_error(error) from None


def _store_error(error: Exception) -> StoreError:
    if isinstance(error, botocore.exceptions.ClientError):
        info = error.response.get("Error", {})
        code = str(info.get("Code", ""))
        message = str(info.get("Message", "")) or code
        if code in ("NoSuchBucket", "404"):
            return StoreError(NO_SUCH_BUCKET, message)
        if code in _DENIED:
            return StoreError(ACCESS_DENIED, message)
        return StoreError(message)
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        return StoreError(ACCESS_DENIED, "no AWS credentials found")
    if isinstance(error, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
                          botocore.exceptions.ReadTimeoutError)):
        return StoreError(UNREACHABLE, str(error))
    return StoreError(str(error) or type(error).__name__)
