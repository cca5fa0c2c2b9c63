"""The model fetcher's own logic: sources, verification, resume, space, the report.

The downloads themselves run against a real S3 server in
tests/integration/server/test_model_sources_s3.py.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx2
import pytest
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from minio import Minio
from minio.datatypes import Object
from minio.error import S3Error

from fusebox_contract.model_fetch import (
    TERMINATION_MESSAGE_MAX_BYTES,
    FetchReason,
    FetchReport,
    model_cache_subdir,
    parse,
)
from fusebox_server.fetch import s3
from fusebox_server.fetch import store as store_module
from fusebox_server.fetch.hub import HubSource
from fusebox_server.fetch.hub import named_error as hub_named_error
from fusebox_server.fetch.progress import Progress
from fusebox_server.fetch.s3 import S3Source, named_error
from fusebox_server.fetch.store import (
    FetchError,
    ModelStore,
    RemoteFile,
    check_relative,
    digest_file,
    disk_error,
    verify,
)

DATA = b"hello\n"
# `git hash-object` of "hello\n": the id the hub lists for a small file.
GIT_BLOB = "ce013625030ba8dba906f756967f9e9ca394464a"


def remote(data: bytes = DATA, **digests: str) -> RemoteFile:
    return RemoteFile("dir/file.bin", len(data), "etag-1", dict(digests))


def test_a_report_survives_the_round_trip_and_fits_a_termination_message() -> None:
    report = FetchReport(FetchReason.DOWNLOADING, "x" * 10_000, 5, 10, 2.5, "rev", False, 3)
    text = report.dumps()
    assert len(text.encode()) <= TERMINATION_MESSAGE_MAX_BYTES
    parsed = parse(text)
    assert parsed is not None and parsed.bytes_done == 5 and parsed.revision == "rev"
    short = FetchReport(FetchReason.VERIFIED, "ok", 1, 1, None, "etags:1", True, 1)
    assert parse(short.dumps()) == short


@pytest.mark.parametrize(
    "text",
    ["", "Traceback (most recent call last):", "[]", '{"reason": "Exploded"}', "null"],
)
def test_a_termination_message_without_a_report_parses_to_none(text: str) -> None:
    assert parse(text) is None


def test_a_report_with_bad_figures_keeps_its_reason_and_drops_them() -> None:
    body = {"reason": "DiskFull", "message": 3, "bytes_done": -1, "rate_bytes_per_second": "x"}
    parsed = parse(json.dumps(body))
    assert parsed == FetchReport(FetchReason.DISK_FULL, "")


def test_the_cache_directory_moves_with_the_source_and_the_revision() -> None:
    one = model_cache_subdir("s3://models/a", "main")
    assert one == model_cache_subdir("s3://models/a", "main")
    assert one != model_cache_subdir("s3://models/b", "main")
    assert one != model_cache_subdir("s3://models/a", "v2")


@pytest.mark.parametrize(
    ("source", "bucket", "prefix"),
    [
        ("s3://models/tiny", "models", "tiny/"),
        ("s3://models/tiny/v1/", "models", "tiny/v1/"),
        ("s3://models", "models", ""),
    ],
)
def test_s3_sources_name_a_bucket_and_a_prefix(source: str, bucket: str, prefix: str) -> None:
    assert S3Source.parse(source) == S3Source(bucket, prefix)


def test_an_s3_source_the_fetcher_cannot_read_is_refused() -> None:
    with pytest.raises(FetchError, match="is not s3://BUCKET"):
        S3Source.parse("s3://UPPER/x")


def test_a_hub_source_pins_its_own_revision_over_the_spec() -> None:
    assert HubSource.parse("hf://org/name", "main") == HubSource("org/name", "main")
    assert HubSource.parse("hf://org/name@v1", "main") == HubSource("org/name", "v1")


@pytest.mark.parametrize("name", ["../etc/passwd", "a/../../b", "", "/"])
def test_a_remote_name_cannot_leave_the_model_directory(name: str) -> None:
    with pytest.raises(FetchError):
        check_relative(name)


def test_remote_names_are_normalised() -> None:
    assert check_relative("/a//b/./c") == "a/b/c"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("NoSuchBucket", FetchReason.NOT_FOUND),
        ("NoSuchKey", FetchReason.NOT_FOUND),
        ("AccessDenied", FetchReason.BAD_CREDENTIALS),
        ("InvalidAccessKeyId", FetchReason.BAD_CREDENTIALS),
        ("SignatureDoesNotMatch", FetchReason.BAD_CREDENTIALS),
        ("SlowDown", FetchReason.FAILED),
    ],
)
def test_s3_error_codes_are_named(code: str, reason: FetchReason) -> None:
    error = S3Error(None, code, "told", "/models", "id", "host")  # type: ignore[arg-type]
    assert named_error(error, "s3://models/").reason is reason


def test_an_unreachable_endpoint_is_named() -> None:
    assert named_error(ConnectionRefusedError(), "s3://m/").reason is FetchReason.UNREACHABLE


def test_a_file_is_verified_by_size_md5_sha256_and_git_blob_id(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(DATA)
    assert digest_file(path, "git-sha1") == GIT_BLOB
    verify(
        path,
        remote(
            md5=hashlib.md5(DATA).hexdigest(),
            sha256=hashlib.sha256(DATA).hexdigest(),
            **{"git-sha1": GIT_BLOB},
        ),
    )


@pytest.mark.parametrize(
    ("listed", "words"),
    [
        (RemoteFile("f", 7, "k"), "6 bytes downloaded, the source lists 7"),
        (RemoteFile("f", 6, "k", {"md5": "0" * 32}), "md5"),
        (RemoteFile("f", 6, "k", {"git-sha1": "0" * 40}), "git-sha1"),
    ],
)
def test_bytes_that_differ_from_the_source_are_a_hash_mismatch(
    tmp_path: Path, listed: RemoteFile, words: str
) -> None:
    path = tmp_path / "f"
    path.write_bytes(DATA)
    with pytest.raises(FetchError, match=words) as caught:
        verify(path, listed)
    assert caught.value.reason is FetchReason.HASH_MISMATCH


def test_a_full_disk_is_named() -> None:
    error = disk_error(OSError(errno.ENOSPC, "No space left on device"), Path("/cache/x"))
    assert error.reason is FetchReason.DISK_FULL
    assert disk_error(OSError(errno.EACCES, "denied"), Path("/x")).reason is FetchReason.FAILED


def test_a_model_larger_than_the_free_space_is_refused_before_downloading(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    store.model_dir.mkdir()
    with pytest.raises(FetchError, match="more bytes and the cache volume has") as caught:
        store.check_space(10**18)
    assert caught.value.reason is FetchReason.DISK_FULL


def test_a_part_file_is_resumed_verified_and_renamed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    listed = remote(md5=hashlib.md5(DATA).hexdigest())
    part = store.part_path(listed)
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:3])
    offset = store.resumable_bytes(listed)
    assert offset == 3
    added: list[int] = []
    store.write_part(listed, iter([DATA[3:]]), offset, added.append)
    assert (store.model_dir / listed.path).read_bytes() == DATA
    assert not part.exists() and added == [3, 0]  # 3 bytes, then one chunk hashed


def test_a_part_longer_than_the_object_is_started_again(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    listed = remote()
    store.part_path(listed).parent.mkdir(parents=True)
    store.part_path(listed).write_bytes(DATA * 2)
    assert store.resumable_bytes(listed) == 0


def test_a_corrupt_download_leaves_neither_the_file_nor_its_part(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    listed = remote(md5="0" * 32)
    with pytest.raises(FetchError):
        store.write_part(listed, iter([DATA]), 0, lambda _: None)
    assert not store.part_path(listed).exists()
    assert not (store.model_dir / listed.path).exists()


def test_a_complete_copy_is_recognised_only_at_its_revision(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    listed = remote()
    store.write_part(listed, iter([DATA]), 0, lambda _: None)
    store.record("s3://m/x", "rev-1", listed, complete=False)
    assert not store.complete("s3://m/x", "rev-1", [listed])  # not marked complete yet
    store.record("s3://m/x", "rev-1", None, complete=True)
    assert store.complete("s3://m/x", "rev-1", [listed])
    assert not store.complete("s3://m/x", "rev-2", [listed])
    changed = RemoteFile(listed.path, listed.size, "etag-2")
    assert not store.is_verified("s3://m/x", changed)  # new bytes at the source


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_counts_only_bytes_downloaded_by_this_run(tmp_path: Path) -> None:
    clock = Clock()
    progress = Progress(tmp_path / "r.json", tmp_path / "t", clock)
    progress.start(bytes_total=1000, files=2, already=400)
    clock.now += 2
    assert progress.rate() is None  # nothing downloaded yet: no rate, not zero
    progress.add(200)
    assert progress.bytes_done == 600
    assert progress.rate() == 100.0


def test_progress_is_written_at_most_once_a_second_and_the_outcome_always(tmp_path: Path) -> None:
    clock = Clock()
    report_file, termination = tmp_path / "r.json", tmp_path / "t"
    progress = Progress(report_file, termination, clock)
    progress.start(bytes_total=1000, files=1)

    def written() -> FetchReport:
        found = parse(report_file.read_text())
        assert found is not None
        return found

    progress.add(10)
    assert written().bytes_done == 0  # within the second: not rewritten
    clock.now += 1.5
    progress.add(10)
    assert written().bytes_done == 20 and written().reason is FetchReason.DOWNLOADING
    outcome = FetchReport(FetchReason.NOT_FOUND, "bucket missing")
    progress.finish(outcome)
    assert written() == outcome
    assert parse(termination.read_text()) == outcome


def hub_reply(status: int) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("GET", "http://hub/api/models/o/n"))


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (HfHubHTTPError("401 Unauthorized", response=hub_reply(401)), FetchReason.BAD_CREDENTIALS),
        (HfHubHTTPError("403 Forbidden", response=hub_reply(403)), FetchReason.BAD_CREDENTIALS),
        (GatedRepoError("gated", response=hub_reply(403)), FetchReason.BAD_CREDENTIALS),
        (RepositoryNotFoundError("absent", response=hub_reply(404)), FetchReason.NOT_FOUND),
        (RevisionNotFoundError("absent", response=hub_reply(404)), FetchReason.NOT_FOUND),
        (HfHubHTTPError("500 Server Error", response=hub_reply(500)), FetchReason.FAILED),
        (httpx2.ConnectError("connection refused"), FetchReason.UNREACHABLE),
    ],
)
def test_hub_errors_are_named(error: Exception, reason: FetchReason) -> None:
    assert hub_named_error(error, "hf://o/n@main").reason is reason


def test_a_fetcher_waiting_for_another_pod_s_download_says_so_at_each_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "LOCK_POLL_SECONDS", 0.01)
    store = ModelStore(tmp_path / "m")
    report_file = tmp_path / "report.json"
    progress = Progress(report_file, None)
    writes: list[str] = []

    def waiting(message: str) -> None:
        progress.waiting(message)
        writes.append(report_file.read_text())
        if len(writes) == 3:
            fcntl.flock(other, fcntl.LOCK_UN)  # the other pod's download ends

    (tmp_path / "m").mkdir()
    with open(tmp_path / "m.lock", "a+b") as other:  # another pod holds the lock
        fcntl.flock(other, fcntl.LOCK_EX)
        with store.locked(waiting):
            pass
    assert len(writes) == 3  # told at each look, so the report's age stays fresh
    report = parse(writes[-1])
    assert report is not None and report.waiting and report.reason is FetchReason.DOWNLOADING
    assert "another pod's download" in report.message
    # A report without the key (an older fetcher) is not waiting.
    assert parse('{"reason": "Downloading", "message": ""}') == FetchReport(
        FetchReason.DOWNLOADING, ""
    )


def test_a_report_file_holding_anything_parses_to_a_report_or_none() -> None:
    assert parse("[" * 100_000 + "]" * 100_000) is None  # deeper than the parser goes
    huge = parse('{"reason": "Downloading", "message": "", "bytes_done": ' + "9" * 400 + "}")
    assert huge == FetchReport(FetchReason.DOWNLOADING, "")  # no figure beyond any model


def test_hashing_a_downloaded_file_keeps_the_report_fresh(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    told: list[int] = []
    data = b"x" * (3 * 1024 * 1024 + 5)
    listed = RemoteFile("w.bin", len(data), "k", {"sha256": hashlib.sha256(data).hexdigest()})
    store.write_part(listed, iter([data]), 0, told.append)
    # The bytes once, then a word at each chunk hashed: a multi-GB shard takes tens of
    # seconds to hash, and its report must not look like a stalled download.
    assert told[0] == len(data) and told[1:] and set(told[1:]) == {0}
    assert (tmp_path / "m" / "w.bin").read_bytes() == data


def test_a_part_of_another_version_of_the_file_is_not_resumed(tmp_path: Path) -> None:
    """A fetcher killed mid-file, then the object replaced by one of the same size (a
    retrained checkpoint): the old part must not be completed with the new bytes."""
    store = ModelStore(tmp_path / "m")
    old = RemoteFile("w.bin", 6, "etag-old-2", {})
    store.part_path(old).parent.mkdir(parents=True)
    store.part_path(old).write_bytes(b"AAA")
    (tmp_path / "m" / "w.bin.part").write_bytes(b"AA")  # an older fetcher's part: no version
    new = RemoteFile("w.bin", 6, "etag-new-2", {})
    assert store.resumable_bytes(new) == 0
    store.write_part(new, iter([b"BBBBBB"]), 0, lambda _: None)
    assert (tmp_path / "m" / "w.bin").read_bytes() == b"BBBBBB"
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["w.bin"]  # stale parts gone


def test_a_part_of_the_same_version_is_resumed_beside_other_files(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    listed = RemoteFile("w.bin", 6, "etag-1", {"md5": hashlib.md5(DATA).hexdigest()})
    other = RemoteFile("w.bin.idx", 6, "etag-9", {})  # a file whose name starts alike
    store.part_path(listed).parent.mkdir(parents=True)
    store.part_path(listed).write_bytes(DATA[:4])
    store.part_path(other).write_bytes(DATA[:2])
    assert store.resumable_bytes(listed) == 4
    store.write_part(listed, iter([DATA[4:]]), 4, lambda _: None)
    assert (tmp_path / "m" / "w.bin").read_bytes() == DATA
    assert store.resumable_bytes(other) == 2  # not another version of w.bin: kept


def test_a_model_larger_than_the_cache_size_limit_is_refused_naming_the_limit(
    tmp_path: Path,
) -> None:
    """An emptyDir's sizeLimit is no quota the filesystem tells: the kubelet evicts past it."""
    store = ModelStore(tmp_path / "m")
    store.model_dir.mkdir()
    (store.model_dir / "held.bin").write_bytes(b"x" * 600)
    store.check_space(400, size_limit_bytes=1000)  # 600 held + 400 to come: fits
    with pytest.raises(FetchError, match="size limit .*1000 bytes") as caught:
        store.check_space(401, size_limit_bytes=1000)
    assert caught.value.reason is FetchReason.DISK_FULL
    assert "600" in caught.value.message  # what the cache already holds


