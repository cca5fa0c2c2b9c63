"""The cache directory one model is fetched into: its lock, resume and record.

Why: replicas on a node may share one cache volume (a claim the spec names),
so N pods starting together must cause one download. The first takes an
exclusive file lock and downloads; the others wait on the lock and then find
the record of a complete, verified copy and download nothing. Each file is
written as `<name>.<version>.part` and renamed only once verified, so a pod
killed in the middle leaves a part file the next run resumes, never a file that
looks done. The version (a digest of the remote file's ETag or hash) is in the
part's name because the remote file may change between two runs: the bytes of
one version must never be completed with another's.

Each revision the source resolves to (a hub commit, a digest of an S3 listing)
has a directory of its own, `<source dir>/revisions/<revision>/`, which is
complete and verified before any server loads it and never written again: a
later pod that finds the source moved fetches the new revision beside it, while
servers that loaded the old one (and restart from it) keep their files. The pod's
link (`link_model`) names the revision it verified.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from fusebox_contract.model_fetch import FetchReason

PART_SUFFIX = ".part"
_PART_TAIL = re.compile(r"(\.[0-9a-f]{12})?\.part")
"""What follows a file's name in the name of one of its parts (none: an older fetcher's)."""
STATE_FILE = ".fusebox-fetch.json"
"""In the model directory: the source, its revision, and each file verified so far."""
REVISIONS_DIR = "revisions"
"""In the source's directory: one subdirectory per resolved revision."""
LOCK_SUFFIX = ".lock"
LOCK_POLL_SECONDS = 2.0
CHUNK_BYTES = 1024 * 1024


