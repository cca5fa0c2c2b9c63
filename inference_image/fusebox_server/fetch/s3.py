"""`s3://BUCKET/PREFIX`: every object under the prefix, through the MinIO client.

Why MinIO's client and not boto3: botocore pins python-dateutil<3 while the
kubernetes client needs >=3, so one environment cannot hold both
(docs/decisions/model-sources.md). Any S3 API works (AWS, MinIO, versitygw, Ceph).

Verification: a single-part object's ETag is the MD5 of its bytes, unless the
object is encrypted with KMS or a customer key (SSE-KMS, SSE-C: its ETag is then
no hash of the content); a multipart one's is not either. Each object's headers
are read (one HEAD) with its full-object SHA-256 checksum (stored when it was
uploaded with one): the MD5 is checked where the ETag is one, else the SHA-256,
and without either only the size can be checked (said so in the outcome).

No HeadBucket before the listing: it needs s3:ListBucket on the whole bucket,
which least-privilege credentials (ListBucket under the prefix, GetObject on
it) do not have, and a missing bucket is named by the listing (NoSuchBucket).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError

from fusebox_contract.model_fetch import S3_SOURCE_PATTERN, FetchReason
from fusebox_server.fetch.store import CHUNK_BYTES, FetchError, RemoteFile, check_relative

_SOURCE = re.compile(S3_SOURCE_PATTERN)
NOT_FOUND_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound"})
KMS_ENCRYPTION = frozenset({"aws:kms", "aws:kms:dsse"})
"""`x-amz-server-side-encryption` values whose object's ETag is no MD5 of its bytes."""
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
    """A client for `endpoint` (host[:port], or with http:// or https://).

    An endpoint the client refuses (a path, a port out of range: the CRD's pattern
    admits both) is a named failure, so the fetcher still writes its report.
    """
    secure = not endpoint.startswith("http://")
    host = endpoint.removeprefix("http://").removeprefix("https://").rstrip("/")
    try:
        return Minio(
            host or "s3.amazonaws.com",
            access_key=access_key or None,
            secret_key=secret_key or None,
            session_token=token or None,
            secure=secure,
            region=region or None,
        )
    except Exception as error:  # noqa: BLE001 - ValueError today; any refusal is named
        raise FetchError(
            FetchReason.FAILED,
            f"spec.model.endpoint {endpoint!r}: the S3 client refuses it ({error}); "
            "give host[:port] or http(s)://host[:port], without a path",
        ) from None


def named_error(error: Exception, where: str) -> FetchError:
    """A client error as the failure it is: not found, refused credentials, unreachable."""
    if isinstance(error, FetchError):
        return error
    if isinstance(error, S3Error):
        if error.code == "NoSuchBucket":
            return FetchError(FetchReason.NOT_FOUND, f"{where}: the bucket does not exist")
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


def _object_headers(s3: Minio, bucket: str, key: str) -> dict[str, str]:
    """The object's HEAD headers (names in lower case), its checksum asked for."""
    stat = s3.stat_object(bucket, key, extra_headers={"x-amz-checksum-mode": "ENABLED"})
    return {str(k).lower(): str(v) for k, v in (stat.metadata or {}).items()}


def _checksum_sha256(headers: Mapping[str, str]) -> str | None:
    """The object's full-object SHA-256 (hex) when it carries one; None otherwise."""
    value = headers.get("x-amz-checksum-sha256")
    if not value or "-" in value:  # a composite checksum is of the parts, not the object
        return None
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return None


def expected_digests(etag: str, headers: Mapping[str, str]) -> dict[str, str]:
    """What the object's bytes must hash to: the ETag where it is their MD5, else the
    stored SHA-256, else nothing (its size only).

    A 32-hex ETag is the MD5 of the bytes of a plaintext or SSE-S3 object; with
    SSE-KMS or SSE-C it is not, and checking it would fail every such file forever.
    """
    encrypted = (
        headers.get("x-amz-server-side-encryption", "").lower() in KMS_ENCRYPTION
        or "x-amz-server-side-encryption-customer-algorithm" in headers
    )
    if not encrypted and re.fullmatch(r"[0-9a-fA-F]{32}", etag):
        return {"md5": etag.lower()}
    sha256 = _checksum_sha256(headers)
    return {"sha256": sha256} if sha256 else {}


def list_files(s3: Minio, source: S3Source) -> list[RemoteFile]:
    """The objects under the prefix, each with what its bytes must hash to."""
    where = f"s3://{source.bucket}/{source.prefix}"
    try:
        files: list[RemoteFile] = []
        for item in s3.list_objects(source.bucket, prefix=source.prefix, recursive=True):
            key = item.object_name or ""
            if key.endswith("/") or item.is_dir:
                continue
            etag = (item.etag or "").strip('"')
            digests = expected_digests(etag, _object_headers(s3, source.bucket, key))
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
