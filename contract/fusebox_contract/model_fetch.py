"""The model fetcher's report: what the init container says and the operator reads.

Why one module: a download's outcome crosses two process boundaries. The
fetcher (fusebox_server.fetch, an init container of the inference pod) writes
it as a JSON file next to the stats file and as its container's termination
message; the operator reads the termination message from the pod's status and
turns it into the ModelReady condition. Both import the reasons, the document
and the environment names from here, so neither side spells them alone.

`parse` never raises: a termination message comes from another process and may
be a log tail (a fetcher killed before it wrote its report) or cut by the
kubelet at 4096 bytes; the report file, read by the sidecar, may hold anything.
Stdlib only.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

FETCH_CONTAINER: Final = "model-fetch"
"""The init container's name in the inference pod."""
MODEL_CACHE_DIR: Final = "/var/cache/fusebox-models"
"""Where the cache volume (an emptyDir, or the claim spec.model.cache names) is mounted."""
FETCH_REPORT_FILE: Final = "/run/fusebox/model-fetch.json"
"""The fetcher's live progress (bytes, rate), in the runtime volume the sidecar also mounts."""
FETCHED_MODEL_LINK: Final = "/run/fusebox/model"
"""The fetched model as the server loads it (its FUSEBOX_MODEL_DIR): a symbolic link the
fetcher points at the revision directory it verified, in the pod's runtime volume. Per pod
and kept across container restarts (init containers do not run again), so a restarted
server loads the very copy its pod verified, whatever later pods fetched into a shared
cache."""
TERMINATION_MESSAGE_MAX_BYTES: Final = 4096
"""The kubelet keeps at most this much of a termination message."""

# RE2-compatible (the CRD's CEL rules use them as they are; a test keeps them equal):
# a bucket name as S3 allows it, then a key prefix without whitespace.
S3_SOURCE_PATTERN: Final = r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^ \t\n\r\f\v]*)?$"
# ORG/NAME as the hub allows them, then an optional @REVISION (a branch, tag or commit).
HF_SOURCE_PATTERN: Final = (
    r"^hf://([A-Za-z0-9][A-Za-z0-9._-]{0,95})/([A-Za-z0-9][A-Za-z0-9._-]{0,95})"
    r"(@[^ \t\n\r\f\v@]+)?$"
)


class FetchEnv(enum.StrEnum):
    """The fetcher's environment: set by the operator, read by the fetcher.

    The credentials come from the Secret the spec names (secretKeyRef), under
    the names each client library already knows; they are never logged.
    """

    SOURCE = "FUSEBOX_FETCH_SOURCE"  # s3://BUCKET/PREFIX or hf://ORG/NAME[@REVISION]
    REVISION = "FUSEBOX_FETCH_REVISION"  # spec.model.revision (hf: branch, tag or commit)
    # The source's directory in the cache; each revision the source resolves to is
    # fetched into its own subdirectory there, never changed once verified.
    MODEL_DIR = "FUSEBOX_FETCH_MODEL_DIR"
    MODEL_LINK = "FUSEBOX_FETCH_MODEL_LINK"  # pointed at the verified revision (the server's)
    REPORT_FILE = "FUSEBOX_FETCH_REPORT_FILE"
    TERMINATION_LOG = "FUSEBOX_FETCH_TERMINATION_LOG"
    # The emptyDir cache's sizeLimit in bytes (absent on a claim): the kubelet evicts a
    # pod past it, and the node's free space the fetcher sees says nothing of it. Given, it
    # also says the cache is this pod's own: revisions other than the one fetched are removed.
    CACHE_SIZE_LIMIT_BYTES = "FUSEBOX_FETCH_CACHE_SIZE_LIMIT_BYTES"
    S3_ENDPOINT = "FUSEBOX_FETCH_S3_ENDPOINT"  # host[:port] or http(s)://host[:port]
    S3_REGION = "FUSEBOX_FETCH_S3_REGION"
    S3_ACCESS_KEY = "AWS_ACCESS_KEY_ID"
    S3_SECRET_KEY = "AWS_SECRET_ACCESS_KEY"  # noqa: S105 - a variable's name, not a secret
    S3_SESSION_TOKEN = "AWS_SESSION_TOKEN"  # noqa: S105
    HF_ENDPOINT = "HF_ENDPOINT"
    HF_TOKEN = "HF_TOKEN"  # noqa: S105