class FetchError(Exception):
    """A download that cannot succeed as configured; `reason` names why."""

    def __init__(self, reason: FetchReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class RemoteFile:
    """One file of the model as the source lists it.

    `digests`: algorithm -> hex digest the bytes must have ("md5", "sha256", or
    "git-sha1", the hub's blob id); `key` changes whenever the remote bytes do
    (an ETag, a hash), so a stale local copy is never taken for the new one.
    """

    path: str
    size: int
    key: str
    digests: dict[str, str] = field(default_factory=dict)


def check_relative(path: str) -> str:
    """A remote name as a path inside the model directory, or a refusal.

    An object key like `../../etc/x` must not write outside the cache.
    """
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise FetchError(FetchReason.FAILED, f"refusing remote file name {path!r}")
    return "/".join(parts)


def digest_file(path: Path, algorithm: str, working: Callable[[], None] = lambda: None) -> str:
    """The file's digest; "git-sha1" is git's blob hash, as the hub lists small files.
    `working` is called at each chunk: hashing a multi-GB shard takes tens of seconds,
    and the report must not look like a stalled download meanwhile."""
    size = path.stat().st_size
    hasher = hashlib.sha1() if algorithm == "git-sha1" else hashlib.new(algorithm)
    if algorithm == "git-sha1":
        hasher.update(f"blob {size}\0".encode())
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            hasher.update(chunk)
            working()
    return hasher.hexdigest()


def verify(path: Path, remote: RemoteFile, working: Callable[[], None] = lambda: None) -> None:
    """Refuse bytes that are not the source's: the size, then every digest it gave."""
    size = path.stat().st_size
    if size != remote.size:
        raise FetchError(
            FetchReason.HASH_MISMATCH,
            f"{remote.path}: {size} bytes downloaded, the source lists {remote.size}",
        )
    for algorithm, expected in sorted(remote.digests.items()):
        actual = digest_file(path, algorithm, working)
        if actual != expected.lower():
            raise FetchError(
                FetchReason.HASH_MISMATCH,
                f"{remote.path}: {algorithm} {actual} does not match the source's {expected}",
            )


def disk_error(error: OSError, where: Path) -> FetchError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return FetchError(FetchReason.DISK_FULL, f"no space left on the cache volume at {where}")
    return FetchError(FetchReason.FAILED, f"cannot write {where}: {error.strerror or error}")


def held_bytes(directory: Path) -> int:
    """What the files under `directory` hold (0 when it is not there)."""
    total = 0
    for folder, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue  # removed meanwhile
    return total


def revision_dir(source_dir: Path, revision: str) -> Path:
    """The directory one resolved revision of the source is fetched into.

    The revision as it is where it is a plain name (a hub commit); any other
    character (the `:` of S3's `etags:DIGEST`) becomes `-`, so the name is safe
    on any filesystem a claim may be.
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "-", revision).lstrip(".")
    if not name:
        raise FetchError(FetchReason.FAILED, f"the source resolved to no revision ({revision!r})")
    return source_dir / REVISIONS_DIR / name


def discard_other_revisions(source_dir: Path, keep: Path) -> None:
    """Remove every revision of the source but `keep`, with its lock.

    Only for a cache that is the pod's own (an emptyDir): its fetcher runs while no
    server of the pod does, so no server can hold what is removed. On a shared claim
    another pod's server may have loaded any of them (docs/decisions/model-sources.md).
    """
    revisions = source_dir / REVISIONS_DIR
    try:
        entries = list(revisions.iterdir()) if revisions.is_dir() else []
        for entry in entries:
            if entry.name in (keep.name, keep.name + LOCK_SUFFIX):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
    except OSError as error:
        raise disk_error(error, revisions) from None


def link_model(link: Path, target: Path) -> None:
    """Point `link` at `target` (a verified revision), replacing what it pointed at.

    Made beside it and renamed over it: a reader sees the old link or the new one.
    """
    temporary = link.with_name(f".{link.name}.tmp")
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(target, target_is_directory=True)
        os.replace(temporary, link)
    except OSError as error:
        raise FetchError(
            FetchReason.FAILED,
            f"cannot link {link} to the verified copy {target}: {error.strerror or error}",
        ) from None


class ModelStore:
    """One model's directory in the cache volume, and what has been verified in it."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._state_path = model_dir / STATE_FILE

    @contextmanager
    def locked(self, waiting: Callable[[str], None]) -> Iterator[None]:
        """Hold the model's lock; `waiting` is told at each look while another pod holds it."""
        try:
            self.model_dir.mkdir(parents=True, exist_ok=True)
            handle = open(  # noqa: SIM115
                self.model_dir.parent / f"{self.model_dir.name}{LOCK_SUFFIX}", "a+b"
            )
        except OSError as error:
            raise disk_error(error, self.model_dir) from None
        with handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    waiting("waiting for another pod's download of this model (shared cache)")
                    time.sleep(LOCK_POLL_SECONDS)
                except OSError as error:
                    # ENOLCK (NFS without a lock daemon), EOPNOTSUPP: without the lock,
                    # replicas sharing the claim would write the same files at once.
                    raise FetchError(
                        FetchReason.FAILED,
                        f"cannot lock {handle.name}: the cache volume refuses file locks "
                        f"({error.strerror or error}); a cache claim (spec.model.cache."
                        "claimName) must be on a filesystem that supports flock",
                    ) from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _state(self) -> dict[str, object]:
        try:
            state = json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _verified(self, source: str) -> dict[str, str]:
        state = self._state()
        files = state.get("files")
        if state.get("source") != source or not isinstance(files, dict):
            return {}
        return {str(k): str(v) for k, v in files.items()}

    def complete(self, source: str, revision: str, files: Iterable[RemoteFile]) -> bool:
        """Whether every file is here, verified at this revision, with its size."""
        state = self._state()
        if state.get("revision") != revision or not state.get("complete"):
            return False
        return all(self.is_verified(source, remote) for remote in files)

    def is_verified(self, source: str, remote: RemoteFile) -> bool:
        target = self.model_dir / remote.path
        return (
            self._verified(source).get(remote.path) == remote.key
            and target.is_file()
            and target.stat().st_size == remote.size
        )

    def record(self, source: str, revision: str, remote: RemoteFile | None, complete: bool) -> None:
        """Add a verified file (or mark the whole copy complete), atomically."""
        files = self._verified(source)
        if remote is not None:
            files[remote.path] = remote.key
        body = {"source": source, "revision": revision, "files": files, "complete": complete}
        temporary = self._state_path.with_name(STATE_FILE + ".tmp")
        try:
            temporary.write_text(json.dumps(body, sort_keys=True))
            os.replace(temporary, self._state_path)
        except OSError as error:
            raise disk_error(error, self._state_path) from None

    def part_path(self, remote: RemoteFile) -> Path:
        """Where this version of the file is written until verified."""
        version = hashlib.sha256(remote.key.encode()).hexdigest()[:12]
        return self.model_dir / f"{remote.path}.{version}{PART_SUFFIX}"

    def resumable_bytes(self, remote: RemoteFile) -> int:
        """Bytes of this version's part file a previous run left (0 when none, or when it
        is too long); a part of another version is never resumed."""
        part = self.part_path(remote)
        size = part.stat().st_size if part.is_file() else 0
        return size if size <= remote.size else 0

    def discard_stale_parts(self, remote: RemoteFile) -> None:
        """Remove the parts of other versions of this file: they can never be completed,
        and a multi-GB shard's part would hold its space for nothing."""
        current = self.part_path(remote)
        name = Path(remote.path).name
        try:
            entries = list(current.parent.iterdir()) if current.parent.is_dir() else []
            for entry in entries:
                stale = entry.name.startswith(name) and _PART_TAIL.fullmatch(
                    entry.name[len(name) :]
                )
                if stale and entry != current:
                    entry.unlink(missing_ok=True)
        except OSError as error:
            raise disk_error(error, current.parent) from None

    def check_space(
        self, needed_bytes: int, size_limit_bytes: int | None = None, held_in: Path | None = None
    ) -> None:
        """Refuse before downloading what the volume cannot hold.

        `size_limit_bytes`: the emptyDir cache's sizeLimit. It is no quota the
        filesystem tells (the free space is the node's): the kubelet evicts a pod
        past it, so what the volume holds (`held_in`, by default the model
        directory: on an emptyDir the source's directory is all it holds) plus
        what is still to come must fit under it.
        """
        free = shutil.disk_usage(self.model_dir).free
        if needed_bytes > free:
            raise FetchError(
                FetchReason.DISK_FULL,
                f"the model needs {needed_bytes} more bytes and the cache volume has {free} free",
            )
        if size_limit_bytes is None:
            return
        held = held_bytes(held_in or self.model_dir)
        if needed_bytes + held > size_limit_bytes:
            raise FetchError(
                FetchReason.DISK_FULL,
                f"the model needs {needed_bytes} more bytes, the cache already holds {held}, "
                f"and the cache's size limit (spec.model.cache.sizeLimit) is "
                f"{size_limit_bytes} bytes",
            )

    def write_part(
        self, remote: RemoteFile, chunks: Iterable[bytes], offset: int, added: Callable[[int], None]
    ) -> None:
        """Append the chunks to the part file from `offset`, then verify and rename it.
        `added` is told each chunk's bytes, and 0 at each chunk hashed."""
        part = self.part_path(remote)
        self.discard_stale_parts(remote)
        try:
            part.parent.mkdir(parents=True, exist_ok=True)
            handle: BinaryIO
            with open(part, "r+b" if offset else "wb") as handle:
                handle.seek(offset)
                handle.truncate()
                for chunk in chunks:
                    handle.write(chunk)
                    added(len(chunk))
        except OSError as error:
            raise disk_error(error, part) from None
        try:
            verify(part, remote, lambda: added(0))  # no bytes, but the report stays fresh
        except FetchError:
            part.unlink(missing_ok=True)  # the next run starts this file again
            raise
        os.replace(part, self.model_dir / remote.path)
