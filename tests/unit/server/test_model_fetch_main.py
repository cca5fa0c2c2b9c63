"""The fetcher as the init container runs it (`main`), against loopback servers.

What a user sees of a failed fetch is its report: the termination message the
operator turns into ModelReady and an event, the report file, and stdout. These
tests drive `main([...])` with the environment the operator renders, against a
listening socket on 127.0.0.1 that answers as an S3 endpoint or a hub would (or
stops answering), and read that report: its reason, its words, and never a
credential.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub.constants
import pytest

from fusebox_contract.model_fetch import FetchEnv, FetchReason, FetchReport, parse
from fusebox_server.fetch import hub
from fusebox_server.fetch.__main__ import main
from fusebox_server.fetch.store import FetchError, ModelStore, RemoteFile

COMMIT = "a" * 40
MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the pod sets HF_HUB_OFFLINE=0 for this container alone: the test run exports 1
    (nothing else may reach a hub), which huggingface_hub read when it was imported."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"


@dataclass
class Stub:
    """An HTTP server on loopback answering GET paths from `replies` (404 otherwise),
    keeping the headers of every request it got."""

    url: str
    replies: dict[str, Reply]
    requests: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
def stub() -> Iterator[Stub]:
    served = Stub("", {})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            served.requests.append({k.lower(): v for k, v in self.headers.items()})
            reply = served.replies.get(urlsplit(self.path).path, Reply(404, b"{}"))
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def hub_repository(stub: Stub, files: dict[str, int]) -> None:
    """`o/n` at `main` (commit COMMIT) on the stub hub, its files listed with sizes."""
    stub.replies["/api/models/o/n/revision/main"] = Reply(
        200, json.dumps({"id": "o/n", "sha": COMMIT}).encode()
    )
    tree = [{"type": "file", "path": p, "size": s, "oid": "b" * 40} for p, s in files.items()]
    stub.replies[f"/api/models/o/n/tree/{COMMIT}"] = Reply(200, json.dumps(tree).encode())


def git_blob_id(data: bytes) -> str:
    """The id the hub's tree lists for a small (non-LFS) file."""
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def hub_branch(stub: Stub, commit: str, files: dict[str, bytes]) -> None:
    """`o/n`'s `main` at `commit` on the stub hub, holding `files`, each served."""
    stub.replies["/api/models/o/n/revision/main"] = Reply(
        200, json.dumps({"id": "o/n", "sha": commit}).encode()
    )
    tree = [
        {"type": "file", "path": p, "size": len(b), "oid": git_blob_id(b)} for p, b in files.items()
    ]
    stub.replies[f"/api/models/o/n/tree/{commit}"] = Reply(200, json.dumps(tree).encode())
    for path, data in files.items():
        stub.replies[f"/o/n/resolve/{commit}/{path}"] = Reply(200, data, "application/octet-stream")


@dataclass(frozen=True)
class Outcome:
    returncode: int
    report: FetchReport
    everything: str  # the termination message, the report file and stdout together
    stderr: str


def run_main(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    *flags: str,
    cache_dir: Path | None = None,
) -> Outcome:
    """`main` with only `env` set of the fetcher's variables, as the init container runs;
    `tmp_path` is the pod (its termination message, its report), `cache_dir` the source's
    directory in the cache volume (by default one of the pod's own)."""
    for name in FetchEnv:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    termination, report_file = tmp_path / "termination", tmp_path / "report.json"
    returncode = main(
        [
            "--model-dir",
            str(cache_dir or tmp_path / "cache" / "models" / "m"),
            "--termination-log",
            str(termination),
            "--report-file",
            str(report_file),
            *flags,
        ]
    )
    message = termination.read_text()
    assert len(message.encode()) <= 4096
    report = parse(message)
    assert report is not None, message
    printed = capsys.readouterr()
    return Outcome(returncode, report, message + report_file.read_text() + printed.out, printed.err)


ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message><RequestId>1</RequestId><HostId>h</HostId></Error>"
)


