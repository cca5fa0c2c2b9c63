"""`hf://ORG/NAME[@REVISION]`: a model repository from a Hugging Face hub (or a mirror).

Why through huggingface_hub: it speaks the hub's API (HF_ENDPOINT, tokens,
revisions, LFS redirects) as every mirror expects. The revision is resolved to
its commit hash once, and every file is fetched at that commit, so a branch that
moves during a download cannot mix two revisions; the hash is reported (status).
Each file is checked against the hub's own hashes: an LFS file's SHA-256, a
small file's git blob id.

Why our own requests (through the library's session, with its URLs and error
classes): the library sends them without a timeout (its listing cannot be
given one), and a mirror that accepts a connection and then sends nothing
would hang the fetcher, and every replica waiting on the shared cache's lock
behind it, forever. Each request here has a connect and a read timeout; one
that runs out is SourceUnreachable, and the kubelet's back-off retries.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx2
from huggingface_hub import constants, hf_hub_url
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
CONNECT_TIMEOUT_SECONDS = 30.0
READ_TIMEOUT_SECONDS = 60.0
"""No byte for this long from the hub (listing or file) is a hub that stopped answering."""


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


def _timed_out(error: httpx2.TimeoutException, where: str, read_timeout_seconds: float) -> str:
    """The words for a timeout: the host (an LFS file may come from a CDN the hub
    redirected to) and the seconds; never the request's headers (the token)."""
    try:
        host = error.request.url.netloc.decode()
    except RuntimeError:  # an error raised without its request
        host = "the hub"
    if isinstance(error, httpx2.ConnectTimeout):
        return f"{where}: no connection to {host} within {CONNECT_TIMEOUT_SECONDS:g} s"
    if isinstance(error, httpx2.ReadTimeout):
        return f"{where}: {host} sent nothing for {read_timeout_seconds:g} s (read timeout)"
    return f"{where}: {host}: {type(error).__name__} after {read_timeout_seconds:g} s"


def named_error(
    error: Exception, where: str, read_timeout_seconds: float = READ_TIMEOUT_SECONDS
) -> FetchError:
    """A hub error as the failure it is: not found (repo, revision, file), bad token,
    a hub that does not answer."""
    if isinstance(error, FetchError):
        return error
    if isinstance(error, httpx2.TimeoutException):
        return FetchError(FetchReason.UNREACHABLE, _timed_out(error, where, read_timeout_seconds))
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
    """One hub (its endpoint and token) and one repository on it.

    The token is sent as it is given (the fetcher strips the Secret's whitespace);
    without one none is sent: credentials come from the environment only, never
    from a token file of whoever runs it.
    """

    def __init__(
        self,
        source: HubSource,
        endpoint: str,
        token: str,
        read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
    ) -> None:
        self.source = source
        self.endpoint = endpoint.rstrip("/") or constants.ENDPOINT
        self.token = token or None
        self.read_timeout_seconds = read_timeout_seconds
        self.timeout = httpx2.Timeout(read_timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS)
        self.where = f"hf://{source.repo_id}@{source.revision}"

    def _headers(self) -> dict[str, str]:
        return build_hf_headers(token=self.token or False)

    def _get_json(self, url: str, params: dict[str, str] | None = None) -> tuple[Any, str | None]:
        """(the reply's JSON, the next page's URL when the reply is paginated)."""
        reply = get_session().get(url, headers=self._headers(), params=params, timeout=self.timeout)
        hf_raise_for_status(reply)
        return reply.json(), reply.links.get("next", {}).get("url")

    def _tree(self, commit: str) -> Iterator[dict[str, Any]]:
        """Every entry of the repository at `commit`, page after page."""
        url: str | None = f"{self.endpoint}/api/models/{self.source.repo_id}/tree/{commit}"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        while url is not None:
            page, url = self._get_json(url, params)
            params = None  # the next page's URL carries them
            if not isinstance(page, list):
                raise FetchError(FetchReason.FAILED, f"{self.where}: the hub's tree is no list")
            yield from (entry for entry in page if isinstance(entry, dict))

    def list_files(self) -> tuple[str, list[RemoteFile]]:
        """(the revision's commit hash, the repository's files with their hashes).

        The files come from the tree API at the commit (sizes, blob ids, LFS
        SHA-256), which the hub and its mirrors serve alike; model_info's
        `siblings` carry them only on the hub itself.
        """
        revision = quote(self.source.revision, safe="")
        try:
            info, _ = self._get_json(
                f"{self.endpoint}/api/models/{self.source.repo_id}/revision/{revision}"
            )
            commit = info.get("sha") if isinstance(info, dict) else None
            if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
                raise FetchError(
                    FetchReason.FAILED, f"{self.where}: the hub gave no commit hash ({commit!r})"
                )
            # The library's own reading of a tree entry, as its list_repo_tree does.
            entries = [
                RepoFile(**entry)  # type: ignore[no-untyped-call]
                for entry in self._tree(commit)
                if entry.get("type") == "file"
            ]
        except Exception as error:  # noqa: BLE001 - every client error gets its name here
            raise named_error(error, self.where, self.read_timeout_seconds) from None
        files = [_remote_file(entry, self.where) for entry in entries]
        if not files:
            raise FetchError(FetchReason.NOT_FOUND, f"{self.where}: the repository has no files")
        return commit, files

    def read_file(self, commit: str, remote: RemoteFile, offset: int) -> Iterator[bytes]:
        """The file's bytes at `commit`, from `offset` (a Range request resumes it)."""
        if offset >= remote.size:
            return
        url = hf_hub_url(self.source.repo_id, remote.path, revision=commit, endpoint=self.endpoint)
        headers = self._headers()
        if offset:
            headers["Range"] = f"bytes={offset}-"
        where = f"{self.where}/{remote.path}"
        try:
            with get_session().stream(
                "GET", url, headers=headers, follow_redirects=True, timeout=self.timeout
            ) as reply:
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
            raise named_error(error, where, self.read_timeout_seconds) from None