class SecretKey(enum.StrEnum):
    """Keys the operator reads from the Secret named by spec.model.credentials.secretName."""

    S3_ACCESS_KEY = "accessKeyId"
    S3_SECRET_KEY = "secretAccessKey"  # noqa: S105
    S3_SESSION_TOKEN = "sessionToken"  # noqa: S105 - optional
    HF_TOKEN = "token"  # noqa: S105


class FetchReason(enum.StrEnum):
    """ModelReady's reason: the download under way, done, or the failure by name."""

    DOWNLOADING = "Downloading"
    VERIFIED = "Verified"
    NOT_FOUND = "NotFound"  # bucket, key, repository or revision
    BAD_CREDENTIALS = "BadCredentials"  # refused key or token
    HASH_MISMATCH = "HashMismatch"  # the bytes are not what the source says they are
    DISK_FULL = "DiskFull"  # the cache volume cannot hold the model
    UNREACHABLE = "SourceUnreachable"  # endpoint down, DNS, TLS
    FAILED = "FetchFailed"  # anything else, with the library's words

    @property
    def failed(self) -> bool:
        return self not in (FetchReason.DOWNLOADING, FetchReason.VERIFIED)


@dataclass(frozen=True)
class FetchReport:
    """One report: progress while downloading, then the outcome.

    `revision`: what the copy is, as the source names it (the hub's commit hash,
    S3's ETags digest). `cached`: a complete verified copy was already there.
    `waiting`: another pod's download of the same model holds the shared cache;
    this one waits for it (rewritten at each look, so the report stays fresh).
    """

    reason: FetchReason
    message: str
    bytes_done: int = 0
    bytes_total: int | None = None
    rate_bytes_per_second: float | None = None
    revision: str = ""
    cached: bool = False
    files: int = 0
    waiting: bool = False

    def dumps(self) -> str:
        """The report as JSON of at most TERMINATION_MESSAGE_MAX_BYTES encoded bytes.

        A longer message is cut to the longest prefix that fits, measured in encoded
        bytes: a character may take four bytes in UTF-8, a control character six as
        an escape, and a document the kubelet cuts no longer parses (its reason lost).
        """
        body = asdict(self)
        body["reason"] = self.reason.value

        def encoded(message: str) -> str:
            body["message"] = message
            return json.dumps(body, sort_keys=True, ensure_ascii=False)

        def fits(text: str) -> bool:
            return len(text.encode()) <= TERMINATION_MESSAGE_MAX_BYTES

        text = encoded(self.message)
        if fits(text):
            return text
        # The longest prefix that fits, by bisection: `short` fits, `long` does not (every
        # character takes at least a byte, so no prefix longer than the limit can fit).
        short, long = 0, min(len(self.message), TERMINATION_MESSAGE_MAX_BYTES)
        while long - short > 1:
            middle = (short + long) // 2
            if fits(encoded(self.message[:middle] + "...")):
                short = middle
            else:
                long = middle
        return encoded(self.message[:short] + "...")


MAX_BYTES: Final = 2**63 - 1
"""No model is larger: a figure beyond it is not a measurement (and would overflow a float)."""


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        return None
    return value


def _rate(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def parse(text: str) -> FetchReport | None:
    """The report in a termination message or report file; None if it holds none."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None
    if not isinstance(body, Mapping):
        return None
    try:
        reason = FetchReason(str(body.get("reason")))
    except ValueError:
        return None
    message = body.get("message")
    revision = body.get("revision")
    return FetchReport(
        reason=reason,
        message=message if isinstance(message, str) else "",
        bytes_done=_int(body.get("bytes_done")) or 0,
        bytes_total=_int(body.get("bytes_total")),
        rate_bytes_per_second=_rate(body.get("rate_bytes_per_second")),
        revision=revision if isinstance(revision, str) else "",
        cached=body.get("cached") is True,
        files=_int(body.get("files")) or 0,
        waiting=body.get("waiting") is True,
    )


def model_cache_subdir(source: str, revision: str) -> str:
    """The directory, under the cache volume, that holds one source at the revision the
    spec names; each copy the source resolves to (a hub commit, an S3 listing's digest)
    is a subdirectory of its own (fusebox_server.fetch.store.revision_dir).

    A digest, not the source's text: bucket keys and repository names may hold
    characters a path should not, and two services naming the same source and
    revision on a shared claim find one copy.
    """
    digest = hashlib.sha256(f"{source}\n{revision}".encode()).hexdigest()[:20]
    return f"models/{digest}"
