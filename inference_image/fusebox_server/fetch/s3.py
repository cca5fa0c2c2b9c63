"""`s3://BUCKET/PREFIX`: every object under the prefix, through the MinIO client.

Why MinIO's client and not boto3: botocore pins python-dateutil<3 while the
kubernetes client needs >=3, so one environment cannot hold both
(docs/decisions/model-sources.md). Any S3 API works (AWS, MinIO, versitygw, Ceph).

Verification: a single-part object's ETag is the MD5 of its bytes; a multipart
one's is not, so its full-object SHA-256 checksum is asked for (stored when it
was uploaded with one), and without one only its size can be checked (said so
in the outcome).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError

from fusebox_contract.model_fetch import S3_SOURCE_PATTERN, FetchReason
from fusebox_server.fetch.store import CHUNK_BYTES, FetchError, RemoteFile, check_relative

_SOURCE = re.compile(S3_SOURCE_PATTERN)
NOT_FOUND_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound"})
CREDENTIAL_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "InvalidSecurity",
    }
)


@dataclass(frozen=True)
class S3Source:
    bucket: str
    prefix: str  # "" or ending in "/"

    @classmethod
    def parse(cls, source: str) -> S3Source:
        match = _SOURCE.fullmatch(source)
        if match is None:
            raise FetchError(
                FetchReason.FAILED,
                f"{source!r} is not s3://BUCKET[/PREFIX] (a bucket name of 3-63 lower-case "
                "letters, digits, '.' and '-')",
            )
        prefix = (match.group(2) or "").strip("/")
        return cls(match.group(1), f"{prefix}/" if prefix else "")


def client(endpoint: str, region: str, access_key: str, secret_key: str, token: str) -> Minio:
    """A client for `endpoint` (host[:port], or with http:// or https://)."""
    secure = not endpoint.startswith("http://")
    host = endpoint.removeprefix("http://").removeprefix("https://").rstrip("/")
    return Minio(
        host or "s3.amazonaws.com",
        access_key=access_key or None,
        secret_key=secret_key or None,
        session_token=token or None,
        secure=secure,
        region=region or None,
    )


def named_error(error: Exception, where: str) -> FetchError:
    """A client error as the failure it is: not found, refused credentials, unreachable."""
    if isinstance(error, FetchError):
        return error
    if isinstance(error, S3Error):
        if error.code in NOT_FOUND_CODES:
            return FetchError(FetchReason.NOT_FOUND, f"{where}: {error.code} ({error.message})")
        if error.code in CREDENTIAL_CODES:
            return FetchError(
                FetchReason.BAD_CREDENTIALS,
                f"{where}: {error.code}: the endpoint refused the credentials of "
                "spec.model.credentials.secretName",
            )
        return FetchError(FetchReason.FAILED, f"{where}: {error.code} ({error.message})")
    if isinstance(error, ServerError | InvalidResponseError):
        return FetchError(FetchReason.FAILED, f"{where}: {error}")
    if isinstance(error, urllib3.exceptions.HTTPError | OSError):
        return FetchError(FetchReason.UNREACHABLE, f"{where}: {type(error).__name__}: {error}")
    return FetchError(FetchReason.FAILED, f"{where}: {type(error).__name__}: {error}")


def _checksum_sha256(s3: Minio, bucket: str, key: str) -> str | None:
    """The object's full-object SHA-256 (hex) when it carries one; None otherwise."""
    stat = s3.stat_object(bucket, key, extra_headers={"x-amz-checksum-mode": "ENABLED"})
    headers = stat.metadata or {}
    value = next((str(v) for k, v in headers.items() if k.lower() == "x-amz-checksum-sha256"), None)
    if not value or "-" in value:  # a composite checksum is of the parts, not the object
        return None
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return None


def list_files(s3: Minio, source: S3Source) -> list[RemoteFile]:
    """The objects under the prefix, each with what its bytes must hash to."""
    where = f"s3://{source.bucket}/{source.prefix}"
    try:
        if not s3.bucket_exists(source.bucket):
            raise FetchError(
                FetchReason.NOT_FOUND, f"{where}: bucket {source.bucket} does not exist"
            )
        files: list[RemoteFile] = []
        for item in s3.list_objects(source.bucket, prefix=source.prefix, recursive=True):
            key = item.object_name or ""
            if key.endswith("/") or item.is_dir:
                continue
            etag = (item.etag or "").strip('"')
            digests: dict[str, str] = {}
            if etag and "-" not in etag and re.fullmatch(r"[0-9a-fA-F]{32}", etag):
                digests["md5"] = etag.lower()
            else:
                sha256 = _checksum_sha256(s3, source.bucket, key)
                if sha256:
                    digests["sha256"] = sha256
            files.append(
                RemoteFile(
                    check_relative(key[len(source.prefix) :]), int(item.size or 0), etag, digests
                )
            )
    except Exception as error:  # noqa: BLE001 - every client error gets its name here
        raise named_error(error, where) from None
    if not files:
        raise FetchError(FetchReason.NOT_FOUND, f"{where}: no objects under this prefix")
    return files


def revision_of(files: list[RemoteFile]) -> str:
    """What this copy is: a digest of every object's name and ETag."""
    text = "\n".join(f"{f.path} {f.key}" for f in sorted(files, key=lambda f: f.path))
    return "etags:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def read_object(s3: Minio, source: S3Source, remote: RemoteFile, offset: int) -> Iterator[bytes]:
    """The object's bytes from `offset` (a resumed part file's length)."""
    key = source.prefix + remote.path
    if offset >= remote.size:
        return
    try:
        response = s3.get_object(source.bucket, key, offset=offset)
    except Exception as error:  # noqa: BLE001
        raise named_error(error, f"s3://{source.bucket}/{key}") from None
    try:
        yield from response.stream(CHUNK_BYTES)
    except Exception as error:  # noqa: BLE001
        raise named_error(error, f"s3://{source.bucket}/{key}") from None
    finally:
        response.close()
        response.release_conn()
