"""`python -m fusebox_server.fetch`: download, verify and report one model, then exit.

Exit 0 with a Verified report when the cache holds a complete, verified copy of
the revision the source resolves to now (downloaded now or found there), in that
revision's own directory, and the pod's link (`--model-link`, what the server
loads) points at it; exit 1 with the failure's name
(fusebox_contract.model_fetch.FetchReason) otherwise. Every input comes from the
environment the operator renders (FetchEnv); a flag overrides its variable for
runs by hand.

Credentials are read from the environment only, without the whitespace around
them (a Secret made with `kubectl create secret --from-file` ends in a newline,
which no HTTP header may hold). They are never printed: a client library that
refuses a header quotes it in its error, so every report leaves the process
through Progress, which replaces each credential's value with `<redacted>`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fusebox_contract.model_fetch import FetchEnv, FetchReason, FetchReport
from fusebox_server.fetch import hub, s3
from fusebox_server.fetch.progress import Progress, secret_forms
from fusebox_server.fetch.store import (
    FetchError,
    ModelStore,
    RemoteFile,
    discard_other_revisions,
    link_model,
    revision_dir,
)

Reader = Callable[[RemoteFile, int], Iterator[bytes]]

CREDENTIALS = (
    FetchEnv.S3_ACCESS_KEY,
    FetchEnv.S3_SECRET_KEY,
    FetchEnv.S3_SESSION_TOKEN,
    FetchEnv.HF_TOKEN,
)
"""The variables holding a credential: stripped when read, redacted from every report."""


def credential(env: Mapping[str, str], name: FetchEnv) -> str:
    """A credential as the clients send it: without the whitespace around it."""
    return env.get(name, "").strip()


def credential_values(env: Mapping[str, str]) -> list[str]:
    """Every form of every credential that a message could quote (raw and stripped)."""
    values = [env.get(name, "") for name in CREDENTIALS]
    return secret_forms(values + [value.strip() for value in values])


@dataclass(frozen=True)
class FetchConfig:
    source: str
    revision: str
    model_dir: Path  # the source's directory; each resolved revision under revisions/
    report_file: Path | None
    termination_log: Path | None
    s3_endpoint: str
    s3_region: str
    hf_endpoint: str
    # The emptyDir's sizeLimit; None on a claim. Given, the cache is this pod's own, and
    # the revisions of the source other than the one fetched are removed.
    cache_size_limit_bytes: int | None = None
    model_link: Path | None = None  # pointed at the verified revision; None: no link


def _byte_count(text: str) -> int | None:
    """A flag's byte count: empty is none, anything else a whole number of bytes."""
    if not text.strip():
        return None
    value = int(text)
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return value


def fetch_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> FetchConfig:
    """The run's inputs: the environment the operator renders, a flag overriding each."""
    parser = argparse.ArgumentParser(prog="python -m fusebox_server.fetch", description=__doc__)
    parser.add_argument("--source", default=env.get(FetchEnv.SOURCE, ""))
    parser.add_argument("--revision", default=env.get(FetchEnv.REVISION, "main"))
    parser.add_argument(
        "--model-dir",
        default=env.get(FetchEnv.MODEL_DIR, ""),
        help="the source's directory in the cache: each revision it resolves to is fetched "
        "into revisions/REVISION there",
    )
    parser.add_argument(
        "--model-link",
        default=env.get(FetchEnv.MODEL_LINK, ""),
        help="a symbolic link to point at the verified revision (the server's model "
        "directory); empty: none",
    )
    parser.add_argument("--report-file", default=env.get(FetchEnv.REPORT_FILE, ""))
    parser.add_argument("--termination-log", default=env.get(FetchEnv.TERMINATION_LOG, ""))
    parser.add_argument("--s3-endpoint", default=env.get(FetchEnv.S3_ENDPOINT, ""))
    parser.add_argument("--s3-region", default=env.get(FetchEnv.S3_REGION, ""))
    parser.add_argument("--hf-endpoint", default=env.get(FetchEnv.HF_ENDPOINT, ""))
    parser.add_argument(
        "--cache-size-limit-bytes",
        type=_byte_count,
        default=env.get(FetchEnv.CACHE_SIZE_LIMIT_BYTES, ""),
        help="the cache volume's size limit (an emptyDir's sizeLimit; the cache is then "
        "the pod's own, and other revisions are removed); empty: none (a shared cache)",
    )
    args = parser.parse_args(argv)
    if not args.source or not args.model_dir:
        parser.error(
            f"--source ({FetchEnv.SOURCE}) and --model-dir ({FetchEnv.MODEL_DIR}) are required"
        )
    return FetchConfig(
        source=args.source,
        revision=args.revision,
        model_dir=Path(args.model_dir),
        report_file=Path(args.report_file) if args.report_file else None,
        termination_log=Path(args.termination_log) if args.termination_log else None,
        s3_endpoint=args.s3_endpoint,
        s3_region=args.s3_region,
        hf_endpoint=args.hf_endpoint,
        cache_size_limit_bytes=args.cache_size_limit_bytes,
        model_link=Path(args.model_link) if args.model_link else None,
    )