def test_an_s3_session_token_with_a_trailing_newline_never_reaches_the_report(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
) -> None:
    """A Secret made with `kubectl create secret --from-file` ends its value in a newline."""
    stub.replies["/models"] = Reply(403, ACCESS_DENIED, "application/xml")
    env = {
        FetchEnv.SOURCE: "s3://models/tiny",
        FetchEnv.S3_ENDPOINT: stub.url,
        FetchEnv.S3_REGION: "us-east-1",
        FetchEnv.S3_ACCESS_KEY: "AKIAEXAMPLE\n",
        FetchEnv.S3_SECRET_KEY: "secretSECRET\n",
        FetchEnv.S3_SESSION_TOKEN: "SESSIONTOKENsecret123\n",
    }
    outcome = run_main(tmp_path, monkeypatch, capsys, env)
    assert outcome.returncode == 1
    assert outcome.report.reason is FetchReason.BAD_CREDENTIALS
    for secret in ("AKIAEXAMPLE", "secretSECRET", "SESSIONTOKENsecret123"):
        assert secret not in outcome.everything
    # The token was sent as the Secret meant it, without the newline.
    assert stub.requests[-1]["x-amz-security-token"] == "SESSIONTOKENsecret123"


@pytest.mark.parametrize(
    ("token", "parts"),
    [
        ("hf_SECRETTOKEN123\n", ["hf_SECRETTOKEN123"]),
        # Inside the value, no strip helps: the HTTP library refuses the header and quotes
        # it (escaped) in its error, which the report must not carry.
        ("hf_SECRET\nTOKEN123", ["hf_SECRET", "TOKEN123"]),
    ],
)
def test_a_hub_token_never_reaches_the_report(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
    token: str,
    parts: list[str],
) -> None:
    stub.replies["/api/models/o/n/revision/main"] = Reply(500, b'{"error": "down"}')
    env = {FetchEnv.SOURCE: "hf://o/n", FetchEnv.HF_ENDPOINT: stub.url, FetchEnv.HF_TOKEN: token}
    outcome = run_main(tmp_path, monkeypatch, capsys, env)
    assert outcome.returncode == 1
    assert outcome.report.reason is FetchReason.FAILED
    assert outcome.report.message.startswith("hf://o/n@main")
    for part in parts:
        assert part not in outcome.everything


def test_an_unexpected_error_quoting_a_token_still_ends_in_a_redacted_report(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
) -> None:
    """A bug is not a named failure, but it must not die without a report, nor leak."""
    hub_repository(stub, {"config.json": 6})

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug holding Bearer hf_SECRETTOKEN123")

    monkeypatch.setattr(ModelStore, "check_space", broken)
    env = {
        FetchEnv.SOURCE: "hf://o/n",
        FetchEnv.HF_ENDPOINT: stub.url,
        FetchEnv.HF_TOKEN: "hf_SECRETTOKEN123",
    }
    outcome = run_main(tmp_path, monkeypatch, capsys, env)
    assert outcome.returncode == 1
    assert outcome.report.reason is FetchReason.FAILED
    assert outcome.report.message == "RuntimeError: a bug holding Bearer <redacted>"
    assert "hf_SECRETTOKEN123" not in outcome.everything
    assert "Traceback" in outcome.stderr and "hf_SECRETTOKEN123" not in outcome.stderr


@pytest.mark.parametrize("endpoint", ["https://s3.example.com/minio", "s3.example.com:99999"])
def test_an_s3_endpoint_the_client_refuses_is_a_named_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    endpoint: str,
) -> None:
    env = {FetchEnv.SOURCE: "s3://models/tiny", FetchEnv.S3_ENDPOINT: endpoint}
    outcome = run_main(tmp_path, monkeypatch, capsys, env)
    assert outcome.returncode == 1
    assert outcome.report.reason is FetchReason.FAILED
    assert endpoint in outcome.report.message and "spec.model.endpoint" in outcome.report.message


