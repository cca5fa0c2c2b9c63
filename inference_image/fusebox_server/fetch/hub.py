"""`hf://ORG/NAME[@REVISION]`: a model repository from a Hugging Face hub (or a mirror).

Why through huggingface_hub: it speaks the hub's API (HF_ENDPOINT, tokens,
revisions, LFS redirects) as every mirror expects. The revision is resolved to
its commit hash once, and every file is fetched at that commit, so a branch that
moves during a download cannot mix two revisions; the hash is reported (status).
Each file is checked against the hub's own hashes: an LFS file's SHA-256, a
small file's git blob id.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils._headers import build_hf_headers
from huggingface_hub.utils._http import get_session, hf_raise_for_status

from fusebox_contract.model_fetch import HF_SOURCE_PATTERN, FetchReason
from fusebox_server.fetch.store import CHUNK_BYTES, FetchError, RemoteFile, check_relative

_SOURCE = re.compile(HF_SOURCE_PATTERN)
COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    revision: str

    @classmethod
    def parse(cls, source: str, revision: str) -> HubSource:
        """`@REVISION` in the source wins over `revision` (spec.model.revision)."""
        match = _SOURCE.fullmatch(source)
        if match is None:
            raise FetchError(FetchReason.FAILED, f"{source!r} is not hf://ORG/NAME[@REVISION]")
        pinned = (match.group(3) or "").removeprefix("@")
        return cls(f"{match.group(1)}/{match.group(2)}", pinned or revision or "main")


def named_error(error: Exception, where: str) -> FetchError:
    """A hub error as the failure it is: not found (repo, revision, file), bad token."""
    if isinstance(error, FetchError):
        return error
    if isinstance(error, RevisionNotFoundError):
        return FetchError(FetchReason.NOT_FOUND, f"{where}: revision not found")
    if isinstance(error, GatedRepoError):
        return FetchError(
            FetchReason.BAD_CREDENTIALS,
            f"{where}: a gated repository; the token of spec.model.credentials.secretName "
            "has no access",
        )
    if isinstance(error, RepositoryNotFoundError):
        # The hub answers a private repository without a valid token the same way.
        return FetchError(
            FetchReason.NOT_FOUND,
            f"{where}: repository not found (or private, and the token gives no access)",
        )
    if isinstance(error, EntryNotFoundError):
        return FetchError(FetchReason.NOT_FOUND, f"{where}: file not found")
    if isinstance(error, HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403):
            return FetchError(
                FetchReason.BAD_CREDENTIALS,
                f"{where}: HTTP {status}: the hub refused the token of "
                "spec.model.credentials.secretName",
            )
        return FetchError(FetchReason.FAILED, f"{where}: {str(error).splitlines()[0]}")
    if isinstance(error, OSError) or "Connect" in type(error).__name__:
        return FetchError(FetchReason.UNREACHABLE, f"{where}: {type(error).__name__}: {error}")
    return FetchError(FetchReason.FAILED, f"{where}: {type(error).__name__}: {error}")


def _remote_file(entry: RepoFile, where: str) -> RemoteFile:
    """A tree entry with what its bytes must hash to: LFS SHA-256, else the git blob id."""
    if entry.lfs is not None:
        return RemoteFile(
            check_relative(entry.path),
            entry.lfs.size,
            entry.lfs.sha256,
            {"sha256": entry.lfs.sha256},
        )
    if not entry.blob_id or entry.size is None:
        raise FetchError(
            FetchReason.FAILED,
            f"{where}: the hub lists no size or hash for {entry.path}; it cannot be verified",
        )
    return RemoteFile(
        check_relative(entry.path), entry.size, entry.blob_id, {"git-sha1": entry.blob_id}
    )


class Hub:
    """One hub (its endpoint and token) and one repository on it."""

    def __init__(self, source: HubSource, endpoint: str, token: str) -> None:
        self.source = source
        self.endpoint = endpoint.rstrip("/") or None
        self.token = token or None
        self.api = HfApi(endpoint=self.endpoint, token=self.token)
        self.where = f"hf://{source.repo_id}@{source.revision}"

    def list_files(self) -> tuple[str, list[RemoteFile]]:
        """(the revision's commit hash, the repository's files with their hashes).

        The files come from the tree API at the commit (sizes, blob ids, LFS
        SHA-256), which the hub and its mirrors serve alike; model_info's
        `siblings` carry them only on the hub itself.
        """
        try:
            info = self.api.model_info(self.source.repo_id, revision=self.source.revision)
            commit = info.sha or ""
            if not COMMIT.fullmatch(commit):
                raise FetchError(
                    FetchReason.FAILED, f"{self.where}: the hub gave no commit hash ({commit!r})"
                )
            entries = list(
                self.api.list_repo_tree(self.source.repo_id, revision=commit, recursive=True)
            )
        except Exception as error:  # noqa: BLE001 - every client error gets its name here
            raise named_error(error, self.where) from None
        files = [
            _remote_file(entry, self.where) for entry in entries if isinstance(entry, RepoFile)
        ]
        if not files:
            raise FetchError(FetchReason.NOT_FOUND, f"{self.where}: the repository has no files")
        return commit, files

    def read_file(self, commit: str, remote: RemoteFile, offset: int) -> Iterator[bytes]:
        """The file's bytes at `commit`, from `offset` (a Range request resumes it)."""
        if offset >= remote.size:
            return
        url = hf_hub_url(self.source.repo_id, remote.path, revision=commit, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        where = f"{self.where}/{remote.path}"
        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True) as reply:
                hf_raise_for_status(reply)
                # A server that ignores Range sends the whole file: skip what the part
                # file already holds (downloaded again, but written once).
                skip = offset if reply.status_code != 206 else 0
                for chunk in reply.iter_bytes(CHUNK_BYTES):
                    if skip >= len(chunk):
                        skip -= len(chunk)
                        continue
                    yield chunk[skip:]
                    skip = 0
        except FetchError:
            raise
        except Exception as error:  # noqa: BLE001
            raise named_error(error, where) from None