def _listing(config: FetchConfig) -> tuple[str, list[RemoteFile], Reader]:
    """(the revision the copy will be, its files, how to read one) for the source's scheme."""
    env = os.environ
    if config.source.startswith("s3://"):
        source = s3.S3Source.parse(config.source)
        client = s3.client(
            config.s3_endpoint,
            config.s3_region,
            credential(env, FetchEnv.S3_ACCESS_KEY),
            credential(env, FetchEnv.S3_SECRET_KEY),
            credential(env, FetchEnv.S3_SESSION_TOKEN),
        )
        files = s3.list_files(client, source)
        return (
            s3.revision_of(files),
            files,
            lambda remote, offset: s3.read_object(client, source, remote, offset),
        )
    if config.source.startswith("hf://"):
        repository = hub.Hub(
            hub.HubSource.parse(config.source, config.revision),
            config.hf_endpoint,
            credential(env, FetchEnv.HF_TOKEN),
        )
        commit, files = repository.list_files()
        return commit, files, lambda remote, offset: repository.read_file(commit, remote, offset)
    raise FetchError(FetchReason.FAILED, f"{config.source!r}: only s3:// and hf:// are fetched")


def fetch(config: FetchConfig, progress: Progress) -> FetchReport:
    """Bring the revision the source resolves to now into its own directory, verified,
    and point the pod's link at it; raise FetchError naming why not.

    The revision is resolved first (the hub's commit, a digest of the S3 listing) and
    its directory is never written once complete: a source that moves later is another
    directory, so a server that loaded this one, and restarts from the link, keeps
    exactly these bytes."""
    revision, files, read = _listing(config)
    source_dir = config.model_dir.absolute()
    store = ModelStore(revision_dir(source_dir, revision))
    if config.cache_size_limit_bytes is not None:
        # The pod's own emptyDir: no server of this pod runs while its fetcher does, and
        # an older revision (a restarted pod sandbox, the source moved) only takes room.
        discard_other_revisions(source_dir, store.model_dir)
    report = _fetch_revision(config, progress, store, revision, files, read, source_dir)
    if config.model_link is not None:
        link_model(config.model_link, store.model_dir)
    return report


def _fetch_revision(
    config: FetchConfig,
    progress: Progress,
    store: ModelStore,
    revision: str,
    files: list[RemoteFile],
    read: Reader,
    source_dir: Path,
) -> FetchReport:
    """The revision's directory complete and verified, under its lock."""
    total = sum(f.size for f in files)
    size_only = sum(1 for f in files if set(f.digests) <= {"size"} or not f.digests)
    checked = f"; {size_only} checked by size only (no hash at the source)" if size_only else ""
    with store.locked(progress.waiting):
        if store.complete(config.source, revision, files):
            return FetchReport(
                FetchReason.VERIFIED,
                f"{len(files)} file(s), {total} bytes, already in the cache at {revision}",
                total,
                total,
                revision=revision,
                cached=True,
                files=len(files),
            )
        todo = [f for f in files if not store.is_verified(config.source, f)]
        for remote in todo:
            store.discard_stale_parts(remote)  # before measuring what the cache holds
        done = total - sum(f.size for f in todo)
        resumed = sum(store.resumable_bytes(f) for f in todo)
        store.check_space(total - done - resumed, config.cache_size_limit_bytes, source_dir)
        progress.start(total, len(files), done + resumed)
        for remote in todo:
            offset = store.resumable_bytes(remote)
            store.write_part(remote, read(remote, offset), offset, progress.add)
            store.record(config.source, revision, remote, complete=False)
        store.record(config.source, revision, None, complete=True)
    rate = progress.rate()
    return FetchReport(
        FetchReason.VERIFIED,
        f"{len(files)} file(s), {total} bytes, verified at {revision}{checked}"
        + (f"; {resumed} bytes resumed" if resumed else ""),
        total,
        total,
        rate,
        revision=revision,
        files=len(files),
    )


def failure_report(error: FetchError, progress: Progress) -> FetchReport:
    """The failure's report, with the figures the run had reached."""
    return FetchReport(
        error.reason,
        error.message,
        progress.bytes_done,
        progress.bytes_total,
        progress.rate(),
        files=progress.files,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = fetch_config(argv, os.environ)
    progress = Progress(
        config.report_file, config.termination_log, secrets=credential_values(os.environ)
    )
    try:
        report = fetch(config, progress)
    except FetchError as error:
        report = failure_report(error, progress)
    except Exception as error:  # noqa: BLE001 - a bug too ends in a report, redacted
        progress.trace(traceback.format_exc())
        unexpected = FetchError(FetchReason.FAILED, f"{type(error).__name__}: {error}")
        report = failure_report(unexpected, progress)
    progress.finish(report)
    return 1 if report.reason.failed else 0


if __name__ == "__main__":
    sys.exit(main())