def test_a_cache_volume_that_refuses_file_locks_is_a_named_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
) -> None:
    """An NFS claim without a lock daemon answers flock with ENOLCK."""
    hub_repository(stub, {"config.json": 6})

    def refuse(handle: object, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    env = {FetchEnv.SOURCE: "hf://o/n", FetchEnv.HF_ENDPOINT: stub.url}
    outcome = run_main(tmp_path, monkeypatch, capsys, env)
    assert outcome.returncode == 1
    assert outcome.report.reason is FetchReason.FAILED
    lock = tmp_path / "cache" / "models" / "m" / "revisions" / f"{COMMIT}.lock"
    assert str(lock) in outcome.report.message
    assert "No locks available" in outcome.report.message


@pytest.mark.parametrize("how", ["env", "flag"])
def test_a_model_larger_than_the_cache_size_limit_is_disk_full_before_any_download(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
    how: str,
) -> None:
    hub_repository(stub, {"config.json": 6, "w.bin": 2 * MIB})
    env = {FetchEnv.SOURCE: "hf://o/n", FetchEnv.HF_ENDPOINT: stub.url}
    flags: tuple[str, ...] = ()
    if how == "env":
        env[FetchEnv.CACHE_SIZE_LIMIT_BYTES] = str(MIB)
    else:
        flags = ("--cache-size-limit-bytes", str(MIB))
    outcome = run_main(tmp_path, monkeypatch, capsys, env, *flags)
    assert outcome.returncode == 1
    assert outcome.report.reason is FetchReason.DISK_FULL
    assert f"{MIB} bytes" in outcome.report.message
    assert len(stub.requests) == 2  # the listing only: no file was asked for


@dataclass
class Staller:
    """A loopback server that answers every request with `head` and then sends nothing."""

    url: str
    head: bytes
    release: threading.Event


@pytest.fixture
def staller() -> Iterator[Staller]:
    listener = socket.create_server(("127.0.0.1", 0))
    served = Staller(f"http://127.0.0.1:{listener.getsockname()[1]}", b"", threading.Event())
    connections: list[socket.socket] = []

    def serve() -> None:
        while not served.release.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connections.append(connection)
            connection.recv(65536)
            connection.sendall(served.head)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.release.set()
        listener.close()
        thread.join(timeout=5)
        for connection in connections:
            connection.close()


STALL_SECONDS = 0.5


def stalled(call: Callable[[], object]) -> FetchError:
    started = time.monotonic()
    with pytest.raises(FetchError) as caught:
        call()
    assert time.monotonic() - started < 10
    return caught.value


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",  # a few bytes, then none
        b"",  # not even the headers
    ],
)
def test_a_hub_that_stops_sending_is_unreachable_not_a_hang(staller: Staller, head: bytes) -> None:
    staller.head = head
    repository = hub.Hub(
        hub.HubSource("o/n", "main"), staller.url, "hf_SECRET", read_timeout_seconds=STALL_SECONDS
    )
    host = staller.url.removeprefix("http://")
    listing = stalled(repository.list_files)
    reading = stalled(lambda: list(repository.read_file(COMMIT, RemoteFile("w", 100, "k"), 0)))
    for error in (listing, reading):
        assert error.reason is FetchReason.UNREACHABLE
        assert host in error.message and f"{STALL_SECONDS:g} s" in error.message
        assert "hf_SECRET" not in error.message


FIRST, SECOND = "1" * 40, "2" * 40
OLD = {"config.json": b'{"v": 1}\n', "w.bin": b"old weights " * 1000}
NEW = {"config.json": b'{"v": 2}\n', "w.bin": b"new weights " * 1000}
"""The same files at two commits: what `main` holds before and after the branch moved."""