@pytest.mark.parametrize("character", ["\x01", "😀", "é"])
def test_any_message_fits_a_termination_message_with_its_reason(character: str) -> None:
    report = FetchReport(FetchReason.UNREACHABLE, "head " + character * 5000, 5, 10)
    text = report.dumps()
    assert len(text.encode()) <= TERMINATION_MESSAGE_MAX_BYTES
    parsed = parse(text)
    assert parsed is not None and parsed.reason is FetchReason.UNREACHABLE
    assert parsed.message.startswith("head " + character) and parsed.message.endswith("...")
    assert len(text.encode()) > TERMINATION_MESSAGE_MAX_BYTES - 16  # cut, not emptied


class FakeBucket:
    """The S3 calls list_files makes, answered from `objects` (key -> ETag, size, HEAD
    headers). `bucket_exists` answers as a HeadBucket does to credentials that may list
    only under a prefix: AccessDenied (when `head_bucket_denied`)."""

    def __init__(
        self,
        objects: dict[str, tuple[str, int, dict[str, str]]],
        head_bucket_denied: bool = False,
        listing_error: str = "",
    ) -> None:
        self.objects = objects
        self.head_bucket_denied = head_bucket_denied
        self.listing_error = listing_error
        self.heads: list[str] = []

    @staticmethod
    def error(code: str) -> S3Error:
        return S3Error(None, code, code, "/b", "id", "host")  # type: ignore[arg-type]

    def bucket_exists(self, bucket: str) -> bool:
        if self.head_bucket_denied:
            raise self.error("AccessDenied")
        return True

    def list_objects(self, bucket: str, prefix: str, recursive: bool) -> Iterator[Object]:
        if self.listing_error:
            raise self.error(self.listing_error)
        for key, (etag, size, _) in self.objects.items():
            if key.startswith(prefix):
                yield Object(bucket, key, etag=f'"{etag}"', size=size)

    def stat_object(
        self, bucket: str, key: str, extra_headers: dict[str, str] | None = None
    ) -> Object:
        self.heads.append(key)
        etag, size, headers = self.objects[key]
        return Object(bucket, key, etag=etag, size=size, metadata=headers)


