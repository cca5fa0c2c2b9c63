"""s3:// model sources against a real S3 server: versitygw on loopback, posix backend.

The fetcher runs as the init container would (`python -m fusebox_server.fetch`,
its environment as the operator renders it), then the real server loads what
it fetched and the real openai client gets an answer. The failures are real
ones too: a bucket that is not there, a key the gateway refuses, and an object
corrupted on the gateway's disk after its ETag was recorded.

versitygw is built by `make setup` (localcluster/build-binaries.sh) and linked
as .cache/versitygw in the checkout.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from fetch_harness import FetchRun, finished, pod_link, serving, start_fetch
from fusebox_server_harness import ServerProcess, free_port
from minio import Minio

from fusebox_contract.model_fetch import FetchEnv, FetchReason, parse
from fusebox_server.fetch import s3
from fusebox_server.fetch.store import ModelStore, RemoteFile, held_bytes, revision_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
VERSITYGW = ROOT / ".cache" / "versitygw" / "versitygw"
ACCESS_KEY = "fusebox-test"
SECRET_KEY = "fusebox-test-secret-key"
BUCKET = "models"
PREFIX = "tiny"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Gateway:
    endpoint: str
    root: Path  # the posix backend's directory: <root>/<bucket>/<key>

    def client(self) -> Minio:
        return Minio(
            self.endpoint.removeprefix("http://"),
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            secure=False,
        )


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fusebox-s3-tests-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def gateway(workdir: Path) -> Iterator[Gateway]:
    assert VERSITYGW.is_file(), f"{VERSITYGW} is missing: run `make setup` (build-binaries.sh)"
    root, meta = workdir / "gateway-root", workdir / "gateway-meta"
    root.mkdir()
    meta.mkdir()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    argv = [
        str(VERSITYGW), "--port", f"127.0.0.1:{port}", "--access", ACCESS_KEY,
        "--secret", SECRET_KEY, "--quiet", "posix", "--sidecar", str(meta), str(root),
    ]  # fmt: skip

    def listening() -> bool:
        try:
            httpx.get(endpoint, timeout=1)
        except httpx.TransportError:
            return False
        return True

    with serving(argv, workdir, "gateway", listening, seconds=30):
        yield Gateway(endpoint, root)


@pytest.fixture(scope="module")
def bucket(gateway: Gateway, tiny_model_dir: Path) -> str:
    """The tiny model under s3://models/tiny; the weights uploaded in 5 MiB parts
    (a multipart ETag is no MD5, so the fetcher checks that object by size)."""
    client = gateway.client()
    client.make_bucket(BUCKET)
    for path in sorted(tiny_model_dir.iterdir()):
        client.fput_object(BUCKET, f"{PREFIX}/{path.name}", str(path), part_size=5 * 1024**2)
    return f"s3://{BUCKET}/{PREFIX}"


def run_fetch(
    gateway: Gateway,
    source: str,
    model_dir: Path,
    secret: str = SECRET_KEY,
    pod: str = "pod",
    **more: str,
) -> subprocess.Popen[str]:
    settings = {
        FetchEnv.SOURCE: source,
        FetchEnv.S3_ENDPOINT: gateway.endpoint,
        FetchEnv.S3_ACCESS_KEY: ACCESS_KEY,
        FetchEnv.S3_SECRET_KEY: secret,
        **more,
    }
    return start_fetch(model_dir, settings, scrubbed=("AWS_",), pod=pod)


def fetch(
    gateway: Gateway,
    source: str,
    model_dir: Path,
    secret: str = SECRET_KEY,
    pod: str = "pod",
    **more: str,
) -> FetchRun:
    return finished(run_fetch(gateway, source, model_dir, secret, pod, **more), model_dir)


def listed(gateway: Gateway, key: str) -> RemoteFile:
    """The object as the fetcher lists it (its name under the prefix, size, ETag)."""
    (item,) = gateway.client().list_objects(BUCKET, prefix=key)
    prefix = key.rsplit("/", 1)[0]
    return RemoteFile(key.removeprefix(f"{prefix}/"), item.size or 0, (item.etag or "").strip('"'))


def copy_dir(gateway: Gateway, model_dir: Path, prefix: str) -> Path:
    """The directory the objects under `prefix` now are fetched into (their revision's)."""
    objects = gateway.client().list_objects(BUCKET, prefix=f"{prefix}/", recursive=True)
    files = [listed(gateway, item.object_name or "") for item in objects]
    return revision_dir(model_dir, s3.revision_of(files))


def model_files(directory: Path) -> dict[str, bytes]:
    """The model's files as a server loading `directory` reads them."""
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.name.startswith(".fusebox")
    }