def model_files(directory: Path) -> dict[str, bytes]:
    """The model's files as a server loading `directory` reads them (not the fetcher's record)."""
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.name.startswith(".fusebox")
    }


def fetch_in_pod(
    pod: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
    *flags: str,
) -> Outcome:
    """One pod's fetcher into the source's directory `cache`, linking `pod`/run/model."""
    pod.mkdir(exist_ok=True)
    env = {FetchEnv.SOURCE: "hf://o/n", FetchEnv.HF_ENDPOINT: stub.url}
    link = ("--model-link", str(pod / "run" / "model"))
    return run_main(pod, monkeypatch, capsys, env, *link, *flags, cache_dir=cache)


def test_a_branch_that_moves_between_two_pods_fetches_leaves_the_first_pod_its_verified_copy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
) -> None:
    """A shared cache (a claim): a scale-up's pod fetches after `main` moved. The first
    pod's server, restarted (its fetcher does not run again), must load what its fetcher
    verified and reported, not the new commit, nor a mix of the two."""
    cache = tmp_path / "claim" / "models" / "m"
    hub_branch(stub, FIRST, OLD)
    first = fetch_in_pod(tmp_path / "pod-a", cache, monkeypatch, capsys, stub)
    hub_branch(stub, SECOND, NEW)
    second = fetch_in_pod(tmp_path / "pod-b", cache, monkeypatch, capsys, stub)
    third = fetch_in_pod(tmp_path / "pod-c", cache, monkeypatch, capsys, stub)
    assert [o.returncode for o in (first, second, third)] == [0, 0, 0]
    assert [o.report.revision for o in (first, second, third)] == [FIRST, SECOND, SECOND]
    assert [o.report.cached for o in (first, second, third)] == [False, False, True]
    assert model_files(tmp_path / "pod-a" / "run" / "model") == OLD
    assert model_files(tmp_path / "pod-b" / "run" / "model") == NEW
    assert model_files(tmp_path / "pod-c" / "run" / "model") == NEW
    revisions = sorted(p.name for p in (cache / "revisions").iterdir() if p.is_dir())
    assert revisions == [FIRST, SECOND]  # one copy per commit, both kept


def test_a_pods_own_cache_keeps_only_the_revision_it_fetched_last(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
) -> None:
    """An emptyDir (its size limit given): the fetcher runs again only when the pod's
    sandbox restarts, with no server running; an older revision would only take room
    under the size limit."""
    cache, pod = tmp_path / "empty-dir" / "models" / "m", tmp_path / "pod"
    limit = ("--cache-size-limit-bytes", str(MIB))
    hub_branch(stub, FIRST, OLD)
    first = fetch_in_pod(pod, cache, monkeypatch, capsys, stub, *limit)
    hub_branch(stub, SECOND, NEW)
    again = fetch_in_pod(pod, cache, monkeypatch, capsys, stub, *limit)
    assert (first.returncode, again.returncode) == (0, 0)
    assert again.report.revision == SECOND
    assert model_files(pod / "run" / "model") == NEW
    assert [p.name for p in (cache / "revisions").iterdir() if p.is_dir()] == [SECOND]


def test_a_fetch_that_fails_leaves_the_pods_link_where_it_was(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stub: Stub,
) -> None:
    """A copy that does not verify is never what the server loads."""
    cache, pod = tmp_path / "claim" / "models" / "m", tmp_path / "pod"
    hub_branch(stub, FIRST, OLD)
    assert fetch_in_pod(pod, cache, monkeypatch, capsys, stub).returncode == 0
    hub_branch(stub, SECOND, NEW)
    stub.replies[f"/o/n/resolve/{SECOND}/w.bin"] = Reply(200, b"x" * len(NEW["w.bin"]))
    failed = fetch_in_pod(pod, cache, monkeypatch, capsys, stub)
    assert failed.returncode == 1 and failed.report.reason is FetchReason.HASH_MISMATCH
    assert model_files(pod / "run" / "model") == OLD