def s3_listing(bucket: FakeBucket) -> list[RemoteFile]:
    return s3.list_files(cast(Minio, bucket), S3Source.parse("s3://models/p"))


MD5_LIKE_ETAG = "0123456789abcdef0123456789abcdef"
SHA256_B64 = base64.b64encode(hashlib.sha256(DATA).digest()).decode()


@pytest.mark.parametrize(
    "encryption",
    [
        {"x-amz-server-side-encryption": "aws:kms"},
        {"X-Amz-Server-Side-Encryption": "aws:kms:dsse"},
        {"x-amz-server-side-encryption-customer-algorithm": "AES256"},
    ],
)
def test_an_s3_object_encrypted_with_kms_or_a_customer_key_is_not_checked_as_md5(
    encryption: dict[str, str],
) -> None:
    """Its 32-hex ETag is no MD5 of its bytes: checking it would fail every single-part file."""
    bucket = FakeBucket(
        {
            "p/config.json": (MD5_LIKE_ETAG, 6, encryption),
            "p/w.bin": (MD5_LIKE_ETAG, 6, encryption | {"x-amz-checksum-sha256": SHA256_B64}),
        }
    )
    config, weights = s3_listing(bucket)
    assert config.digests == {}  # checked by size only, and the outcome says so
    assert weights.digests == {"sha256": hashlib.sha256(DATA).hexdigest()}


@pytest.mark.parametrize("headers", [{}, {"x-amz-server-side-encryption": "AES256"}])
def test_a_plain_or_sse_s3_object_is_checked_against_its_etag_md5(headers: dict[str, str]) -> None:
    (listed,) = s3_listing(FakeBucket({"p/config.json": (MD5_LIKE_ETAG, 6, headers)}))
    assert listed.digests == {"md5": MD5_LIKE_ETAG}


def test_credentials_that_may_list_only_under_the_prefix_are_not_refused() -> None:
    """No HeadBucket: it needs s3:ListBucket on the whole bucket, which a least-privilege
    policy (ListBucket under a prefix, GetObject on it) does not grant."""
    bucket = FakeBucket({"p/config.json": (MD5_LIKE_ETAG, 6, {})}, head_bucket_denied=True)
    assert [f.path for f in s3_listing(bucket)] == ["config.json"]


def test_a_missing_bucket_is_named_by_the_listing() -> None:
    with pytest.raises(FetchError, match="does not exist") as caught:
        s3_listing(FakeBucket({}, listing_error="NoSuchBucket"))
    assert caught.value.reason is FetchReason.NOT_FOUND