def test_a_model_fetched_from_s3_is_verified_and_served(
    gateway: Gateway, bucket: str, workdir: Path, tiny_model_dir: Path
) -> None:
    model_dir = workdir / "served" / "model"
    run = fetch(gateway, bucket, model_dir)
    assert run.returncode == 0, run.output
    assert run.report.reason is FetchReason.VERIFIED
    total = sum(p.stat().st_size for p in tiny_model_dir.iterdir())
    assert run.report.bytes_total == total and run.report.bytes_done == total
    assert run.report.revision.startswith("etags:")
    assert "1 checked by size only" in run.report.message  # the multipart weights
    assert SECRET_KEY not in run.output
    server = ServerProcess(workdir / "server", pod_link(model_dir), {"max-new-tokens": 8}, {})
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert reply.choices[0].message.content is not None
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        server.stop()


def test_replicas_sharing_a_cache_download_once(
    gateway: Gateway, bucket: str, workdir: Path
) -> None:
    model_dir = workdir / "shared" / "model"
    processes = [run_fetch(gateway, bucket, model_dir) for _ in range(3)]
    runs = [finished(p, model_dir) for p in processes]
    assert [r.returncode for r in runs] == [0, 0, 0]
    # One termination log for all three: read each run's own line from its stdout.
    reports = [parse(r.output.strip().splitlines()[-1]) for r in runs]
    assert all(r is not None and r.reason is FetchReason.VERIFIED for r in reports)
    assert sorted(r.cached for r in reports if r is not None) == [False, True, True]
    again = fetch(gateway, bucket, model_dir)
    assert again.returncode == 0 and again.report.cached


def test_objects_replaced_between_two_pods_fetches_never_change_what_the_first_pod_loads(
    gateway: Gateway, workdir: Path, tiny_model_dir: Path
) -> None:
    """A shared cache (a claim): pod A fetches the model, the objects under the prefix
    are replaced (here by a model no server can load), pod B (a scale-up) fetches. Each
    copy is a directory of its own; pod A's link still names the copy it verified, byte
    for byte, and its server, restarted (its fetcher does not run again), serves it."""
    client = gateway.client()
    for path in sorted(tiny_model_dir.iterdir()):
        client.fput_object(BUCKET, f"moving/{path.name}", str(path))
    model_dir = workdir / "moving" / "model"
    first = fetch(gateway, f"s3://{BUCKET}/moving", model_dir, pod="a")
    assert first.returncode == 0, first.output
    replaced = {"config.json": b'{"model_type": "replaced"}', WEIGHTS: b"\0" * 4096}
    for name, data in replaced.items():
        client.put_object(BUCKET, f"moving/{name}", io.BytesIO(data), len(data))
    second = fetch(gateway, f"s3://{BUCKET}/moving", model_dir, pod="b")
    assert second.returncode == 0, second.output
    assert second.report.revision != first.report.revision and not second.report.cached
    original = {path.name: path.read_bytes() for path in tiny_model_dir.iterdir()}
    assert model_files(pod_link(model_dir, "a")) == original
    assert model_files(pod_link(model_dir, "b")) == original | replaced
    assert len([p for p in (model_dir / "revisions").iterdir() if p.is_dir()]) == 2
    server = ServerProcess(workdir / "restarted", pod_link(model_dir, "a"), {}, {})
    try:
        server.wait_ready()
        client_api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        reply = client_api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        server.stop()


def test_a_partial_download_is_resumed(
    gateway: Gateway, bucket: str, workdir: Path, tiny_model_dir: Path
) -> None:
    model_dir = workdir / "resumed" / "model"
    copy = copy_dir(gateway, model_dir, PREFIX)
    copy.mkdir(parents=True)
    weights = (tiny_model_dir / WEIGHTS).read_bytes()
    part = ModelStore(copy).part_path(listed(gateway, f"{PREFIX}/{WEIGHTS}"))
    part.write_bytes(weights[: len(weights) // 2])
    # A part an older fetcher left, of no known version: never resumed, removed.
    (copy / f"{WEIGHTS}.part").write_bytes(b"\0" * (len(weights) // 3))
    run = fetch(gateway, bucket, model_dir)
    assert run.returncode == 0, run.output
    assert f"{len(weights) // 2} bytes resumed" in run.report.message
    assert (pod_link(model_dir) / WEIGHTS).read_bytes() == weights
    assert not list(copy.glob("*.part"))


def test_a_part_of_an_object_since_replaced_is_not_resumed(
    gateway: Gateway, workdir: Path, tiny_model_dir: Path
) -> None:
    """A fetcher killed mid-file, then the object replaced by one of the same size, with
    no hash the fetcher could check (a multipart upload): the copy is the new one whole."""
    key, size = "replaced/w.bin", 6 * 1024 * 1024
    client = gateway.client()
    client.put_object(BUCKET, key, io.BytesIO(b"A" * size), size, part_size=5 * 1024**2)
    old = listed(gateway, key)
    client.put_object(BUCKET, key, io.BytesIO(b"B" * size), size, part_size=5 * 1024**2)
    model_dir = workdir / "replaced" / "model"
    # A killed run leaves its part in the old listing's directory, which no later run
    # writes; put in the new listing's, its version in its name still keeps it out.
    copy = copy_dir(gateway, model_dir, "replaced")
    copy.mkdir(parents=True)
    ModelStore(copy).part_path(RemoteFile("w.bin", size, old.key)).write_bytes(b"A" * 1000)
    run = fetch(gateway, f"s3://{BUCKET}/replaced", model_dir)
    assert run.returncode == 0, run.output
    assert "1 checked by size only" in run.report.message and "resumed" not in run.report.message
    assert (pod_link(model_dir) / "w.bin").read_bytes() == b"B" * size
    assert not list(copy.glob("*.part"))


def test_credentials_ending_in_a_newline_are_used_without_it(
    gateway: Gateway, bucket: str, workdir: Path
) -> None:
    """What `kubectl create secret --from-file` makes of a key in a file that ends a line."""
    model_dir = workdir / "newline" / "model"
    run = fetch(
        gateway,
        bucket,
        model_dir,
        SECRET_KEY + "\n",
        **{FetchEnv.S3_ACCESS_KEY: ACCESS_KEY + "\n"},
    )
    assert run.returncode == 0, run.output
    assert run.report.reason is FetchReason.VERIFIED
    assert SECRET_KEY not in run.output


def test_a_model_larger_than_the_cache_size_limit_is_disk_full(
    gateway: Gateway, bucket: str, workdir: Path
) -> None:
    """The operator sets the emptyDir's sizeLimit in the fetcher's environment."""
    model_dir = workdir / "limited" / "model"
    run = fetch(gateway, bucket, model_dir, **{FetchEnv.CACHE_SIZE_LIMIT_BYTES: "1048576"})
    assert run.returncode == 1
    assert run.report.reason is FetchReason.DISK_FULL
    assert "size limit (spec.model.cache.sizeLimit) is 1048576 bytes" in run.report.message
    assert held_bytes(model_dir) == 0  # refused before any byte


@pytest.mark.parametrize(
    ("source", "secret", "reason", "words"),
    [
        ("s3://no-such-bucket/tiny", SECRET_KEY, FetchReason.NOT_FOUND, "bucket does not exist"),
        ("s3://models/no-such-prefix", SECRET_KEY, FetchReason.NOT_FOUND, "no objects"),
        ("s3://models/tiny", "not-the-secret", FetchReason.BAD_CREDENTIALS, "refused"),
    ],
)
def test_a_failed_fetch_exits_non_zero_naming_why(
    gateway: Gateway,
    bucket: str,
    workdir: Path,
    source: str,
    secret: str,
    reason: FetchReason,
    words: str,
) -> None:
    model_dir = Path(tempfile.mkdtemp(dir=workdir)) / "model"
    run = fetch(gateway, source, model_dir, secret)
    assert run.returncode == 1
    assert run.report.reason is reason
    assert words in run.report.message
    assert "not-the-secret" not in run.output


def test_an_object_corrupted_at_the_source_is_a_hash_mismatch(
    gateway: Gateway, bucket: str, workdir: Path, tiny_model_dir: Path
) -> None:
    """The gateway keeps the ETag (MD5) it recorded at upload; the bytes on its disk rot."""
    gateway.client().fput_object(BUCKET, "rotten/config.json", str(tiny_model_dir / "config.json"))
    stored = gateway.root / BUCKET / "rotten" / "config.json"
    data = bytearray(stored.read_bytes())
    data[0] ^= 0xFF
    stored.write_bytes(bytes(data))
    model_dir = workdir / "rotten" / "model"
    run = fetch(gateway, f"s3://{BUCKET}/rotten", model_dir)
    assert run.returncode == 1
    assert run.report.reason is FetchReason.HASH_MISMATCH
    assert "config.json: md5" in run.report.message
    assert not pod_link(model_dir).exists()  # nothing for the server to load
    assert not list(model_dir.rglob("config.json*"))  # nor its part: the next run starts again
